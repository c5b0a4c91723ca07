"""Test helpers: AMQP values of the codec and of python-qpid-proton side by side, compared type-exactly.

``tagged`` maps a value of either library to nested tuples that spell out the AMQP type at every
level, so ``tagged(a) == tagged(b)`` means same types and same values (floats by their bits, so
NaN equals NaN). proton is only an independent cross-check here; the library never imports it.
"""

import struct
import uuid

import proton
from proton import Data

from backlog_syphon.restore.amqp import values as codec

PROTON_ARRAY_TYPES = {
    Data.NULL: "null", Data.BOOL: "boolean", Data.UBYTE: "ubyte", Data.USHORT: "ushort", Data.UINT: "uint",
    Data.ULONG: "ulong", Data.BYTE: "byte", Data.SHORT: "short", Data.INT: "int", Data.LONG: "long",
    Data.FLOAT: "float", Data.DOUBLE: "double", Data.DECIMAL32: "decimal32", Data.DECIMAL64: "decimal64",
    Data.DECIMAL128: "decimal128", Data.CHAR: "char", Data.TIMESTAMP: "timestamp", Data.UUID: "uuid",
    Data.BINARY: "binary", Data.STRING: "string", Data.SYMBOL: "symbol", Data.LIST: "list", Data.MAP: "map",
    Data.ARRAY: "array",
}
PROTON_TYPE_BY_NAME = {name: code for code, name in PROTON_ARRAY_TYPES.items()}

_SCALAR_TAGS = {
    bool: ("boolean", bool),
    int: ("long", int),
    str: ("string", str),
    uuid.UUID: ("uuid", lambda v: v),
    bytes: ("binary", bytes),
    memoryview: ("binary", bytes),
    float: ("double", lambda v: struct.pack(">d", v)),
    codec.UByte: ("ubyte", int), proton.ubyte: ("ubyte", int),
    codec.UShort: ("ushort", int), proton.ushort: ("ushort", int),
    codec.UInt: ("uint", int), proton.uint: ("uint", int),
    codec.ULong: ("ulong", int), proton.ulong: ("ulong", int),
    codec.Byte: ("byte", int), proton.byte: ("byte", int),
    codec.Short: ("short", int), proton.short: ("short", int),
    codec.Int: ("int", int), proton.int32: ("int", int),
    codec.Float: ("float", lambda v: struct.pack(">f", v)), proton.float32: ("float", lambda v: struct.pack(">f", v)),
    codec.Timestamp: ("timestamp", int), proton.timestamp: ("timestamp", int),
    codec.Decimal32: ("decimal32", int), proton.decimal32: ("decimal32", int),
    codec.Decimal64: ("decimal64", int), proton.decimal64: ("decimal64", int),
    codec.Decimal128: ("decimal128", bytes), proton.decimal128: ("decimal128", bytes),
    codec.Char: ("char", str), proton.char: ("char", str),
    codec.Symbol: ("symbol", str), proton.symbol: ("symbol", str),
}


def tagged(value):
    """``value`` (codec or proton) as nested tuples naming the AMQP type at every level."""
    if value is None:
        return ("null",)
    kind = type(value)
    if kind in _SCALAR_TAGS:
        name, convert = _SCALAR_TAGS[kind]
        return (name, convert(value))
    if kind is list:
        return ("list", tuple(tagged(item) for item in value))
    if kind is dict:
        return ("map", tuple((tagged(k), tagged(v)) for k, v in value.items()))
    if kind is codec.MapPairs:
        return ("map", tuple((tagged(k), tagged(v)) for k, v in value))
    if kind in (codec.Described, proton.Described):
        return ("described", tagged(value.descriptor), tagged(value.value))
    if kind is codec.Array:
        descriptor = None if value.descriptor is None else tagged(value.descriptor)
        return ("array", value.element_type.value, descriptor, tuple(tagged(e) for e in value.elements))
    if kind is proton.Array:
        descriptor = None if value.descriptor is proton.UNDESCRIBED else tagged(value.descriptor)
        return ("array", PROTON_ARRAY_TYPES[value.type], descriptor, tuple(tagged(e) for e in value.elements))
    raise AssertionError(f"not an AMQP value of either library: {kind.__name__}")


_TO_PROTON = {
    codec.UByte: proton.ubyte, codec.UShort: proton.ushort, codec.UInt: proton.uint, codec.ULong: proton.ulong,
    codec.Byte: proton.byte, codec.Short: proton.short, codec.Int: proton.int32, codec.Float: proton.float32,
    codec.Timestamp: proton.timestamp, codec.Decimal32: proton.decimal32, codec.Decimal64: proton.decimal64,
    codec.Decimal128: proton.decimal128, codec.Char: proton.char, codec.Symbol: proton.symbol,
}


def to_proton(value):
    """A codec value as the equivalent proton value (MapPairs has none: proton maps are dicts)."""
    kind = type(value)
    if kind in _TO_PROTON:
        return _TO_PROTON[kind](value)
    if kind is list:
        return [to_proton(item) for item in value]
    if kind is dict:
        return {to_proton(k): to_proton(v) for k, v in value.items()}
    if kind is codec.Described:
        return proton.Described(to_proton(value.descriptor), to_proton(value.value))
    if kind is codec.Array:
        descriptor = proton.UNDESCRIBED if value.descriptor is None else to_proton(value.descriptor)
        return proton.Array(descriptor, PROTON_TYPE_BY_NAME[value.element_type.value],
                            *(to_proton(e) for e in value.elements))
    if kind is codec.MapPairs:
        raise AssertionError("proton cannot hold a map a dict cannot hold")
    return value


def proton_encode(value) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def proton_decode(raw: bytes):
    """The single value in ``raw`` as proton decodes it (all of ``raw`` must be consumed)."""
    data = Data()
    consumed = data.decode(raw)
    assert consumed == len(raw), f"proton consumed {consumed} of {len(raw)} bytes"
    data.rewind()
    data.next()
    return _copied(data.get_object())


def _copied(value):
    """proton's binaries are views of C memory that dies with its Data object: copy them out."""
    kind = type(value)
    if kind is memoryview:
        return bytes(value)
    if kind is list:
        return [_copied(item) for item in value]
    if kind is dict:
        return {_copied(k): _copied(v) for k, v in value.items()}
    if kind is proton.Described:
        return proton.Described(_copied(value.descriptor), _copied(value.value))
    if kind is proton.Array:
        return proton.Array(_copied(value.descriptor), value.type, *(_copied(e) for e in value.elements))
    return value
