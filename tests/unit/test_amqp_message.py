"""Raw AMQP bytes <-> DecodedMessage: type fidelity, body sections, and the restored copy."""

import dataclasses
import pickle
import uuid
from datetime import datetime, timedelta, timezone

import proton
import pytest
from proton import Data, Described, Message, symbol

from backlog_syphon.amqp_message import (
    BROKER_OWNED_ANNOTATIONS,
    UINT_MAX,
    DecodedMessage,
    MessageHeader,
    MessageProperties,
    decode_message,
    header_ttl_ms,
    restore_message_bytes,
    restored_message,
)
from backlog_syphon.legacy_properties import LegacyFields, decode_legacy_properties

UTC = timezone.utc
TIMESPAN = symbol("com.microsoft:timespan")
ENQUEUED_MS = 1714560000000
SCHEDULED = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)

TYPED_PROPERTIES = {
    "long": 2**40,
    "small-long": 5,
    "int": proton.int32(-7),
    "ulong": proton.ulong(2**64 - 1),
    "uint": proton.uint(9),
    "short": proton.short(-3),
    "ubyte": proton.ubyte(255),
    "symbol": symbol("sym"),
    "string": "text",
    "timestamp": proton.timestamp(ENQUEUED_MS),
    "described": Described(TIMESPAN, 600_000_000),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "binary": b"\x00\xff\x10",
    "double": 1.25,
    "float": proton.float32(0.5),
    "bool": True,
    "char": proton.char("z"),
    "null": None,
    "list": [proton.int32(1), "two", b"3"],
    "map": {symbol("k"): proton.ulong(1)},
}


def typed(value):
    """A value with every nested type spelled out, so equality also compares AMQP types."""
    if isinstance(value, Described):
        return ("described", typed(value.descriptor), typed(value.value))
    if isinstance(value, dict):
        return ("map", tuple((typed(k), typed(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(typed(item) for item in value))
    if isinstance(value, proton.Array):
        return ("array", typed(value.descriptor), value.type, tuple(typed(e) for e in value.elements))
    return (type(value), value)


def typed_message(message: DecodedMessage):
    return {
        "header": typed(list(dataclasses.astuple(message.header))),
        "delivery_annotations": typed(message.delivery_annotations),
        "message_annotations": typed(message.message_annotations),
        "properties": typed(list(dataclasses.astuple(message.properties))),
        "application_properties": typed(message.application_properties),
        "body_kind": message.body_kind,
        "body": typed(message.body),
        "footer": typed(message.footer),
    }


def legacy_backlog_message(**application_properties) -> DecodedMessage:
    """A backlog copy as the legacy client and the broker leave it."""
    return DecodedMessage(
        header=MessageHeader(durable=True, delivery_count=proton.uint(3)),
        delivery_annotations={symbol("x-opt-lock-token"): uuid.UUID(int=5)},
        message_annotations={
            symbol("x-opt-sequence-number"): 42,
            symbol("x-opt-enqueued-time"): proton.timestamp(ENQUEUED_MS),
            symbol("x-opt-locked-until"): proton.timestamp(ENQUEUED_MS + 60_000),
            symbol("x-opt-enqueue-sequence-number"): 7,
            symbol("x-opt-message-state"): proton.int32(0),
            symbol("x-opt-deadletter-source"): "elsewhere",
            symbol("x-opt-partition-key"): "pk-1",
            symbol("x-opt-via-partition-key"): "via-1",
            symbol("x-custom"): proton.int32(1),
        },
        properties=MessageProperties(
            message_id="msg-1", to="orders", subject="label", reply_to="replies", correlation_id=uuid.UUID(int=9),
            content_type=symbol("application/json"), reply_to_group_id="reply-session",
        ),
        application_properties={
            "x-ms-path": "orders",
            "x-ms-sessionid": "session-1",
            "x-ms-timetolive": Described(TIMESPAN, 15 * 60 * 10_000_000),
            "x-ms-scheduledenqueuetimeutc": proton.timestamp(int(SCHEDULED.timestamp() * 1000)),
            **TYPED_PROPERTIES,
        },
        body=(b'{"order": 1}',),
    )


# --- decode of bytes written by proton's own Message encoder ------------------------------------

def test_decode_message_written_by_proton_message():
    message = Message(body=b"hello", properties=dict(TYPED_PROPERTIES), inferred=True)
    message.id = proton.ulong(77)
    message.correlation_id = "corr"
    message.subject = "label"
    message.content_type = "text/plain"
    message.group_id = "session-1"
    message.reply_to_group_id = "reply-session"
    message.ttl = 90.0
    message.durable = True
    message.annotations = {
        symbol("x-opt-sequence-number"): 12,
        symbol("x-opt-enqueued-time"): proton.timestamp(ENQUEUED_MS),
    }

    decoded = decode_message(bytes(message.encode()))

    assert decoded.body_kind == "data"
    assert decoded.body == (b"hello",)
    assert typed(decoded.application_properties) == typed(TYPED_PROPERTIES)
    assert (decoded.header.durable, decoded.header.ttl_ms) == (True, 90_000)
    assert typed(decoded.properties.message_id) == typed(proton.ulong(77))
    assert typed(decoded.properties.content_type) == typed(symbol("text/plain"))
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
    assert typed(message.properties["long"]) == typed(2**40)
    assert typed(message.properties["described"]) == typed(Described(TIMESPAN, 600_000_000))


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
    ("value", {symbol("k"): [proton.int32(1), 2**40]}),
    ("value", None),
    ("value", b"binary in an amqp-value"),
    ("sequence", ([1, "two"],)),
    ("sequence", ([1], [proton.ulong(2)])),
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
    array = proton.Array(proton.UNDESCRIBED, Data.INT, proton.int32(1), proton.int32(2))
    described_array = proton.Array(symbol("d"), Data.STRING, "a", "b")
    nested = Described(symbol("outer"), Described(proton.ulong(1), [b"x", {"k": proton.timestamp(1)}]))
    original = DecodedMessage(application_properties={"array": array, "darray": described_array, "nested": nested})
    decoded = decode_message(original.encode())
    assert typed_message(decoded) == typed_message(original)


def test_symbolic_section_descriptors_are_understood():
    data = Data()
    for name, value in (("amqp:properties:list", ["id-1"]), ("amqp:data:binary", b"body")):
        data.put_object(Described(symbol(name), value))
    decoded = decode_message(bytes(data.encode()))
    assert (decoded.properties.message_id, decoded.body) == ("id-1", (b"body",))


def test_binary_application_property_keys_become_str():
    data = Data()
    data.put_object(Described(proton.ulong(0x74), {b"x-ms-path": "orders", "k": proton.int32(1)}))
    decoded = decode_message(bytes(data.encode()))
    assert typed(decoded.application_properties) == typed({"x-ms-path": "orders", "k": proton.int32(1)})


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
    assert typed(list(dataclasses.astuple(decoded.header))) == typed(
        [True, proton.ubyte(4), proton.uint(1000), None, proton.uint(0)])
    assert typed(decoded.properties.message_id) == typed(proton.ulong(5))
    assert typed(decoded.properties.content_type) == typed(symbol("text/plain"))
    scheduled_ms = proton.timestamp(int(SCHEDULED.timestamp() * 1000))
    assert typed(decoded.properties.creation_time) == typed(scheduled_ms)
    assert typed(decoded.properties.group_sequence) == typed(proton.uint(2))
    assert typed(decoded.message_annotations) == typed({symbol("x-opt-scheduled-enqueue-time"): scheduled_ms})
    assert typed(decoded.application_properties) == typed({"when": scheduled_ms})
    assert decoded.scheduled_enqueue_time == SCHEDULED


def test_empty_message_encodes_to_nothing_and_back():
    assert DecodedMessage().encode() == b""
    assert decode_message(b"") == DecodedMessage()


def test_decoded_message_pickles_with_types():
    decoded = decode_message(legacy_backlog_message().encode())
    assert typed_message(pickle.loads(pickle.dumps(decoded))) == typed_message(decoded)


@pytest.mark.parametrize("raw, message", [
    (b"\x00\x53", "cannot decode"),
    (b"\xa1\x03abc", "not a described section"),
    (b"\x00\x53\x79\x45", "unknown section descriptor"),  # described ulong 0x79: not a section
    (b"\x00\x53\x74\xa1\x01x", "section 0x74 must be a dict"),  # application properties as a string
    (b"\x00\x53\x70\xa1\x01x", "section 0x70 must be a list"),  # header as a string
    (b"\x00\x53\x75\xa1\x01x", "data body must be a tuple of bytes"),  # Data section holding a string
])
def test_garbage_is_a_value_error(raw, message):
    with pytest.raises(ValueError, match=message):
        decode_message(raw)


def test_repeated_or_mixed_sections_are_rejected():
    header = DecodedMessage(header=MessageHeader(durable=True)).encode()
    with pytest.raises(ValueError, match="appears twice"):
        decode_message(header + header)
    data_body = DecodedMessage(body=(b"x",)).encode()
    value_body = DecodedMessage(body_kind="value", body="x").encode()
    with pytest.raises(ValueError, match="different kinds"):
        decode_message(data_body + value_body)


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
    assert restored.header == MessageHeader(durable=True, ttl_ms=600_000)
    assert restored.delivery_annotations == {}
    assert typed(restored.message_annotations) == typed({
        symbol("x-opt-partition-key"): "pk-1",
        symbol("x-opt-via-partition-key"): "via-1",
        symbol("x-custom"): proton.int32(1),
        symbol("x-opt-scheduled-enqueue-time"): proton.timestamp(int(SCHEDULED.timestamp() * 1000)),
    })
    assert restored.scheduled_enqueue_time == SCHEDULED
    assert restored.partition_key == "pk-1"
    assert restored.sequence_number is None and restored.enqueued_time is None


def test_restored_message_without_session_ttl_or_schedule():
    backlog = legacy_backlog_message()
    backlog = dataclasses.replace(
        backlog,
        header=MessageHeader(ttl_ms=proton.uint(UINT_MAX)),
        properties=dataclasses.replace(backlog.properties, group_id=None),
        application_properties={"x-ms-path": "orders", "keep": proton.int32(1)},
    )
    fields = decode_legacy_properties(backlog.application_properties)
    restored = restored_message(backlog, fields, None)
    assert restored.header == MessageHeader()
    assert restored.properties.group_id is None
    assert typed(restored.application_properties) == typed({"keep": proton.int32(1)})
    assert not BROKER_OWNED_ANNOTATIONS & {str(key) for key in restored.message_annotations}
    assert "x-opt-scheduled-enqueue-time" not in restored.message_annotations


def test_restored_message_replaces_an_existing_schedule_annotation_once():
    backlog = DecodedMessage(message_annotations={symbol("x-opt-scheduled-enqueue-time"): proton.timestamp(1)})
    restored = restored_message(backlog, LegacyFields("orders", scheduled_enqueue_time=SCHEDULED), None)
    assert list(restored.message_annotations.values()) == [proton.timestamp(int(SCHEDULED.timestamp() * 1000))]


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
    with pytest.raises(ValueError, match="x-ms-path is missing.*x-ms-sessionid must be a string"):
        restore_message_bytes(raw, None)
