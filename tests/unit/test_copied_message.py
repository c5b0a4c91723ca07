"""The copy a migration sends: the stored message as its sender wrote it, its absolute expiry kept, the broker's
fields dropped (or kept as provenance), byte for byte everywhere else."""

from __future__ import annotations

import pytest

from backlog_syphon.model import ExpiredBeforeSendError
from backlog_syphon.restore.amqp.message import DecodedMessage, MessageHeader, MessageProperties
from backlog_syphon.restore.amqp.message_decoding import decode_message
from backlog_syphon.restore.amqp.sections import split_sections
from backlog_syphon.restore.amqp.values import Char, Int, Symbol, Timestamp, UInt, UShort
from backlog_syphon.restore.copied_message import Additions, copy_message_bytes, remaining_ttl_ms

ENQUEUED = 1_800_000_000_000
SCHEDULED_AT = ENQUEUED + 3_600_000


def stored(*, ttl_ms=60_000, state=0, application=None, scheduled=None, body=(b"payload", b" more")) -> bytes:
    """A message as a peek returns it: the sender's sections, and the broker's annotations and header fields."""
    annotations = {Symbol("x-opt-sequence-number"): 42, Symbol("x-opt-enqueued-time"): Timestamp(ENQUEUED),
                   Symbol("x-opt-partition-id"): UShort(3), Symbol("x-opt-locked-until"): Timestamp(ENQUEUED + 9),
                   Symbol("x-opt-message-state"): Int(state), Symbol("x-opt-partition-key"): "tenant-1",
                   Symbol("x-sender-own"): Char("x")}
    if scheduled is not None:
        annotations[Symbol("x-opt-scheduled-enqueue-time")] = Timestamp(scheduled)
    message = DecodedMessage(
        header=MessageHeader(durable=True, priority=None if ttl_ms else None,
                             ttl_ms=None if ttl_ms is None else UInt(ttl_ms), delivery_count=UInt(2)),
        message_annotations=annotations,
        properties=MessageProperties(message_id="m-1", correlation_id="c-1", subject="order", reply_to="replies",
                                     content_type=Symbol("application/json"), group_id="s-1", reply_to_group_id="r-1",
                                     to="orders"),
        application_properties=application if application is not None else {"n": Int(7), "k": "v"},
        body=body)
    return message.encode()


def section_bytes(raw: bytes, code) -> bytes | None:
    found = [raw[section.start:section.end] for section in split_sections(raw) if section.code == code]
    return found[0] if found else None


def test_every_field_of_the_sender_is_copied_byte_for_byte_and_the_brokers_own_are_dropped():
    from backlog_syphon.restore.amqp.message import APPLICATION_PROPERTIES, DATA, PROPERTIES

    raw = stored()
    copy = copy_message_bytes(raw, now_ms=ENQUEUED + 15_000)
    for code in (PROPERTIES, APPLICATION_PROPERTIES):
        assert section_bytes(copy, code) == section_bytes(raw, code)
    assert [copy[s.start:s.end] for s in split_sections(copy) if s.code == DATA] == [
        raw[s.start:s.end] for s in split_sections(raw) if s.code == DATA]
    decoded = decode_message(copy)
    assert decoded.message_annotations == {Symbol("x-opt-partition-key"): "tenant-1", Symbol("x-sender-own"): Char("x")}
    assert (decoded.header.durable, decoded.header.delivery_count) == (True, None)
    assert decoded.header.ttl_ms == UInt(45_000)  # what was left: the absolute expiry is the original's


def test_a_scheduled_message_keeps_its_time_to_live_and_its_time_and_one_without_ttl_gets_none():
    scheduled = decode_message(copy_message_bytes(stored(state=2, scheduled=SCHEDULED_AT), now_ms=ENQUEUED + 90_000))
    assert scheduled.header.ttl_ms == UInt(60_000)  # its clock starts when it becomes active
    assert scheduled.message_annotations[Symbol("x-opt-scheduled-enqueue-time")] == Timestamp(SCHEDULED_AT)
    assert decode_message(copy_message_bytes(stored(ttl_ms=None), now_ms=ENQUEUED + 10**9)).header.ttl_ms is None


def test_an_expired_message_is_not_built_and_the_remaining_time_is_never_zero():
    with pytest.raises(ExpiredBeforeSendError, match="expired 1 ms before it was sent"):
        copy_message_bytes(stored(), now_ms=ENQUEUED + 60_001)
    assert remaining_ttl_ms(ENQUEUED, 60_000, ENQUEUED + 60_000) is None
    assert remaining_ttl_ms(ENQUEUED, 60_000, ENQUEUED + 59_999) == 1


def test_a_dead_lettered_message_loses_the_brokers_reasons_and_provenance_keeps_them_with_their_types():
    application = {"n": Int(7), "DeadLetterReason": "Poison", "DeadLetterErrorDescription": "the consumer gave up"}
    copy = decode_message(copy_message_bytes(stored(application=application), now_ms=ENQUEUED,
                                             additions=Additions(source_entity="orders/$DeadLetterQueue"),
                                             from_dead_letters=True))
    assert copy.application_properties == {
        "n": Int(7), "x-syphon-source-entity": "orders/$DeadLetterQueue", "x-syphon-original-sequence-number": 42,
        "x-syphon-original-enqueued-time": Timestamp(ENQUEUED), "x-syphon-original-delivery-count": UInt(2),
        "x-syphon-dead-letter-reason": "Poison", "x-syphon-dead-letter-error-description": "the consumer gave up"}
    assert type(copy.application_properties["x-syphon-original-sequence-number"]) is int  # an AMQP long


def test_a_routes_property_is_added_and_a_property_the_message_has_keeps_its_value():
    added = decode_message(copy_message_bytes(stored(), now_ms=ENQUEUED,
                                              additions=Additions(property_name="x-syphon-subscription",
                                                                  property_value="eu")))
    assert added.application_properties == {"n": Int(7), "k": "v", "x-syphon-subscription": "eu"}
    kept = decode_message(copy_message_bytes(stored(application={"x-syphon-subscription": "own"}), now_ms=ENQUEUED,
                                             additions=Additions(property_name="x-syphon-subscription",
                                                                 property_value="eu")))
    assert kept.application_properties == {"x-syphon-subscription": "own"}


def test_value_and_sequence_bodies_are_copied_as_they_are():
    from backlog_syphon.restore.amqp.message import AMQP_VALUE

    value = DecodedMessage(body_kind="value", body={"a": [Int(1), "two"]},
                           message_annotations={Symbol("x-opt-enqueued-time"): Timestamp(ENQUEUED)})
    raw = value.encode()
    assert section_bytes(copy_message_bytes(raw, now_ms=ENQUEUED), AMQP_VALUE) == section_bytes(raw, AMQP_VALUE)
