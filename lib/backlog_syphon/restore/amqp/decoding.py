"""AMQP bytes -> values of the value model (:mod:`backlog_syphon.restore.amqp.values`), and where a
value ends without decoding it.

Invariants:
- Decoding is strict: anything that is not a legal encoding raises :class:`AmqpDecodeError` (a
  ``ValueError``) naming the problem and the byte offset, never the bytes themselves (values may hold
  secrets). No other exception escapes the decoders, whatever the input.
- Counts are checked against the bytes present before anything is allocated, and nesting is limited
  to :data:`~backlog_syphon.restore.amqp.values.MAX_NESTING_DEPTH`, so hostile input costs memory and
  time in proportion to its size.
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any, Iterable

from backlog_syphon.restore.amqp.values import (
    MAX_NESTING_DEPTH,
    AmqpType,
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float,
    Int,
    MapPairs,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)
from backlog_syphon.restore.amqp.wire import (
    COUNTS8,
    COUNTS32,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
)


class AmqpDecodeError(ValueError):
    """Bytes that are not a legal AMQP encoding; ``offset`` is where the problem was found."""

    def __init__(self, problem: str, offset: int):
        super().__init__(f"{problem} at byte {offset}")
        self.offset = offset


# Decoders take (buffer, offset just past the constructor, depth) and return (value, end offset);
# the table is filled below, once the decoders are defined.
DECODERS: list = []
# Constructor byte -> the AMQP type it encodes (for array element types and error messages).
_TYPE_OF_CONSTRUCTOR: dict[int, AmqpType] = {}


def decode_value(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[Any, int]:
    """The AMQP value encoded at ``offset`` of ``buf`` and the offset just past it."""
    if type(buf) is not bytes:
        buf = bytes(buf)
    if not 0 <= offset:
        raise ValueError(f"offset must be >= 0, got {offset}")
    return decode_at(buf, offset, 0)


def decode_at(buf: bytes, offset: int, depth: int) -> tuple[Any, int]:
    if offset >= len(buf):
        raise AmqpDecodeError("truncated: a value is missing", offset)
    return DECODERS[buf[offset]](buf, offset + 1, depth)


def _truncated(type_name: str, constructor_offset: int, needed: int, buf: bytes) -> AmqpDecodeError:
    left = max(len(buf) - constructor_offset - 1, 0)
    return AmqpDecodeError(f"truncated: the {type_name} needs {needed} bytes after its constructor, "
                           f"{left} left", constructor_offset)


def unknown_constructor(buf: bytes, pos: int, depth: int):
    raise AmqpDecodeError(f"unknown constructor 0x{buf[pos - 1]:02x}", pos - 1)


def _register(codes: Iterable[int], amqp_type: AmqpType, decoder) -> None:
    for code in codes:
        DECODERS[code] = decoder
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
    code_point = U32.unpack_from(buf, pos)[0]
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
    unpack_size = U32.unpack_from

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


def compound_header(buf, pos, depth, type_name, wide):
    """(count, first element offset, end offset) of a list, map or array, checked against the bytes present."""
    if depth >= MAX_NESTING_DEPTH:
        raise AmqpDecodeError(f"values are nested more than {MAX_NESTING_DEPTH} deep", pos - 1)
    if wide:
        if pos + 8 > len(buf):
            raise _truncated(type_name, pos - 1, 8, buf)
        size, count = COUNTS32.unpack_from(buf, pos)
        width = 4
    else:
        if pos + 2 > len(buf):
            raise _truncated(type_name, pos - 1, 2, buf)
        size, count = COUNTS8.unpack_from(buf, pos)
        width = 1
    if size < width:
        raise AmqpDecodeError(f"the size of the {type_name} ({size} bytes) cannot hold its count", pos - 1)
    end = pos + width + size
    if end > len(buf):
        raise _overrun(type_name, pos - 1, size, len(buf) - pos - width)
    return count, pos + 2 * width, end


def check_count(count: int, start: int, end: int, type_name: str, constructor_offset: int) -> None:
    if count > end - start:  # every element takes at least one byte
        raise AmqpDecodeError(f"the {type_name} declares {count} elements in {end - start} bytes",
                              constructor_offset)


def check_end(position: int, end: int, type_name: str, constructor_offset: int) -> None:
    if position != end:
        raise AmqpDecodeError(f"the elements of the {type_name} at byte {constructor_offset} end at byte "
                              f"{position}, its size says {end}", position)


def _list_decoder(wide: bool):
    def decode(buf, pos, depth):
        count, p, end = compound_header(buf, pos, depth, "list", wide)
        check_count(count, p, end, "list", pos - 1)
        depth += 1
        items = []
        append = items.append
        decoders = DECODERS
        for _ in range(count):
            if p >= end:
                raise AmqpDecodeError("truncated: a list element is missing", p)
            item, p = decoders[buf[p]](buf, p + 1, depth)
            append(item)
        check_end(p, end, "list", pos - 1)
        return items, end
    return decode


def _map_decoder(wide: bool):
    def decode(buf, pos, depth):
        count, p, end = compound_header(buf, pos, depth, "map", wide)
        if count % 2:
            raise AmqpDecodeError(f"the map has an odd number of elements ({count})", pos - 1)
        check_count(count, p, end, "map", pos - 1)
        depth += 1
        result = {}
        decoders = DECODERS
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
        check_end(p, end, "map", pos - 1)
        if len(result) != count // 2:  # keys equal in Python, distinct in AMQP
            return _map_pairs(buf, pos, depth, wide)
        return result, end
    return decode


def _map_pairs(buf, pos, depth, wide):
    """The slow path of a map a dict cannot hold: decode it again as pairs."""
    count, p, end = compound_header(buf, pos, depth - 1, "map", wide)
    pairs = []
    for _ in range(count // 2):
        key, p = decode_at(buf, p, depth)
        if p >= end:
            raise AmqpDecodeError("truncated: a map value is missing", p)
        value, p = decode_at(buf, p, depth)
        pairs.append((key, value))
    check_end(p, end, "map", pos - 1)
    return tuple.__new__(MapPairs, pairs), end


_ZERO_WIDTH = frozenset({0x40, 0x41, 0x42, 0x43, 0x44, 0x45})


def _array_decoder(wide: bool):
    def decode(buf, pos, depth):
        count, p, end = compound_header(buf, pos, depth, "array", wide)
        depth += 1
        if p >= end:
            raise AmqpDecodeError("the array has no element constructor", pos - 1)
        code = buf[p]
        descriptor = None
        if code == 0x00:
            descriptor, p = decode_at(buf, p + 1, depth)
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
            check_count(count, p, end, "array", pos - 1)
        decoder = DECODERS[code]
        elements = [None] * count
        for index in range(count):
            elements[index], p = decoder(buf, p, depth)
        check_end(p, end, "array", pos - 1)
        return Array.from_decoded(element_type, tuple(elements), descriptor), end
    return decode


def _decode_described(buf, pos, depth):
    if depth >= MAX_NESTING_DEPTH:
        raise AmqpDecodeError(f"values are nested more than {MAX_NESTING_DEPTH} deep", pos - 1)
    descriptor, p = decode_at(buf, pos, depth + 1)
    value, p = decode_at(buf, p, depth + 1)
    return Described(descriptor, value), p


def _typed(cls):
    return partial(int.__new__, cls)


DECODERS.extend([unknown_constructor] * 256)
DECODERS[0x00] = _decode_described
_register([0x40], AmqpType.NULL, _constant(None))
_register([0x41], AmqpType.BOOLEAN, _constant(True))
_register([0x42], AmqpType.BOOLEAN, _constant(False))
_register([0x56], AmqpType.BOOLEAN, _decode_boolean)
_register([0x50], AmqpType.UBYTE, _fixed("ubyte", 1, U8.unpack_from, _typed(UByte)))
_register([0x60], AmqpType.USHORT, _fixed("ushort", 2, U16.unpack_from, _typed(UShort)))
_register([0x43], AmqpType.UINT, _constant(int.__new__(UInt, 0)))
_register([0x52], AmqpType.UINT, _fixed("uint", 1, U8.unpack_from, _typed(UInt)))
_register([0x70], AmqpType.UINT, _fixed("uint", 4, U32.unpack_from, _typed(UInt)))
_register([0x44], AmqpType.ULONG, _constant(int.__new__(ULong, 0)))
_register([0x53], AmqpType.ULONG, _fixed("ulong", 1, U8.unpack_from, _typed(ULong)))
_register([0x80], AmqpType.ULONG, _fixed("ulong", 8, U64.unpack_from, _typed(ULong)))
_register([0x51], AmqpType.BYTE, _fixed("byte", 1, I8.unpack_from, _typed(Byte)))
_register([0x61], AmqpType.SHORT, _fixed("short", 2, I16.unpack_from, _typed(Short)))
_register([0x54], AmqpType.INT, _fixed("int", 1, I8.unpack_from, _typed(Int)))
_register([0x71], AmqpType.INT, _fixed("int", 4, I32.unpack_from, _typed(Int)))
_register([0x55], AmqpType.LONG, _fixed("long", 1, I8.unpack_from))
_register([0x81], AmqpType.LONG, _fixed("long", 8, I64.unpack_from))
_register([0x72], AmqpType.FLOAT, _fixed("float", 4, F32.unpack_from, partial(float.__new__, Float)))
_register([0x82], AmqpType.DOUBLE, _fixed("double", 8, F64.unpack_from))
_register([0x74], AmqpType.DECIMAL32, _fixed("decimal32", 4, U32.unpack_from, _typed(Decimal32)))
_register([0x84], AmqpType.DECIMAL64, _fixed("decimal64", 8, U64.unpack_from, _typed(Decimal64)))
_register([0x94], AmqpType.DECIMAL128, _decode_decimal128)
_register([0x73], AmqpType.CHAR, _decode_char)
_register([0x83], AmqpType.TIMESTAMP, _fixed("timestamp", 8, I64.unpack_from, _typed(Timestamp)))
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


def skip_value(buf: bytes, offset: int, depth: int = 0) -> int:
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
            end = offset + 5 + U32.unpack_from(buf, offset + 1)[0]
    elif code == 0x00:
        if depth >= MAX_NESTING_DEPTH:
            raise AmqpDecodeError(f"values are nested more than {MAX_NESTING_DEPTH} deep", offset)
        return skip_value(buf, skip_value(buf, offset + 1, depth + 1), depth + 1)
    else:
        raise AmqpDecodeError(f"unknown constructor 0x{code:02x}", offset)
    if end > len(buf):
        raise AmqpDecodeError(f"truncated: the {_TYPE_OF_CONSTRUCTOR[code].value} runs past the end "
                              f"({end - len(buf)} bytes missing)", offset)
    return end
