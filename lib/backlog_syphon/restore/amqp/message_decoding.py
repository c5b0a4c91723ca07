"""Raw AMQP message bytes -> :class:`~backlog_syphon.restore.amqp.message.DecodedMessage` (or, without
copying a data body, its :class:`~backlog_syphon.restore.amqp.message.MessageEnvelope`).

Invariants:
- A message is read completely or not at all: anything the codec cannot read raises
  :class:`~backlog_syphon.restore.amqp.decoding.AmqpDecodeError` (a ``ValueError``), so nothing is
  forwarded half right.
"""

from __future__ import annotations

from typing import Any

from backlog_syphon.restore.amqp.decoding import AmqpDecodeError
from backlog_syphon.restore.amqp.message import (
    HEADER_FIELDS,
    PROPERTY_FIELDS,
    AMQP_VALUE,
    APPLICATION_PROPERTIES,
    BODY_KIND_BY_SECTION,
    DATA,
    DELIVERY_ANNOTATIONS,
    FOOTER,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    DecodedMessage,
    MessageEnvelope,
    MessageHeader,
    MessageProperties,
)
from backlog_syphon.restore.amqp.sections import BODY_SECTIONS, Section, as_bytes, decode_sections
from backlog_syphon.restore.amqp.values import MapPairs, Symbol
from backlog_syphon.restore.amqp.describing import amqp_type_name, quote


def decode_message(raw: bytes) -> DecodedMessage:
    """Decode one AMQP message with exact types; AmqpDecodeError (a ValueError) if it is not one."""
    raw = as_bytes(raw)
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
    raw = as_bytes(raw)
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


def _non_body_parts(sections: list[tuple[Section, Any]]) -> dict:
    """The decoded non-body sections as keyword arguments of DecodedMessage and MessageEnvelope."""
    values = {section.code: (section, value) for section, value in sections if section.code not in BODY_SECTIONS}
    application = values.get(APPLICATION_PROPERTIES)
    return {
        "header": MessageHeader(*_fields(values.get(HEADER), len(HEADER_FIELDS))),
        "delivery_annotations": map_section_dict(*values.get(DELIVERY_ANNOTATIONS, (None, None))),
        "message_annotations": map_section_dict(*values.get(MESSAGE_ANNOTATIONS, (None, None))),
        "properties": MessageProperties(*_fields(values.get(PROPERTIES), len(PROPERTY_FIELDS))),
        "application_properties": {} if application is None or application[1] is None else decode_application_properties(
            application[0], _pairs(application[1])),
        "footer": map_section_dict(*values.get(FOOTER, (None, None))),
    }


def _fields(section_value: tuple[Section, Any] | None, count: int) -> list:
    # Extra trailing fields would come from a later protocol revision; AMQP lets readers ignore them.
    return padded(list((section_value and section_value[1]) or [])[:count], count, None)


def padded(values: list, count: int, filler: Any) -> list:
    return values + [filler] * (count - len(values))


def _pairs(value: dict | MapPairs):
    return value.items() if type(value) is dict else value


def map_section_dict(section: Section | None, value: dict | MapPairs | None) -> dict:
    """A map section as a dict; AmqpDecodeError if a dict cannot hold it."""
    if value is None:
        return {}
    if type(value) is MapPairs:
        raise AmqpDecodeError(f"section 0x{section.code:02x} has a key twice (or a key that is a list or map)",
                              section.value_start)
    return value


def decode_application_properties(section: Section, pairs) -> dict:
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
