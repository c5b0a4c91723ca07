"""Raw AMQP 1.0 message bytes <-> a plain, typed, picklable description, and the restored copy.

The syphon peeks raw message bytes from backlog queues and forwards them. The azure-servicebus SDK's
decoded messages lose AMQP types (a ``long`` becomes ``int`` and is re-sent as a 32-bit ``int``, a
described value loses its descriptor, symbols become strings), so this module decodes the bytes
section by section with python-qpid-proton's codec (``proton.Data``), which keeps every type.
No networking.

Invariants:
- Fidelity: body sections, properties, annotations and application properties keep their values and
  AMQP types through decode -> encode (``long``/``int``/``ulong``/``symbol``/``timestamp``/described/
  ``uuid``/binary/double/``float``/bool and the rest of proton's types).
- Binary values are copied to ``bytes`` as they are read: proton hands them out as memoryviews into C
  memory that dies with its ``Data`` object.
- :func:`restored_message` changes only what restoring requires: the four legacy properties, the
  session id, the header TTL and delivery count, the scheduled enqueue time and broker-owned
  annotations. Everything else is the same object.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import proton
from proton import Data, Described, symbol, ulong

from backlog_syphon.legacy_properties import (
    LegacyFields,
    datetime_to_ms,
    decode_legacy_properties,
    ms_to_datetime,
    strip_legacy_properties,
    timedelta_to_ms,
)

# Section descriptors (AMQP 1.0 part 3.2): numeric code and symbolic name.
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
_SECTION_CODES_BY_NAME = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}
BODY_KIND_BY_SECTION = {DATA: "data", AMQP_SEQUENCE: "sequence", AMQP_VALUE: "value"}
BODY_KINDS = frozenset(BODY_KIND_BY_SECTION.values())

# Service Bus message annotations.
SEQUENCE_NUMBER_ANNOTATION = "x-opt-sequence-number"
ENQUEUED_TIME_ANNOTATION = "x-opt-enqueued-time"
PARTITION_KEY_ANNOTATION = "x-opt-partition-key"
SCHEDULED_ENQUEUE_TIME_ANNOTATION = "x-opt-scheduled-enqueue-time"
# Set by the broker on delivery; stale on a re-sent copy, so they are dropped.
BROKER_OWNED_ANNOTATIONS = frozenset({
    SEQUENCE_NUMBER_ANNOTATION,
    ENQUEUED_TIME_ANNOTATION,
    "x-opt-locked-until",
    "x-opt-enqueue-sequence-number",
    "x-opt-lock-token",
    "x-opt-deadletter-source",
    "x-opt-message-state",
})

UINT_MAX = 2**32 - 1

_HEADER_FIELDS = ("durable", "priority", "ttl_ms", "first_acquirer", "delivery_count")
_PROPERTY_FIELDS = (
    "message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
    "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
    "reply_to_group_id",
)


@dataclass(frozen=True)
class MessageHeader:
    """The header section; None means the field is absent (the AMQP default applies)."""

    durable: bool | None = None
    priority: int | None = None
    ttl_ms: int | None = None
    first_acquirer: bool | None = None
    delivery_count: int | None = None


@dataclass(frozen=True)
class MessageProperties:
    """The properties section with values as decoded (``message_id`` may be str, ulong, uuid or bytes).

    ``group_id`` is the Service Bus SessionId; ``subject`` is the Label; times are proton timestamps (ms).
    """

    message_id: Any = None
    user_id: bytes | None = None
    to: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    correlation_id: Any = None
    content_type: str | None = None
    content_encoding: str | None = None
    absolute_expiry_time: int | None = None
    creation_time: int | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None


@dataclass(frozen=True)
class DecodedMessage:
    """One AMQP message. Treat the dicts as read-only; build changed copies with ``dataclasses.replace``.

    ``body`` is a tuple of ``bytes`` (one per Data section) when ``body_kind`` is ``"data"``, the
    decoded value for ``"value"``, and a tuple of lists (one per AmqpSequence section) for
    ``"sequence"``. A message without any body section is ``"data"`` with ``body == ()``.
    Application-property keys are ``str`` (``symbol`` keys stay symbols, which are ``str``; binary
    keys are decoded as UTF-8) and values keep their proton types.
    """

    header: MessageHeader = field(default_factory=MessageHeader)
    delivery_annotations: dict = field(default_factory=dict)
    message_annotations: dict = field(default_factory=dict)
    properties: MessageProperties = field(default_factory=MessageProperties)
    application_properties: dict = field(default_factory=dict)
    body_kind: str = "data"
    body: Any = ()
    footer: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.body_kind not in BODY_KINDS:
            raise ValueError(f"body_kind must be one of {sorted(BODY_KINDS)}, got {self.body_kind!r}")
        if self.body_kind == "data" and not (
            isinstance(self.body, tuple) and all(isinstance(part, bytes) for part in self.body)
        ):
            raise ValueError("a data body must be a tuple of bytes, one per Data section")
        if self.body_kind == "sequence" and not (
            isinstance(self.body, tuple) and all(isinstance(part, list) for part in self.body)
        ):
            raise ValueError("a sequence body must be a tuple of lists, one per AmqpSequence section")

    @property
    def sequence_number(self) -> int | None:
        value = self.message_annotations.get(SEQUENCE_NUMBER_ANNOTATION)
        return int(value) if value is not None else None

    @property
    def enqueued_time(self) -> datetime | None:
        return _annotation_time(self.message_annotations.get(ENQUEUED_TIME_ANNOTATION))

    @property
    def scheduled_enqueue_time(self) -> datetime | None:
        return _annotation_time(self.message_annotations.get(SCHEDULED_ENQUEUE_TIME_ANNOTATION))

    @property
    def partition_key(self) -> str | None:
        value = self.message_annotations.get(PARTITION_KEY_ANNOTATION)
        return str(value) if value is not None else None

    @property
    def body_size(self) -> int:
        """Payload bytes of a data body; the encoded size of the body sections otherwise."""
        if self.body_kind == "data":
            return sum(len(part) for part in self.body)
        data = Data()
        _put_body(data, self)
        return len(data.encode())

    def encode(self) -> bytes:
        """The message as AMQP bytes, sections in the standard order; empty sections are left out."""
        data = Data()
        header = _header_list(self.header)
        if header:
            _put_section(data, HEADER, header)
        for code, mapping in ((DELIVERY_ANNOTATIONS, self.delivery_annotations),
                              (MESSAGE_ANNOTATIONS, self.message_annotations)):
            if mapping:
                _put_section(data, code, _annotation_map(mapping))
        properties = _properties_list(self.properties)
        if properties:
            _put_section(data, PROPERTIES, properties)
        if self.application_properties:
            _put_section(data, APPLICATION_PROPERTIES,
                         {key: _amqp_value(value) for key, value in self.application_properties.items()})
        _put_body(data, self)
        if self.footer:
            _put_section(data, FOOTER, _annotation_map(self.footer))
        return bytes(data.encode())


def decode_message(raw: bytes) -> DecodedMessage:
    """Decode one AMQP message; ValueError if ``raw`` is not a well-formed sequence of message sections."""
    raw = bytes(raw)
    view = memoryview(raw)
    sections: dict[int, Any] = {}
    body_code = None
    body_parts: list = []
    offset = 0
    while offset < len(raw):
        data = Data()
        try:
            consumed = data.decode(view[offset:])
        except proton.DataException as error:
            raise ValueError(f"not an AMQP message: cannot decode at byte {offset}: {error}") from None
        if consumed <= 0:
            raise ValueError(f"not an AMQP message: nothing decodable at byte {offset}")
        data.rewind()
        data.next()
        section = _read(data)
        code = _section_code(section, offset)
        offset += consumed
        if code in BODY_KIND_BY_SECTION:
            if body_code not in (None, code):
                raise ValueError("not an AMQP message: body sections of different kinds")
            body_code = code
            body_parts.append(section.value)
        elif code in sections:
            raise ValueError(f"not an AMQP message: section {code:#x} appears twice")
        else:
            sections[code] = _checked_section_value(code, section.value)
    return DecodedMessage(
        header=MessageHeader(*_fields(sections.get(HEADER), len(_HEADER_FIELDS))),
        delivery_annotations=dict(sections.get(DELIVERY_ANNOTATIONS) or {}),
        message_annotations=dict(sections.get(MESSAGE_ANNOTATIONS) or {}),
        properties=MessageProperties(*_fields(sections.get(PROPERTIES), len(_PROPERTY_FIELDS))),
        application_properties={
            _property_key(key): value for key, value in (sections.get(APPLICATION_PROPERTIES) or {}).items()
        },
        body_kind=BODY_KIND_BY_SECTION.get(body_code, "data"),
        body=body_parts[0] if body_code == AMQP_VALUE else tuple(body_parts),
        footer=dict(sections.get(FOOTER) or {}),
    )


def restored_message(decoded: DecodedMessage, fields: LegacyFields, time_to_live: timedelta | None) -> DecodedMessage:
    """The message its sender meant to send, rebuilt from a backlog copy.

    ``time_to_live`` is passed separately from ``fields.time_to_live`` because the TTL policy decides
    it (the original, or what remains of it). Delivery annotations are hop-scoped (the lock token
    lives there), so they are not forwarded either.
    """
    if time_to_live is not None and time_to_live <= timedelta(0):
        raise ValueError(f"time_to_live must be positive or None, got {time_to_live}")
    annotations = {
        key: value for key, value in decoded.message_annotations.items()
        if str(key) not in BROKER_OWNED_ANNOTATIONS
    }
    if fields.scheduled_enqueue_time is not None:
        annotations = {key: value for key, value in annotations.items()
                       if str(key) != SCHEDULED_ENQUEUE_TIME_ANNOTATION}
        annotations[symbol(SCHEDULED_ENQUEUE_TIME_ANNOTATION)] = proton.timestamp(
            datetime_to_ms(fields.scheduled_enqueue_time)
        )
    properties = decoded.properties
    if fields.session_id is not None:
        properties = dataclasses.replace(properties, group_id=fields.session_id)
    header = dataclasses.replace(decoded.header, ttl_ms=header_ttl_ms(time_to_live), delivery_count=None)
    return dataclasses.replace(
        decoded,
        header=header,
        delivery_annotations={},
        message_annotations=annotations,
        properties=properties,
        application_properties=strip_legacy_properties(decoded.application_properties),
    )


def restore_message_bytes(raw: bytes, restored_time_to_live_ms: int | None) -> bytes:
    """Restore a raw backlog message for sending, with the TTL the classification chose.

    The legacy fields are decoded again from the message itself so the bytes sent can never disagree
    with the message. ValueError if they cannot be restored (classification dead-letters those).
    """
    decoded = decode_message(raw)
    fields = decode_legacy_properties(decoded.application_properties)
    if fields.problems:
        raise ValueError("; ".join(problem.reason for problem in fields.problems))
    time_to_live = None if restored_time_to_live_ms is None else timedelta(milliseconds=restored_time_to_live_ms)
    return restored_message(decoded, fields, time_to_live).encode()


def header_ttl_ms(time_to_live: timedelta | None) -> int | None:
    """A TTL as header milliseconds: rounded up so it stays positive, capped at the uint maximum."""
    if time_to_live is None:
        return None
    return min(timedelta_to_ms(time_to_live), UINT_MAX)


# --- decoding helpers --------------------------------------------------------------------------

def _read(data: Data) -> Any:
    """The value at the cursor, with containers read recursively and binaries copied out of C memory."""
    kind = data.type()
    if kind == Data.BINARY:
        return bytes(data.get_binary())
    if kind == Data.DESCRIBED:
        data.enter()
        try:
            data.next()
            descriptor = _read(data)
            data.next()
            return Described(descriptor, _read(data))
        finally:
            data.exit()
    if kind == Data.LIST:
        count = data.get_list()
        return _read_items(data, count)
    if kind == Data.MAP:
        items = _read_items(data, data.get_map())
        try:
            return dict(zip(items[::2], items[1::2]))
        except TypeError:
            raise ValueError("unsupported AMQP map key type (unhashable)") from None
    if kind == Data.ARRAY:
        count, described, element_type = data.get_array()
        data.enter()
        try:
            descriptor = proton.UNDESCRIBED
            if described:
                data.next()
                descriptor = _read(data)
            elements = []
            for _ in range(count):
                data.next()
                elements.append(_read(data))
            return proton.Array(descriptor, element_type, *elements)
        finally:
            data.exit()
    return data.get_object()


def _read_items(data: Data, count: int) -> list:
    data.enter()
    try:
        items = []
        for _ in range(count):
            data.next()
            items.append(_read(data))
        return items
    finally:
        data.exit()


def _section_code(section: Any, offset: int) -> int:
    if not isinstance(section, Described):
        raise ValueError(f"not an AMQP message: the value at byte {offset} is not a described section")
    descriptor = section.descriptor
    if isinstance(descriptor, ulong) and HEADER <= descriptor <= FOOTER:
        return int(descriptor)
    if isinstance(descriptor, symbol) and descriptor in _SECTION_CODES_BY_NAME:
        return _SECTION_CODES_BY_NAME[descriptor]
    raise ValueError(f"not an AMQP message: unknown section descriptor {descriptor!r} at byte {offset}")


def _checked_section_value(code: int, value: Any) -> Any:
    expected = list if code in (HEADER, PROPERTIES) else dict
    if value is not None and not isinstance(value, expected):
        raise ValueError(f"not an AMQP message: section {code:#x} must be a {expected.__name__}")
    return value


def _fields(values: list | None, count: int) -> list:
    # Extra trailing fields would come from a later protocol revision; AMQP lets readers ignore them.
    values = list(values or [])[:count]
    return values + [None] * (count - len(values))


def _property_key(key: Any) -> Any:
    if isinstance(key, bytes):
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return key
    return key


def _annotation_time(value: Any) -> datetime | None:
    # The SDK re-encodes time annotations of re-sent messages as plain longs; accept both.
    if value is None:
        return None
    if isinstance(value, datetime):
        return value
    return ms_to_datetime(int(value))


# --- encoding helpers --------------------------------------------------------------------------

def _put_section(data: Data, code: int, value: Any) -> None:
    data.put_described()
    data.enter()
    data.put_ulong(code)
    _put(data, value)
    data.exit()


def _put(data: Data, value: Any) -> None:
    try:
        data.put_object(value)
    except KeyError as error:  # proton looks encoders up by exact class
        unsupported = error.args[0]
        name = unsupported.__name__ if isinstance(unsupported, type) else type(unsupported).__name__
        raise TypeError(f"cannot encode a {name} value as AMQP") from None


def _put_body(data: Data, message: DecodedMessage) -> None:
    if message.body_kind == "data":
        for part in message.body:
            _put_section(data, DATA, part)
    elif message.body_kind == "sequence":
        for part in message.body:
            _put_section(data, AMQP_SEQUENCE, part)
    else:
        _put_section(data, AMQP_VALUE, _amqp_value(message.body))


def _trimmed(values: list) -> list:
    # Trailing nulls are implied by a shorter list (AMQP composite encoding).
    while values and values[-1] is None:
        values.pop()
    return values


def _header_list(header: MessageHeader) -> list:
    # Header field types are fixed by the spec; coerce plain ints and bools to them.
    typed = {
        "durable": bool,
        "priority": proton.ubyte,
        "ttl_ms": proton.uint,
        "first_acquirer": bool,
        "delivery_count": proton.uint,
    }
    return _trimmed([
        None if getattr(header, name) is None else typed[name](getattr(header, name))
        for name in _HEADER_FIELDS
    ])


def _properties_list(properties: MessageProperties) -> list:
    return _trimmed([_typed_property(name, getattr(properties, name)) for name in _PROPERTY_FIELDS])


def _typed_property(name: str, value: Any) -> Any:
    """Plain Python values get the property's spec type; decoded proton values pass through unchanged."""
    if value is None:
        return None
    if name in ("message_id", "correlation_id") and type(value) is int:
        return ulong(value)
    if name in ("content_type", "content_encoding") and type(value) is str:
        return symbol(value)
    if name in ("absolute_expiry_time", "creation_time"):
        if isinstance(value, datetime):
            return proton.timestamp(datetime_to_ms(value))
        if type(value) is int:
            return proton.timestamp(value)
    if name == "group_sequence" and type(value) is int:
        return proton.uint(value)
    return _amqp_value(value)


def _annotation_map(mapping: dict) -> dict:
    # Annotation keys must be symbols (or ulongs); plain str keys become symbols.
    return {
        symbol(key) if type(key) is str else key: _amqp_value(value)
        for key, value in mapping.items()
    }


def _amqp_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return proton.timestamp(datetime_to_ms(value))
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value
