"""Values of the value model (:mod:`backlog_syphon.restore.amqp.values`) -> AMQP bytes, and lists and
maps assembled from items already encoded.

Invariants:
- ``encode_value(decode_value(b)[0])`` decodes to the same types and values as ``b`` (encodings may
  become more compact). Floats keep their bits, NaN payloads included.
- Encoding is type-exact: a value outside the model (a ``tuple``, a ``datetime``, an ``int`` subclass
  of its own) is a ``TypeError``, an out-of-range number a ``ValueError``.
"""

from __future__ import annotations

import operator
import uuid
from typing import Any, Sequence

from backlog_syphon.restore.amqp.values import (
    ELEMENT_CLASSES,
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
from backlog_syphon.restore.amqp.wire import COUNTS32, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64


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
        out += I8.pack(value)
    elif -(2**63) <= value < 2**63:
        out.append(0x81)
        out += I64.pack(value)
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
        out += U32.pack(value)


def _encode_ulong(value, out, depth):
    if value == 0:
        out.append(0x44)
    elif value < 256:
        out.append(0x53)
        out.append(value)
    else:
        out.append(0x80)
        out += U64.pack(value)


def _encode_int(value, out, depth):
    if -128 <= value <= 127:
        out.append(0x54)
        out += I8.pack(value)
    else:
        out.append(0x71)
        out += I32.pack(value)


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
        out += U32.pack(len(data))
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
        out += COUNTS32.pack(len(body) + 4, count)
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
                body += U32.pack(len(data))
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
    out += COUNTS32.pack(len(body) + 4, len(value))
    out += body


def _wide_map(value, out, depth):
    body = bytearray()
    for key, item in (value.items() if type(value) is dict else value):
        _encode(key, body, depth)
        _encode(item, body, depth)
    out.append(0xD1)
    out += COUNTS32.pack(len(body) + 4, 2 * len(value))
    out += body


def _wide_array(value, out, depth):
    piece = bytearray()
    _encode_array(value, piece, depth)
    if piece[0] == 0xE0:  # re-frame a small array as a wide one, as the element constructor says
        size, count = piece[1], piece[2]
        piece[0:3] = bytes([0xF0]) + COUNTS32.pack(size + 3, count)
    out += piece


_ENCODERS: dict[type, Any] = {
    type(None): _encode_null,
    bool: _encode_bool,
    int: _encode_long,
    UByte: _fixed_encoder(0x50, U8.pack),
    UShort: _fixed_encoder(0x60, U16.pack),
    UInt: _encode_uint,
    ULong: _encode_ulong,
    Byte: _fixed_encoder(0x51, I8.pack),
    Short: _fixed_encoder(0x61, I16.pack),
    Int: _encode_int,
    Float: _fixed_encoder(0x72, F32.pack),
    float: _fixed_encoder(0x82, F64.pack),
    Decimal32: _fixed_encoder(0x74, U32.pack),
    Decimal64: _fixed_encoder(0x84, U64.pack),
    Decimal128: _fixed_encoder(0x94, bytes),
    Char: _fixed_encoder(0x73, U32.pack, ord),
    Timestamp: _fixed_encoder(0x83, I64.pack),
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
    0x52: _fixed_encoder(0x52, U8.pack), 0x53: _fixed_encoder(0x53, U8.pack),
    0x54: _fixed_encoder(0x54, I8.pack), 0x55: _fixed_encoder(0x55, I8.pack),
    0x70: _fixed_encoder(0x70, U32.pack), 0x80: _fixed_encoder(0x80, U64.pack),
    0x71: _fixed_encoder(0x71, I32.pack), 0x81: _fixed_encoder(0x81, I64.pack),
    0xD0: _wide_list, 0xD1: _wide_map, 0xF0: _wide_array,
}
for _amqp_type, _code in _WIDE_ELEMENT.items():
    if _code not in _ARRAY_ELEMENT_ENCODERS:
        _ARRAY_ELEMENT_ENCODERS[_code] = _ENCODERS[ELEMENT_CLASSES[_amqp_type][0]]
del _amqp_type, _code


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
