"""AMQP 1.0 values and message sections in pure Python (standard library only), every type kept exactly.

The syphon reads the raw bytes of backlog messages and forwards them. A decoder that merges AMQP
types (``long`` and ``int``, ``symbol`` and ``string``), drops descriptors or cannot read ``char``
and the decimals would change what the legacy .NET client sent. This module decodes and encodes the
whole AMQP 1.0 type system (part 1 of the specification) and splits a message into its sections
(part 3) so that sections can be rewritten while untouched bytes are copied as they are.

The value model. Plain Python types stand for: ``None`` null, ``bool`` boolean, ``int`` long (so a
long whose value fits in 32 bits stays a long), ``float`` double, ``str`` string, ``bytes`` binary,
``uuid.UUID`` uuid, ``list`` list, ``dict`` map. The other types have a class named after them:
:class:`UByte` :class:`UShort` :class:`UInt` :class:`ULong` :class:`Byte` :class:`Short`
:class:`Int` :class:`Timestamp` :class:`Decimal32` :class:`Decimal64` (``int`` subclasses),
:class:`Float` (``float`` subclass, float32), :class:`Char` and :class:`Symbol` (``str``
subclasses), :class:`Decimal128` (``bytes`` subclass), :class:`Described`, :class:`Array`, and
:class:`MapPairs` for a map that a ``dict`` cannot hold (a key that is unhashable, such as a list, or
keys that Python considers equal though AMQP does not, such as symbol ``"a"`` and string ``"a"``, or
``true`` and long ``1``).

Invariants:
- ``encode_value(decode_value(b)[0])`` decodes to the same types and values as ``b`` (encodings may
  become more compact). Floats keep their bits, NaN payloads included.
- Decoding is strict: anything that is not a legal encoding raises :class:`AmqpDecodeError` (a
  ``ValueError``) naming the problem and the byte offset, never the bytes themselves (values may hold
  secrets). No other exception escapes the decoders, whatever the input.
- Counts are checked against the bytes present before anything is allocated, and nesting is limited
  to :data:`MAX_NESTING_DEPTH`, so hostile input costs memory and time in proportion to its size.
- Encoding is type-exact too: a value outside the model (a ``tuple``, a ``datetime``, an ``int``
  subclass of its own) is a ``TypeError``, an out-of-range number a ``ValueError``.
"""

from __future__ import annotations

import operator
import struct
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum, IntEnum
from functools import partial
from typing import Any, Iterable, NamedTuple, Sequence

MAX_NESTING_DEPTH = 64  # lists, maps, arrays and described values inside one another

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class AmqpDecodeError(ValueError):
    """Bytes that are not a legal AMQP encoding; ``offset`` is where the problem was found."""

    def __init__(self, problem: str, offset: int):
        super().__init__(f"{problem} at byte {offset}")
        self.offset = offset


# --- the value model ---------------------------------------------------------------------------

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
        return cls(_decimal_to_bid(value, _BID32))

    def to_decimal(self) -> Decimal:
        return _bid_to_decimal(int(self), _BID32)


class Decimal64(_BoundedInt):
    """AMQP decimal64: the 64 raw bits of an IEEE 754-2008 decimal64 (binary integer decimal encoding)."""
    __slots__ = ()
    _min, _max = 0, 2**64 - 1

    @classmethod
    def from_decimal(cls, value: Decimal) -> Decimal64:
        return cls(_decimal_to_bid(value, _BID64))

    def to_decimal(self) -> Decimal:
        return _bid_to_decimal(int(self), _BID64)


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
        return cls(_decimal_to_bid(value, _BID128).to_bytes(16, "big"))

    def to_decimal(self) -> Decimal:
        return _bid_to_decimal(int.from_bytes(self, "big"), _BID128)

    def __repr__(self) -> str:
        return f"Decimal128({bytes.__repr__(self)})"


class Float(float):
    """AMQP float (IEEE 754 binary32; a plain Python ``float`` is an AMQP double). Rounded to float32."""

    __slots__ = ()

    def __new__(cls, value: float = 0.0):
        try:
            rounded = _F32.unpack(_F32.pack(value))[0]
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
        accepted = _ELEMENT_CLASSES[element_type]
        checked = []
        for element in elements:
            if type(element) not in accepted:
                element = _coerce_element(element_type, element)
            checked.append(element)
        object.__setattr__(self, "element_type", element_type)
        object.__setattr__(self, "elements", tuple(checked))
        object.__setattr__(self, "descriptor", descriptor)

    @classmethod
    def _trusted(cls, element_type: AmqpType, elements: tuple, descriptor: Any) -> Array:
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
    target = _ELEMENT_CLASSES[element_type][0]
    if target is not bool and any(type(element) is base and issubclass(target, base)
                                  for base in (int, float, str, bytes)):
        return target(element)
    raise TypeError(f"an array of {element_type.value} cannot hold a {type(element).__name__}")


_ELEMENT_CLASSES: dict[AmqpType, tuple[type, ...]] = {
    AmqpType.NULL: (type(None),), AmqpType.BOOLEAN: (bool,), AmqpType.UBYTE: (UByte,),
    AmqpType.USHORT: (UShort,), AmqpType.UINT: (UInt,), AmqpType.ULONG: (ULong,), AmqpType.BYTE: (Byte,),
    AmqpType.SHORT: (Short,), AmqpType.INT: (Int,), AmqpType.LONG: (int,), AmqpType.FLOAT: (Float,),
    AmqpType.DOUBLE: (float,), AmqpType.DECIMAL32: (Decimal32,), AmqpType.DECIMAL64: (Decimal64,),
    AmqpType.DECIMAL128: (Decimal128,), AmqpType.CHAR: (Char,), AmqpType.TIMESTAMP: (Timestamp,),
    AmqpType.UUID: (uuid.UUID,), AmqpType.BINARY: (bytes,), AmqpType.STRING: (str,),
    AmqpType.SYMBOL: (Symbol,), AmqpType.LIST: (list,), AmqpType.MAP: (dict, MapPairs),
    AmqpType.ARRAY: (Array,),
}


# --- IEEE 754-2008 decimals, binary integer decimal (BID) encoding -----------------------------

class _BidFormat(NamedTuple):
    bits: int
    exponent_bits: int
    bias: int
    digits: int


_BID32 = _BidFormat(32, 8, 101, 7)
_BID64 = _BidFormat(64, 10, 398, 16)
_BID128 = _BidFormat(128, 14, 6176, 34)


def _bid_to_decimal(bits: int, fmt: _BidFormat) -> Decimal:
    sign = bits >> (fmt.bits - 1)
    top = (bits >> (fmt.bits - 6)) & 0x1F  # the five bits after the sign
    if top == 0x1F:
        return Decimal("-NaN" if sign else "NaN")
    if top == 0x1E:
        return Decimal("-Infinity" if sign else "Infinity")
    if top >> 3 == 0b11:  # large-coefficient form: 11, exponent, then the coefficient's low bits
        coefficient_bits = fmt.bits - 3 - fmt.exponent_bits
        exponent = (bits >> coefficient_bits) & ((1 << fmt.exponent_bits) - 1)
        coefficient = (0b100 << coefficient_bits) | (bits & ((1 << coefficient_bits) - 1))
    else:
        coefficient_bits = fmt.bits - 1 - fmt.exponent_bits
        exponent = (bits >> coefficient_bits) & ((1 << fmt.exponent_bits) - 1)
        coefficient = bits & ((1 << coefficient_bits) - 1)
    if coefficient >= 10**fmt.digits:
        coefficient = 0  # non-canonical: IEEE 754 reads it as zero
    return Decimal((sign, tuple(int(d) for d in str(coefficient)), exponent - fmt.bias))


def _decimal_to_bid(value: Decimal, fmt: _BidFormat) -> int:
    sign, digits, exponent = Decimal(value).as_tuple()
    top = sign << (fmt.bits - 1)
    if exponent == "n" or exponent == "N":
        return top | (0x1F << (fmt.bits - 6))
    if exponent == "F":
        return top | (0x1E << (fmt.bits - 6))
    coefficient = int("".join(map(str, digits)) or "0")
    biased = exponent + fmt.bias
    if coefficient >= 10**fmt.digits or not 0 <= biased < (3 << (fmt.exponent_bits - 2)):
        raise ValueError(f"{value} does not fit a decimal{fmt.bits} exactly")
    coefficient_bits = fmt.bits - 1 - fmt.exponent_bits
    if coefficient < 1 << coefficient_bits:
        return top | (biased << coefficient_bits) | coefficient
    coefficient_bits -= 2
    return (top | (0b11 << (fmt.bits - 3)) | (biased << coefficient_bits)
            | (coefficient & ((1 << coefficient_bits) - 1)))


# --- decoding ----------------------------------------------------------------------------------

_U8 = struct.Struct(">B")
_I8 = struct.Struct(">b")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_COUNTS8 = struct.Struct(">BB")
_COUNTS32 = struct.Struct(">II")

# Decoders take (buffer, offset just past the constructor, depth) and return (value, end offset);
# the table is filled below, once the decoders are defined.
_DECODERS: list = []
# Constructor byte -> the AMQP type it encodes (for array element types and error messages).
_TYPE_OF_CONSTRUCTOR: dict[int, AmqpType] = {}


def decode_value(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[Any, int]:
    """The AMQP value encoded at ``offset`` of ``buf`` and the offset just past it."""
    if type(buf) is not bytes:
        buf = bytes(buf)
    if not 0 <= offset:
        raise ValueError(f"offset must be >= 0, got {offset}")
    return _decode(buf, offset, 0)


def _decode(buf: bytes, offset: int, depth: int) -> tuple[Any, int]:
    if offset >= len(buf):
        raise AmqpDecodeError("truncated: a value is missing", offset)
    return _DECODERS[buf[offset]](buf, offset + 1, depth)


def _truncated(type_name: str, constructor_offset: int, needed: int, buf: bytes) -> AmqpDecodeError:
    left = max(len(buf) - constructor_offset - 1, 0)
    return AmqpDecodeError(f"truncated: the {type_name} needs {needed} bytes after its constructor, "
                           f"{left} left", constructor_offset)


def _unknown(buf: bytes, pos: int, depth: int):
    raise AmqpDecodeError(f"unknown constructor 0x{buf[pos - 1]:02x}", pos - 1)


def _register(codes: Iterable[int], amqp_type: AmqpType, decoder) -> None:
    for code in codes:
        _DECODERS[code] = decoder
        _TYPE_OF_CONSTRUCTOR[code] = amqp_type


def _constant(value):
    def decode(buf, pos, depth):
        return value, pos
    return decode


def _fixed(type_name: str, width: int, unpack_from, make=None):
    """A decoder of a fixed-width value; ``make`` turns the unpacked number into its class."""
    if make is None:
        def decode(buf, pos, depth):
            end = pos + width
            if end > len(buf):
                raise _truncated(type_name, pos - 1, width, buf)
            return unpack_from(buf, pos)[0], end
    else:
        def decode(buf, pos, depth):
            end = pos + width
            if end > len(buf):
                raise _truncated(type_name, pos - 1, width, buf)
            return make(unpack_from(buf, pos)[0]), end
    return decode


def _decode_boolean(buf, pos, depth):
    if pos >= len(buf):
        raise _truncated("boolean", pos - 1, 1, buf)
    flag = buf[pos]
    if flag > 1:
        raise AmqpDecodeError("a boolean byte must be 0x00 or 0x01", pos)
    return flag == 1, pos + 1


def _decode_char(buf, pos, depth):
    end = pos + 4
    if end > len(buf):
        raise _truncated("char", pos - 1, 4, buf)
    code_point = _U32.unpack_from(buf, pos)[0]
    if code_point > 0x10FFFF or 0xD800 <= code_point <= 0xDFFF:
        raise AmqpDecodeError("a char is not a Unicode code point (surrogate or above U+10FFFF)", pos - 1)
    return str.__new__(Char, chr(code_point)), end


def _decode_uuid(buf, pos, depth):
    end = pos + 16
    if end > len(buf):
        raise _truncated("uuid", pos - 1, 16, buf)
    return uuid.UUID(bytes=buf[pos:end]), end


def _decode_decimal128(buf, pos, depth):
    end = pos + 16
    if end > len(buf):
        raise _truncated("decimal128", pos - 1, 16, buf)
    return bytes.__new__(Decimal128, buf[pos:end]), end


def _variable(type_name: str, wide: bool):
    """A decoder of binary, string or symbol with a one- or four-byte size (hot: written out, no helper calls)."""
    size_width = 4 if wide else 1
    unpack_size = _U32.unpack_from

    if type_name == "binary":
        def decode(buf, pos, depth):
            start = pos + size_width
            if start > len(buf):
                raise _truncated(type_name, pos - 1, size_width, buf)
            end = start + (unpack_size(buf, pos)[0] if wide else buf[pos])
            if end > len(buf):
                raise _overrun(type_name, pos - 1, end - start, len(buf) - start)
            return buf[start:end], end
        return decode

    encoding = "utf-8" if type_name == "string" else "ascii"
    wrong = "a string is not valid UTF-8" if type_name == "string" else "a symbol is not ASCII"
    symbol = type_name == "symbol"

    def decode(buf, pos, depth):
        start = pos + size_width
        if start > len(buf):
            raise _truncated(type_name, pos - 1, size_width, buf)
        end = start + (unpack_size(buf, pos)[0] if wide else buf[pos])
        if end > len(buf):
            raise _overrun(type_name, pos - 1, end - start, len(buf) - start)
        try:
            text = buf[start:end].decode(encoding)
        except UnicodeDecodeError:
            raise AmqpDecodeError(wrong, pos - 1) from None
        return (str.__new__(Symbol, text) if symbol else text), end
    return decode


def _overrun(type_name: str, constructor_offset: int, size: int, left: int) -> AmqpDecodeError:
    return AmqpDecodeError(f"truncated: the {type_name} is {size} bytes long, {left} left", constructor_offset)


def _compound_header(buf, pos, depth, type_name, wide):
    """(count, first element offset, end offset) of a list, map or array, checked against the bytes present."""
    if depth >= MAX_NESTING_DEPTH:
        raise AmqpDecodeError(f"values are nested more than {MAX_NESTING_DEPTH} deep", pos - 1)
    if wide:
        if pos + 8 > len(buf):
            raise _truncated(type_name, pos - 1, 8, buf)
        size, count = _COUNTS32.unpack_from(buf, pos)
        width = 4
    else:
        if pos + 2 > len(buf):
            raise _truncated(type_name, pos - 1, 2, buf)
        size, count = _COUNTS8.unpack_from(buf, pos)
        width = 1
    if size < width:
        raise AmqpDecodeError(f"the size of the {type_name} ({size} bytes) cannot hold its count", pos - 1)
    end = pos + width + size
    if end > len(buf):
        raise _overrun(type_name, pos - 1, size, len(buf) - pos - width)
    return count, pos + 2 * width, end


def _check_count(count: int, start: int, end: int, type_name: str, constructor_offset: int) -> None:
    if count > end - start:  # every element takes at least one byte
        raise AmqpDecodeError(f"the {type_name} declares {count} elements in {end - start} bytes",
                              constructor_offset)


def _check_end(position: int, end: int, type_name: str, constructor_offset: int) -> None:
    if position != end:
        raise AmqpDecodeError(f"the elements of the {type_name} at byte {constructor_offset} end at byte "
                              f"{position}, its size says {end}", position)


def _list_decoder(wide: bool):
    def decode(buf, pos, depth):
        count, p, end = _compound_header(buf, pos, depth, "list", wide)
        _check_count(count, p, end, "list", pos - 1)
        depth += 1
        items = []
        append = items.append
        decoders = _DECODERS
        for _ in range(count):
            if p >= end:
                raise AmqpDecodeError("truncated: a list element is missing", p)
            item, p = decoders[buf[p]](buf, p + 1, depth)
            append(item)
        _check_end(p, end, "list", pos - 1)
        return items, end
    return decode


def _map_decoder(wide: bool):
    def decode(buf, pos, depth):
        count, p, end = _compound_header(buf, pos, depth, "map", wide)
        if count % 2:
            raise AmqpDecodeError(f"the map has an odd number of elements ({count})", pos - 1)
        _check_count(count, p, end, "map", pos - 1)
        depth += 1
        result = {}
        decoders = _DECODERS
        try:
            for _ in range(count // 2):
                if p >= end:
                    raise AmqpDecodeError("truncated: a map element is missing", p)
                code = buf[p]
                key_end = p + 2 + buf[p + 1] if (code == 0xA3 or code == 0xA1) and p + 1 < end else end + 1
                if key_end <= end:  # a short symbol or string key, the usual case: decoded here, for speed
                    try:
                        key = buf[p + 2:key_end].decode("ascii" if code == 0xA3 else "utf-8")
                    except UnicodeDecodeError:
                        raise AmqpDecodeError("a symbol is not ASCII" if code == 0xA3 else
                                              "a string is not valid UTF-8", p) from None
                    if code == 0xA3:
                        key = str.__new__(Symbol, key)
                    p = key_end
                else:
                    key, p = decoders[code](buf, p + 1, depth)
                if p >= end:
                    raise AmqpDecodeError("truncated: a map value is missing", p)
                value, p = decoders[buf[p]](buf, p + 1, depth)
                result[key] = value
        except TypeError:  # an unhashable key
            return _map_pairs(buf, pos, depth, wide)
        _check_end(p, end, "map", pos - 1)
        if len(result) != count // 2:  # keys equal in Python, distinct in AMQP
            return _map_pairs(buf, pos, depth, wide)
        return result, end
    return decode


def _map_pairs(buf, pos, depth, wide):
    """The slow path of a map a dict cannot hold: decode it again as pairs."""
    count, p, end = _compound_header(buf, pos, depth - 1, "map", wide)
    pairs = []
    for _ in range(count // 2):
        key, p = _decode(buf, p, depth)
        if p >= end:
            raise AmqpDecodeError("truncated: a map value is missing", p)
        value, p = _decode(buf, p, depth)
        pairs.append((key, value))
    _check_end(p, end, "map", pos - 1)
    return tuple.__new__(MapPairs, pairs), end


_ZERO_WIDTH = frozenset({0x40, 0x41, 0x42, 0x43, 0x44, 0x45})


def _array_decoder(wide: bool):
    def decode(buf, pos, depth):
        count, p, end = _compound_header(buf, pos, depth, "array", wide)
        depth += 1
        if p >= end:
            raise AmqpDecodeError("the array has no element constructor", pos - 1)
        code = buf[p]
        descriptor = None
        if code == 0x00:
            descriptor, p = _decode(buf, p + 1, depth)
            if descriptor is None:
                raise AmqpDecodeError("the array is described by null", pos - 1)
            if p >= end:
                raise AmqpDecodeError("the described array has no element constructor", pos - 1)
            code = buf[p]
        element_type = _TYPE_OF_CONSTRUCTOR.get(code)
        if element_type is None:
            raise AmqpDecodeError(f"0x{code:02x} is not an array element constructor", p)
        p += 1
        if code in _ZERO_WIDTH:
            if count > len(buf):
                raise AmqpDecodeError(f"the array declares {count} elements, more than the bytes given", pos - 1)
        else:
            _check_count(count, p, end, "array", pos - 1)
        decoder = _DECODERS[code]
        elements = [None] * count
        for index in range(count):
            elements[index], p = decoder(buf, p, depth)
        _check_end(p, end, "array", pos - 1)
        return Array._trusted(element_type, tuple(elements), descriptor), end
    return decode


def _decode_described(buf, pos, depth):
    if depth >= MAX_NESTING_DEPTH:
        raise AmqpDecodeError(f"values are nested more than {MAX_NESTING_DEPTH} deep", pos - 1)
    descriptor, p = _decode(buf, pos, depth + 1)
    value, p = _decode(buf, p, depth + 1)
    return Described(descriptor, value), p


def _typed(cls):
    return partial(int.__new__, cls)


_DECODERS.extend([_unknown] * 256)
_DECODERS[0x00] = _decode_described
_register([0x40], AmqpType.NULL, _constant(None))
_register([0x41], AmqpType.BOOLEAN, _constant(True))
_register([0x42], AmqpType.BOOLEAN, _constant(False))
_register([0x56], AmqpType.BOOLEAN, _decode_boolean)
_register([0x50], AmqpType.UBYTE, _fixed("ubyte", 1, _U8.unpack_from, _typed(UByte)))
_register([0x60], AmqpType.USHORT, _fixed("ushort", 2, _U16.unpack_from, _typed(UShort)))
_register([0x43], AmqpType.UINT, _constant(int.__new__(UInt, 0)))
_register([0x52], AmqpType.UINT, _fixed("uint", 1, _U8.unpack_from, _typed(UInt)))
_register([0x70], AmqpType.UINT, _fixed("uint", 4, _U32.unpack_from, _typed(UInt)))
_register([0x44], AmqpType.ULONG, _constant(int.__new__(ULong, 0)))
_register([0x53], AmqpType.ULONG, _fixed("ulong", 1, _U8.unpack_from, _typed(ULong)))
_register([0x80], AmqpType.ULONG, _fixed("ulong", 8, _U64.unpack_from, _typed(ULong)))
_register([0x51], AmqpType.BYTE, _fixed("byte", 1, _I8.unpack_from, _typed(Byte)))
_register([0x61], AmqpType.SHORT, _fixed("short", 2, _I16.unpack_from, _typed(Short)))
_register([0x54], AmqpType.INT, _fixed("int", 1, _I8.unpack_from, _typed(Int)))
_register([0x71], AmqpType.INT, _fixed("int", 4, _I32.unpack_from, _typed(Int)))
_register([0x55], AmqpType.LONG, _fixed("long", 1, _I8.unpack_from))
_register([0x81], AmqpType.LONG, _fixed("long", 8, _I64.unpack_from))
_register([0x72], AmqpType.FLOAT, _fixed("float", 4, _F32.unpack_from, partial(float.__new__, Float)))
_register([0x82], AmqpType.DOUBLE, _fixed("double", 8, _F64.unpack_from))
_register([0x74], AmqpType.DECIMAL32, _fixed("decimal32", 4, _U32.unpack_from, _typed(Decimal32)))
_register([0x84], AmqpType.DECIMAL64, _fixed("decimal64", 8, _U64.unpack_from, _typed(Decimal64)))
_register([0x94], AmqpType.DECIMAL128, _decode_decimal128)
_register([0x73], AmqpType.CHAR, _decode_char)
_register([0x83], AmqpType.TIMESTAMP, _fixed("timestamp", 8, _I64.unpack_from, _typed(Timestamp)))
_register([0x98], AmqpType.UUID, _decode_uuid)
_register([0xA0], AmqpType.BINARY, _variable("binary", False))
_register([0xB0], AmqpType.BINARY, _variable("binary", True))
_register([0xA1], AmqpType.STRING, _variable("string", False))
_register([0xB1], AmqpType.STRING, _variable("string", True))
_register([0xA3], AmqpType.SYMBOL, _variable("symbol", False))
_register([0xB3], AmqpType.SYMBOL, _variable("symbol", True))
_register([0x45], AmqpType.LIST, lambda buf, pos, depth: ([], pos))
_register([0xC0], AmqpType.LIST, _list_decoder(wide=False))
_register([0xD0], AmqpType.LIST, _list_decoder(wide=True))
_register([0xC1], AmqpType.MAP, _map_decoder(wide=False))
_register([0xD1], AmqpType.MAP, _map_decoder(wide=True))
_register([0xE0], AmqpType.ARRAY, _array_decoder(wide=False))
_register([0xF0], AmqpType.ARRAY, _array_decoder(wide=True))


# --- skipping (framing only, for section boundaries and raw entries) ---------------------------

_FIXED_WIDTH = {code: 0 for code in (0x40, 0x41, 0x42, 0x43, 0x44, 0x45)}
_FIXED_WIDTH.update({code: 1 for code in (0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56)})
_FIXED_WIDTH.update({code: 2 for code in (0x60, 0x61)})
_FIXED_WIDTH.update({code: 4 for code in (0x70, 0x71, 0x72, 0x73, 0x74)})
_FIXED_WIDTH.update({code: 8 for code in (0x80, 0x81, 0x82, 0x83, 0x84)})
_FIXED_WIDTH.update({0x94: 16, 0x98: 16})
_SIZE_WIDTH = {code: 1 for code in (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0)}
_SIZE_WIDTH.update({code: 4 for code in (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0)})


def _skip(buf: bytes, offset: int, depth: int = 0) -> int:
    """The end of the value at ``offset``, read from its constructor and size only (contents unchecked)."""
    if offset >= len(buf):
        raise AmqpDecodeError("truncated: a value is missing", offset)
    code = buf[offset]
    width = _FIXED_WIDTH.get(code)
    if width is not None:
        end = offset + 1 + width
    elif code in _SIZE_WIDTH:
        if _SIZE_WIDTH[code] == 1:
            if offset + 2 > len(buf):
                raise _truncated(_TYPE_OF_CONSTRUCTOR[code].value, offset, 1, buf)
            end = offset + 2 + buf[offset + 1]
        else:
            if offset + 5 > len(buf):
                raise _truncated(_TYPE_OF_CONSTRUCTOR[code].value, offset, 4, buf)
            end = offset + 5 + _U32.unpack_from(buf, offset + 1)[0]
    elif code == 0x00:
        if depth >= MAX_NESTING_DEPTH:
            raise AmqpDecodeError(f"values are nested more than {MAX_NESTING_DEPTH} deep", offset)
        return _skip(buf, _skip(buf, offset + 1, depth + 1), depth + 1)
    else:
        raise AmqpDecodeError(f"unknown constructor 0x{code:02x}", offset)
    if end > len(buf):
        raise AmqpDecodeError(f"truncated: the {_TYPE_OF_CONSTRUCTOR[code].value} runs past the end "
                              f"({end - len(buf)} bytes missing)", offset)
    return end


# --- encoding ----------------------------------------------------------------------------------

def encode_value(value: Any) -> bytes:
    """``value`` as AMQP bytes, in the most compact encoding of its exact type."""
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def _encode(value: Any, out: bytearray, depth: int) -> None:
    try:
        encoder = _ENCODERS[type(value)]
    except KeyError:
        raise TypeError(f"cannot encode a {type(value).__name__} value as AMQP") from None
    encoder(value, out, depth)


def _deeper(depth: int) -> int:
    if depth >= MAX_NESTING_DEPTH:
        raise ValueError(f"values are nested more than {MAX_NESTING_DEPTH} deep (or a container holds itself)")
    return depth + 1


def _encode_null(value, out, depth):
    out.append(0x40)


def _encode_bool(value, out, depth):
    out.append(0x41 if value else 0x42)


def _encode_long(value, out, depth):
    if -128 <= value <= 127:
        out.append(0x55)
        out += _I8.pack(value)
    elif -(2**63) <= value < 2**63:
        out.append(0x81)
        out += _I64.pack(value)
    else:
        raise ValueError(f"an int (AMQP long) must fit in 64 bits, got {value}")


def _encode_uint(value, out, depth):
    if value == 0:
        out.append(0x43)
    elif value < 256:
        out.append(0x52)
        out.append(value)
    else:
        out.append(0x70)
        out += _U32.pack(value)


def _encode_ulong(value, out, depth):
    if value == 0:
        out.append(0x44)
    elif value < 256:
        out.append(0x53)
        out.append(value)
    else:
        out.append(0x80)
        out += _U64.pack(value)


def _encode_int(value, out, depth):
    if -128 <= value <= 127:
        out.append(0x54)
        out += _I8.pack(value)
    else:
        out.append(0x71)
        out += _I32.pack(value)


def _fixed_encoder(code: int, pack, convert=None):
    if convert is None:
        def encode(value, out, depth):
            out.append(code)
            out += pack(value)
    else:
        def encode(value, out, depth):
            out.append(code)
            out += pack(convert(value))
    return encode


def _encode_variable(code8: int, code32: int, data: bytes, out: bytearray) -> None:
    if len(data) < 256:
        out.append(code8)
        out.append(len(data))
    else:
        out.append(code32)
        out += _U32.pack(len(data))
    out += data


def _to_utf8(value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds a lone surrogate, which UTF-8 cannot encode") from None


def _encode_str(value, out, depth):
    _encode_variable(0xA1, 0xB1, _to_utf8(value), out)


def _encode_symbol(value, out, depth):
    _encode_variable(0xA3, 0xB3, value.encode("ascii"), out)


def _encode_binary(value, out, depth):
    _encode_variable(0xA0, 0xB0, value, out)


def _compound(code8: int, code32: int, count: int, body: bytearray, out: bytearray) -> None:
    if count < 256 and len(body) < 255:
        out.append(code8)
        out.append(len(body) + 1)
        out.append(count)
    else:
        out.append(code32)
        out += _COUNTS32.pack(len(body) + 4, count)
    out += body


def _encode_list(value, out, depth):
    if not value:
        out.append(0x45)
        return
    depth = _deeper(depth)
    body = bytearray()
    for item in value:
        _encode(item, body, depth)
    _compound(0xC0, 0xD0, len(value), body, out)


def _encode_map(value, out, depth):  # a dict or MapPairs
    depth = _deeper(depth)
    body = bytearray()
    for key, item in (value.items() if type(value) is dict else value):
        _encode(key, body, depth)
        _encode(item, body, depth)
    _compound(0xC1, 0xD1, 2 * len(value), body, out)


def _encode_described(value, out, depth):
    depth = _deeper(depth)
    out.append(0x00)
    _encode(value.descriptor, out, depth)
    _encode(value.value, out, depth)


def _encode_array(value, out, depth):
    depth = _deeper(depth)
    body = bytearray()
    if value.descriptor is not None:
        body.append(0x00)
        _encode(value.descriptor, body, depth)
    elements = value.elements
    element_type = value.element_type
    if element_type in _VARIABLE_ELEMENT:
        code8, code32, to_bytes = _VARIABLE_ELEMENT[element_type]
        encoded = [to_bytes(element) for element in elements]
        if all(len(data) < 256 for data in encoded):
            body.append(code8)
            for data in encoded:
                body.append(len(data))
                body += data
        else:
            body.append(code32)
            for data in encoded:
                body += _U32.pack(len(data))
                body += data
    else:
        code = _array_element_code(element_type, elements)
        body.append(code)
        for element in elements:
            # Encode as a standalone value, then drop its constructor: same bytes as the element form.
            piece = bytearray()
            _ARRAY_ELEMENT_ENCODERS[code](element, piece, depth)
            body += memoryview(piece)[1:]
    _compound(0xE0, 0xF0, len(elements), body, out)


def _array_element_code(element_type: AmqpType, elements: tuple) -> int:
    small = _SMALL_ELEMENT.get(element_type)
    if small is not None:
        code, low, high = small
        if elements and all(low <= element <= high for element in elements):
            return code
    return _WIDE_ELEMENT[element_type]


_VARIABLE_ELEMENT = {
    AmqpType.BINARY: (0xA0, 0xB0, bytes),
    AmqpType.STRING: (0xA1, 0xB1, _to_utf8),
    AmqpType.SYMBOL: (0xA3, 0xB3, lambda symbol: symbol.encode("ascii")),
}
# Element types whose small encoding fits every element within (low, high).
_SMALL_ELEMENT = {
    AmqpType.UINT: (0x52, 0, 255), AmqpType.ULONG: (0x53, 0, 255),
    AmqpType.INT: (0x54, -128, 127), AmqpType.LONG: (0x55, -128, 127),
}
_WIDE_ELEMENT = {
    AmqpType.NULL: 0x40, AmqpType.BOOLEAN: 0x56, AmqpType.UBYTE: 0x50, AmqpType.USHORT: 0x60,
    AmqpType.UINT: 0x70, AmqpType.ULONG: 0x80, AmqpType.BYTE: 0x51, AmqpType.SHORT: 0x61, AmqpType.INT: 0x71,
    AmqpType.LONG: 0x81, AmqpType.FLOAT: 0x72, AmqpType.DOUBLE: 0x82, AmqpType.DECIMAL32: 0x74,
    AmqpType.DECIMAL64: 0x84, AmqpType.DECIMAL128: 0x94, AmqpType.CHAR: 0x73, AmqpType.TIMESTAMP: 0x83,
    AmqpType.UUID: 0x98, AmqpType.LIST: 0xD0, AmqpType.MAP: 0xD1, AmqpType.ARRAY: 0xF0,
}


def _wide_list(value, out, depth):
    body = bytearray()
    for item in value:
        _encode(item, body, depth)
    out.append(0xD0)
    out += _COUNTS32.pack(len(body) + 4, len(value))
    out += body


def _wide_map(value, out, depth):
    body = bytearray()
    for key, item in (value.items() if type(value) is dict else value):
        _encode(key, body, depth)
        _encode(item, body, depth)
    out.append(0xD1)
    out += _COUNTS32.pack(len(body) + 4, 2 * len(value))
    out += body


def _wide_array(value, out, depth):
    piece = bytearray()
    _encode_array(value, piece, depth)
    if piece[0] == 0xE0:  # re-frame a small array as a wide one, as the element constructor says
        size, count = piece[1], piece[2]
        piece[0:3] = bytes([0xF0]) + _COUNTS32.pack(size + 3, count)
    out += piece


_ENCODERS: dict[type, Any] = {
    type(None): _encode_null,
    bool: _encode_bool,
    int: _encode_long,
    UByte: _fixed_encoder(0x50, _U8.pack),
    UShort: _fixed_encoder(0x60, _U16.pack),
    UInt: _encode_uint,
    ULong: _encode_ulong,
    Byte: _fixed_encoder(0x51, _I8.pack),
    Short: _fixed_encoder(0x61, _I16.pack),
    Int: _encode_int,
    Float: _fixed_encoder(0x72, _F32.pack),
    float: _fixed_encoder(0x82, _F64.pack),
    Decimal32: _fixed_encoder(0x74, _U32.pack),
    Decimal64: _fixed_encoder(0x84, _U64.pack),
    Decimal128: _fixed_encoder(0x94, bytes),
    Char: _fixed_encoder(0x73, _U32.pack, ord),
    Timestamp: _fixed_encoder(0x83, _I64.pack),
    uuid.UUID: _fixed_encoder(0x98, operator.attrgetter("bytes")),
    bytes: _encode_binary,
    str: _encode_str,
    Symbol: _encode_symbol,
    list: _encode_list,
    dict: _encode_map,
    MapPairs: _encode_map,
    Described: _encode_described,
    Array: _encode_array,
}

# Array elements use one constructor for all; these encoders always write that constructor's form.
_ARRAY_ELEMENT_ENCODERS = {
    0x40: _encode_null,
    0x56: lambda value, out, depth: out.extend(b"\x56\x01" if value else b"\x56\x00"),
    0x52: _fixed_encoder(0x52, _U8.pack), 0x53: _fixed_encoder(0x53, _U8.pack),
    0x54: _fixed_encoder(0x54, _I8.pack), 0x55: _fixed_encoder(0x55, _I8.pack),
    0x70: _fixed_encoder(0x70, _U32.pack), 0x80: _fixed_encoder(0x80, _U64.pack),
    0x71: _fixed_encoder(0x71, _I32.pack), 0x81: _fixed_encoder(0x81, _I64.pack),
    0xD0: _wide_list, 0xD1: _wide_map, 0xF0: _wide_array,
}
for _amqp_type, _code in _WIDE_ELEMENT.items():
    if _code not in _ARRAY_ELEMENT_ENCODERS:
        _ARRAY_ELEMENT_ENCODERS[_code] = _ENCODERS[_ELEMENT_CLASSES[_amqp_type][0]]
del _amqp_type, _code


# --- message sections --------------------------------------------------------------------------

class SectionCode(IntEnum):
    """The descriptor codes of the message sections (AMQP 1.0 part 3.2)."""

    __hash__ = int.__hash__  # Enum's own hash is a Python call; sections are hashed on the hot path

    HEADER = 0x70
    DELIVERY_ANNOTATIONS = 0x71
    MESSAGE_ANNOTATIONS = 0x72
    PROPERTIES = 0x73
    APPLICATION_PROPERTIES = 0x74
    DATA = 0x75
    AMQP_SEQUENCE = 0x76
    AMQP_VALUE = 0x77
    FOOTER = 0x78


SECTION_NAMES = {
    SectionCode.HEADER: "amqp:header:list",
    SectionCode.DELIVERY_ANNOTATIONS: "amqp:delivery-annotations:map",
    SectionCode.MESSAGE_ANNOTATIONS: "amqp:message-annotations:map",
    SectionCode.PROPERTIES: "amqp:properties:list",
    SectionCode.APPLICATION_PROPERTIES: "amqp:application-properties:map",
    SectionCode.DATA: "amqp:data:binary",
    SectionCode.AMQP_SEQUENCE: "amqp:amqp-sequence:list",
    SectionCode.AMQP_VALUE: "amqp:amqp-value:*",
    SectionCode.FOOTER: "amqp:footer:map",
}
BODY_SECTIONS = frozenset({SectionCode.DATA, SectionCode.AMQP_SEQUENCE, SectionCode.AMQP_VALUE})
_BODY_CODES = tuple(BODY_SECTIONS)
_SECTION_BY_NAME = {name.encode("ascii"): code for code, name in SECTION_NAMES.items()}
_SECTION_BY_BYTE = [None] * 256
for _section_code in SectionCode:
    _SECTION_BY_BYTE[_section_code] = _section_code
del _section_code
_LIST_CONSTRUCTORS = frozenset({0x45, 0xC0, 0xD0})
_MAP_CONSTRUCTORS = frozenset({0xC1, 0xD1})
# The value constructors each section may hold; header, properties and the maps may also be null.
_SECTION_VALUE_CONSTRUCTORS = {
    SectionCode.HEADER: _LIST_CONSTRUCTORS | {0x40},
    SectionCode.DELIVERY_ANNOTATIONS: _MAP_CONSTRUCTORS | {0x40},
    SectionCode.MESSAGE_ANNOTATIONS: _MAP_CONSTRUCTORS | {0x40},
    SectionCode.PROPERTIES: _LIST_CONSTRUCTORS | {0x40},
    SectionCode.APPLICATION_PROPERTIES: _MAP_CONSTRUCTORS | {0x40},
    SectionCode.DATA: frozenset({0xA0, 0xB0}),
    SectionCode.AMQP_SEQUENCE: _LIST_CONSTRUCTORS,
    SectionCode.AMQP_VALUE: None,  # any value
    SectionCode.FOOTER: _MAP_CONSTRUCTORS | {0x40},
}
_SECTION_VALUE_KIND = {0x40: "null", 0xA0: "binary", 0xB0: "binary"}
_SECTION_VALUE_KIND.update({code: "list" for code in _LIST_CONSTRUCTORS})
_SECTION_VALUE_KIND.update({code: "map" for code in _MAP_CONSTRUCTORS})

SEQUENCE_NUMBER_ANNOTATION = "x-opt-sequence-number"
ENQUEUED_TIME_ANNOTATION = "x-opt-enqueued-time"
_IDENTITY_ANNOTATIONS = (SEQUENCE_NUMBER_ANNOTATION, ENQUEUED_TIME_ANNOTATION)


class Section(NamedTuple):
    """One message section: ``raw[start:end]`` is the whole section, ``raw[value_start:end]`` its value."""

    code: SectionCode
    start: int
    value_start: int
    end: int

    def data_payload_range(self, raw: bytes) -> tuple[int, int]:
        """Where the payload of a Data section lies in ``raw`` (without its binary constructor and size)."""
        if self.code is not SectionCode.DATA:
            raise ValueError(f"section 0x{self.code:02x} is not a Data section")
        return self.value_start + (2 if raw[self.value_start] == 0xA0 else 5), self.end


class MapEntry(NamedTuple):
    """One entry of an encoded map, decoded, and where it lies: ``raw[start:end]`` is key and value as encoded."""

    key: Any
    value: Any
    start: int
    value_start: int
    end: int


class ListItem(NamedTuple):
    """One item of an encoded list, decoded, and where it lies: ``raw[start:end]`` is the item as encoded."""

    value: Any
    start: int
    end: int


def split_sections(raw: bytes) -> list[Section]:
    """The sections of one encoded message, in order, with their byte ranges.

    Checks the framing: every section is a described value with a section descriptor (ulong or
    symbolic), holds the kind of value its section requires, and fits in ``raw``; non-body sections
    appear at most once, body sections are all of one kind, and there is at most one amqp-value.
    The contents of the values are not checked here (decoding them does that). Sections in an
    unusual order are accepted. AmqpDecodeError otherwise.
    """
    return _walk_sections(_as_bytes(raw), False)


def decode_sections(raw: bytes) -> list[tuple[Section, Any]]:
    """Like :func:`split_sections`, with each section's value decoded (checking all of it) in the same pass.

    The value of a Data section is None: its payload, ``raw[slice(*section.data_payload_range(raw))]``,
    needs no decoding, so it is neither decoded nor copied.
    """
    raw = _as_bytes(raw)
    return list(zip(*_walk_sections(raw, True)))  # type: ignore[arg-type]


def _walk_sections(raw: bytes, decode: bool):
    """The sections (and, when ``decode``, their values) of ``raw``, framing and order rules checked."""
    sections: list[Section] = []
    values: list = []
    seen: set = set()
    body_code = None
    offset = 0
    length = len(raw)
    while offset < length:
        code, value_start = _section_start(raw, offset)
        if code in _BODY_CODES:
            if body_code is not None and body_code is not code:
                raise AmqpDecodeError("not an AMQP message: body sections of different kinds", offset)
            if code is SectionCode.AMQP_VALUE and code in seen:
                raise AmqpDecodeError("not an AMQP message: more than one amqp-value section", offset)
            body_code = code
        elif code in seen:
            raise AmqpDecodeError(f"not an AMQP message: section 0x{code:02x} ({SECTION_NAMES[code]}) "
                                  "appears twice", offset)
        seen.add(code)
        if decode and code is not SectionCode.DATA:
            value, end = _DECODERS[raw[value_start]](raw, value_start + 1, 0)
            values.append(value)
        else:
            end = _skip(raw, value_start)
            values.append(None)
        sections.append(tuple.__new__(Section, (code, offset, value_start, end)))
        offset = end
    return (sections, values) if decode else sections


def _section_start(raw: bytes, offset: int) -> tuple[SectionCode, int]:
    """The code of the section at ``offset`` and where its value starts; its value's constructor is checked."""
    if raw[offset] != 0x00:
        raise AmqpDecodeError("not an AMQP message: the value is not a described section", offset)
    descriptor_at = offset + 1
    code = None
    if descriptor_at + 2 <= len(raw) and raw[descriptor_at] == 0x53:
        code = _SECTION_BY_BYTE[raw[descriptor_at + 1]]
        value_start = descriptor_at + 2
    else:
        value_start = _skip(raw, descriptor_at)
        constructor = raw[descriptor_at]
        if constructor == 0x80:
            number = _U64.unpack_from(raw, descriptor_at + 1)[0]
            code = _SECTION_BY_BYTE[number] if number < 256 else None
        elif constructor in (0xA3, 0xB3):
            code = _SECTION_BY_NAME.get(raw[descriptor_at + (2 if constructor == 0xA3 else 5):value_start])
    if code is None:
        raise AmqpDecodeError("not an AMQP message: unknown section descriptor", descriptor_at)
    if value_start >= len(raw):
        raise AmqpDecodeError(f"truncated: section 0x{code:02x} has no value", value_start)
    allowed = _SECTION_VALUE_CONSTRUCTORS[code]
    if allowed is not None and raw[value_start] not in allowed:
        wanted = sorted({_SECTION_VALUE_KIND[c] for c in allowed})
        raise AmqpDecodeError(f"not an AMQP message: section 0x{code:02x} ({SECTION_NAMES[code]}) must hold "
                              f"a {' or '.join(wanted)}", value_start)
    return code, value_start


def _as_bytes(raw) -> bytes:
    return raw if type(raw) is bytes else bytes(raw)


def map_entries(raw: bytes, offset: int) -> list[MapEntry]:
    """The entries of the map (or null, which has none) encoded at ``offset``, decoded, with their byte ranges.

    ``raw[entry.start:entry.end]`` is the entry's key and value exactly as encoded, so a map can be
    rewritten keeping untouched entries byte for byte (see :func:`encode_map_raw`). Everything is
    decoded and checked as :func:`decode_value` does, except that repeated keys are all listed.
    """
    raw = _as_bytes(raw)
    if offset >= len(raw):
        raise AmqpDecodeError("truncated: a map is missing", offset)
    constructor = raw[offset]
    if constructor == 0x40:
        return []
    if constructor not in _MAP_CONSTRUCTORS:
        raise AmqpDecodeError(f"expected a map, found constructor 0x{constructor:02x}", offset)
    count, p, end = _compound_header(raw, offset + 1, 0, "map", constructor == 0xD1)
    if count % 2:
        raise AmqpDecodeError(f"the map has an odd number of elements ({count})", offset)
    _check_count(count, p, end, "map", offset)
    entries = []
    decoders = _DECODERS
    for _ in range(count // 2):
        if p >= end:
            raise AmqpDecodeError("truncated: a map element is missing", p)
        key, value_start = decoders[raw[p]](raw, p + 1, 1)
        if value_start >= end:
            raise AmqpDecodeError("truncated: a map value is missing", value_start)
        value, entry_end = decoders[raw[value_start]](raw, value_start + 1, 1)
        entries.append(tuple.__new__(MapEntry, (key, value, p, value_start, entry_end)))
        p = entry_end
    _check_end(p, end, "map", offset)
    return entries


def list_items(raw: bytes, offset: int) -> list[ListItem]:
    """The items of the list (or null, which has none) encoded at ``offset``, decoded, with their byte ranges."""
    raw = _as_bytes(raw)
    if offset >= len(raw):
        raise AmqpDecodeError("truncated: a list is missing", offset)
    constructor = raw[offset]
    if constructor in (0x40, 0x45):
        return []
    if constructor not in _LIST_CONSTRUCTORS:
        raise AmqpDecodeError(f"expected a list, found constructor 0x{constructor:02x}", offset)
    count, p, end = _compound_header(raw, offset + 1, 0, "list", constructor == 0xD0)
    _check_count(count, p, end, "list", offset)
    items = []
    decoders = _DECODERS
    for _ in range(count):
        if p >= end:
            raise AmqpDecodeError("truncated: a list element is missing", p)
        value, item_end = decoders[raw[p]](raw, p + 1, 1)
        items.append(tuple.__new__(ListItem, (value, p, item_end)))
        p = item_end
    _check_end(p, end, "list", offset)
    return items


def encode_section(code: SectionCode, value: bytes) -> bytes:
    """A section from its code and its already encoded value."""
    return bytes((0x00, 0x53, code)) + value


def encode_list_raw(items: Sequence[bytes]) -> bytes:
    """A list from already encoded items."""
    if not items:
        return b"\x45"
    out = bytearray()
    _compound(0xC0, 0xD0, len(items), bytearray().join(items), out)
    return bytes(out)


def encode_map_raw(entries: Sequence[bytes]) -> bytes:
    """A map from already encoded entries, each an encoded key followed by its encoded value."""
    out = bytearray()
    _compound(0xC1, 0xD1, 2 * len(entries), bytearray().join(entries), out)
    return bytes(out)


def sequence_number(raw: bytes) -> int | None:
    """The ``x-opt-sequence-number`` message annotation, read from the bytes without decoding the body.

    None when the message has no such annotation. AmqpDecodeError if the framing is broken or the
    annotation is not an integer.
    """
    return broker_identity(raw)[0]


def broker_identity(raw: bytes) -> tuple[int | None, int | None]:
    """``(x-opt-sequence-number, x-opt-enqueued-time in ms)``: the broker's own marks of a stored
    message, which identify it within one queue (read without decoding the body).

    Each is None when absent. AmqpDecodeError if the framing is broken or an annotation is not an
    integer (a timestamp is one).
    """
    raw = _as_bytes(raw)
    found: dict[str, int] = {}
    for section in split_sections(raw):
        if section.code is SectionCode.MESSAGE_ANNOTATIONS:
            for entry in map_entries(raw, section.value_start):
                if isinstance(entry.key, str) and entry.key in _IDENTITY_ANNOTATIONS:
                    value, _ = _decode(raw, entry.value_start, 1)
                    if not isinstance(value, int) or isinstance(value, bool):
                        raise AmqpDecodeError(f"{entry.key} is not an integer", entry.value_start)
                    found[entry.key] = int(value)
            break
    return found.get(SEQUENCE_NUMBER_ANNOTATION), found.get(ENQUEUED_TIME_ANNOTATION)
