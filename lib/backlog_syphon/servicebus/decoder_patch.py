"""Teach the azure-servicebus SDK's AMQP decoder the values it cannot read: char, decimal32/64, standard decimal128.

The SDK decodes every received message with ``azure.servicebus._pyamqp._decode``, which looks a
decoder up by constructor byte in the list ``_DECODE_BY_CONSTRUCTOR``. In 7.15.0:

- the entries for char (0x73), decimal32 (0x74) and decimal64 (0x84) are empty, so a message with
  one of them anywhere (an application property, the body, an array) fails with ``'NoneType'
  object is not callable``. Legacy .NET clients send ``char`` values as a matter of course;
- the decimal128 (0x94) decoder reads the exponent the way the legacy WindowsAzure.ServiceBus
  client wrote it (shifted two bits off the IEEE 754 layout), so it reads those right, but a
  standard decimal128 (IEEE 754-2008, binary integer decimal, as current AMQP libraries write it)
  overflows and fails the whole message with ``Invalid AMQP decimal128 encoding``.

A message the SDK cannot decode cannot be received, so the syphon could never settle it (its
PeekLock purge of delivered backlog messages). :func:`install` fills the three empty entries and
wraps the decimal128 decoder, following the SDK's convention ``(buffer: memoryview, depth=0) ->
(remaining memoryview, value)``: char becomes a one-character ``str`` (the SDK hands strings over
as ``bytes``, but a char is not a string; a value beyond U+10FFFF reads as U+FFFD); decimal32 and
decimal64 become ``decimal.Decimal`` (binary integer decimal), as decimal128 already does; a
decimal128 the SDK's own decoder refuses is read as a standard one. The syphon never forwards what
the SDK decodes (it sends spliced raw bytes), so these values only need to be read without failing.

Invariants:
- Only the pinned SDK version is patched, and only when its table looks exactly as expected (the
  three entries empty, decimal128 and the neighbours the SDK's own decoders). Otherwise
  :func:`install` logs a warning and changes nothing: a different SDK may have fixed this itself
  or changed its tables, and guessing would be worse than the original error.
- :func:`install` is idempotent. Every value the SDK decoded before still decodes to the same thing.
"""

from __future__ import annotations

import logging
import struct
from decimal import Decimal

import azure.servicebus
from azure.servicebus._pyamqp import _decode as sdk_decode

from backlog_syphon.restore.amqp_codec import Decimal32, Decimal64, Decimal128

logger = logging.getLogger(__name__)

PATCHED_SDK_VERSION = "7.15.0"
CHAR, DECIMAL32, DECIMAL64, DECIMAL128 = 0x73, 0x74, 0x84, 0x94

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def _decode_char(buffer: memoryview, _depth: int = 0) -> tuple[memoryview, str]:
    code_point = _U32.unpack(buffer[:4])[0]
    return buffer[4:], chr(code_point) if code_point <= 0x10FFFF else "\ufffd"


def _decode_decimal32(buffer: memoryview, _depth: int = 0) -> tuple[memoryview, Decimal]:
    return buffer[4:], Decimal32(_U32.unpack(buffer[:4])[0]).to_decimal()


def _decode_decimal64(buffer: memoryview, _depth: int = 0) -> tuple[memoryview, Decimal]:
    return buffer[8:], Decimal64(_U64.unpack(buffer[:8])[0]).to_decimal()


def _decode_decimal128(buffer: memoryview, depth: int = 0) -> tuple[memoryview, Decimal]:
    try:
        return sdk_decode._decode_decimal128(buffer, depth)  # the legacy .NET layout, as the SDK reads it
    except ValueError:
        return buffer[16:], Decimal128(buffer[:16].tobytes()).to_decimal()


_PATCHED = {CHAR: _decode_char, DECIMAL32: _decode_decimal32, DECIMAL64: _decode_decimal64,
            DECIMAL128: _decode_decimal128}
# The SDK's own decoders that must sit in these slots before patching (a check of the table's layout).
_EXPECTED_BEFORE = {CHAR: None, DECIMAL32: None, DECIMAL64: None,
                    DECIMAL128: getattr(sdk_decode, "_decode_decimal128", object()),
                    0x72: getattr(sdk_decode, "_decode_float", object()),
                    0x83: getattr(sdk_decode, "_decode_timestamp", object()),
                    0x98: getattr(sdk_decode, "_decode_uuid", object())}


def install() -> bool:
    """Patch the SDK's decoder table once per process; True if char and the decimals now decode."""
    if is_installed():
        return True
    version = azure.servicebus.__version__
    table = getattr(sdk_decode, "_DECODE_BY_CONSTRUCTOR", None)
    if version != PATCHED_SDK_VERSION:
        logger.warning("azure-servicebus %s is not the pinned %s: its AMQP decoder is left unpatched, so receiving "
                       "messages with char, decimal32/64 or standard decimal128 values may fail",
                       version, PATCHED_SDK_VERSION)
        return False
    if not (_is_table(table) and all(table[code] is decoder for code, decoder in _EXPECTED_BEFORE.items())):
        logger.warning("azure-servicebus %s's AMQP decoder table is not laid out as expected: left unpatched, so "
                       "receiving messages with char, decimal32/64 or standard decimal128 values may fail", version)
        return False
    for code, decoder in _PATCHED.items():
        table[code] = decoder
    logger.info("azure-servicebus AMQP decoder taught char, decimal32, decimal64 and standard decimal128")
    return True


def is_installed() -> bool:
    """Whether the SDK's decoder table holds this module's decoders."""
    table = getattr(sdk_decode, "_DECODE_BY_CONSTRUCTOR", None)
    return _is_table(table) and all(table[code] is decoder for code, decoder in _PATCHED.items())


def _is_table(table) -> bool:
    return isinstance(table, list) and len(table) == 256
