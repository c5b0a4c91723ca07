"""Raw AMQP 1.0 message handling that keeps the sender's encoding.

A stored message keeps the sender's encoded properties, application-properties, body and footer
sections byte for byte, so every AMQP type (long vs int, ulong, symbol, timestamp, described values,
uuid, binary, ...) survives peek and receive exactly. Only the broker-owned parts (header,
delivery-annotations, message-annotations) are re-encoded, and message-annotations keep the sender's
raw entries that are not broker-owned.

Encoders here are hand-written for the few fixed shapes the broker emits (they are on the hot path);
anything else is decoded with ``proton.Data`` and copied out of C memory at once.
"""
from __future__ import annotations

import struct
import uuid
from typing import Any, Iterable, List, Optional, Tuple

from proton import Data, Described

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78
BODY_CODES = (DATA, AMQP_SEQUENCE, AMQP_VALUE)
# the spec's symbolic section descriptors (a sender may use them instead of the numeric codes)
_SYMBOLIC = {
    "amqp:header:list": HEADER, "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS, "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES, "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE, "amqp:amqp-value:*": AMQP_VALUE, "amqp:footer:map": FOOTER,
}

# constructor byte -> width of its fixed-size payload
_FIXED = {0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0}
_FIXED.update({c: 1 for c in (0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56)})
_FIXED.update({c: 2 for c in (0x60, 0x61)})
_FIXED.update({c: 4 for c in (0x70, 0x71, 0x72, 0x73, 0x74)})
_FIXED.update({c: 8 for c in (0x80, 0x81, 0x82, 0x83, 0x84)})
_FIXED.update({0x94: 16, 0x98: 16})
_SIZE1 = (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0)
_SIZE4 = (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0)


class DecodeError(ValueError):
    pass


def value_end(buf, pos: int) -> int:
    """Offset just past the encoded AMQP value starting at ``pos``."""
    try:
        code = buf[pos]
        if code == 0x00:                       # described: descriptor, then value
            return value_end(buf, value_end(buf, pos + 1))
        width = _FIXED.get(code)
        if width is not None:
            end = pos + 1 + width
        elif code in _SIZE1:
            end = pos + 2 + buf[pos + 1]
        elif code in _SIZE4:
            end = pos + 5 + struct.unpack_from(">I", buf, pos + 1)[0]
        else:
            raise DecodeError(f"unknown AMQP constructor 0x{code:02x} at {pos}")
    except (IndexError, struct.error):
        raise DecodeError(f"truncated AMQP value at {pos}") from None
    if end > len(buf):
        raise DecodeError(f"truncated AMQP value at {pos}")
    return end


def split_sections(buf) -> List[Tuple[int, bytes]]:
    """Split an encoded message into ``[(section code, raw section bytes)]``."""
    try:
        return _split_sections(buf)
    except (IndexError, struct.error):
        raise DecodeError("truncated AMQP message") from None


def _split_sections(buf) -> List[Tuple[int, bytes]]:
    out, pos, n = [], 0, len(buf)
    while pos < n:
        if buf[pos] != 0x00:
            raise DecodeError(f"expected a described section at {pos}")
        if buf[pos + 1] == 0x53:
            code = buf[pos + 2]
        elif buf[pos + 1] == 0x80:
            code = struct.unpack_from(">Q", buf, pos + 2)[0]
        else:
            code = _SYMBOLIC.get(key_name(bytes(buf[pos + 1:value_end(buf, pos + 1)])), -1)
        if not HEADER <= code <= FOOTER:
            raise DecodeError(f"unknown section descriptor at {pos}")
        end = value_end(buf, pos)
        out.append((code, bytes(buf[pos:end])))
        pos = end
    return out


def owned(obj):
    """Deep-copy a value decoded by proton so nothing points into freed C memory."""
    if isinstance(obj, memoryview):
        return obj.tobytes()
    if isinstance(obj, dict):
        return {owned(k): owned(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [owned(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(owned(v) for v in obj)
    if isinstance(obj, Described):
        return Described(owned(obj.descriptor), owned(obj.value))
    return obj


def decode_value(buf) -> Any:
    d = Data()
    d.decode(bytes(buf))
    d.rewind()
    d.next()
    return owned(d.get_object())


def section_value(raw: bytes) -> Any:
    """The value inside a described section (a list for header/properties, a dict for maps)."""
    return decode_value(raw[value_end(raw, 1):])


def map_entries(buf, pos: int) -> List[Tuple[bytes, bytes]]:
    """Raw (key, value) byte pairs of the map encoded at ``pos``."""
    code = buf[pos]
    if code == 0xC1:
        count, p = buf[pos + 2], pos + 3
    elif code == 0xD1:
        count, p = struct.unpack_from(">I", buf, pos + 5)[0], pos + 9
    elif code == 0x40:
        return []
    else:
        raise DecodeError(f"expected a map at {pos}")
    out = []
    for _ in range(count // 2):
        k_end = value_end(buf, p)
        v_end = value_end(buf, k_end)
        out.append((bytes(buf[p:k_end]), bytes(buf[k_end:v_end])))
        p = v_end
    return out


def section_map_entries(raw: bytes) -> List[Tuple[bytes, bytes]]:
    return map_entries(raw, value_end(raw, 1))


def section_binary(raw: bytes) -> bytes:
    """The payload of a Data section."""
    pos = value_end(raw, 1)
    if raw[pos] == 0xA0:
        return raw[pos + 2:]
    if raw[pos] == 0xB0:
        return raw[pos + 5:]
    raise DecodeError(f"expected a binary at {pos}")


def key_name(raw_key: bytes) -> Optional[str]:
    """The text of a string/symbol map key, else None."""
    code = raw_key[0]
    if code in (0xA1, 0xA3):
        return raw_key[2:].decode("utf-8", "replace")
    if code in (0xB1, 0xB3):
        return raw_key[5:].decode("utf-8", "replace")
    return None


# ---- encoders ---------------------------------------------------------------------------------

def enc_sym(s: str) -> bytes:
    b = s.encode()
    return (b"\xa3" + bytes((len(b),)) if len(b) < 256 else b"\xb3" + struct.pack(">I", len(b))) + b


def enc_str(s: str) -> bytes:
    b = s.encode()
    return (b"\xa1" + bytes((len(b),)) if len(b) < 256 else b"\xb1" + struct.pack(">I", len(b))) + b


def enc_long(v: int) -> bytes:
    return b"\x81" + struct.pack(">q", v)


def enc_timestamp(ms: int) -> bytes:
    return b"\x83" + struct.pack(">q", int(ms))


def enc_short(v: int) -> bytes:
    return b"\x61" + struct.pack(">h", v)


def enc_int(v: int) -> bytes:
    return b"\x71" + struct.pack(">i", v)


def enc_uuid(u: uuid.UUID) -> bytes:
    return b"\x98" + u.bytes


def enc_map(entries: Iterable[Tuple[bytes, bytes]]) -> bytes:
    entries = list(entries)
    body = b"".join(k + v for k, v in entries)
    return b"\xd1" + struct.pack(">II", len(body) + 4, len(entries) * 2) + body


def enc_section(code: int, value: bytes) -> bytes:
    return b"\x00\x53" + bytes((code,)) + value


def enc_header(durable: bool, priority: Optional[int], ttl: Optional[int], delivery_count: int) -> bytes:
    items = (b"\x41" if durable else b"\x42",
             b"\x40" if priority is None else b"\x50" + bytes((priority & 0xFF,)),
             b"\x40" if ttl is None else b"\x70" + struct.pack(">I", ttl & 0xFFFFFFFF),
             b"\x42",
             b"\x70" + struct.pack(">I", delivery_count & 0xFFFFFFFF))
    body = b"".join(items)
    return enc_section(HEADER, b"\xd0" + struct.pack(">II", len(body) + 4, 5) + body)


def encode_any(value: Any) -> bytes:
    """Encode a Python/proton value with proton's codec (proton picks AMQP types from Python types)."""
    d = Data()
    d.put_object(value)
    return d.encode()


def enc_app_value(value: Any) -> bytes:
    """Encode a value for the broker's own application properties (dead-letter reason etc.)."""
    if isinstance(value, str):
        return enc_str(value)
    return encode_any(value)


def as_text(v) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)
