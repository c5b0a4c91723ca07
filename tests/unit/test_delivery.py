"""The delivery state machine with a fake sender and a fake clock: grouping, order, retries, destinations
taking turns, outages, round deadlines and final failures."""

from __future__ import annotations

from backlog_syphon.config import SinkConfig
from backlog_syphon.sink.delivery import (
    Outgoing,
    PartialSendError,
    RoundLimits,
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


class QuotaExceeded(Exception):
    pass


class NotAllowed(Exception):
    """A final refusal of one message (amqp:not-allowed)."""


class SessionNotSet(NotAllowed):
    pass


def classify(exc, destination):
    if isinstance(exc, Missing):
        return SendFailure(False, ReasonCode.DESTINATION_NOT_FOUND, f"no '{destination}'")
    if isinstance(exc, TooLarge):
        return SendFailure(False, ReasonCode.MESSAGE_TOO_LARGE, "too large")
    if isinstance(exc, SessionNotSet):
        return SendFailure(False, ReasonCode.SESSION_REQUIRED, "the SessionId was not set")
    if isinstance(exc, NotAllowed):
        return SendFailure(False, ReasonCode.DESTINATION_REFUSED, "not allowed")
    if isinstance(exc, QuotaExceeded):
        return SendFailure(True, ReasonCode.QUOTA_EXCEEDED, f"destination '{destination}' is full")
    return SendFailure(True, ReasonCode.TRANSIENT, "busy")


class FakeClock:
    """Seconds since the epoch, moved only by ``sleep`` (and by the fake sender's sends)."""

    def __init__(self, now=1_000.0):
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


class FakeSender:
    """Records what was sent; ``script`` is a list of per-call behaviours (None = send all).

    ``script`` may also be a dict: per destination, its own list. ``down``: destinations that refuse
    every send (transiently). ``refuse``: message id -> the error every send holding it fails with (a batch
    is sent whole or not at all); ``largest``: sends of more messages are refused with ``NotAllowed`` (a
    refusal of the batch's shape). Every send call takes ``send_seconds`` of the clock, if there is one.
    """

    def __init__(self, script=(), *, down=(), clock=None, send_seconds=0.0, refuse=None, largest=None):
        self.script = {d: list(steps) for d, steps in script.items()} if isinstance(script, dict) else list(script)
        self.down = set(down)
        self.refuse, self.largest = dict(refuse or {}), largest
        self.sizes: list[int] = []  # messages per send call
        self.clock, self.send_seconds = clock, send_seconds
        self.sent: list[tuple[str, str]] = []  # (destination, message id) in send order
        self.calls: list[tuple[str, float | None]] = []  # (destination, when)
        self.resets: list[str] = []

    def send(self, destination, messages):
        self.calls.append((destination, None if self.clock is None else self.clock()))
        if self.clock is not None:
            self.clock.now += self.send_seconds
        self.sizes.append(len(messages))
        if destination in self.down:
            raise PartialSendError(0, Busy())
        refused = [self.refuse[m.message_id] for m in messages if m.message_id in self.refuse]
        if refused:
            raise PartialSendError(0, refused[0], len(messages))
        if self.largest is not None and len(messages) > self.largest:
            raise PartialSendError(0, NotAllowed(), len(messages))
        steps = self.script.get(destination, []) if isinstance(self.script, dict) else self.script
        step = steps.pop(0) if steps else None
        if step is None:
            self.sent += [(destination, m.message_id) for m in messages]
            return len(messages)
        count, error = step
        self.sent += [(destination, m.message_id) for m in messages[:count]]
        raise PartialSendError(count, error, len(messages) - count)

    def reset(self, destination):
        self.resets.append(destination)


def row(seq, destination="orders", session=None, action=Action.DELIVER, queue="q0", reason_code=None):
    return {"backlog_queue": queue, "sequence_number": seq, "message_id": f"m{seq}", "destination": destination,
            "session_id": session, "action": action, "reason_code": reason_code, "reason": None,
            "raw_message": f"raw{seq}".encode()}


def build(r):
    return Outgoing(r["raw_message"], r["message_id"], r["session_id"], None)


def run(rows, sender, builder=build, clock=None, limits=RoundLimits(), sink=SINK):
    clock = FakeClock() if clock is None else clock
    return list(deliver_rows(rows, build=builder, sender=sender, classify=classify, sink=sink, limits=limits,
                             clock=clock, sleep=clock.sleep))


def outcomes(results):
    return [(r.row["sequence_number"], r.outcome, r.reason_code) for r in results]


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
    clock = FakeClock()
    results = run([row(seq) for seq in range(1, 6)], sender, clock=clock)
    assert sender.sent == [("orders", f"m{seq}") for seq in range(1, 6)]  # each once, in order
    assert [r.attempts for r in results] == [1, 1, 3, 3, 3]
    assert clock.sleeps == [1.0, 2.0] and sender.resets == ["orders", "orders"]


def test_a_failing_destination_is_retried_with_capped_backoff_until_it_takes_the_messages():
    sender = FakeSender(script=[(0, Busy())] * 4 + [None])
    clock = FakeClock()
    results = run([row(1), row(2)], sender, clock=clock)
    assert outcomes(results) == [(1, Outcome.DELIVERED, None), (2, Outcome.DELIVERED, None)]
    assert [r.attempts for r in results] == [5, 5]
    assert clock.sleeps == [1.0, 2.0, 2.0, 2.0]  # doubling from 1 s, at most 2 s
    assert sender.sent == [("orders", "m1"), ("orders", "m2")]


def test_quota_exceeded_is_throttling_waited_out_without_spending_attempts_and_delivered_once_in_order():
    sender = FakeSender(script=[(1, QuotaExceeded()), (0, QuotaExceeded()), None])
    clock = FakeClock()
    results = run([row(seq) for seq in range(1, 5)], sender, clock=clock)
    assert sender.sent == [("orders", f"m{seq}") for seq in range(1, 5)]
    assert outcomes(results) == [(seq, Outcome.DELIVERED, None) for seq in range(1, 5)]
    assert [r.attempts for r in results] == [1, 1, 1, 1]  # throttling spends none of max_send_attempts
    assert sender.resets == []  # the link is kept: the namespace refused, the link is fine
    assert clock.sleeps[:2] == [1.0, 2.0]  # the destination waits, doubling from retry_backoff_seconds
    # ... then the task, slowed down (no cap: half of the 10 msg/s floor of a reference), sends the
    # other three one at a time instead of in one batch
    assert len(sender.calls) == 2 + 3 and sum(clock.sleeps[2:]) > 0


def test_a_refusing_destination_does_not_hold_the_others_and_its_messages_are_left_unsent():
    # a and b interleaved in one backlog queue, a in two sessions; a refuses everything.
    rows = [row(1, "a", "s1"), row(2, "b"), row(3, "a", "s2"), row(4, "b"), row(5, "a", "s1"), row(6, "b", "s9")]
    clock = FakeClock(now=1_000.0)
    sender = FakeSender(down={"a"}, clock=clock, send_seconds=0.5)
    results = run(rows, sender, clock=clock)

    assert sender.sent == [("b", "m2"), ("b", "m4"), ("b", "m6")]  # b goes on while a is retried
    assert sender.calls[0] == ("a", 1_000.0)  # a's first try came first, in backlog order
    assert [t for d, t in sender.calls if d == "b"] == [1_000.5, 1_001.5]  # b between a's retries, not after
    by_seq = {r.row["sequence_number"]: r for r in results}
    assert [(seq, by_seq[seq].outcome) for seq in (2, 4, 6)] == [(2, Outcome.DELIVERED), (4, Outcome.DELIVERED),
                                                                  (6, Outcome.DELIVERED)]
    unsent = [r for r in results if r.outcome == Outcome.UNSENT]
    assert [r.row["sequence_number"] for r in unsent] == [1, 5, 3]  # a's groups in order, nothing of a sent
    assert {r.reason_code for r in unsent} == {ReasonCode.DESTINATION_UNAVAILABLE}
    assert unsent[0].reason == ("destination 'a' stayed unavailable for 60 s (busy); nothing was lost: its "
                                "messages stay in the backlog for the next run")
    assert {r.at for r in unsent} == {1_000.0}  # failing since its first try
    assert clock.now - 1_000.0 >= 60.0  # it gave up only after the outage wait
    first_try, last_try = sender.calls[0][1], [t for d, t in sender.calls if d == "a"][-1]
    assert last_try - first_try >= 60.0
    assert len(sender.sent) == len(set(sender.sent))


def test_a_destination_failing_since_an_earlier_round_gives_up_when_the_wait_is_over():
    clock = FakeClock(now=1_000.0)
    sender = FakeSender(down={"a"}, clock=clock)
    limits = RoundLimits(unavailable_since={"a": 950.0})  # failing for 50 s already
    results = run([row(1, "a"), row(2, "a")], sender, clock=clock, limits=limits)
    assert outcomes(results) == [(1, Outcome.UNSENT, ReasonCode.DESTINATION_UNAVAILABLE),
                                 (2, Outcome.UNSENT, ReasonCode.DESTINATION_UNAVAILABLE)]
    assert [r.at for r in results] == [950.0, 950.0]
    assert clock.now - 950.0 >= 60.0 and clock.now - 1_000.0 < 60.0  # only the rest of the wait


def test_nothing_is_sent_at_or_after_the_rounds_deadline():
    # one send per session; each takes 1 s; the deadline falls after the third
    rows = [row(seq, "orders", f"s{seq}") for seq in range(1, 7)]
    clock = FakeClock(now=1_000.0)
    sender = FakeSender(clock=clock, send_seconds=1.0)
    results = run(rows, sender, clock=clock, limits=RoundLimits(deadline=1_003.0))
    assert sender.sent == [("orders", "m1"), ("orders", "m2"), ("orders", "m3")]
    assert all(t < 1_003.0 for _, t in sender.calls)
    assert outcomes(results) == [(1, Outcome.DELIVERED, None), (2, Outcome.DELIVERED, None),
                                 (3, Outcome.DELIVERED, None)] + [
        (seq, Outcome.UNSENT, ReasonCode.ROUND_DEADLINE) for seq in (4, 5, 6)]
    assert {r.at for r in results[3:]} == {1_003.0}


def test_a_round_deadline_cuts_a_backoff_short_and_leaves_the_failing_destination_unsent():
    clock = FakeClock(now=1_000.0)
    sender = FakeSender(down={"a"}, clock=clock)
    results = run([row(1, "a"), row(2, "b")], sender, clock=clock, limits=RoundLimits(deadline=1_001.5))
    assert outcomes(results) == [(2, Outcome.DELIVERED, None), (1, Outcome.UNSENT, ReasonCode.ROUND_DEADLINE)]
    assert results[1].at == 1_000.0  # a has been failing since its first try
    assert clock.sleeps == [1.0, 0.5]  # the second wait ends at the deadline, not at the next try
    assert sender.sent == [("b", "m2")]


def test_an_expired_round_sends_nothing():
    sender = FakeSender()
    results = run([row(1), row(2, "b")], sender, clock=FakeClock(now=2_000.0), limits=RoundLimits(deadline=2_000.0))
    assert outcomes(results) == [(1, Outcome.UNSENT, ReasonCode.ROUND_DEADLINE),
                                 (2, Outcome.UNSENT, ReasonCode.ROUND_DEADLINE)]
    assert sender.calls == []


def test_final_failures_dead_letter_what_they_concern():
    missing = FakeSender(script=[(1, Missing())])
    results = run([row(1), row(2), row(3)], missing)
    assert [(r.row["sequence_number"], r.outcome, r.reason_code) for r in results] == [
        (1, Outcome.DELIVERED, None), (2, Outcome.DEAD_LETTERED, ReasonCode.DESTINATION_NOT_FOUND),
        (3, Outcome.DEAD_LETTERED, ReasonCode.DESTINATION_NOT_FOUND)]

    too_large = FakeSender(refuse={"m2": TooLarge()})  # only the message at fault; the rest still goes
    results = run([row(1), row(2), row(3)], too_large)
    assert [(r.row["sequence_number"], r.outcome) for r in results] == [
        (1, Outcome.DELIVERED), (2, Outcome.DEAD_LETTERED), (3, Outcome.DELIVERED)]
    assert too_large.sent == [("orders", "m1"), ("orders", "m3")]
    assert too_large.resets == []  # a refused message says nothing against the link


def test_a_refused_message_in_a_batch_is_found_by_halving_and_only_it_is_dead_lettered():
    sender = FakeSender(refuse={"m6": NotAllowed()})
    results = run([row(seq) for seq in range(1, 17)], sender)
    assert outcomes(results) == [(seq, Outcome.DELIVERED, None) for seq in range(1, 6)] + [
        (6, Outcome.DEAD_LETTERED, ReasonCode.DESTINATION_REFUSED)] + [
        (seq, Outcome.DELIVERED, None) for seq in range(7, 17)]
    assert [m for _, m in sender.sent] == [f"m{seq}" for seq in range(1, 17) if seq != 6]  # in order
    # 16 refused, 8 refused, 4 sent (m1..m4), 2 refused (m5, m6), 1 sent (m5), 1 refused (m6), the rest whole
    assert sender.sizes == [16, 8, 4, 2, 1, 1, 10]
    assert results[5].reason == "not allowed" and sender.resets == []


def test_a_refusal_of_the_batchs_shape_dead_letters_nothing():
    sender = FakeSender(largest=1)  # a destination that takes only single messages
    results = run([row(seq) for seq in range(1, 6)], sender)
    assert outcomes(results) == [(seq, Outcome.DELIVERED, None) for seq in range(1, 6)]
    assert [m for _, m in sender.sent] == ["m1", "m2", "m3", "m4", "m5"]


def test_a_refusal_for_a_missing_session_teaches_the_sender_about_the_destination():
    rows = [row(1), row(2, session="s"), row(3), row(4, session="s"), row(5)]
    sender = FakeSender(refuse={"m1": SessionNotSet(), "m3": SessionNotSet(), "m5": SessionNotSet()})
    results = run(rows, sender)
    assert sorted(outcomes(results)) == [
        (1, Outcome.DEAD_LETTERED, ReasonCode.SESSION_REQUIRED), (2, Outcome.DELIVERED, None),
        (3, Outcome.DEAD_LETTERED, ReasonCode.SESSION_REQUIRED), (4, Outcome.DELIVERED, None),
        (5, Outcome.DEAD_LETTERED, ReasonCode.SESSION_REQUIRED)]
    # m1, m3 and m5 share a group (no session): the first refusal is narrowed to m1; m3 and m5 are not sent again
    assert sender.sizes == [3, 1, 2] and [m for _, m in sender.sent] == ["m2", "m4"]
    assert "requires sessions" in next(r for r in results if r.row["sequence_number"] == 3).reason


def test_a_refused_link_dead_letters_what_waits_for_it_and_a_transient_error_does_not_end_the_search():
    class LinkRefused(FakeSender):
        def send(self, destination, messages):
            self.sizes.append(len(messages))
            raise PartialSendError(0, NotAllowed(), 0)  # the attach itself was refused: nothing was transferred

    link = LinkRefused()
    results = run([row(1), row(2), row(3)], link)
    assert outcomes(results) == [(seq, Outcome.DEAD_LETTERED, ReasonCode.DESTINATION_REFUSED) for seq in (1, 2, 3)]
    assert link.sizes == [3] and link.resets == ["orders"]

    clock = FakeClock()
    flaky = FakeSender(refuse={"m3": NotAllowed()}, clock=clock)
    flaky.script = [None, (0, Busy())]  # the whole batch is refused, then a transient error mid-search
    results = run([row(1), row(2), row(3), row(4)], flaky, clock=clock)
    assert outcomes(results) == [(1, Outcome.DELIVERED, None), (2, Outcome.DELIVERED, None),
                                 (3, Outcome.DEAD_LETTERED, ReasonCode.DESTINATION_REFUSED),
                                 (4, Outcome.DELIVERED, None)]


def test_after_a_partial_send_nothing_more_of_that_destination_goes_and_the_rest_stays_in_order():
    rows = [row(1, "a"), row(2, "b"), row(3, "a"), row(4, "b"), row(5, "a")]
    clock = FakeClock(now=1_000.0)
    sender = FakeSender({"a": [(1, Busy())] + [(0, Busy())] * 100}, clock=clock, send_seconds=0.25)
    results = run(rows, sender, clock=clock)
    assert sender.sent == [("a", "m1"), ("b", "m2"), ("b", "m4")]
    assert outcomes(results) == [(1, Outcome.DELIVERED, None), (2, Outcome.DELIVERED, None),
                                 (4, Outcome.DELIVERED, None),
                                 (3, Outcome.UNSENT, ReasonCode.DESTINATION_UNAVAILABLE),
                                 (5, Outcome.UNSENT, ReasonCode.DESTINATION_UNAVAILABLE)]
    assert results[3].at == 1_000.0  # failing since the send that stopped after m1


def test_chunks_carry_a_destination_left_unsent_so_its_later_messages_never_overtake():
    from backlog_syphon.sink.delivery import deliver_chunks

    clock = FakeClock()
    sender = FakeSender(down={"payments"}, clock=clock, send_seconds=1.0)
    chunks = [[row(1, "payments"), row(2, "orders")], [row(3, "payments"), row(4, "orders")]]
    delivered = deliver_chunks(chunks, build=build, sender=sender, classify=classify, sink=SINK, clock=clock,
                               sleep=clock.sleep)
    first = next(delivered)
    payments_tries = [d for d, _ in sender.calls].count("payments")
    second = next(delivered)
    assert [outcomes(first), outcomes(second)] == [
        [(2, Outcome.DELIVERED, None), (1, Outcome.UNSENT, ReasonCode.DESTINATION_UNAVAILABLE)],
        [(3, Outcome.UNSENT, ReasonCode.DESTINATION_UNAVAILABLE), (4, Outcome.DELIVERED, None)]]
    # payments' outage ran its course in the first chunk: the second never tries it (order kept), orders goes on.
    assert payments_tries > 1 and [d for d, _ in sender.calls].count("payments") == payments_tries
    assert sender.sent == [("orders", "m2"), ("orders", "m4")]


def test_held_rows_are_never_built_nor_sent_and_the_others_go_on():
    """``Action.HOLD`` (a destination in restore.skip_destinations): one HELD outcome each, no send, no link."""
    sender = FakeSender()
    built = []

    def counting_build(r):
        built.append(r["sequence_number"])
        return build(r)

    rows = [row(1), row(2, "payments", action=Action.HOLD, reason_code="destination_skipped"), row(3),
            row(4, "payments", action=Action.HOLD, reason_code="destination_skipped")]
    results = run(rows, sender, builder=counting_build)
    assert sorted(outcomes(results)) == [(1, Outcome.DELIVERED, None), (2, Outcome.HELD, "destination_skipped"),
                                         (3, Outcome.DELIVERED, None), (4, Outcome.HELD, "destination_skipped")]
    assert sender.sent == [("orders", "m1"), ("orders", "m3")] and built == [1, 3]
    assert all(r.attempts == 0 for r in results if r.outcome == Outcome.HELD)


def test_a_message_refused_before_sending_is_dead_lettered_with_its_reason_and_the_rest_goes_on():
    from backlog_syphon.model import RefusedBeforeSending

    def build_refusing(r):
        if r["sequence_number"] == 2:
            raise RefusedBeforeSending(ReasonCode.PROPERTY_TOO_LARGE, "its property 'p' is 33,000 bytes")
        return build(r)

    results = {r.row["sequence_number"]: r for r in run([row(1), row(2), row(3)], FakeSender(), builder=build_refusing)}
    assert (results[2].outcome, results[2].reason_code, results[2].reason) == (
        Outcome.DEAD_LETTERED, ReasonCode.PROPERTY_TOO_LARGE, "its property 'p' is 33,000 bytes")
    assert results[1].outcome == results[3].outcome == Outcome.DELIVERED
