"""The AMQP 1.0 value model (part 1 of the specification): a class for every type Python has none of.

Plain Python types stand for: ``None`` null, ``bool`` boolean, ``int`` long (so a long whose value fits
in 32 bits stays a long), ``float`` double, ``str`` string, ``bytes`` binary, ``uuid.UUID`` uuid,
``list`` list, ``dict`` map. The other types have a class named after them: :class:`UByte`
:class:`UShort` :class:`UInt` :class:`ULong` :class:`Byte` :class:`Short` :class:`Int`
:class:`Timestamp` :class:`Decimal32` :class:`Decimal64` (``int`` subclasses), :class:`Float`
(``float`` subclass, float32), :class:`Char` and :class:`Symbol` (``str`` subclasses),
:class:`Decimal128` (``bytes`` subclass), :class:`Described`, :class:`Array`, and :class:`MapPairs` for
a map that a ``dict`` cannot hold (a key that is unhashable, such as a list, or keys that Python
considers equal though AMQP does not, such as symbol ``"a"`` and string ``"a"``, or ``true`` and long
``1``).

Invariants:
- A value of these classes is checked when it is made: an out-of-range number is a ``ValueError``, a
  value of the wrong kind a ``TypeError``.
- Values are immutable and pickle by value (executors receive them).
"""

from __future__ import annotations

import operator
import struct
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum
from typing import Any, Iterable

from backlog_syphon.restore.amqp.decimals import BID32, BID64, BID128, bid_to_decimal, decimal_to_bid
from backlog_syphon.restore.amqp.wire import F32

MAX_NESTING_DEPTH = 64  # lists, maps, arrays and described values inside one another

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class AmqpType(str, Enum):
    """AMQP primitive type names, as used for :attr:`Array.element_type`."""

    NULL = "null"
    BOOLEAN = "boolean"
    UBYTE = "ubyte"
    USHORT = "ushort"
    UINT = "uint"
    ULONG = "ulong"
    BYTE = "byte"
    SHORT = "short"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    DECIMAL32 = "decimal32"
    DECIMAL64 = "decimal64"
    DECIMAL128 = "decimal128"
    CHAR = "char"
    TIMESTAMP = "timestamp"
    UUID = "uuid"
    BINARY = "binary"
    STRING = "string"
    SYMBOL = "symbol"
    LIST = "list"
    MAP = "map"
    ARRAY = "array"

    def __repr__(self) -> str:
        return repr(self.value)


class _BoundedInt(int):
    """An AMQP integer type: an ``int`` checked against its range on construction."""

    __slots__ = ()
    _min = _max = 0

    def __new__(cls, value: int = 0):
        number = int.__new__(cls, operator.index(value))
        if not cls._min <= number <= cls._max:
            raise ValueError(f"{cls.__name__} must be between {cls._min} and {cls._max}, got {int(number)}")
        return number

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int.__repr__(self)})"

    __str__ = int.__repr__  # str() and f-strings show the number, not the repr


class UByte(_BoundedInt):
    """AMQP ubyte: 0 .. 2**8 - 1."""
    __slots__ = ()
    _min, _max = 0, 2**8 - 1


class UShort(_BoundedInt):
    """AMQP ushort: 0 .. 2**16 - 1."""
    __slots__ = ()
    _min, _max = 0, 2**16 - 1


class UInt(_BoundedInt):
    """AMQP uint: 0 .. 2**32 - 1."""
    __slots__ = ()
    _min, _max = 0, 2**32 - 1


class ULong(_BoundedInt):
    """AMQP ulong: 0 .. 2**64 - 1."""
    __slots__ = ()
    _min, _max = 0, 2**64 - 1


class Byte(_BoundedInt):
    """AMQP byte: -2**7 .. 2**7 - 1."""
    __slots__ = ()
    _min, _max = -(2**7), 2**7 - 1


class Short(_BoundedInt):
    """AMQP short: -2**15 .. 2**15 - 1."""
    __slots__ = ()
    _min, _max = -(2**15), 2**15 - 1


class Int(_BoundedInt):
    """AMQP int (32 bits; a plain Python ``int`` is an AMQP long)."""
    __slots__ = ()
    _min, _max = -(2**31), 2**31 - 1


class Timestamp(_BoundedInt):
    """AMQP timestamp: milliseconds since the Unix epoch (UTC), negative before 1970."""
    __slots__ = ()
    _min, _max = -(2**63), 2**63 - 1

    @classmethod
    def from_datetime(cls, value: datetime) -> Timestamp:
        """A datetime (naive means UTC) as a timestamp; the sub-millisecond part is floored."""
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return cls((value - _EPOCH) // timedelta(milliseconds=1))

    def to_datetime(self) -> datetime:
        """The instant as a UTC datetime; OverflowError outside the years 1 to 9999."""
        return _EPOCH + timedelta(milliseconds=int(self))


class Decimal32(_BoundedInt):
    """AMQP decimal32: the 32 raw bits of an IEEE 754-2008 decimal32 (binary integer decimal encoding)."""
    __slots__ = ()
    _min, _max = 0, 2**32 - 1

    @classmethod
    def from_decimal(cls, value: Decimal) -> Decimal32:
        return cls(decimal_to_bid(value, BID32))

    def to_decimal(self) -> Decimal:
        return bid_to_decimal(int(self), BID32)


class Decimal64(_BoundedInt):
    """AMQP decimal64: the 64 raw bits of an IEEE 754-2008 decimal64 (binary integer decimal encoding)."""
    __slots__ = ()
    _min, _max = 0, 2**64 - 1

    @classmethod
    def from_decimal(cls, value: Decimal) -> Decimal64:
        return cls(decimal_to_bid(value, BID64))

    def to_decimal(self) -> Decimal:
        return bid_to_decimal(int(self), BID64)


class Decimal128(bytes):
    """AMQP decimal128: the 16 raw bytes of an IEEE 754-2008 decimal128 (.NET ``decimal`` values travel as these).

    The codec never interprets the bytes, so they are forwarded exactly. :meth:`to_decimal` reads
    them as the standard says (binary integer decimal). The legacy WindowsAzure.ServiceBus client
    wrote the exponent's high bits two places too far right, so its values read as vanishingly
    small numbers there; its own reader and the Python SDK's read them back as they were meant.
    """

    __slots__ = ()

    def __new__(cls, value: bytes):
        raw = bytes.__new__(cls, value)
        if len(raw) != 16:
            raise ValueError(f"Decimal128 takes exactly 16 bytes, got {len(raw)}")
        return raw

    @classmethod
    def from_decimal(cls, value: Decimal) -> Decimal128:
        return cls(decimal_to_bid(value, BID128).to_bytes(16, "big"))

    def to_decimal(self) -> Decimal:
        return bid_to_decimal(int.from_bytes(self, "big"), BID128)

    def __repr__(self) -> str:
        return f"Decimal128({bytes.__repr__(self)})"


class Float(float):
    """AMQP float (IEEE 754 binary32; a plain Python ``float`` is an AMQP double). Rounded to float32."""

    __slots__ = ()

    def __new__(cls, value: float = 0.0):
        try:
            rounded = F32.unpack(F32.pack(value))[0]
        except OverflowError:
            raise ValueError(f"Float (float32) is out of range: {value!r}") from None
        except struct.error:
            raise TypeError(f"Float takes a number, got {type(value).__name__}") from None
        return float.__new__(cls, rounded)

    def __repr__(self) -> str:
        return f"Float({float.__repr__(self)})"

    __str__ = float.__repr__


class Char(str):
    """AMQP char: exactly one Unicode code point (UTF-32 on the wire; surrogates are not code points)."""

    __slots__ = ()

    def __new__(cls, value: str):
        if not isinstance(value, str):
            raise TypeError(f"Char takes a str, got {type(value).__name__}")
        text = str.__new__(cls, value)
        if len(text) != 1 or 0xD800 <= ord(text) <= 0xDFFF:
            raise ValueError("Char must be exactly one Unicode code point (not a surrogate)")
        return text

    def __repr__(self) -> str:
        return f"Char({str.__repr__(self)})"


class Symbol(str):
    """AMQP symbol: ASCII text from a constrained domain (annotation keys, descriptors, content types)."""

    __slots__ = ()

    def __new__(cls, value: str):
        if not isinstance(value, str):
            raise TypeError(f"Symbol takes a str, got {type(value).__name__}")
        text = str.__new__(cls, value)
        if not text.isascii():
            raise ValueError("Symbol must be ASCII")
        return text

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class _Immutable:
    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    __delattr__ = __setattr__


class Described(_Immutable):
    """An AMQP described value; hashable when its descriptor and value are."""

    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any):
        object.__setattr__(self, "descriptor", descriptor)
        object.__setattr__(self, "value", value)

    def __eq__(self, other):
        if type(other) is not Described:
            return NotImplemented
        return self.descriptor == other.descriptor and self.value == other.value

    def __hash__(self):
        return hash((Described, self.descriptor, self.value))

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"

    def __reduce__(self):
        return Described, (self.descriptor, self.value)


class Array(_Immutable):
    """An AMQP array: elements of one type, optionally all described by one descriptor.

    ``element_type`` is an :class:`AmqpType` (or its name, such as ``"symbol"``). ``elements`` holds
    the undescribed values, each of the exact class of that type (``int`` for long, ``str`` for
    string, ``UInt`` for uint, ``dict`` or ``MapPairs`` for map, ``Array`` for array...); plain
    ``int``, ``float``, ``str`` and ``bytes`` are converted to the element type's class. ``descriptor``
    None means the array is not described.
    """

    __slots__ = ("element_type", "elements", "descriptor")

    def __init__(self, element_type: AmqpType | str, elements: Iterable = (), descriptor: Any = None):
        element_type = AmqpType(element_type)
        accepted = ELEMENT_CLASSES[element_type]
        checked = []
        for element in elements:
            if type(element) not in accepted:
                element = _coerce_element(element_type, element)
            checked.append(element)
        object.__setattr__(self, "element_type", element_type)
        object.__setattr__(self, "elements", tuple(checked))
        object.__setattr__(self, "descriptor", descriptor)

    @classmethod
    def from_decoded(cls, element_type: AmqpType, elements: tuple, descriptor: Any) -> Array:
        """An array of elements the decoder already read as ``element_type``: not checked again."""
        array = object.__new__(cls)
        object.__setattr__(array, "element_type", element_type)
        object.__setattr__(array, "elements", elements)
        object.__setattr__(array, "descriptor", descriptor)
        return array

    def __len__(self) -> int:
        return len(self.elements)

    def __iter__(self):
        return iter(self.elements)

    def __eq__(self, other):
        if type(other) is not Array:
            return NotImplemented
        return (self.element_type == other.element_type and self.descriptor == other.descriptor
                and self.elements == other.elements)

    def __hash__(self):
        return hash((Array, self.element_type, self.descriptor, self.elements))

    def __repr__(self) -> str:
        described = "" if self.descriptor is None else f", descriptor={self.descriptor!r}"
        return f"Array({self.element_type.value!r}, {self.elements!r}{described})"

    def __reduce__(self):
        return Array, (self.element_type, self.elements, self.descriptor)


class MapPairs(tuple):
    """An AMQP map that a ``dict`` cannot hold, as its ordered ``(key, value)`` pairs.

    The decoder returns a ``dict`` for a map whenever it can and this class only when a key is
    unhashable (a list or map key) or two keys are equal in Python but distinct in AMQP (symbol
    ``"a"`` and string ``"a"``, uint 1 and long 1, boolean true and long 1), so nothing is lost.
    """

    __slots__ = ()

    def __new__(cls, pairs: Iterable = ()):
        checked = tuple(pairs)
        for pair in checked:
            if type(pair) is not tuple or len(pair) != 2:
                raise TypeError("MapPairs takes (key, value) tuples")
        return tuple.__new__(cls, checked)

    def __repr__(self) -> str:
        return f"MapPairs({tuple.__repr__(self)})"


def _coerce_element(element_type: AmqpType, element: Any) -> Any:
    target = ELEMENT_CLASSES[element_type][0]
    if target is not bool and any(type(element) is base and issubclass(target, base)
                                  for base in (int, float, str, bytes)):
        return target(element)
    raise TypeError(f"an array of {element_type.value} cannot hold a {type(element).__name__}")


ELEMENT_CLASSES: dict[AmqpType, tuple[type, ...]] = {
    AmqpType.NULL: (type(None),), AmqpType.BOOLEAN: (bool,), AmqpType.UBYTE: (UByte,),
    AmqpType.USHORT: (UShort,), AmqpType.UINT: (UInt,), AmqpType.ULONG: (ULong,), AmqpType.BYTE: (Byte,),
    AmqpType.SHORT: (Short,), AmqpType.INT: (Int,), AmqpType.LONG: (int,), AmqpType.FLOAT: (Float,),
    AmqpType.DOUBLE: (float,), AmqpType.DECIMAL32: (Decimal32,), AmqpType.DECIMAL64: (Decimal64,),
    AmqpType.DECIMAL128: (Decimal128,), AmqpType.CHAR: (Char,), AmqpType.TIMESTAMP: (Timestamp,),
    AmqpType.UUID: (uuid.UUID,), AmqpType.BINARY: (bytes,), AmqpType.STRING: (str,),
    AmqpType.SYMBOL: (Symbol,), AmqpType.LIST: (list,), AmqpType.MAP: (dict, MapPairs),
    AmqpType.ARRAY: (Array,),
}


def ms_to_datetime(ms: int) -> datetime:
    """Milliseconds since the Unix epoch (an AMQP timestamp) to a tz-aware UTC datetime (OverflowError
    outside years 1-9999)."""
    return _EPOCH + timedelta(milliseconds=ms)


def datetime_to_ms(value: datetime) -> int:
    """A datetime (naive means UTC) to milliseconds since the Unix epoch, sub-millisecond part floored."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return (value - _EPOCH) // timedelta(milliseconds=1)
