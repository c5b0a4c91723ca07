"""Raw AMQP bytes <-> DecodedMessage: type fidelity, body sections, and the restored copy."""

import dataclasses
import pickle
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import proton
import pytest
from proton import Message

from backlog_syphon.restore.amqp.annotations import BROKER_OWNED_ANNOTATIONS
from backlog_syphon.restore.amqp.decoding import AmqpDecodeError
from backlog_syphon.restore.amqp.encoding import encode_value
from backlog_syphon.restore.amqp.message import DecodedMessage, MessageHeader, MessageProperties
from backlog_syphon.restore.amqp.message_decoding import decode_envelope, decode_message
from backlog_syphon.restore.restored_message import (
    UINT_MAX,
    LegacyPropertiesError,
    header_ttl_ms,
    restore_message_bytes,
    restored_message,
)
from backlog_syphon.restore.amqp.sections import BODY_SECTIONS, SectionCode, encode_section, map_entries, split_sections
from backlog_syphon.restore.amqp.values import (
    Array,
    Char,
    Decimal128,
    Described,
    Float,
    Int,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
)
from backlog_syphon.restore.legacy_properties import LegacyFields, decode_legacy_properties
from tests.unit.amqp_values import proton_encode, tagged, to_proton

UTC = timezone.utc
TIMESPAN = Symbol("com.microsoft:timespan")
ENQUEUED_MS = 1714560000000
SCHEDULED = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)

TYPED_PROPERTIES = {
    "long": 2**40,
    "small-long": 5,
    "int": Int(-7),
    "ulong": ULong(2**64 - 1),
    "uint": UInt(9),
    "short": Short(-3),
    "ubyte": UByte(255),
    "symbol": Symbol("sym"),
    "string": "text",
    "timestamp": Timestamp(ENQUEUED_MS),
    "described": Described(TIMESPAN, 600_000_000),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "binary": b"\x00\xff\x10",
    "double": 1.25,
    "float": Float(0.5),
    "bool": True,
    "char": Char("z"),
    "null": None,
    "list": [Int(1), "two", b"3"],
    "map": {Symbol("k"): ULong(1)},
    "decimal": Decimal128.from_decimal(Decimal("-79228162514264337593543950335")),
    "array": Array("int", [Int(1), Int(2)]),
}


def typed(value):
    """A value with every nested type spelled out, so equality also compares AMQP types."""
    if isinstance(value, tuple) and type(value) is tuple:  # header/properties fields, body parts
        return ("tuple", tuple(typed(item) for item in value))
    return tagged(value)


def typed_message(message: DecodedMessage):
    return {
        "header": typed(tuple(getattr(message.header, f.name) for f in dataclasses.fields(MessageHeader))),
        "delivery_annotations": typed(message.delivery_annotations),
        "message_annotations": typed(message.message_annotations),
        "properties": typed(tuple(getattr(message.properties, f.name) for f in dataclasses.fields(MessageProperties))),
        "application_properties": typed(message.application_properties),
        "body_kind": message.body_kind,
        "body": typed(message.body),
        "footer": typed(message.footer),
    }


def legacy_backlog_message(**application_properties) -> DecodedMessage:
    """A backlog copy as the legacy client and the broker leave it."""
    return DecodedMessage(
        header=MessageHeader(durable=True, delivery_count=UInt(3)),
        delivery_annotations={Symbol("x-opt-lock-token"): uuid.UUID(int=5)},
        message_annotations={
            Symbol("x-opt-sequence-number"): 42,
            Symbol("x-opt-enqueued-time"): Timestamp(ENQUEUED_MS),
            Symbol("x-opt-locked-until"): Timestamp(ENQUEUED_MS + 60_000),
            Symbol("x-opt-enqueue-sequence-number"): 7,
            Symbol("x-opt-message-state"): Int(0),
            Symbol("x-opt-deadletter-source"): "elsewhere",
            Symbol("x-opt-partition-key"): "pk-1",
            Symbol("x-opt-via-partition-key"): "via-1",
            Symbol("x-custom"): Int(1),
        },
        properties=MessageProperties(
            message_id="msg-1", to="orders", subject="label", reply_to="replies", correlation_id=uuid.UUID(int=9),
            content_type=Symbol("application/json"), reply_to_group_id="reply-session",
        ),
        application_properties={
            "x-ms-path": "orders",
            "x-ms-sessionid": "session-1",
            "x-ms-timetolive": Described(TIMESPAN, 15 * 60 * 10_000_000),
            "x-ms-scheduledenqueuetimeutc": Timestamp.from_datetime(SCHEDULED),
            **TYPED_PROPERTIES,
        },
        body=(b'{"order": 1}',),
    )


# --- decode of bytes written by proton's own Message encoder ------------------------------------

def test_decode_message_written_by_proton_message():
    message = Message(body=b"hello", properties=to_proton(TYPED_PROPERTIES), inferred=True)
    message.id = proton.ulong(77)
    message.correlation_id = "corr"
    message.subject = "label"
    message.content_type = "text/plain"
    message.group_id = "session-1"
    message.reply_to_group_id = "reply-session"
    message.ttl = 90.0
    message.durable = True
    message.annotations = {
        proton.symbol("x-opt-sequence-number"): 12,
        proton.symbol("x-opt-enqueued-time"): proton.timestamp(ENQUEUED_MS),
    }

    decoded = decode_message(bytes(message.encode()))

    assert decoded.body_kind == "data"
    assert decoded.body == (b"hello",)
    assert typed(decoded.application_properties) == typed(TYPED_PROPERTIES)
    assert typed((decoded.header.durable, decoded.header.ttl_ms)) == typed((True, UInt(90_000)))
    assert typed(decoded.properties.message_id) == typed(ULong(77))
    assert typed(decoded.properties.content_type) == typed(Symbol("text/plain"))
    assert decoded.properties.group_id == "session-1"
    assert decoded.properties.reply_to_group_id == "reply-session"
    assert decoded.sequence_number == 12
    assert decoded.enqueued_time == datetime(2024, 5, 1, 10, 40, tzinfo=UTC)
    assert decoded.body_size == 5


def test_our_encoding_is_read_back_by_proton_message():
    decoded = legacy_backlog_message()
    message = Message()
    message.decode(decoded.encode())
    assert bytes(message.body) == b'{"order": 1}'
    assert message.id == "msg-1"
    assert message.durable is True
    assert typed(dict(message.properties)) == typed(decoded.application_properties)
    assert typed(dict(message.annotations)) == typed(decoded.message_annotations)


# --- round trips --------------------------------------------------------------------------------

def test_round_trip_keeps_every_type():
    original = legacy_backlog_message()
    raw = original.encode()
    decoded = decode_message(raw)
    assert typed_message(decoded) == typed_message(original)
    assert decode_message(decoded.encode()).encode() == raw  # re-encoding is stable


@pytest.mark.parametrize("body_kind, body", [
    ("data", ()),
    ("data", (b"",)),
    ("data", (b"part-1", b"part-2", b"\x00" * 70_000)),
    ("value", "a string value"),
    ("value", {Symbol("k"): [Int(1), 2**40]}),
    ("value", None),
    ("value", b"binary in an amqp-value"),
    ("value", Char("\u00e9")),
    ("value", Decimal128.from_decimal(Decimal("12.50"))),
    ("value", Array("symbol", ["a", "b"])),
    ("value", Described(Symbol("com.microsoft:uri"), "https://example.com/a")),
    ("value", Described(Symbol("com.microsoft:datetime-offset"), 638500000000000000)),
    ("sequence", ([1, "two"],)),
    ("sequence", ([1], [ULong(2)])),
])
def test_round_trip_of_each_body_kind(body_kind, body):
    original = DecodedMessage(properties=MessageProperties(message_id="m"), body_kind=body_kind, body=body)
    decoded = decode_message(original.encode())
    assert typed_message(decoded) == typed_message(original)


def test_multiple_data_sections_stay_separate_and_byte_identical():
    parts = (bytes(range(256)), b"\x00\x00", b"tail")
    decoded = decode_message(DecodedMessage(body=parts).encode())
    assert decoded.body == parts
    assert all(type(part) is bytes for part in decoded.body)
    assert decoded.body_size == 256 + 2 + 4


def test_binary_values_are_real_bytes_that_outlive_the_decoder():
    decoded = decode_message(DecodedMessage(application_properties={"b": b"abc"}, body=(b"xyz",)).encode())
    assert type(decoded.application_properties["b"]) is bytes
    assert type(decoded.body[0]) is bytes
    # Decode other messages so freed C memory would be reused, then read again.
    for _ in range(50):
        decode_message(DecodedMessage(body=(b"#" * 100,)).encode())
    assert decoded.application_properties["b"] == b"abc" and decoded.body == (b"xyz",)


def test_arrays_and_nested_described_values_round_trip():
    array = Array("int", [Int(1), Int(2)])
    described_array = Array("string", ["a", "b"], descriptor=Symbol("d"))
    nested = Described(Symbol("outer"), Described(ULong(1), [b"x", {"k": Timestamp(1)}]))
    original = DecodedMessage(application_properties={"array": array, "darray": described_array, "nested": nested})
    decoded = decode_message(original.encode())
    assert typed_message(decoded) == typed_message(original)


def test_symbolic_section_descriptors_are_understood():
    raw = b"".join(encode_value(Described(Symbol(name), value)) for name, value in (
        ("amqp:properties:list", ["id-1"]), ("amqp:application-properties:map", {"k": 1}),
        ("amqp:amqp-value:*", "text"), ("amqp:footer:map", {Symbol("f"): 1})))
    decoded = decode_message(raw)
    assert (decoded.properties.message_id, decoded.application_properties, decoded.body_kind, decoded.body,
            decoded.footer) == ("id-1", {"k": 1}, "value", "text", {"f": 1})
    data = encode_value(Described(Symbol("amqp:data:binary"), b"body"))
    assert decode_message(data).body == (b"body",)
    # The 8-byte ulong form of a section code, too.
    assert decode_message(b"\x00\x80" + (0x75).to_bytes(8, "big") + b"\xa0\x01x").body == (b"x",)


def test_binary_application_property_keys_become_str():
    raw = proton_encode(proton.Described(proton.ulong(0x74), {b"x-ms-path": "orders", "k": proton.int32(1),
                                                              b"\xff": 2}))
    decoded = decode_message(raw)
    assert typed(decoded.application_properties) == typed({"x-ms-path": "orders", "k": Int(1), b"\xff": 2})


def test_plain_python_values_are_encoded_with_their_spec_types():
    message = DecodedMessage(
        header=MessageHeader(durable=1, priority=4, ttl_ms=1000, delivery_count=0),
        message_annotations={"x-opt-scheduled-enqueue-time": SCHEDULED},
        properties=MessageProperties(
            message_id=5, content_type="text/plain", creation_time=SCHEDULED, group_sequence=2
        ),
        application_properties={"when": SCHEDULED},
    )
    decoded = decode_message(message.encode())
    assert typed_message(decoded)["header"] == typed((True, UByte(4), UInt(1000), None, UInt(0)))
    assert typed(decoded.properties.message_id) == typed(ULong(5))
    assert typed(decoded.properties.content_type) == typed(Symbol("text/plain"))
    scheduled_ms = Timestamp(int(SCHEDULED.timestamp() * 1000))
    assert typed(decoded.properties.creation_time) == typed(scheduled_ms)
    assert typed(decoded.properties.group_sequence) == typed(UInt(2))
    assert typed(decoded.message_annotations) == typed({Symbol("x-opt-scheduled-enqueue-time"): scheduled_ms})
    assert typed(decoded.application_properties) == typed({"when": scheduled_ms})
    assert decoded.scheduled_enqueue_time == SCHEDULED


def test_empty_message_encodes_to_nothing_and_back():
    assert DecodedMessage().encode() == b""
    assert decode_message(b"") == DecodedMessage()


def test_decoded_message_pickles_with_types():
    decoded = decode_message(legacy_backlog_message().encode())
    assert typed_message(pickle.loads(pickle.dumps(decoded))) == typed_message(decoded)


@pytest.mark.parametrize("raw, message", [
    (b"\x00\x53", "truncated.* at byte 1"),
    (b"\xa1\x03abc", "not a described section at byte 0"),
    (b"\x00\x53\x79\x45", "unknown section descriptor at byte 1"),  # described ulong 0x79: not a section
    (b"\x00\xa3\x03abc\x45", "unknown section descriptor at byte 1"),
    (b"\x00\x53\x74\xa1\x01x", r"section 0x74 \(amqp:application-properties:map\) must hold a map or null"),
    (b"\x00\x53\x70\xa1\x01x", r"section 0x70 \(amqp:header:list\) must hold a list or null"),
    (b"\x00\x53\x75\xa1\x01x", r"section 0x75 \(amqp:data:binary\) must hold a binary at byte 3"),
    (b"\x00\x53\x77\xa1\x02\xc3\x28", "a string is not valid UTF-8 at byte 3"),
    (b"\x00\x53\x74\xc1\x05\x04\xa1\x01k\x41" + b"\x00\x53\x75\xa0\x00", "a map element is missing at byte 10"),
    (b"\x00\x53\x74\xc1\x04\x03\x41\x41\x41", r"the map has an odd number of elements \(3\) at byte 3"),
    (b"\x00\x53\x74\xc1\x09\x04\xa1\x01k\x41\xa3\x01k\x42",  # string "k" and symbol "k"
     "application property 'k' appears more than once"),
    (b"\x00\x53\x74\xc1\x04\x02\x55\x01\x41", "application property key is a long, not a string at byte 3"),
    (b"\x00\x53\x72\xc1\x09\x04\xa3\x01k\x41\xa1\x01k\x42", "section 0x72 has a key twice"),
])
def test_garbage_is_an_amqp_decode_error_with_its_offset(raw, message):
    with pytest.raises(AmqpDecodeError, match=message):
        decode_message(raw)
    with pytest.raises(AmqpDecodeError, match=message):
        decode_envelope(raw)


def test_repeated_or_mixed_sections_are_rejected():
    header = DecodedMessage(header=MessageHeader(durable=True)).encode()
    with pytest.raises(AmqpDecodeError, match="appears twice at byte 7"):
        decode_message(header + header)
    data_body = DecodedMessage(body=(b"x",)).encode()
    value_body = DecodedMessage(body_kind="value", body="x").encode()
    with pytest.raises(AmqpDecodeError, match="different kinds"):
        decode_message(data_body + value_body)
    with pytest.raises(AmqpDecodeError, match="more than one amqp-value"):
        decode_message(value_body + value_body)


@pytest.mark.parametrize("kwargs", [
    {"body_kind": "text"}, {"body": b"not a tuple"}, {"body_kind": "sequence", "body": [1]},
])
def test_invalid_message_shapes_are_rejected(kwargs):
    with pytest.raises(ValueError):
        DecodedMessage(**kwargs)


def test_unencodable_value_is_a_type_error():
    with pytest.raises(TypeError, match="cannot encode a set"):
        DecodedMessage(application_properties={"s": {1}}).encode()


# --- restored_message ---------------------------------------------------------------------------

def test_restored_message_restores_fields_and_keeps_everything_else():
    backlog = decode_message(legacy_backlog_message().encode())
    fields = decode_legacy_properties(backlog.application_properties)

    restored = decode_message(restored_message(backlog, fields, timedelta(minutes=10)).encode())

    assert restored.body == backlog.body == (b'{"order": 1}',)
    assert typed(restored.application_properties) == typed(TYPED_PROPERTIES)
    assert restored.properties == dataclasses.replace(backlog.properties, group_id="session-1")
    assert typed(restored.properties.correlation_id) == typed(uuid.UUID(int=9))
    assert typed_message(restored)["header"] == typed((True, None, UInt(600_000), None, None))
    assert restored.delivery_annotations == {}
    assert typed(restored.message_annotations) == typed({
        Symbol("x-opt-partition-key"): "pk-1",
        Symbol("x-opt-via-partition-key"): "via-1",
        Symbol("x-custom"): Int(1),
        Symbol("x-opt-scheduled-enqueue-time"): Timestamp(int(SCHEDULED.timestamp() * 1000)),
    })
    assert restored.scheduled_enqueue_time == SCHEDULED
    assert restored.partition_key == "pk-1"
    assert restored.sequence_number is None and restored.enqueued_time is None


def test_restored_message_without_session_ttl_or_schedule():
    backlog = legacy_backlog_message()
    backlog = dataclasses.replace(
        backlog,
        header=MessageHeader(ttl_ms=UInt(UINT_MAX)),
        properties=dataclasses.replace(backlog.properties, group_id=None),
        application_properties={"x-ms-path": "orders", "keep": Int(1)},
    )
    fields = decode_legacy_properties(backlog.application_properties)
    restored = restored_message(backlog, fields, None)
    assert restored.header == MessageHeader()
    assert restored.properties.group_id is None
    assert typed(restored.application_properties) == typed({"keep": Int(1)})
    assert not BROKER_OWNED_ANNOTATIONS & {str(key) for key in restored.message_annotations}
    assert "x-opt-scheduled-enqueue-time" not in restored.message_annotations


def test_restored_message_replaces_an_existing_schedule_annotation_once():
    backlog = DecodedMessage(message_annotations={Symbol("x-opt-scheduled-enqueue-time"): Timestamp(1)})
    restored = restored_message(backlog, LegacyFields("orders", scheduled_enqueue_time=SCHEDULED), None)
    assert typed(restored.message_annotations) == typed(
        {Symbol("x-opt-scheduled-enqueue-time"): Timestamp(int(SCHEDULED.timestamp() * 1000))})


def test_restored_message_does_not_modify_its_input():
    backlog = legacy_backlog_message()
    before = typed_message(backlog)
    restored_message(backlog, decode_legacy_properties(backlog.application_properties), timedelta(seconds=1))
    assert typed_message(backlog) == before


def test_restored_message_rejects_a_non_positive_ttl():
    with pytest.raises(ValueError, match="positive"):
        restored_message(DecodedMessage(), LegacyFields("orders"), timedelta(0))


def test_header_ttl_is_rounded_up_and_capped():
    assert header_ttl_ms(None) is None
    assert header_ttl_ms(timedelta(microseconds=1)) == 1
    assert header_ttl_ms(timedelta(seconds=2)) == 2000
    assert header_ttl_ms(timedelta(days=365)) == UINT_MAX


def test_restore_message_bytes_uses_the_chosen_ttl():
    raw = legacy_backlog_message().encode()
    restored = decode_message(restore_message_bytes(raw, 1234))
    assert restored.header.ttl_ms == 1234
    assert restored.properties.group_id == "session-1"
    assert "x-ms-path" not in restored.application_properties
    assert decode_message(restore_message_bytes(raw, None)).header.ttl_ms is None


def test_restore_message_bytes_refuses_messages_with_legacy_problems():
    raw = DecodedMessage(application_properties={"x-ms-sessionid": 5}).encode()
    with pytest.raises(LegacyPropertiesError, match="x-ms-path is missing.*x-ms-sessionid must be a string") as error:
        restore_message_bytes(raw, None)
    assert [problem.code for problem in error.value.problems] == ["missing_path", "invalid_legacy_property"]


# --- multi-section bodies ----------------------------------------------------------------------

def test_hand_built_multi_section_bodies_decode_to_one_part_per_section():
    properties = encode_section(SectionCode.PROPERTIES, encode_value(["id-1"]))
    data = b"".join(encode_section(SectionCode.DATA, encode_value(part)) for part in (b"one", b"", b"t" * 300))
    footer = encode_section(SectionCode.FOOTER, encode_value({Symbol("f"): Int(1)}))
    decoded = decode_message(properties + data + footer)
    assert typed_message(decoded) == typed_message(DecodedMessage(
        properties=MessageProperties(message_id="id-1"), body=(b"one", b"", b"t" * 300),
        footer={Symbol("f"): Int(1)}))
    assert decoded.body_size == decode_envelope(properties + data + footer).body_size == 303

    sequences = b"".join(encode_section(SectionCode.AMQP_SEQUENCE, encode_value(part))
                         for part in ([Int(1), "two"], [], [Array("symbol", ["s"])]))
    decoded = decode_message(sequences)
    assert typed_message(decoded) == typed_message(DecodedMessage(
        body_kind="sequence", body=([Int(1), "two"], [], [Array("symbol", ["s"])])))
    assert decode_envelope(sequences).body_size == len(sequences) == decoded.body_size


def test_decode_envelope_reads_everything_but_the_body_and_measures_it():
    raw = legacy_backlog_message().encode()
    envelope = decode_envelope(raw)
    decoded = decode_message(raw)
    assert (envelope.body_kind, envelope.body_size) == ("data", 12)
    envelope_parts = typed_message(dataclasses.replace(decoded, **{
        name: getattr(envelope, name) for name in ("header", "delivery_annotations", "message_annotations",
                                                   "properties", "application_properties", "footer")}))
    assert envelope_parts == typed_message(decoded)
    assert (envelope.sequence_number, envelope.enqueued_time) == (42, datetime(2024, 5, 1, 10, 40, tzinfo=UTC))


# --- restore_message_bytes splices ---------------------------------------------------------------

LEGACY = {
    "x-ms-path": "orders",
    "x-ms-sessionid": "session-1",
    "x-ms-timetolive": Described(TIMESPAN, 15 * 60 * 10_000_000),
    "x-ms-scheduledenqueuetimeutc": Timestamp.from_datetime(SCHEDULED),
}


def _proton_backlog_message(**kwargs) -> bytes:
    """A backlog copy encoded by proton (wide list and map forms, a value body)."""
    message = Message(body=kwargs.pop("body", {proton.symbol("k"): [proton.char("c")]}), inferred=False,
                      properties=to_proton({**LEGACY, "array": Array("long", [1, 2]), "keep": Int(7)}))
    message.annotations = {proton.symbol("x-opt-sequence-number"): 12,
                           proton.symbol("x-opt-partition-key"): "pk"}
    message.id = proton.ulong(77)
    message.group_id = "stale"
    message.ttl = 90.0
    message.durable = True
    message.delivery_count = 4
    message.priority = 7
    return bytes(message.encode())


def _varied_backlog_messages() -> dict[str, bytes]:
    full = legacy_backlog_message()
    with_footer = dataclasses.replace(full, footer={Symbol("x-footer"): "f"}, body=(b"part-1", b"part-2"))
    binary_keys = DecodedMessage(application_properties={
        b"x-ms-path": b"orders", b"x-ms-sessionid": "s-2", b"other": Symbol("kept"), "x": 1})
    symbol_keys = DecodedMessage(application_properties={
        Symbol("x-ms-path"): "a/b/topic", Symbol("x-ms-timetolive"): 5_000_000_000, Symbol("sym"): Char("c")})
    value_body = DecodedMessage(
        header=MessageHeader(priority=UByte(4), first_acquirer=True),
        message_annotations={Symbol("x-opt-scheduled-enqueue-time"): Timestamp(1),
                             Symbol("x-opt-enqueued-time"): Timestamp(5)},
        properties=MessageProperties(message_id=uuid.UUID(int=3), group_id="original-session"),
        application_properties={"x-ms-path": "orders",
                                "x-ms-scheduledenqueuetimeutc": Timestamp.from_datetime(SCHEDULED)},
        body_kind="value",
        body={"decimal": Decimal128.from_decimal(Decimal("1.50")), "char": Char("x"), "list": [Int(1), "two"],
              "array": Array("int", [1, 2]), "uri": Described(Symbol("com.microsoft:uri"), "https://example.com/"),
              "offset": Described(Symbol("com.microsoft:datetime-offset"), 638500000000000000),
              "span": Described(TIMESPAN, 10_000_000)},
        footer={Symbol("f"): Array("symbol", ["a"])})
    sequences = DecodedMessage(application_properties={"x-ms-path": "orders", "x-ms-sessionid": ""},
                               body_kind="sequence", body=([1], [ULong(2), None]))
    only_path = DecodedMessage(application_properties={"x-ms-path": "orders"})
    future_header = [True, None, UInt(5), None, UInt(2), "a field of a later protocol revision"]
    extra_header_field = encode_section(SectionCode.HEADER, encode_value(future_header)) + only_path.encode()
    null_sections = (encode_section(SectionCode.HEADER, b"\x40") + encode_section(SectionCode.PROPERTIES, b"\x40")
                     + encode_section(SectionCode.MESSAGE_ANNOTATIONS, b"\x40")
                     + DecodedMessage(application_properties=LEGACY).encode())
    symbolic_out_of_order = b"".join(encode_value(Described(Symbol(name), value)) for name, value in (
        ("amqp:data:binary", b"body"), ("amqp:application-properties:map", LEGACY),
        ("amqp:properties:list", ["id", None, "to"]), ("amqp:header:list", [False]),
        ("amqp:footer:map", {Symbol("f"): 1})))
    return {
        "full": full.encode(), "footer-two-data": with_footer.encode(), "binary-keys": binary_keys.encode(),
        "symbol-keys": symbol_keys.encode(), "value-body": value_body.encode(), "sequences": sequences.encode(),
        "only-path": only_path.encode(), "extra-header-field": extra_header_field, "null-sections": null_sections,
        "symbolic-out-of-order": symbolic_out_of_order, "proton": _proton_backlog_message(),
        "proton-data": _proton_backlog_message(body=b"payload"),
    }


VARIED = _varied_backlog_messages()


@pytest.mark.parametrize("ttl_ms", [None, 1234, UINT_MAX + 1])
@pytest.mark.parametrize("name", VARIED)
def test_spliced_bytes_decode_to_the_restored_message(name, ttl_ms):
    raw = VARIED[name]
    decoded = decode_message(raw)
    fields = decode_legacy_properties(decoded.application_properties)
    expected = restored_message(decoded, fields, None if ttl_ms is None else timedelta(milliseconds=ttl_ms))

    spliced = restore_message_bytes(raw, ttl_ms)

    assert typed_message(decode_message(spliced)) == typed_message(expected)
    # Body sections and the footer are the same bytes, in the same order.
    kept = [raw[s.start:s.end] for s in split_sections(raw) if s.code in BODY_SECTIONS or s.code == SectionCode.FOOTER]
    assert [spliced[s.start:s.end] for s in split_sections(spliced)
            if s.code in BODY_SECTIONS or s.code == SectionCode.FOOTER] == kept


@pytest.mark.parametrize("from_dead_letters", [False, True])
@pytest.mark.parametrize("name", VARIED)
def test_a_send_tasks_splice_of_a_message_the_source_read_whole_gives_the_same_bytes(name, from_dead_letters):
    """The send task restores a deliverable row's message with the legacy fields its row carries (decoded by
    the source from the same bytes, which it read whole): nothing is decoded again but framing and keys."""
    from backlog_syphon.restore.backlog_rows import backlog_row_values
    from backlog_syphon.restore.legacy_properties import LegacyFields

    raw = VARIED[name]
    row = backlog_row_values("contoso/x-servicebus-transfer/0", raw)
    assert row["decode_problem_code"] is None
    checked = LegacyFields(session_id=row["session_id"], scheduled_enqueue_time=row["scheduled_enqueue_time"])
    for ttl_ms in (None, 1234):
        assert restore_message_bytes(raw, ttl_ms, from_dead_letters=from_dead_letters, checked=checked) == \
            restore_message_bytes(raw, ttl_ms, from_dead_letters=from_dead_letters)


def test_splice_keeps_untouched_entries_byte_for_byte():
    raw = _proton_backlog_message()
    spliced = restore_message_bytes(raw, 1000)
    raw_entries = {str(e.key): raw[e.start:e.end] for s in split_sections(raw)
                   if s.code == SectionCode.APPLICATION_PROPERTIES for e in map_entries(raw, s.value_start)}
    spliced_entries = {str(e.key): spliced[e.start:e.end] for s in split_sections(spliced)
                       if s.code == SectionCode.APPLICATION_PROPERTIES for e in map_entries(spliced, s.value_start)}
    assert set(spliced_entries) == {"array", "keep"}
    assert spliced_entries == {key: raw_entries[key] for key in ("array", "keep")}
    # proton wrote the array in its wide form; re-encoding would have made it compact
    assert encode_value(decode_message(raw).application_properties["array"]) not in spliced_entries["array"]
    annotations = [spliced[e.start:e.end] for s in split_sections(spliced)
                   if s.code == SectionCode.MESSAGE_ANNOTATIONS for e in map_entries(spliced, s.value_start)]
    assert annotations[0] == encode_value(Symbol("x-opt-partition-key")) + encode_value("pk")
    assert len(annotations) == 2  # the partition key, and the schedule


@pytest.mark.parametrize("splice", [True, False], ids=["restore_message_bytes", "restored_message"])
def test_a_copy_from_a_partitioned_queue_loses_the_brokers_annotations_and_keeps_its_partition_key(splice):
    # What a partitioned backlog queue's broker adds on delivery names the backlog's partition and position,
    # not the destination's: the destination chooses its partition from the message's own keys.
    backlog = dataclasses.replace(legacy_backlog_message(), message_annotations={
        Symbol("x-opt-sequence-number"): (3 << 48) | 9,
        Symbol("x-opt-enqueued-time"): Timestamp(ENQUEUED_MS),
        Symbol("x-opt-partition-id"): Short(3),
        Symbol("x-opt-offset"): "12345",
        Symbol("x-opt-locked-until"): Timestamp(ENQUEUED_MS + 60_000),
        Symbol("x-opt-enqueue-sequence-number"): 7,
        Symbol("x-opt-message-state"): Int(0),
        Symbol("x-opt-partition-key"): "session-1",
        Symbol("x-custom"): Int(1),
    })
    if splice:
        restored = decode_message(restore_message_bytes(backlog.encode(), 60_000))
    else:
        restored = restored_message(decode_message(backlog.encode()),
                                    decode_legacy_properties(backlog.application_properties), timedelta(minutes=1))
    annotations = {str(key) for key in restored.message_annotations}
    assert annotations == {"x-opt-partition-key", "x-custom", "x-opt-scheduled-enqueue-time"}
    assert restored.partition_key == "session-1"
    assert {"x-opt-partition-id", "x-opt-offset"} <= BROKER_OWNED_ANNOTATIONS


def test_splice_copies_the_properties_section_when_the_session_is_not_restored():
    raw = dataclasses.replace(legacy_backlog_message(), application_properties={"x-ms-path": "orders"}).encode()
    properties = next(raw[s.start:s.end] for s in split_sections(raw) if s.code == SectionCode.PROPERTIES)
    assert properties in restore_message_bytes(raw, None)


def test_restore_message_bytes_refuses_what_decode_message_refuses():
    valid = DecodedMessage(application_properties={"x-ms-path": "orders"}).encode()
    for broken in (valid + b"\x00\x53\x77\xa1\x01\xff", valid + b"\x00\x53\x76\x45\x00",
                   encode_section(SectionCode.DELIVERY_ANNOTATIONS, b"\xc1\x02\x01\x40") + valid):
        with pytest.raises(AmqpDecodeError) as from_decode:
            decode_message(broken)
        with pytest.raises(AmqpDecodeError) as from_restore:
            restore_message_bytes(broken, None)
        assert str(from_restore.value) == str(from_decode.value)
    with pytest.raises(ValueError, match="positive"):
        restore_message_bytes(valid, 0)


def test_every_truncation_of_a_message_is_refused_except_at_section_boundaries():
    raw = _proton_backlog_message()
    boundaries = {section.start for section in split_sections(raw)}
    for cut in range(len(raw)):
        if cut in boundaries:
            decode_message(raw[:cut])  # a shorter message, but a message
            continue
        for read in (decode_message, decode_envelope, lambda b: restore_message_bytes(b, None)):
            with pytest.raises(AmqpDecodeError, match=r"at byte \d+$"):
                read(raw[:cut])
