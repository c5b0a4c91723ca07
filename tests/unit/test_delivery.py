"""The delivery state machine with a fake sender: grouping, order, retries, waits and final failures."""

from __future__ import annotations

import pytest

from backlog_syphon.config import SinkConfig
from backlog_syphon.sink.delivery import (
    Outgoing,
    PartialSendError,
    PrimaryUnreachableError,
    SendFailure,
    deliver_rows,
    send_groups,
)
from backlog_syphon.model import Action, Outcome, ReasonCode

SINK = SinkConfig(max_send_attempts=3, retry_backoff_seconds=1.0, max_retry_backoff_seconds=2.0,
                  outage_wait_seconds=60.0)


class Busy(Exception):
    pass


class Missing(Exception):
    pass


class TooLarge(Exception):
    pass


def classify(exc, destination):
    if isinstance(exc, Missing):
        return SendFailure(False, ReasonCode.DESTINATION_NOT_FOUND, f"no '{destination}'")
    if isinstance(exc, TooLarge):
        return SendFailure(False, ReasonCode.MESSAGE_TOO_LARGE, "too large")
    return SendFailure(True, ReasonCode.TRANSIENT, "busy")


class FakeSender:
    """Records what was sent; ``script`` is a list of per-call behaviours (None = send all)."""

    def __init__(self, script=(), reachable=True):
        self.script = list(script)
        self.sent: list[tuple[str, str]] = []  # (destination, message id) in send order
        self.calls = 0
        self.resets: list[str] = []
        self.waits = 0
        self.reachable = reachable

    def send(self, destination, messages):
        self.calls += 1
        step = self.script.pop(0) if self.script else None
        if step is None:
            self.sent += [(destination, m.message_id) for m in messages]
            return len(messages)
        count, error = step
        self.sent += [(destination, m.message_id) for m in messages[:count]]
        raise PartialSendError(count, error)

    def reset(self, destination):
        self.resets.append(destination)

    def wait_until_reachable(self, destination, max_wait_seconds):
        self.waits += 1
        return self.reachable


def row(seq, destination="orders", session=None, action=Action.DELIVER, queue="q0", reason_code=None):
    return {"backlog_queue": queue, "sequence_number": seq, "message_id": f"m{seq}", "destination": destination,
            "session_id": session, "action": action, "reason_code": reason_code, "reason": None,
            "raw_message": f"raw{seq}".encode()}


def build(r):
    return Outgoing(r["raw_message"], r["message_id"], r["session_id"], None)


def run(rows, sender, builder=build, sleeps=None):
    sleeps = [] if sleeps is None else sleeps
    return list(deliver_rows(rows, build=builder, sender=sender, classify=classify, sink=SINK, sleep=sleeps.append))


def test_groups_keep_sequence_order_per_destination_and_session():
    rows = [row(3, "a"), row(1, "a"), row(2, "b"), row(4, "a", "s1"), row(5, action=Action.SKIP), row(6, "a", "s1")]
    groups = send_groups(rows)
    assert [[r["sequence_number"] for r in g] for g in groups] == [[1, 3], [2], [4, 6], [5]]


def test_every_row_gets_one_outcome_and_sends_are_ordered():
    sender = FakeSender()
    rows = [row(1), row(2, "payments"), row(3), row(4, action=Action.DEAD_LETTER, reason_code="missing_path"),
            row(5, action=Action.SKIP, reason_code="ping")]
    results = run(rows, sender)
    assert sorted((r.row["sequence_number"], r.outcome) for r in results) == [
        (1, Outcome.DELIVERED), (2, Outcome.DELIVERED), (3, Outcome.DELIVERED), (4, Outcome.DEAD_LETTERED),
        (5, Outcome.SKIPPED_PING)]
    assert sender.sent == [("orders", "m1"), ("orders", "m3"), ("payments", "m2")]
    assert next(r for r in results if r.row["sequence_number"] == 4).reason_code == "missing_path"


def test_a_message_that_cannot_be_built_is_dead_lettered_and_the_rest_goes_on():
    def flaky_build(r):
        if r["sequence_number"] == 3:
            raise ValueError("unknown AMQP constructor 0x99 at byte 17")
        return build(r)

    sender = FakeSender()
    results = run([row(seq, session="s1") for seq in range(1, 6)], sender, builder=flaky_build)
    assert sender.sent == [("orders", f"m{seq}") for seq in (1, 2, 4, 5)]
    failed = [r for r in results if r.outcome == Outcome.DEAD_LETTERED]
    assert [r.row["sequence_number"] for r in failed] == [3]
    assert failed[0].reason_code == ReasonCode.RESTORE_FAILED
    assert "ValueError: unknown AMQP constructor 0x99 at byte 17" in failed[0].reason
    assert sum(r.outcome == Outcome.DELIVERED for r in results) == 4


def test_transient_failures_resume_where_the_send_stopped_with_backoff():
    sender = FakeSender(script=[(2, Busy()), (0, Busy()), None])
    sleeps = []
    results = run([row(seq) for seq in range(1, 6)], sender, sleeps=sleeps)
    assert sender.sent == [("orders", f"m{seq}") for seq in range(1, 6)]  # each once, in order
    assert [r.attempts for r in results] == [1, 1, 3, 3, 3]
    assert sleeps == [1.0, 2.0] and sender.resets == ["orders", "orders"] and sender.waits == 0


def test_persistent_failure_waits_for_the_primary_then_goes_on_or_fails_the_batch():
    sender = FakeSender(script=[(0, Busy())] * 3 + [None])
    results = run([row(1)], sender)
    assert sender.waits == 1 and results[0].outcome == Outcome.DELIVERED and results[0].attempts == 4

    down = FakeSender(script=[(0, Busy())] * 3, reachable=False)
    with pytest.raises(PrimaryUnreachableError, match="stayed unreachable for 60 s while sending to 'orders'"):
        run([row(1)], down)
    assert down.sent == []


def test_final_failures_dead_letter_what_they_concern():
    missing = FakeSender(script=[(1, Missing())])
    results = run([row(1), row(2), row(3)], missing)
    assert [(r.row["sequence_number"], r.outcome, r.reason_code) for r in results] == [
        (1, Outcome.DELIVERED, None), (2, Outcome.DEAD_LETTERED, ReasonCode.DESTINATION_NOT_FOUND),
        (3, Outcome.DEAD_LETTERED, ReasonCode.DESTINATION_NOT_FOUND)]

    too_large = FakeSender(script=[(1, TooLarge())])  # only the message at fault; the rest still goes
    results = run([row(1), row(2), row(3)], too_large)
    assert [(r.row["sequence_number"], r.outcome) for r in results] == [
        (1, Outcome.DELIVERED), (2, Outcome.DEAD_LETTERED), (3, Outcome.DELIVERED)]
    assert too_large.sent == [("orders", "m1"), ("orders", "m3")]
