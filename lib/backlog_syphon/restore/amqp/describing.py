"""How a decoded AMQP value is named in a reason ("got long"), and how a text from a message is shown in one:
quoted when short and harmless, otherwise only its length, so reasons never carry secrets."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta

from backlog_syphon.restore.amqp.values import (
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

_QUOTABLE = re.compile(r"[A-Za-z0-9._/: -]{0,64}")

_AMQP_TYPE_NAMES = {
    type(None): "null",
    bool: "bool",
    int: "long",
    float: "double",
    str: "string",
    bytes: "binary",
    bytearray: "binary",
    list: "list",
    tuple: "list",
    dict: "map",
    uuid.UUID: "uuid",
    datetime: "datetime",
    timedelta: "timedelta",
    MapPairs: "map",
    UByte: "ubyte",
    UShort: "ushort",
    UInt: "uint",
    ULong: "ulong",
    Byte: "byte",
    Short: "short",
    Int: "int",
    Float: "float",
    Timestamp: "timestamp",
    Symbol: "symbol",
    Char: "char",
    Decimal32: "decimal32",
    Decimal64: "decimal64",
    Decimal128: "decimal128",
    Array: "array",
}


def amqp_type_name(value) -> str:
    """The AMQP type name of a decoded value, for reasons ("got long"); a plain int is what a long decodes to."""
    if isinstance(value, Described):
        descriptor = value.descriptor
        if isinstance(descriptor, str):
            shown = quote(str(descriptor))
        elif isinstance(descriptor, int) and not isinstance(descriptor, bool):
            shown = f"{int(descriptor):#x}"
        else:
            shown = f"a {amqp_type_name(descriptor)} descriptor"
        return f"described value ({shown})"
    return _AMQP_TYPE_NAMES.get(type(value), type(value).__name__)


def quote(text: str) -> str:
    """``text`` quoted when short and harmless, otherwise only its length, so reasons never carry secrets."""
    if _QUOTABLE.fullmatch(text):
        return repr(text)
    return f"(a {len(text)}-character value)"
