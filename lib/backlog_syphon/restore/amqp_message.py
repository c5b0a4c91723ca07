"""Raw AMQP 1.0 message bytes <-> a plain, typed, picklable description, and the restored copy.

The syphon peeks raw message bytes from backlog queues and forwards them. The azure-servicebus SDK's
decoded messages lose AMQP types (a ``long`` becomes ``int`` and is re-sent as a 32-bit ``int``, a
described value loses its descriptor, symbols become strings), so this module reads the bytes with
:mod:`backlog_syphon.restore.amqp_codec`, which keeps every type. No networking.

Invariants:
- Fidelity: body sections, properties, annotations and application properties keep their values and
  AMQP types through decode -> encode (the codec's value model: ``int`` is long, ``Int`` is int,
  ``Symbol``, ``Timestamp``, ``Described``, ``Array`` and the rest).
- :func:`restore_message_bytes` splices: body sections, the footer and every application property
  and message annotation it does not change are copied byte for byte; so are the properties, unless
  the session id is restored, and then only the group-id field changes.
- :func:`restored_message` changes only what restoring requires: the four legacy properties, the
  session id, the header TTL and delivery count, the scheduled enqueue time and broker-owned
  annotations. Everything else is the same object. Decoding the bytes of :func:`restore_message_bytes`
  gives what :func:`restored_message` gives for the same message.
- A message is read completely or not at all: anything the codec cannot read raises
  :class:`~backlog_syphon.restore.amqp_codec.AmqpDecodeError` (a ``ValueError``), so nothing is forwarded
  half right.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from backlog_syphon.restore.amqp_codec import (
    BODY_SECTIONS,
    SEQUENCE_NUMBER_ANNOTATION,
    AmqpDecodeError,
    MapPairs,
    Section,
    SectionCode,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    decode_sections,
    decode_value,
    encode_list_raw,
    encode_map_raw,
    encode_section,
    encode_value,
    list_items,
    map_entries,
    split_sections,
)
from backlog_syphon.restore.legacy_properties import (
    LegacyFields,
    amqp_type_name,
    Problem,
    decode_legacy_properties,
    is_legacy_key,
    ms_to_datetime,
    quote,
    strip_legacy_properties,
    timedelta_to_ms,
)

# Section descriptor codes (AMQP 1.0 part 3.2).
HEADER = SectionCode.HEADER
DELIVERY_ANNOTATIONS = SectionCode.DELIVERY_ANNOTATIONS
MESSAGE_ANNOTATIONS = SectionCode.MESSAGE_ANNOTATIONS
PROPERTIES = SectionCode.PROPERTIES
APPLICATION_PROPERTIES = SectionCode.APPLICATION_PROPERTIES
DATA = SectionCode.DATA
AMQP_SEQUENCE = SectionCode.AMQP_SEQUENCE
AMQP_VALUE = SectionCode.AMQP_VALUE
FOOTER = SectionCode.FOOTER
BODY_KIND_BY_SECTION = {DATA: "data", AMQP_SEQUENCE: "sequence", AMQP_VALUE: "value"}
BODY_KINDS = frozenset(BODY_KIND_BY_SECTION.values())

# Service Bus message annotations.
ENQUEUED_TIME_ANNOTATION = "x-opt-enqueued-time"
PARTITION_KEY_ANNOTATION = "x-opt-partition-key"
SCHEDULED_ENQUEUE_TIME_ANNOTATION = "x-opt-scheduled-enqueue-time"
# Set by the broker on delivery; stale on a re-sent copy, so they are dropped.
# The application properties Service Bus adds to a message it dead-letters: a re-drive removes them, so
# the destination gets the message as its sender wrote it (the audit row keeps them).
DEAD_LETTER_REASON_PROPERTY = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION_PROPERTY = "DeadLetterErrorDescription"
DEAD_LETTER_PROPERTIES = frozenset({DEAD_LETTER_REASON_PROPERTY, DEAD_LETTER_DESCRIPTION_PROPERTY})

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
_TTL_FIELD, _DELIVERY_COUNT_FIELD = _HEADER_FIELDS.index("ttl_ms"), _HEADER_FIELDS.index("delivery_count")
_GROUP_ID_FIELD = _PROPERTY_FIELDS.index("group_id")
_NULL = b"\x40"
_SCHEDULED_KEY = encode_value(Symbol(SCHEDULED_ENQUEUE_TIME_ANNOTATION))


class LegacyPropertiesError(ValueError):
    """The legacy ``x-ms-*`` properties of a backlog message cannot be restored; ``problems`` says why."""

    def __init__(self, problems: tuple[Problem, ...]):
        super().__init__("; ".join(problem.reason for problem in problems))
        self.problems = problems


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
    """The properties section with values as decoded (``message_id`` may be str, ULong, UUID or bytes).

    ``group_id`` is the Service Bus SessionId; ``subject`` is the Label; times are ``Timestamp`` (ms).
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


class _ServiceBusAnnotations:
    """Service Bus's message annotations, read from ``self.message_annotations``."""

    message_annotations: dict

    @property
    def sequence_number(self) -> int | None:
        """ValueError if the annotation is not an integer."""
        value = self.message_annotations.get(SEQUENCE_NUMBER_ANNOTATION)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{SEQUENCE_NUMBER_ANNOTATION} is a {type(value).__name__}, not an integer")
        return int(value)

    @property
    def enqueued_time(self) -> datetime | None:
        """ValueError if the annotation is not a time or is outside the years 1 to 9999."""
        return _annotation_time(ENQUEUED_TIME_ANNOTATION, self.message_annotations.get(ENQUEUED_TIME_ANNOTATION))

    @property
    def scheduled_enqueue_time(self) -> datetime | None:
        return _annotation_time(SCHEDULED_ENQUEUE_TIME_ANNOTATION,
                                self.message_annotations.get(SCHEDULED_ENQUEUE_TIME_ANNOTATION))

    @property
    def partition_key(self) -> str | None:
        value = self.message_annotations.get(PARTITION_KEY_ANNOTATION)
        return str(value) if value is not None else None


@dataclass(frozen=True)
class DecodedMessage(_ServiceBusAnnotations):
    """One AMQP message. Treat the dicts as read-only; build changed copies with ``dataclasses.replace``.

    ``body`` is a tuple of ``bytes`` (one per Data section) when ``body_kind`` is ``"data"``, the
    decoded value for ``"value"``, and a tuple of lists (one per AmqpSequence section) for
    ``"sequence"``. A message without any body section is ``"data"`` with ``body == ()``.
    Application-property keys are ``str`` (``Symbol`` keys stay symbols, which are ``str``; binary
    keys are decoded as UTF-8 when they are valid UTF-8) and values keep their codec types.
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
    def body_size(self) -> int:
        """Payload bytes of a data body; the encoded size of the body sections otherwise."""
        if self.body_kind == "data":
            return sum(len(part) for part in self.body)
        return len(_encode_body(self))

    def encode(self) -> bytes:
        """The message as AMQP bytes, sections in the standard order; empty sections are left out.

        Plain Python values get the AMQP type their field or section requires (an ``int`` priority
        becomes ``UByte``, a ``str`` content type or annotation key a ``Symbol``, a ``datetime`` a
        ``Timestamp``...); values that already have a codec type are written as they are.
        """
        parts = []
        header = _header_list(self.header)
        if header:
            parts.append(_section(HEADER, header))
        for code, mapping in ((DELIVERY_ANNOTATIONS, self.delivery_annotations),
                              (MESSAGE_ANNOTATIONS, self.message_annotations)):
            if mapping:
                parts.append(_section(code, _annotation_map(mapping)))
        properties = _properties_list(self.properties)
        if properties:
            parts.append(_section(PROPERTIES, properties))
        if self.application_properties:
            parts.append(_section(APPLICATION_PROPERTIES, {
                key: _amqp_value(value) for key, value in self.application_properties.items()
            }))
        parts.append(_encode_body(self))
        if self.footer:
            parts.append(_section(FOOTER, _annotation_map(self.footer)))
        return b"".join(parts)


@dataclass(frozen=True)
class MessageEnvelope(_ServiceBusAnnotations):
    """Everything of a message but its body, with the body's kind and size: what a backlog row needs.

    ``body_size`` is the payload bytes of a data body and the encoded size of the body sections
    otherwise, both measured on the raw bytes.
    """

    header: MessageHeader
    delivery_annotations: dict
    message_annotations: dict
    properties: MessageProperties
    application_properties: dict
    footer: dict
    body_kind: str
    body_size: int


def decode_message(raw: bytes) -> DecodedMessage:
    """Decode one AMQP message with exact types; AmqpDecodeError (a ValueError) if it is not one."""
    raw = _as_bytes(raw)
    sections = decode_sections(raw)
    body = [(section, value) for section, value in sections if section.code in BODY_SECTIONS]
    body_code = body[0][0].code if body else DATA
    if body_code is DATA:
        body_value: Any = tuple(raw[slice(*section.data_payload_range(raw))] for section, _ in body)
    elif body_code is AMQP_VALUE:
        body_value = body[0][1]
    else:
        body_value = tuple(value for _, value in body)
    return DecodedMessage(body_kind=BODY_KIND_BY_SECTION[body_code], body=body_value, **_non_body_parts(sections))


def decode_envelope(raw: bytes) -> MessageEnvelope:
    """Like :func:`decode_message`, checking the whole message, but without copying a data body."""
    raw = _as_bytes(raw)
    sections = decode_sections(raw)
    body_code, body_size = DATA, 0
    for section, _ in sections:
        if section.code is DATA:
            start, end = section.data_payload_range(raw)
            body_size += end - start
        elif section.code in BODY_SECTIONS:
            body_code = section.code
            body_size += section.end - section.start
    return MessageEnvelope(body_kind=BODY_KIND_BY_SECTION[body_code], body_size=body_size,
                           **_non_body_parts(sections))


def restored_message(decoded: DecodedMessage, fields: LegacyFields, time_to_live: timedelta | None) -> DecodedMessage:
    """The message its sender meant to send, rebuilt from a backlog copy.

    ``time_to_live`` is passed separately from ``fields.time_to_live`` because the TTL policy decides
    it (the original, or what remains of it). Delivery annotations are hop-scoped (the lock token
    lives there), so they are not forwarded either.
    """
    if time_to_live is not None and time_to_live <= timedelta(0):
        raise ValueError(f"time_to_live must be positive or None, got {time_to_live}")
    scheduled = fields.scheduled_enqueue_time
    annotations = {
        key: value for key, value in decoded.message_annotations.items()
        if not _is_replaced_annotation(key, scheduled is not None)
    }
    if scheduled is not None:
        annotations[Symbol(SCHEDULED_ENQUEUE_TIME_ANNOTATION)] = Timestamp.from_datetime(scheduled)
    properties = decoded.properties
    if fields.session_id is not None:
        properties = dataclasses.replace(properties, group_id=fields.session_id)
    ttl_ms = header_ttl_ms(time_to_live)
    header = dataclasses.replace(decoded.header, ttl_ms=None if ttl_ms is None else UInt(ttl_ms),
                                 delivery_count=None)
    return dataclasses.replace(
        decoded,
        header=header,
        delivery_annotations={},
        message_annotations=annotations,
        properties=properties,
        application_properties=strip_legacy_properties(decoded.application_properties),
    )


def restore_message_bytes(raw: bytes, restored_time_to_live_ms: int | None, *,
                          from_dead_letters: bool = False) -> bytes:
    """Restore a raw backlog message for sending, with the TTL the classification chose, by splicing ``raw``.

    The legacy fields are decoded again from the message itself so the bytes sent can never disagree
    with the message. The whole message is checked as :func:`decode_message` checks it (data payloads
    only for their framing). Raises AmqpDecodeError if ``raw`` is not a message the codec can read and
    LegacyPropertiesError if its legacy properties cannot be restored (both are ValueErrors;
    classification dead-letters those). ``from_dead_letters``: ``raw`` was read from a dead-letter
    sub-queue, whose dead-letter properties (``DEAD_LETTER_PROPERTIES``) are removed too.
    """
    if restored_time_to_live_ms is not None and restored_time_to_live_ms <= 0:
        raise ValueError(f"restored_time_to_live_ms must be positive or None, got {restored_time_to_live_ms}")
    raw = _as_bytes(raw)
    sections = split_sections(raw)
    # One pass that checks every section (as decode_message does) and keeps what the splice needs.
    by_code: dict = {}
    header_items: list = []
    properties_items: list = []
    annotation_entries: list = []
    application_entries: list = []
    for section in sections:
        code = section.code
        if code is HEADER:
            header_items = list_items(raw, section.value_start)
        elif code is PROPERTIES:
            properties_items = list_items(raw, section.value_start)
        elif code is MESSAGE_ANNOTATIONS:
            annotation_entries = map_entries(raw, section.value_start)
            _map_section(section, _entries_as_map(annotation_entries))
        elif code is APPLICATION_PROPERTIES:
            application_entries = map_entries(raw, section.value_start)
        elif code is not DATA:  # delivery annotations, an amqp-value or amqp-sequence body, the footer
            value, _ = decode_value(raw, section.value_start)
            if code is not AMQP_VALUE and code is not AMQP_SEQUENCE:
                _map_section(section, value)
        if code not in BODY_SECTIONS:
            by_code[code] = section
    application_properties = {} if not application_entries else _application_properties(
        by_code[APPLICATION_PROPERTIES], ((entry.key, entry.value) for entry in application_entries))
    fields = decode_legacy_properties(application_properties)
    if fields.problems:
        raise LegacyPropertiesError(fields.problems)

    out = []
    header = _padded([raw[item.start:item.end] for item in header_items], len(_HEADER_FIELDS))
    ttl_ms = None if restored_time_to_live_ms is None else min(restored_time_to_live_ms, UINT_MAX)
    header[_TTL_FIELD] = _NULL if ttl_ms is None else encode_value(UInt(ttl_ms))
    header[_DELIVERY_COUNT_FIELD] = _NULL
    while header and header[-1] == _NULL:
        header.pop()
    if header:
        out.append(encode_section(HEADER, encode_list_raw(header)))

    scheduled = fields.scheduled_enqueue_time
    annotations = [raw[entry.start:entry.end] for entry in annotation_entries
                   if not _is_replaced_annotation(entry.key, scheduled is not None)]
    if scheduled is not None:
        annotations.append(_SCHEDULED_KEY + encode_value(Timestamp.from_datetime(scheduled)))
    if annotations:
        out.append(encode_section(MESSAGE_ANNOTATIONS, encode_map_raw(annotations)))

    properties_section = by_code.get(PROPERTIES)
    if fields.session_id is not None:
        properties = _padded([raw[item.start:item.end] for item in properties_items], len(_PROPERTY_FIELDS))
        properties[_GROUP_ID_FIELD] = encode_value(fields.session_id)
        out.append(encode_section(PROPERTIES, encode_list_raw(properties)))
    elif properties_section is not None:
        out.append(raw[properties_section.start:properties_section.end])

    kept = [raw[entry.start:entry.end] for entry in application_entries if not is_legacy_key(entry.key)
            and not (from_dead_letters and _application_key(entry.key) in DEAD_LETTER_PROPERTIES)]
    if kept:
        out.append(encode_section(APPLICATION_PROPERTIES, encode_map_raw(kept)))

    out.extend(raw[section.start:section.end] for section in sections if section.code in BODY_SECTIONS)
    footer = by_code.get(FOOTER)
    if footer is not None:
        out.append(raw[footer.start:footer.end])
    return b"".join(out)


def header_ttl_ms(time_to_live: timedelta | None) -> int | None:
    """A TTL as header milliseconds: rounded up so it stays positive, capped at the uint maximum."""
    if time_to_live is None:
        return None
    return min(timedelta_to_ms(time_to_live), UINT_MAX)


# --- decoding helpers --------------------------------------------------------------------------

def _as_bytes(raw) -> bytes:
    return raw if type(raw) is bytes else bytes(raw)


def _non_body_parts(sections: list[tuple[Section, Any]]) -> dict:
    """The decoded non-body sections as keyword arguments of DecodedMessage and MessageEnvelope."""
    values = {section.code: (section, value) for section, value in sections if section.code not in BODY_SECTIONS}
    application = values.get(APPLICATION_PROPERTIES)
    return {
        "header": MessageHeader(*_fields(values.get(HEADER), len(_HEADER_FIELDS))),
        "delivery_annotations": _map_section(*values.get(DELIVERY_ANNOTATIONS, (None, None))),
        "message_annotations": _map_section(*values.get(MESSAGE_ANNOTATIONS, (None, None))),
        "properties": MessageProperties(*_fields(values.get(PROPERTIES), len(_PROPERTY_FIELDS))),
        "application_properties": {} if application is None or application[1] is None else _application_properties(
            application[0], _pairs(application[1])),
        "footer": _map_section(*values.get(FOOTER, (None, None))),
    }


def _fields(section_value: tuple[Section, Any] | None, count: int) -> list:
    # Extra trailing fields would come from a later protocol revision; AMQP lets readers ignore them.
    return _padded(list((section_value and section_value[1]) or [])[:count], count, None)


def _padded(values: list, count: int, filler: Any = _NULL) -> list:
    return values + [filler] * (count - len(values))


def _pairs(value: dict | MapPairs):
    return value.items() if type(value) is dict else value


def _map_section(section: Section | None, value: dict | MapPairs | None) -> dict:
    """A map section as a dict; AmqpDecodeError if a dict cannot hold it."""
    if value is None:
        return {}
    if type(value) is MapPairs:
        raise AmqpDecodeError(f"section 0x{section.code:02x} has a key twice (or a key that is a list or map)",
                              section.value_start)
    return value


def _entries_as_map(entries: list) -> dict | MapPairs:
    """What the decoder makes of these map entries: a dict, or MapPairs when a dict cannot hold them."""
    pairs = [(entry.key, entry.value) for entry in entries]
    try:
        as_dict = dict(pairs)
    except TypeError:
        return MapPairs(pairs)
    return as_dict if len(as_dict) == len(pairs) else MapPairs(pairs)


def _application_properties(section: Section, pairs) -> dict:
    """String keys (binary keys decoded as UTF-8 when they are valid UTF-8), each at most once."""
    result: dict = {}
    for key, item in pairs:
        if type(key) is bytes:
            try:
                key = key.decode("utf-8")
            except UnicodeDecodeError:
                pass
        elif type(key) not in (str, Symbol):
            raise AmqpDecodeError(f"an application property key is a {amqp_type_name(key)}, not a string",
                                  section.value_start)
        if key in result:
            shown = quote(str(key)) if isinstance(key, str) else "(a binary key)"
            raise AmqpDecodeError(f"application property {shown} appears more than once", section.value_start)
        result[key] = item
    return result


def _application_key(key: Any) -> Any:
    """An application property's key as text where it is text (a binary key as valid UTF-8 reads as one)."""
    if type(key) is bytes:
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return key
    return key


def _is_replaced_annotation(key: Any, replacing_schedule: bool) -> bool:
    return isinstance(key, str) and (
        key in BROKER_OWNED_ANNOTATIONS or (replacing_schedule and key == SCHEDULED_ENQUEUE_TIME_ANNOTATION)
    )


def _annotation_time(name: str, value: Any) -> datetime | None:
    # The SDK re-encodes time annotations of re-sent messages as plain longs; accept both.
    if value is None or isinstance(value, datetime):
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} is a {type(value).__name__}, not a timestamp")
    try:
        return ms_to_datetime(int(value))
    except OverflowError:
        raise ValueError(f"{name} is out of range (before year 1 or after 9999)") from None


# --- encoding helpers --------------------------------------------------------------------------

def _section(code: SectionCode, value: Any) -> bytes:
    return encode_section(code, encode_value(value))


def _encode_body(message: DecodedMessage) -> bytes:
    if message.body_kind == "data":
        return b"".join(_section(DATA, part) for part in message.body)
    if message.body_kind == "sequence":
        return b"".join(_section(AMQP_SEQUENCE, part) for part in message.body)
    return _section(AMQP_VALUE, _amqp_value(message.body))


def _trimmed(values: list) -> list:
    # Trailing nulls are implied by a shorter list (AMQP composite encoding).
    while values and values[-1] is None:
        values.pop()
    return values


_HEADER_TYPES = {"durable": bool, "priority": UByte, "ttl_ms": UInt, "first_acquirer": bool, "delivery_count": UInt}


def _header_list(header: MessageHeader) -> list:
    # Header field types are fixed by the spec; plain ints and bools get them.
    values = []
    for name in _HEADER_FIELDS:
        value = getattr(header, name)
        if type(value) in (int, bool):
            value = _HEADER_TYPES[name](value)
        values.append(value)
    return _trimmed(values)


def _properties_list(properties: MessageProperties) -> list:
    return _trimmed([_typed_property(name, getattr(properties, name)) for name in _PROPERTY_FIELDS])


def _typed_property(name: str, value: Any) -> Any:
    """Plain Python values get the property's spec type; values with a codec type pass through unchanged."""
    if value is None:
        return None
    if name in ("message_id", "correlation_id") and type(value) is int:
        return ULong(value)
    if name in ("content_type", "content_encoding") and type(value) is str:
        return Symbol(value)
    if name in ("absolute_expiry_time", "creation_time") and type(value) is int:
        return Timestamp(value)
    if name == "group_sequence" and type(value) is int:
        return UInt(value)
    return _amqp_value(value)


def _annotation_map(mapping: dict) -> dict:
    # Annotation keys must be symbols (or ulongs); plain str keys become symbols.
    return {
        Symbol(key) if type(key) is str else key: _amqp_value(value)
        for key, value in mapping.items()
    }


def _amqp_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return Timestamp.from_datetime(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value
