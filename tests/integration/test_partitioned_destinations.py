"""Partitioned destinations, end to end (emulator, Spark, Delta): an available-now run into a partitioned
queue and a partitioned queue with duplicate detection delivers every message once, each session's in
order, dead-letters nothing, keeps every partition key and forwards no backlog broker's partition id,
both where the administration API describes the destinations (the shape known up front) and where it
does not answer (the first refused batch teaches the sender)."""

from __future__ import annotations

import dataclasses

import pytest
from tools import backlog_writer
from tools.backlog_writer import OriginalMessage
from tools.testing import backlog_dead_letters, drain_destinations

from backlog_syphon.model import Outcome
from backlog_syphon.restore.amqp.message_decoding import decode_message
from backlog_syphon.restore.amqp.values import Short, Symbol
from backlog_syphon.restore.queue_names import backlog_queue_names
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.storage import delta

from .conftest import PRIMARY, make_config
from .helpers import free_port

BACKLOG_QUEUES = backlog_queue_names(PRIMARY, 10)[:2]
PARTITIONED, DEDUPE, PLAIN = "partitioned-orders", "partitioned-dedupe-orders", "orders"
# What a partitioned backlog queue's broker leaves on each copy it hands out: a partition of the *backlog*
# queue, which the syphon must not forward.
BACKLOG_PARTITION_ID = 7


def _originals(destination: str, queue_index: int) -> list[OriginalMessage]:
    """Per destination and backlog queue: three sessions (one with a partition key equal to its SessionId, as
    Service Bus requires), two partition keys and key-less messages, interleaved as a backlog holds them."""
    kinds = [("s1", None), (None, None), ("s2", None), (None, "k1"), ("s3", None), (None, None), (None, "k2")]
    originals = []
    for index in range(10 * len(kinds)):
        session, key = kinds[index % len(kinds)]
        prefix = f"{destination}-q{queue_index}"
        originals.append(OriginalMessage(destination, f"{prefix}-{index}".encode(), message_id=f"{prefix}-{index}",
                                         session_id=None if session is None else f"{prefix}-{session}",
                                         partition_key=(f"{prefix}-{session}" if session == "s1" else
                                                        None if key is None else f"{prefix}-{key}")))
    return originals


def _write_backlog(config, monkeypatch) -> dict[str, list[OriginalMessage]]:
    """Each backlog queue gets its share of every destination, interleaved; each copy carries a partition id
    as a partitioned backlog queue's copies do."""
    per_queue: dict[str, list[OriginalMessage]] = {}
    for index, queue in enumerate(BACKLOG_QUEUES):
        by_destination = [_originals(destination, index) for destination in (PARTITIONED, DEDUPE)]
        plain = [OriginalMessage(PLAIN, f"plain-q{index}-{n}".encode(), message_id=f"plain-q{index}-{n}")
                 for n in range(20)]
        per_queue[queue] = [m for trio in zip(*by_destination) for m in trio] + plain
    original_bytes = backlog_writer.legacy_backlog_bytes

    def with_backlog_partition_id(original: OriginalMessage) -> bytes:
        decoded = decode_message(original_bytes(original))
        annotations = {**decoded.message_annotations, Symbol("x-opt-partition-id"): Short(BACKLOG_PARTITION_ID)}
        return dataclasses.replace(decoded, message_annotations=annotations).encode()

    with monkeypatch.context() as patch:
        patch.setattr(backlog_writer, "legacy_backlog_bytes", with_backlog_partition_id)
        backlog_writer.send_legacy_backlog(config.secondary, per_queue)
    return {destination: [m for queue in BACKLOG_QUEUES for m in per_queue[queue] if m.destination == destination]
            for destination in (PARTITIONED, DEDUPE, PLAIN)}


def _annotation(message, name: str):
    return (message.raw_amqp_message.annotations or {}).get(name.encode())


def _assert_delivered_once_in_order(spark, emulator, config, originals: dict[str, list[OriginalMessage]]):
    drained = drain_destinations(emulator.connection_string(PRIMARY), list(originals))
    for destination, sent in originals.items():
        received = drained[destination]
        # every message once
        assert sorted(m.message_id for m in received) == sorted(m.message_id for m in sent), destination
        by_id = {m.message_id: m for m in sent}
        # each session's (and partition key's) messages in the order the backlog held them
        order: dict[str, list[str]] = {}
        for message in received:
            original = by_id[message.message_id]
            assert message.session_id == original.session_id
            assert message.partition_key == original.partition_key  # kept where the original carried one
            key = original.session_id or original.partition_key
            if key is not None:
                order.setdefault(key, []).append(message.message_id)
        for key, ids in order.items():
            assert ids == [m.message_id for m in sent if (m.session_id or m.partition_key) == key], key
        # the backlog's partition id is not forwarded: a non-partitioned destination shows none, a partitioned
        # one its own, the same for all of a key's messages
        if destination == PLAIN:
            assert {_annotation(m, "x-opt-partition-id") for m in received} == {None}
        else:
            partitions: dict[str, set] = {}
            for message in received:
                key = by_id[message.message_id].session_id or by_id[message.message_id].partition_key
                if key is not None:
                    partitions.setdefault(key, set()).add(_annotation(message, "x-opt-partition-id"))
            assert all(len(ids) == 1 for ids in partitions.values()), partitions
            assert {next(iter(ids)) for ids in partitions.values()} != {BACKLOG_PARTITION_ID}
    stats = emulator.stats(PRIMARY)
    assert stats[DEDUPE]["duplicates"] == 0  # nothing was sent twice
    # nothing dead-lettered, every row delivered
    assert backlog_dead_letters(config.secondary, BACKLOG_QUEUES) == []
    audit = delta.read_table(spark, config.storage.audit_table).collect()
    assert len(audit) == sum(len(sent) for sent in originals.values())
    assert {row.outcome for row in audit} == {Outcome.DELIVERED}
    assert {row.reason_code for row in audit} == {None}
    return stats


def _precondition_backlog_copies_carry_a_partition_id(config):
    from backlog_syphon.servicebus.clients import open_client
    from backlog_syphon.servicebus.sdk_internals import peek_stored_bytes, prompt

    with open_client(config.secondary, role="secondary") as client:
        with prompt(client.get_queue_receiver(BACKLOG_QUEUES[0])) as receiver:
            stored = peek_stored_bytes(receiver, 1, 1)
    annotations = {str(key): value for key, value in decode_message(stored[0]).message_annotations.items()}
    assert annotations.get("x-opt-partition-id") == BACKLOG_PARTITION_ID


def test_partitioned_destinations_described_by_the_administration_api_get_their_shape_up_front(
        emulator, tmp_path, spark, monkeypatch):
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 2, "sink.outage_wait_seconds": 3600})
    originals = _write_backlog(config, monkeypatch)
    _precondition_backlog_copies_carry_a_partition_id(config)
    sends_before = {d: emulator.stats(PRIMARY)[d]["ops"].get("send", 0) for d in (PARTITIONED, DEDUPE)}

    summary = run_syphon(spark, config)

    assert summary.drained
    stats = _assert_delivered_once_in_order(spark, emulator, config, originals)
    sends = {d: stats[d]["ops"].get("send", 0) - sends_before[d] for d in (PARTITIONED, DEDUPE)}
    # batched per key into the partitioned queue; one send per message, none refused, into the deduplicating one
    assert sends[PARTITIONED] <= len(originals[PARTITIONED]) // 10
    assert sends[DEDUPE] == len(originals[DEDUPE])


def test_a_destination_whose_administration_api_does_not_answer_learns_its_shape_from_the_first_refusal(
        emulator, tmp_path, spark, monkeypatch):
    # Nothing listens at the administration endpoint: nothing is known of the destinations up front.
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 2, "sink.outage_wait_seconds": 3600,
                                                "primary.administration_endpoint": f"127.0.0.1:{free_port()}"})
    originals = _write_backlog(config, monkeypatch)
    sends_before = emulator.stats(PRIMARY)[DEDUPE]["ops"].get("send", 0)

    summary = run_syphon(spark, config)

    assert summary.drained
    stats = _assert_delivered_once_in_order(spark, emulator, config, originals)
    # one refused batch per send task at most (each learns once; a later task in the same worker starts knowing),
    # then one send per message
    refused_batches = stats[DEDUPE]["ops"].get("send", 0) - sends_before - len(originals[DEDUPE])
    assert 1 <= refused_batches <= len(BACKLOG_QUEUES)


@pytest.fixture(autouse=True)
def _destinations_configured(emulator):
    """The emulator the tests use (``conf/emulator.yaml``) has the partitioned destinations."""
    assert {PARTITIONED, DEDUPE} <= set(emulator.stats(PRIMARY))
