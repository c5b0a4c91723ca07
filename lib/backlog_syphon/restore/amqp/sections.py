"""A message's sections (AMQP 1.0 part 3.2) and their byte ranges, so that sections, map entries and
list items can be rewritten while untouched bytes are copied as they are; the broker's identity
annotations read without decoding the body.

Invariants:
- Framing is checked as strictly as values are decoded: a section that is not one raises
  :class:`~backlog_syphon.restore.amqp.decoding.AmqpDecodeError` with its offset.
- Byte ranges are exact: ``raw[start:end]`` of a section, map entry or list item is its encoding as
  it came.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

from backlog_syphon.restore.amqp.annotations import ENQUEUED_TIME_ANNOTATION, SEQUENCE_NUMBER_ANNOTATION
from backlog_syphon.restore.amqp.decoding import (
    DECODERS,
    AmqpDecodeError,
    check_count,
    check_end,
    compound_header,
    decode_at,
    skip_value,
)
from backlog_syphon.restore.amqp.wire import U64


class SectionCode(IntEnum):
    """The descriptor codes of the message sections (AMQP 1.0 part 3.2)."""

    __hash__ = int.__hash__  # Enum's own hash is a Python call; sections are hashed on the hot path

    HEADER = 0x70
    DELIVERY_ANNOTATIONS = 0x71
    MESSAGE_ANNOTATIONS = 0x72
    PROPERTIES = 0x73
    APPLICATION_PROPERTIES = 0x74
    DATA = 0x75
    AMQP_SEQUENCE = 0x76
    AMQP_VALUE = 0x77
    FOOTER = 0x78


SECTION_NAMES = {
    SectionCode.HEADER: "amqp:header:list",
    SectionCode.DELIVERY_ANNOTATIONS: "amqp:delivery-annotations:map",
    SectionCode.MESSAGE_ANNOTATIONS: "amqp:message-annotations:map",
    SectionCode.PROPERTIES: "amqp:properties:list",
    SectionCode.APPLICATION_PROPERTIES: "amqp:application-properties:map",
    SectionCode.DATA: "amqp:data:binary",
    SectionCode.AMQP_SEQUENCE: "amqp:amqp-sequence:list",
    SectionCode.AMQP_VALUE: "amqp:amqp-value:*",
    SectionCode.FOOTER: "amqp:footer:map",
}
BODY_SECTIONS = frozenset({SectionCode.DATA, SectionCode.AMQP_SEQUENCE, SectionCode.AMQP_VALUE})
_BODY_CODES = tuple(BODY_SECTIONS)
_SECTION_BY_NAME = {name.encode("ascii"): code for code, name in SECTION_NAMES.items()}
_SECTION_BY_BYTE = [None] * 256
for _section_code in SectionCode:
    _SECTION_BY_BYTE[_section_code] = _section_code
del _section_code
_LIST_CONSTRUCTORS = frozenset({0x45, 0xC0, 0xD0})
_MAP_CONSTRUCTORS = frozenset({0xC1, 0xD1})
# The value constructors each section may hold; header, properties and the maps may also be null.
_SECTION_VALUE_CONSTRUCTORS = {
    SectionCode.HEADER: _LIST_CONSTRUCTORS | {0x40},
    SectionCode.DELIVERY_ANNOTATIONS: _MAP_CONSTRUCTORS | {0x40},
    SectionCode.MESSAGE_ANNOTATIONS: _MAP_CONSTRUCTORS | {0x40},
    SectionCode.PROPERTIES: _LIST_CONSTRUCTORS | {0x40},
    SectionCode.APPLICATION_PROPERTIES: _MAP_CONSTRUCTORS | {0x40},
    SectionCode.DATA: frozenset({0xA0, 0xB0}),
    SectionCode.AMQP_SEQUENCE: _LIST_CONSTRUCTORS,
    SectionCode.AMQP_VALUE: None,  # any value
    SectionCode.FOOTER: _MAP_CONSTRUCTORS | {0x40},
}
_SECTION_VALUE_KIND = {0x40: "null", 0xA0: "binary", 0xB0: "binary"}
_SECTION_VALUE_KIND.update({code: "list" for code in _LIST_CONSTRUCTORS})
_SECTION_VALUE_KIND.update({code: "map" for code in _MAP_CONSTRUCTORS})

_IDENTITY_ANNOTATIONS = (SEQUENCE_NUMBER_ANNOTATION, ENQUEUED_TIME_ANNOTATION)


class Section(NamedTuple):
    """One message section: ``raw[start:end]`` is the whole section, ``raw[value_start:end]`` its value."""

    code: SectionCode
    start: int
    value_start: int
    end: int

    def data_payload_range(self, raw: bytes) -> tuple[int, int]:
        """Where the payload of a Data section lies in ``raw`` (without its binary constructor and size)."""
        if self.code is not SectionCode.DATA:
            raise ValueError(f"section 0x{self.code:02x} is not a Data section")
        return self.value_start + (2 if raw[self.value_start] == 0xA0 else 5), self.end


class MapEntry(NamedTuple):
    """One entry of an encoded map, decoded, and where it lies: ``raw[start:end]`` is key and value as encoded."""

    key: Any
    value: Any
    start: int
    value_start: int
    end: int


class ListItem(NamedTuple):
    """One item of an encoded list, decoded, and where it lies: ``raw[start:end]`` is the item as encoded."""

    value: Any
    start: int
    end: int


def split_sections(raw: bytes) -> list[Section]:
    """The sections of one encoded message, in order, with their byte ranges.

    Checks the framing: every section is a described value with a section descriptor (ulong or
    symbolic), holds the kind of value its section requires, and fits in ``raw``; non-body sections
    appear at most once, body sections are all of one kind, and there is at most one amqp-value.
    The contents of the values are not checked here (decoding them does that). Sections in an
    unusual order are accepted. AmqpDecodeError otherwise.
    """
    return _walk_sections(as_bytes(raw), False)


def decode_sections(raw: bytes) -> list[tuple[Section, Any]]:
    """Like :func:`split_sections`, with each section's value decoded (checking all of it) in the same pass.

    The value of a Data section is None: its payload, ``raw[slice(*section.data_payload_range(raw))]``,
    needs no decoding, so it is neither decoded nor copied.
    """
    raw = as_bytes(raw)
    return list(zip(*_walk_sections(raw, True)))  # type: ignore[arg-type]


def _walk_sections(raw: bytes, decode: bool):
    """The sections (and, when ``decode``, their values) of ``raw``, framing and order rules checked."""
    sections: list[Section] = []
    values: list = []
    seen: set = set()
    body_code = None
    offset = 0
    length = len(raw)
    while offset < length:
        code, value_start = _section_start(raw, offset)
        if code in _BODY_CODES:
            if body_code is not None and body_code is not code:
                raise AmqpDecodeError("not an AMQP message: body sections of different kinds", offset)
            if code is SectionCode.AMQP_VALUE and code in seen:
                raise AmqpDecodeError("not an AMQP message: more than one amqp-value section", offset)
            body_code = code
        elif code in seen:
            raise AmqpDecodeError(f"not an AMQP message: section 0x{code:02x} ({SECTION_NAMES[code]}) "
                                  "appears twice", offset)
        seen.add(code)
        if decode and code is not SectionCode.DATA:
            value, end = DECODERS[raw[value_start]](raw, value_start + 1, 0)
            values.append(value)
        else:
            end = skip_value(raw, value_start)
            values.append(None)
        sections.append(tuple.__new__(Section, (code, offset, value_start, end)))
        offset = end
    return (sections, values) if decode else sections


def _section_start(raw: bytes, offset: int) -> tuple[SectionCode, int]:
    """The code of the section at ``offset`` and where its value starts; its value's constructor is checked."""
    if raw[offset] != 0x00:
        raise AmqpDecodeError("not an AMQP message: the value is not a described section", offset)
    descriptor_at = offset + 1
    code = None
    if descriptor_at + 2 <= len(raw) and raw[descriptor_at] == 0x53:
        code = _SECTION_BY_BYTE[raw[descriptor_at + 1]]
        value_start = descriptor_at + 2
    else:
        value_start = skip_value(raw, descriptor_at)
        constructor = raw[descriptor_at]
        if constructor == 0x80:
            number = U64.unpack_from(raw, descriptor_at + 1)[0]
            code = _SECTION_BY_BYTE[number] if number < 256 else None
        elif constructor in (0xA3, 0xB3):
            code = _SECTION_BY_NAME.get(raw[descriptor_at + (2 if constructor == 0xA3 else 5):value_start])
    if code is None:
        raise AmqpDecodeError("not an AMQP message: unknown section descriptor", descriptor_at)
    if value_start >= len(raw):
        raise AmqpDecodeError(f"truncated: section 0x{code:02x} has no value", value_start)
    allowed = _SECTION_VALUE_CONSTRUCTORS[code]
    if allowed is not None and raw[value_start] not in allowed:
        wanted = sorted({_SECTION_VALUE_KIND[c] for c in allowed})
        raise AmqpDecodeError(f"not an AMQP message: section 0x{code:02x} ({SECTION_NAMES[code]}) must hold "
                              f"a {' or '.join(wanted)}", value_start)
    return code, value_start


def as_bytes(raw) -> bytes:
    return raw if type(raw) is bytes else bytes(raw)


def map_entries(raw: bytes, offset: int, *, values: bool = True) -> list[MapEntry]:
    """The entries of the map (or null, which has none) encoded at ``offset``, decoded, with their byte ranges.

    ``raw[entry.start:entry.end]`` is the entry's key and value exactly as encoded, so a map can be
    rewritten keeping untouched entries byte for byte (see :func:`encode_map_raw`). Everything is
    decoded and checked as :func:`decode_value` does, except that repeated keys are all listed.
    ``values=False``: the values are only stepped over (``value`` None), for bytes already checked whole.
    """
    raw = as_bytes(raw)
    if offset >= len(raw):
        raise AmqpDecodeError("truncated: a map is missing", offset)
    constructor = raw[offset]
    if constructor == 0x40:
        return []
    if constructor not in _MAP_CONSTRUCTORS:
        raise AmqpDecodeError(f"expected a map, found constructor 0x{constructor:02x}", offset)
    count, p, end = compound_header(raw, offset + 1, 0, "map", constructor == 0xD1)
    if count % 2:
        raise AmqpDecodeError(f"the map has an odd number of elements ({count})", offset)
    check_count(count, p, end, "map", offset)
    entries = []
    decoders = DECODERS
    for _ in range(count // 2):
        if p >= end:
            raise AmqpDecodeError("truncated: a map element is missing", p)
        key, value_start = decoders[raw[p]](raw, p + 1, 1)
        if value_start >= end:
            raise AmqpDecodeError("truncated: a map value is missing", value_start)
        if values:
            value, entry_end = decoders[raw[value_start]](raw, value_start + 1, 1)
        else:
            value, entry_end = None, skip_value(raw, value_start, 1)
        entries.append(tuple.__new__(MapEntry, (key, value, p, value_start, entry_end)))
        p = entry_end
    check_end(p, end, "map", offset)
    return entries


def list_items(raw: bytes, offset: int, *, values: bool = True) -> list[ListItem]:
    """The items of the list (or null, which has none) encoded at ``offset``, decoded, with their byte ranges
    (``values=False``: only stepped over, ``value`` None, for bytes already checked whole)."""
    raw = as_bytes(raw)
    if offset >= len(raw):
        raise AmqpDecodeError("truncated: a list is missing", offset)
    constructor = raw[offset]
    if constructor in (0x40, 0x45):
        return []
    if constructor not in _LIST_CONSTRUCTORS:
        raise AmqpDecodeError(f"expected a list, found constructor 0x{constructor:02x}", offset)
    count, p, end = compound_header(raw, offset + 1, 0, "list", constructor == 0xD0)
    check_count(count, p, end, "list", offset)
    items = []
    decoders = DECODERS
    for _ in range(count):
        if p >= end:
            raise AmqpDecodeError("truncated: a list element is missing", p)
        if values:
            value, item_end = decoders[raw[p]](raw, p + 1, 1)
        else:
            value, item_end = None, skip_value(raw, p, 1)
        items.append(tuple.__new__(ListItem, (value, p, item_end)))
        p = item_end
    check_end(p, end, "list", offset)
    return items


def encode_section(code: SectionCode, value: bytes) -> bytes:
    """A section from its code and its already encoded value."""
    return bytes((0x00, 0x53, code)) + value


def sequence_number(raw: bytes) -> int | None:
    """The ``x-opt-sequence-number`` message annotation, read from the bytes without decoding the body.

    None when the message has no such annotation. AmqpDecodeError if the framing is broken or the
    annotation is not an integer.
    """
    return broker_identity(raw)[0]


def broker_identity(raw: bytes) -> tuple[int | None, int | None]:
    """``(x-opt-sequence-number, x-opt-enqueued-time in ms)``: the broker's own marks of a stored
    message, which identify it within one queue (read without decoding the body).

    Each is None when absent. AmqpDecodeError if the framing is broken or an annotation is not an
    integer (a timestamp is one).
    """
    raw = as_bytes(raw)
    found: dict[str, int] = {}
    for section in split_sections(raw):
        if section.code is SectionCode.MESSAGE_ANNOTATIONS:
            for entry in map_entries(raw, section.value_start):
                if isinstance(entry.key, str) and entry.key in _IDENTITY_ANNOTATIONS:
                    value, _ = decode_at(raw, entry.value_start, 1)
                    if not isinstance(value, int) or isinstance(value, bool):
                        raise AmqpDecodeError(f"{entry.key} is not an integer", entry.value_start)
                    found[entry.key] = int(value)
            break
    return found.get(SEQUENCE_NUMBER_ANNOTATION), found.get(ENQUEUED_TIME_ANNOTATION)
