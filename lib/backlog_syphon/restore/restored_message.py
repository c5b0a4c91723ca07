"""A backlog copy -> the message its sender meant to send: as a description (:func:`restored_message`)
or by splicing the raw bytes (:func:`restore_message_bytes`). No networking.

Invariants:
- :func:`restore_message_bytes` splices: body sections, the footer and every application property
  and message annotation it does not change are copied byte for byte; so are the properties, unless
  the session id is restored, and then only the group-id field changes.
- :func:`restored_message` changes only what restoring requires: the four legacy properties, the
  session id, the header TTL and delivery count, the scheduled enqueue time and broker-owned
  annotations. Everything else is the same object. Decoding the bytes of :func:`restore_message_bytes`
  gives what :func:`restored_message` gives for the same message.
- A message is restored completely or not at all: anything the codec cannot read raises
  :class:`~backlog_syphon.restore.amqp.decoding.AmqpDecodeError` and legacy properties that cannot be
  restored :class:`LegacyPropertiesError` (both ``ValueError``), so nothing is forwarded half right.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from backlog_syphon.restore.amqp.annotations import (
    BROKER_OWNED_ANNOTATIONS,
    DEAD_LETTER_PROPERTIES,
    SCHEDULED_ENQUEUE_TIME_ANNOTATION,
)
from backlog_syphon.restore.amqp.decoding import decode_value
from backlog_syphon.restore.amqp.encoding import encode_list_raw, encode_map_raw, encode_value
from backlog_syphon.restore.amqp.message import (
    HEADER_FIELDS,
    PROPERTY_FIELDS,
    AMQP_SEQUENCE,
    AMQP_VALUE,
    APPLICATION_PROPERTIES,
    DATA,
    FOOTER,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    DecodedMessage,
)
from backlog_syphon.restore.amqp.message_decoding import decode_application_properties, map_section_dict, padded
from backlog_syphon.restore.amqp.sections import (
    BODY_SECTIONS,
    as_bytes,
    encode_section,
    list_items,
    map_entries,
    split_sections,
)
from backlog_syphon.restore.amqp.values import MapPairs, Symbol, Timestamp, UInt
from backlog_syphon.restore.legacy_properties import (
    LegacyFields,
    Problem,
    decode_legacy_properties,
    is_legacy_key,
    strip_legacy_properties,
    timedelta_to_ms,
)

UINT_MAX = 2**32 - 1

_TTL_FIELD, _DELIVERY_COUNT_FIELD = HEADER_FIELDS.index("ttl_ms"), HEADER_FIELDS.index("delivery_count")
_GROUP_ID_FIELD = PROPERTY_FIELDS.index("group_id")
_NULL = b"\x40"
_SCHEDULED_KEY = encode_value(Symbol(SCHEDULED_ENQUEUE_TIME_ANNOTATION))


class LegacyPropertiesError(ValueError):
    """The legacy ``x-ms-*`` properties of a backlog message cannot be restored; ``problems`` says why."""

    def __init__(self, problems: tuple[Problem, ...]):
        super().__init__("; ".join(problem.reason for problem in problems))
        self.problems = problems


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
                          from_dead_letters: bool = False, checked: LegacyFields | None = None) -> bytes:
    """Restore a raw backlog message for sending, with the TTL the classification chose, by splicing ``raw``.

    The legacy fields are decoded again from the message itself so the bytes sent can never disagree
    with the message. The whole message is checked as :func:`decode_message` checks it (data payloads
    only for their framing). Raises AmqpDecodeError if ``raw`` is not a message the codec can read and
    LegacyPropertiesError if its legacy properties cannot be restored (both are ValueErrors;
    classification dead-letters those). ``from_dead_letters``: ``raw`` was read from a dead-letter
    sub-queue, whose dead-letter properties (``DEAD_LETTER_PROPERTIES``) are removed too.

    ``checked``: the legacy fields the source decoded from these same bytes when it read them whole (a
    backlog row without a decode problem, ``backlog_rows``): then nothing is decoded or checked again but
    the framing and the keys of the maps the splice rewrites, and the session id and scheduled enqueue time
    spliced in are those (a send task's restore, the second and last decode of a message).
    """
    if restored_time_to_live_ms is not None and restored_time_to_live_ms <= 0:
        raise ValueError(f"restored_time_to_live_ms must be positive or None, got {restored_time_to_live_ms}")
    raw = as_bytes(raw)
    sections = split_sections(raw)
    values = checked is None
    # One pass that checks every section (as decode_message does) and keeps what the splice needs.
    by_code: dict = {}
    header_items: list = []
    properties_items: list = []
    annotation_entries: list = []
    application_entries: list = []
    for section in sections:
        code = section.code
        if code is HEADER:
            header_items = list_items(raw, section.value_start, values=values)
        elif code is PROPERTIES:
            properties_items = list_items(raw, section.value_start, values=values)
        elif code is MESSAGE_ANNOTATIONS:
            annotation_entries = map_entries(raw, section.value_start, values=values)
            if values:
                map_section_dict(section, _entries_as_map(annotation_entries))
        elif code is APPLICATION_PROPERTIES:
            application_entries = map_entries(raw, section.value_start, values=values)
        elif code is not DATA and values:  # delivery annotations, an amqp-value or amqp-sequence body, the footer
            value, _ = decode_value(raw, section.value_start)
            if code is not AMQP_VALUE and code is not AMQP_SEQUENCE:
                map_section_dict(section, value)
        if code not in BODY_SECTIONS:
            by_code[code] = section
    if checked is not None:
        fields = checked
    else:
        application_properties = {} if not application_entries else decode_application_properties(
            by_code[APPLICATION_PROPERTIES], ((entry.key, entry.value) for entry in application_entries))
        fields = decode_legacy_properties(application_properties)
        if fields.problems:
            raise LegacyPropertiesError(fields.problems)

    out = []
    header = padded([raw[item.start:item.end] for item in header_items], len(HEADER_FIELDS), _NULL)
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
        properties = padded([raw[item.start:item.end] for item in properties_items], len(PROPERTY_FIELDS),
                             _NULL)
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


def _entries_as_map(entries: list) -> dict | MapPairs:
    """What the decoder makes of these map entries: a dict, or MapPairs when a dict cannot hold them."""
    pairs = [(entry.key, entry.value) for entry in entries]
    try:
        as_dict = dict(pairs)
    except TypeError:
        return MapPairs(pairs)
    return as_dict if len(as_dict) == len(pairs) else MapPairs(pairs)


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
