"""A stored message -> the copy the migration mode sends: the message as its sender wrote it, with its absolute
expiry kept. Pure; built by splicing the raw bytes, as ``restored_message`` does.

What changes, and only that:
- the header's time to live becomes what is left of it (enqueue time + time to live - now, rounded up, at least
  1 ms): the copy expires on the target when it would have on the source. A scheduled message keeps its time
  to live whole (its clock starts when it becomes active). The delivery count is dropped;
- the broker's annotations are dropped (``BROKER_OWNED_ANNOTATIONS``: sequence number, enqueue time, partition
  id, lock, message state ...); delivery annotations (hop-scoped) too; the sender's annotations, the scheduled
  enqueue time and the partition key among them, are kept byte for byte;
- from a dead-letter sub-queue, the broker's ``DeadLetterReason`` and ``DeadLetterErrorDescription`` application
  properties are dropped;
- added application properties (``Additions``): provenance (``x-syphon-*``, ``PROVENANCE_PROPERTIES``) and a
  route's property (``property`` delivery of a subscription's messages). A message that already has a property
  of that name keeps its own value.

Invariants:
- the properties section, every other application property, every body section and the footer are copied byte
  for byte: the body, MessageId, SessionId, PartitionKey, CorrelationId, Subject, ContentType, ReplyTo,
  ReplyToSessionId, To and every property's AMQP type are the sender's;
- the whole message is checked as the restore checks it (``AmqpDecodeError``, a ``ValueError``, for what the
  codec cannot read), so nothing is sent half right;
- a message whose expiry has passed is not built: ``model.ExpiredBeforeSendError``.
"""

from __future__ import annotations

from dataclasses import dataclass

from backlog_syphon.model import ExpiredBeforeSendError
from backlog_syphon.restore.amqp.annotations import (
    BROKER_OWNED_ANNOTATIONS,
    DEAD_LETTER_DESCRIPTION_PROPERTY,
    DEAD_LETTER_PROPERTIES,
    DEAD_LETTER_REASON_PROPERTY,
    ENQUEUED_TIME_ANNOTATION,
    MESSAGE_STATE_ANNOTATION,
    SEQUENCE_NUMBER_ANNOTATION,
)
from backlog_syphon.restore.amqp.decoding import decode_value
from backlog_syphon.restore.amqp.encoding import encode_list_raw, encode_map_raw, encode_value
from backlog_syphon.restore.amqp.message import (
    AMQP_SEQUENCE,
    AMQP_VALUE,
    APPLICATION_PROPERTIES,
    DATA,
    FOOTER,
    HEADER,
    HEADER_FIELDS,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
)
from backlog_syphon.restore.amqp.message_decoding import map_section_dict, padded
from backlog_syphon.restore.amqp.sections import (
    BODY_SECTIONS,
    as_bytes,
    encode_section,
    list_items,
    map_entries,
    split_sections,
)
from backlog_syphon.restore.amqp.values import Timestamp, UInt

UINT_MAX = 2**32 - 1
SCHEDULED_STATE = 2  # ``x-opt-message-state`` of a scheduled message

# The provenance application properties: what the broker owned of the original, on the copy.
SOURCE_ENTITY_PROPERTY = "x-syphon-source-entity"  # string: the source's entity path
ORIGINAL_SEQUENCE_NUMBER_PROPERTY = "x-syphon-original-sequence-number"  # long
ORIGINAL_ENQUEUED_TIME_PROPERTY = "x-syphon-original-enqueued-time"  # timestamp
ORIGINAL_DELIVERY_COUNT_PROPERTY = "x-syphon-original-delivery-count"  # uint
DEAD_LETTER_REASON_COPY = "x-syphon-dead-letter-reason"  # string, from a dead-letter sub-queue
DEAD_LETTER_DESCRIPTION_COPY = "x-syphon-dead-letter-error-description"  # string, from a dead-letter sub-queue
PROVENANCE_PROPERTIES = (SOURCE_ENTITY_PROPERTY, ORIGINAL_SEQUENCE_NUMBER_PROPERTY, ORIGINAL_ENQUEUED_TIME_PROPERTY,
                         ORIGINAL_DELIVERY_COUNT_PROPERTY, DEAD_LETTER_REASON_COPY, DEAD_LETTER_DESCRIPTION_COPY)

_TTL_FIELD, _DELIVERY_COUNT_FIELD = HEADER_FIELDS.index("ttl_ms"), HEADER_FIELDS.index("delivery_count")
_NULL = b"\x40"


@dataclass(frozen=True)
class Additions:
    """What the copy gets on top of the original: provenance, and a route's property."""

    source_entity: str | None = None  # provenance on: the source's path (None: no provenance)
    property_name: str | None = None  # ``property`` delivery: the property and its value
    property_value: str | None = None


def copy_message_bytes(raw: bytes, *, now_ms: int, additions: Additions = Additions(),
                       from_dead_letters: bool = False) -> bytes:
    """The copy of the stored message ``raw`` to send at ``now_ms`` (milliseconds since the epoch)."""
    raw = as_bytes(raw)
    sections = split_sections(raw)
    by_code: dict = {}
    header_items: list = []
    annotation_entries: list = []
    application_entries: list = []
    for section in sections:
        code = section.code
        if code is HEADER:
            header_items = list_items(raw, section.value_start)
        elif code is MESSAGE_ANNOTATIONS:
            annotation_entries = map_entries(raw, section.value_start)
        elif code is APPLICATION_PROPERTIES:
            application_entries = map_entries(raw, section.value_start)
        elif code is PROPERTIES:
            list_items(raw, section.value_start)
        elif code is not DATA:  # delivery annotations, an amqp-value or amqp-sequence body, the footer
            value, _ = decode_value(raw, section.value_start)
            if code is not AMQP_VALUE and code is not AMQP_SEQUENCE:
                map_section_dict(section, value)
        if code not in BODY_SECTIONS:
            by_code[code] = section
    broker = {entry.key: decode_value(raw, entry.value_start)[0] for entry in annotation_entries
              if isinstance(entry.key, str) and entry.key in (SEQUENCE_NUMBER_ANNOTATION, ENQUEUED_TIME_ANNOTATION,
                                                               MESSAGE_STATE_ANNOTATION)}
    header = padded([raw[item.start:item.end] for item in header_items], len(HEADER_FIELDS), _NULL)
    ttl_ms = decode_value(header[_TTL_FIELD], 0)[0] if header[_TTL_FIELD] != _NULL else None
    delivery_count = decode_value(header[_DELIVERY_COUNT_FIELD], 0)[0] if header[_DELIVERY_COUNT_FIELD] != _NULL else 0
    scheduled = broker.get(MESSAGE_STATE_ANNOTATION) == SCHEDULED_STATE
    enqueued_ms = broker.get(ENQUEUED_TIME_ANNOTATION)
    if ttl_ms and enqueued_ms is not None and not scheduled:
        left = remaining_ttl_ms(int(enqueued_ms), int(ttl_ms), now_ms)
        if left is None:
            raise ExpiredBeforeSendError(f"expired {now_ms - int(enqueued_ms) - int(ttl_ms)} ms before it was sent "
                                      f"(time to live {int(ttl_ms)} ms from its enqueue time)")
        header[_TTL_FIELD] = encode_value(UInt(min(left, UINT_MAX)))
    header[_DELIVERY_COUNT_FIELD] = _NULL
    while header and header[-1] == _NULL:
        header.pop()

    out = []
    if header:
        out.append(encode_section(HEADER, encode_list_raw(header)))
    annotations = [raw[entry.start:entry.end] for entry in annotation_entries
                   if not (isinstance(entry.key, str) and entry.key in BROKER_OWNED_ANNOTATIONS)]
    if annotations:
        out.append(encode_section(MESSAGE_ANNOTATIONS, encode_map_raw(annotations)))
    if PROPERTIES in by_code:
        section = by_code[PROPERTIES]
        out.append(raw[section.start:section.end])

    own = {_text_key(entry.key): decode_value(raw, entry.value_start)[0] for entry in application_entries
           if _text_key(entry.key) in DEAD_LETTER_PROPERTIES}
    kept = [raw[entry.start:entry.end] for entry in application_entries
            if not (from_dead_letters and _text_key(entry.key) in DEAD_LETTER_PROPERTIES)]
    present = {_text_key(entry.key) for entry in application_entries}
    added = []
    if additions.source_entity is not None:
        added += [(SOURCE_ENTITY_PROPERTY, additions.source_entity),
                  (ORIGINAL_SEQUENCE_NUMBER_PROPERTY, _long(broker.get(SEQUENCE_NUMBER_ANNOTATION))),
                  (ORIGINAL_ENQUEUED_TIME_PROPERTY, None if enqueued_ms is None else Timestamp(int(enqueued_ms))),
                  (ORIGINAL_DELIVERY_COUNT_PROPERTY, UInt(int(delivery_count)))]
        if from_dead_letters:
            added += [(DEAD_LETTER_REASON_COPY, _text(own.get(DEAD_LETTER_REASON_PROPERTY))),
                      (DEAD_LETTER_DESCRIPTION_COPY, _text(own.get(DEAD_LETTER_DESCRIPTION_PROPERTY)))]
    if additions.property_name is not None:
        added.append((additions.property_name, additions.property_value))
    kept += [encode_value(name) + encode_value(value) for name, value in added
             if value is not None and name not in present]
    if kept:
        out.append(encode_section(APPLICATION_PROPERTIES, encode_map_raw(kept)))
    out.extend(raw[section.start:section.end] for section in sections if section.code in BODY_SECTIONS)
    if FOOTER in by_code:
        section = by_code[FOOTER]
        out.append(raw[section.start:section.end])
    return b"".join(out)


def remaining_ttl_ms(enqueued_ms: int, ttl_ms: int, now_ms: int) -> int | None:
    """What is left at ``now_ms`` of a time to live counted from ``enqueued_ms``; None once it has run out."""
    left = enqueued_ms + ttl_ms - now_ms
    return left if left > 0 else None


def _text_key(key) -> str | None:
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _long(value) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
