"""An AMQP 1.0 message as a plain, typed, picklable description, and its encoding.

The azure-servicebus SDK's decoded messages lose AMQP types (a ``long`` becomes ``int`` and is re-sent
as a 32-bit ``int``, a described value loses its descriptor, symbols become strings), so the syphon
describes a message with the codec's value model (:mod:`backlog_syphon.restore.amqp.values`), which
keeps every type. :mod:`~backlog_syphon.restore.amqp.message_decoding` reads one from bytes. No
networking.

Invariants:
- Fidelity: body sections, properties, annotations and application properties keep their values and
  AMQP types through decode -> encode (the codec's value model: ``int`` is long, ``Int`` is int,
  ``Symbol``, ``Timestamp``, ``Described``, ``Array`` and the rest).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from backlog_syphon.restore.amqp.annotations import (
    ENQUEUED_TIME_ANNOTATION,
    PARTITION_KEY_ANNOTATION,
    SCHEDULED_ENQUEUE_TIME_ANNOTATION,
    SEQUENCE_NUMBER_ANNOTATION,
)
from backlog_syphon.restore.amqp.encoding import encode_value
from backlog_syphon.restore.amqp.sections import SectionCode, encode_section
from backlog_syphon.restore.amqp.values import Symbol, Timestamp, UByte, UInt, ULong
from backlog_syphon.restore.amqp.values import ms_to_datetime


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

HEADER_FIELDS = ("durable", "priority", "ttl_ms", "first_acquirer", "delivery_count")
PROPERTY_FIELDS = (
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
    for name in HEADER_FIELDS:
        value = getattr(header, name)
        if type(value) in (int, bool):
            value = _HEADER_TYPES[name](value)
        values.append(value)
    return _trimmed(values)


def _properties_list(properties: MessageProperties) -> list:
    return _trimmed([_typed_property(name, getattr(properties, name)) for name in PROPERTY_FIELDS])


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
