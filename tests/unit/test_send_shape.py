"""Sending to partitioned destinations: the send shape (``sink.send_shape``, pure) and what the delivery
rounds do with it against a fake partitioned destination (``sink.delivery``): batches of one session and
partition key, one MessageId per send where duplicate detection is on, the shape known up front or learned
from the first refusal of a batch, and nothing dead-lettered for a batch's shape."""

from __future__ import annotations

import logging

import pytest

from backlog_syphon.config import SinkConfig
from backlog_syphon.model import (
    Action,
    DestinationShape,
    EntityKind,
    Outcome,
    Outgoing,
    PartialSendError,
    ReasonCode,
    SendFailure,
    SendFailureClass,
    SendShape,
    DEAD_LETTER_REASON_CODES,
)
from backlog_syphon.sink.delivery import deliver_chunks, deliver_rows
from backlog_syphon.sink.send_shape import (
    MAX_IN_FLIGHT,
    SendShapes,
    known_shapes,
    next_send_size,
    plan_sends,
    shape_for,
)

SINK = SinkConfig(max_send_attempts=3, retry_backoff_seconds=1.0, max_retry_backoff_seconds=2.0,
                  outage_wait_seconds=60.0)
BATCH_SHAPE_TEXT = ("Batching brokered messages with distinct SessionId, PartitionKey, or MessageId is not "
                    "supported for an entity with partitioning and duplicate detection enabled.")


def message(message_id, session=None, key=None):
    return Outgoing(message_id.encode(), message_id, session, key)


# --- the pure shape -------------------------------------------------------------------------------

@pytest.mark.parametrize("partitioned, dedupe, expected", [
    (False, False, SendShape.KEYED_BATCHES),
    (True, False, SendShape.KEYED_BATCHES),
    (False, True, SendShape.KEYED_BATCHES),  # not partitioned: duplicate detection keys on MessageId, batches go
    (True, True, SendShape.SINGLE_MESSAGES),
])
def test_the_administration_apis_description_decides_the_shape(partitioned, dedupe, expected):
    shape = DestinationShape("orders", EntityKind.QUEUE, partitioned=partitioned, duplicate_detection=dedupe)
    assert shape_for(shape) is expected
    assert shape_for(None) is SendShape.KEYED_BATCHES
    assert known_shapes({"Orders": shape}) == ({"orders": SendShape.SINGLE_MESSAGES} if partitioned and dedupe else {})


def test_keyed_batches_hold_one_session_and_one_partition_key_each_in_order():
    messages = [message("m0", "s1", "s1"), message("m1", None, "k1"), message("m2", "s1", "s1"), message("m3"),
                message("m4", None, "k1"), message("m5"), message("m6", "s2", "s2")]
    assert plan_sends(SendShape.KEYED_BATCHES, messages) == [[0, 2], [1, 4], [3, 5], [6]]


def test_single_messages_go_one_per_send_in_the_same_order():
    messages = [message("m0", "s1"), message("m1"), message("m2", "s1"), message("m3")]
    assert plan_sends(SendShape.SINGLE_MESSAGES, messages) == [[0], [2], [1], [3]]


def test_next_send_size_takes_the_first_keys_run_and_bounds_messages_in_flight():
    keyed = [message("a", "s1"), message("b", "s1"), message("c", "s2")]
    assert next_send_size(SendShape.KEYED_BATCHES, keyed) == 2
    assert next_send_size(SendShape.KEYED_BATCHES, keyed, largest=1) == 1
    many = [message(f"m{i}") for i in range(200)]
    assert next_send_size(SendShape.KEYED_BATCHES, many) == 200
    assert next_send_size(SendShape.SINGLE_MESSAGES, many) == MAX_IN_FLIGHT
    assert next_send_size(SendShape.SINGLE_MESSAGES, many, largest=5) == 5
    assert next_send_size(SendShape.SINGLE_MESSAGES, []) == 0


def test_a_sessions_or_partition_keys_single_messages_go_one_at_a_time_keyless_ones_in_flight():
    # In flight, a transient refusal of one while the next of its session was stored would reorder the session.
    session = [message(f"s{i}", "s1", "s1") for i in range(10)]
    keyed = [message(f"k{i}", None, "k1") for i in range(10)]
    keyless = [message(f"m{i}") for i in range(10)]
    assert next_send_size(SendShape.SINGLE_MESSAGES, session) == 1
    assert next_send_size(SendShape.SINGLE_MESSAGES, keyed) == 1
    assert next_send_size(SendShape.SINGLE_MESSAGES, keyless) == 10
    assert next_send_size(SendShape.SINGLE_MESSAGES, keyless + session) == 10  # the keyless run only
    assert next_send_size(SendShape.KEYED_BATCHES, session) == 10  # a batch is one transfer: no such risk


def test_learned_shapes_are_kept_by_name_in_any_case():
    shapes = SendShapes(known={"known": SendShape.SINGLE_MESSAGES})
    assert shapes.of("KNOWN") is SendShape.SINGLE_MESSAGES
    assert shapes.of("orders") is SendShape.KEYED_BATCHES
    assert shapes.learn("Orders") is True
    assert shapes.learn("orders") is False
    assert shapes.of("ORDERS") is SendShape.SINGLE_MESSAGES
    assert shapes.learn("known") is False


def test_the_batch_shape_reason_is_never_a_dead_letter_reason():
    assert ReasonCode.BATCH_SHAPE_REFUSED not in DEAD_LETTER_REASON_CODES
    assert SendFailure(False, ReasonCode.BATCH_SHAPE_REFUSED, "x").failure_class is SendFailureClass.REFUSED


# --- delivery into a fake partitioned destination -------------------------------------------------

class ShapeRefusal(Exception):
    """amqp:not-allowed with the service's words for a batch's shape."""


def classify(exc, destination):
    if isinstance(exc, ShapeRefusal):
        return SendFailure(False, ReasonCode.BATCH_SHAPE_REFUSED, f"destination '{destination}' refused: {exc}")
    return SendFailure(True, ReasonCode.TRANSIENT, "busy")


class PartitionedDestination:
    """A partitioned destination (``dedupe``: with duplicate detection on MessageId + PartitionKey): refuses a
    batch of distinct sessions or partition keys, and, with duplicate detection, of distinct MessageIds,
    as the service does; drops duplicates silently. ``send_singly`` has several messages in flight."""

    def __init__(self, *, dedupe: bool, transient_failures: dict[str, int] | None = None):
        self.dedupe = dedupe
        self.stored: list[str] = []
        self.seen: set[tuple] = set()
        self.batch_sizes: list[int] = []
        self.singly_calls: list[int] = []
        self.refusals = 0
        self.transient = dict(transient_failures or {})  # message id -> times its send fails first

    def _store(self, m):
        key = (m.message_id, m.partition_key or m.session_id)
        if self.dedupe and key in self.seen:
            return
        self.seen.add(key)
        self.stored.append(m.message_id)

    def send(self, destination, messages):
        self.batch_sizes.append(len(messages))
        keys = {(m.session_id, m.partition_key) for m in messages}
        ids = {m.message_id for m in messages}
        if len(messages) > 1 and (len(keys) > 1 or (self.dedupe and len(ids) > 1)):
            self.refusals += 1
            raise PartialSendError(0, ShapeRefusal(BATCH_SHAPE_TEXT), len(messages))
        for m in messages:
            self._store(m)
        return len(messages)

    def send_singly(self, destination, messages):
        self.singly_calls.append(len(messages))
        for index, m in enumerate(messages):
            if self.transient.get(m.message_id):
                self.transient[m.message_id] -= 1
                raise PartialSendError(index, RuntimeError("link detached"), 1)
            self._store(m)
        return len(messages)

    def reset(self, destination):
        pass


def row(seq, session=None, key=None, destination="orders"):
    return {"backlog_queue": "q0", "sequence_number": seq, "message_id": f"m{seq}", "destination": destination,
            "session_id": session, "partition_key": key, "action": Action.DELIVER, "reason_code": None,
            "reason": None, "raw_message": b""}


def build(r):
    return Outgoing(r["raw_message"], r["message_id"], r["session_id"], r["partition_key"])


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def deliver(rows, destination, shapes=None):
    clock = Clock()
    return list(deliver_rows(rows, build=build, sender=destination, classify=classify, sink=SINK, clock=clock,
                             sleep=clock.sleep, shapes=shapes))


def interleaved_rows(count=300):
    """Three sessions, key-less messages and partition-keyed ones, interleaved as a backlog holds them."""
    kinds = [("s1", "s1"), (None, None), ("s2", None), (None, "k1"), ("s3", "s3")]
    return [row(seq, *kinds[seq % len(kinds)]) for seq in range(count)]


def per_key_order(stored_ids, rows):
    by_id = {r["message_id"]: r for r in rows}
    orders: dict[tuple, list[int]] = {}
    for message_id in stored_ids:
        r = by_id[message_id]
        orders.setdefault((r["session_id"], r["partition_key"]), []).append(r["sequence_number"])
    return orders


def assert_all_delivered_once_in_order(results, destination, rows):
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * len(rows)
    assert sorted(destination.stored) == sorted(r["message_id"] for r in rows)  # each once
    for sequence in per_key_order(destination.stored, rows).values():
        assert sequence == sorted(sequence)


def test_a_partitioned_destination_gets_one_batch_per_key_and_never_refuses():
    rows = interleaved_rows()
    destination = PartitionedDestination(dedupe=False)
    results = deliver(rows, destination)
    assert_all_delivered_once_in_order(results, destination, rows)
    assert destination.refusals == 0
    assert destination.batch_sizes == [60] * 5  # one batch per key


def test_a_known_deduplicating_destination_gets_single_messages_in_flight_from_the_start():
    rows = interleaved_rows()
    destination = PartitionedDestination(dedupe=True)
    results = deliver(rows, destination, SendShapes(known={"orders": SendShape.SINGLE_MESSAGES}))
    assert_all_delivered_once_in_order(results, destination, rows)
    assert destination.refusals == 0 and destination.batch_sizes == []
    # The 60 keyless messages in flight together, each session's and key's (240) one after the other.
    assert sorted(destination.singly_calls, reverse=True) == [60] + [1] * 240


def test_the_first_refusal_of_a_batchs_shape_teaches_the_sender_and_dead_letters_nothing(caplog):
    rows = interleaved_rows()
    destination = PartitionedDestination(dedupe=True)
    shapes = SendShapes()
    with caplog.at_level(logging.WARNING, logger="backlog_syphon.sink.delivery"):
        results = deliver(rows, destination, shapes)
    assert_all_delivered_once_in_order(results, destination, rows)
    assert destination.refusals == shapes.refusals == 1  # once: the destination is remembered
    assert shapes.of("ORDERS") is SendShape.SINGLE_MESSAGES
    assert not [r for r in results if r.reason_code is not None]
    assert sum("reason_code=batch_shape_refused" in record.getMessage() for record in caplog.records) == 1


def test_what_a_task_learned_holds_for_its_later_chunks_and_the_processs_later_tasks():
    rows = interleaved_rows(100)
    destination = PartitionedDestination(dedupe=True)
    learned: dict = {}
    clock = Clock()
    for _ in range(2):  # two tasks of one process, each in two chunks
        chunks = [rows[:50], rows[50:]]
        for results in deliver_chunks(chunks, build=build, sender=destination, classify=classify, sink=SINK,
                                      clock=clock, sleep=clock.sleep, shapes=SendShapes(learned=learned)):
            assert {r.outcome for r in results} == {Outcome.DELIVERED}
    assert destination.refusals == 1
    assert sorted(destination.stored) == sorted(r["message_id"] for r in rows)  # the second task's copies dropped


def test_a_single_message_refused_with_the_shapes_words_is_refused_for_itself():
    class RefusesOne(PartitionedDestination):
        def send_singly(self, destination, messages):
            for index, m in enumerate(messages):
                if m.message_id == "m2":
                    raise PartialSendError(index, ShapeRefusal(BATCH_SHAPE_TEXT), 1)
                self._store(m)
            return len(messages)

    rows = [row(seq) for seq in range(5)]
    destination = RefusesOne(dedupe=True)
    results = deliver(rows, destination, SendShapes(known={"orders": SendShape.SINGLE_MESSAGES}))
    assert [(r.row["sequence_number"], r.outcome, r.reason_code) for r in results] == [
        (0, Outcome.DELIVERED, None), (1, Outcome.DELIVERED, None),
        (2, Outcome.DEAD_LETTERED, ReasonCode.DESTINATION_REFUSED),
        (3, Outcome.DELIVERED, None), (4, Outcome.DELIVERED, None)]
    assert destination.stored == ["m0", "m1", "m3", "m4"]


def test_a_transient_failure_in_flight_resumes_after_the_accepted_prefix_with_its_usual_back_off():
    rows = [row(seq) for seq in range(10)]  # keyless: in flight together
    destination = PartitionedDestination(dedupe=True, transient_failures={"m4": 2})
    results = deliver(rows, destination, SendShapes(known={"orders": SendShape.SINGLE_MESSAGES}))
    assert_all_delivered_once_in_order(results, destination, rows)
    assert destination.stored == [f"m{seq}" for seq in range(10)]
    assert destination.singly_calls == [10, 6, 6]
    assert [r.attempts for r in results] == [1] * 4 + [3] * 6


def test_a_transient_failure_in_a_session_delays_only_that_message_and_nothing_of_its_session_passes_it():
    rows = [row(seq, "s1") for seq in range(10)]
    destination = PartitionedDestination(dedupe=True, transient_failures={"m4": 2})
    results = deliver(rows, destination, SendShapes(known={"orders": SendShape.SINGLE_MESSAGES}))
    assert_all_delivered_once_in_order(results, destination, rows)
    assert destination.stored == [f"m{seq}" for seq in range(10)]
    assert set(destination.singly_calls) == {1}  # one at a time: nothing of s1 in flight behind m4
    assert [r.attempts for r in results] == [1] * 4 + [3] + [1] * 5


def test_a_long_keyless_run_goes_at_most_max_in_flight_at_a_time_in_order():
    rows = [row(seq) for seq in range(150)]
    destination = PartitionedDestination(dedupe=True)
    results = deliver(rows, destination, SendShapes(known={"orders": SendShape.SINGLE_MESSAGES}))
    assert_all_delivered_once_in_order(results, destination, rows)
    assert destination.singly_calls == [MAX_IN_FLIGHT, MAX_IN_FLIGHT, 150 - 2 * MAX_IN_FLIGHT]
    assert destination.stored == [f"m{seq}" for seq in range(150)]


def test_what_the_tasks_learned_reaches_the_driver_with_their_pacing():
    from backlog_syphon.model import PacingStats

    first = PacingStats(sent=5, tasks=1, single_message_destinations=("orders",), shape_refusals=1)
    second = PacingStats(sent=3, tasks=1, single_message_destinations=("audit", "orders"), shape_refusals=2)
    merged = first.merge(second)
    assert (merged.single_message_destinations, merged.shape_refusals, merged.sent) == (("audit", "orders"), 3, 8)
