"""AMQP 1.0 values and messages in pure Python (standard library only), every type kept exactly.

The syphon reads the raw bytes of backlog messages and forwards them. A decoder that merges AMQP
types (``long`` and ``int``, ``symbol`` and ``string``), drops descriptors or cannot read ``char``
and the decimals would change what the legacy .NET client sent. This package decodes and encodes the
whole AMQP 1.0 type system (part 1 of the specification) and splits a message into its sections
(part 3) so that sections can be rewritten while untouched bytes are copied as they are.

One role per module, each importing only those above it here:
- ``wire``: the fixed-width formats; ``decimals``: IEEE 754-2008 decimals (BID);
- ``values``: the value model, a class for every AMQP type Python has none of;
- ``decoding``: bytes -> values, strict; ``encoding``: values -> bytes, type-exact;
- ``annotations``: the names Service Bus gives its annotations and dead-letter properties;
- ``sections``: a message's sections, map entries and list items with their byte ranges;
- ``describing``: how a value is named in a reason, and a text shown without leaking it;
- ``message``: a message as a typed description, and its encoding; ``message_decoding``: bytes -> one.

The package knows AMQP and Service Bus's annotations, nothing of the legacy client: it imports nothing from
the rest of ``restore`` (``restore.restored_message`` turns a backlog copy back into its original with it).

A leading underscore marks a name its module keeps to itself; what the package's modules share is public.

The codec's names are re-exported here; the message modules' are not, import them from their modules.
"""

from backlog_syphon.restore.amqp.annotations import ENQUEUED_TIME_ANNOTATION, SEQUENCE_NUMBER_ANNOTATION
from backlog_syphon.restore.amqp.decoding import AmqpDecodeError, decode_value
from backlog_syphon.restore.amqp.encoding import encode_list_raw, encode_map_raw, encode_value
from backlog_syphon.restore.amqp.sections import (
    BODY_SECTIONS,
    SECTION_NAMES,
    ListItem,
    MapEntry,
    Section,
    SectionCode,
    broker_identity,
    decode_sections,
    encode_section,
    list_items,
    map_entries,
    sequence_number,
    split_sections,
)
from backlog_syphon.restore.amqp.values import (
    MAX_NESTING_DEPTH,
    AmqpType,
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

__all__ = [
    "MAX_NESTING_DEPTH", "AmqpDecodeError", "AmqpType", "Array", "Byte", "Char", "Decimal32", "Decimal64",
    "Decimal128", "Described", "Float", "Int", "MapPairs", "Short", "Symbol", "Timestamp", "UByte", "UInt",
    "ULong", "UShort", "decode_value", "encode_value", "encode_list_raw", "encode_map_raw",
    "ENQUEUED_TIME_ANNOTATION", "SEQUENCE_NUMBER_ANNOTATION", "BODY_SECTIONS", "SECTION_NAMES", "ListItem",
    "MapEntry", "Section", "SectionCode", "broker_identity", "decode_sections", "encode_section", "list_items",
    "map_entries", "sequence_number", "split_sections",
]
