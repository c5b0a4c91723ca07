"""Pacing with plain numbers for time: the cap's shares, the token bucket, the AIMD controller, the
pacer's report, and the delivery state machine sending under a cap and through throttling."""

from __future__ import annotations

import pytest

from backlog_syphon.config import SinkConfig
from backlog_syphon.model import Outcome, PacingStats, ReasonCode, SendFailure, SendFailureClass
from backlog_syphon.sink.delivery import deliver_chunks, deliver_rows
from backlog_syphon.rate_control import BURST_SECONDS, HOLD_SECONDS, MIN_RATE, RateController, TokenBucket
from backlog_syphon.sink.pacing import PaceEvent, Pacer, PaceSignal, cap_share

from .test_delivery import Busy, FakeClock, FakeSender, QuotaExceeded, build, row


def test_the_shares_of_tasks_running_at_once_sum_to_at_most_the_cap():
    assert cap_share(0, 4) is None  # no cap
    assert cap_share(200, 2) == 100
    assert cap_share(200, 0) == 200  # a batch planned with no task still gets a sane share
    for tasks in (1, 3, 7, 10):
        assert cap_share(1000, tasks) * tasks == pytest.approx(1000)


def _send_as_allowed(bucket: TokenBucket, seconds: float, now: float = 0.0) -> list[tuple[float, int]]:
    """A task that sends as soon as and as much as the bucket lets it: (when, messages) per send."""
    sends, end = [], now + seconds
    while now < end:
        count = bucket.largest_send()
        wait = bucket.wait(count, now)
        if wait > 0:
            now += wait
            continue
        bucket.take(count, now)
        sends.append((now, count))
        now += 0.001  # a send takes a millisecond
    return sends


def _most_in_any_window(sends, window: float) -> int:
    return max(sum(n for t, n in sends if start <= t < start + window) for start, _ in sends)


def test_the_bucket_keeps_every_5_second_window_within_5_percent_of_the_rate():
    rate = 100.0
    sends = _send_as_allowed(TokenBucket(rate, 0.0), 20.0)
    assert max(n for _, n in sends) == rate * BURST_SECONDS  # a send carries at most the burst
    assert _most_in_any_window(sends, 5.0) <= 5 * rate * 1.05
    assert sum(n for _, n in sends) >= 20 * rate * 0.99  # and it does use its rate


def test_an_unlimited_bucket_never_waits():
    bucket = TokenBucket(None, 0.0)
    assert bucket.largest_send() is None and bucket.wait(10_000, 0.0) == 0.0
    bucket.take(10_000, 0.0)
    bucket.empty(0.0)
    assert bucket.wait(10_000, 0.0) == 0.0


def test_a_slow_bucket_still_sends_one_message_at_a_time():
    bucket = TokenBucket(2.0, 0.0)  # a burst of 0.5 messages: one at a time, every half second
    assert bucket.largest_send() == 1
    bucket.take(1, 0.0)
    assert bucket.wait(1, 0.0) == pytest.approx(0.5)


def test_throttling_halves_the_rate_once_per_hold_and_it_climbs_back_to_the_cap_over_the_recovery():
    controller = RateController(cap=100.0, recovery_seconds=10.0)
    assert controller.throttled(1.0, measured_rate=100.0) is True
    assert controller.rate == 50.0
    assert controller.throttled(1.0 + HOLD_SECONDS / 2, measured_rate=50.0) is False  # same burst: once
    assert controller.rate == 50.0
    assert controller.throttled(1.0 + HOLD_SECONDS, measured_rate=50.0) is True
    assert controller.rate == 25.0
    throttled_at = 1.0 + HOLD_SECONDS
    controller.sent(throttled_at + 0.5)  # within the hold: no increase yet
    assert controller.rate == 25.0
    rates = []
    now = throttled_at + HOLD_SECONDS
    while now < throttled_at + HOLD_SECONDS + 20:
        controller.sent(now)
        rates.append(controller.rate)
        now += 0.1
    assert rates == sorted(rates) and max(rates) == 100.0  # gradual, never above the cap
    # (100 - 1) / 10 s = 9.9 msg/s a second: from 25 to 100 in about 7.6 s of sending
    reached = throttled_at + HOLD_SECONDS + 0.1 * rates.index(100.0)
    assert 7.0 <= reached - (throttled_at + HOLD_SECONDS) <= 8.0


def test_repeated_throttling_never_goes_below_the_floor():
    controller = RateController(cap=10.0, recovery_seconds=5.0)
    for second in range(20):
        controller.throttled(float(second), measured_rate=0.0)
    assert controller.rate == MIN_RATE


def test_a_pause_in_the_sends_earns_at_most_a_seconds_increase():
    controller = RateController(cap=100.0, recovery_seconds=10.0)
    controller.throttled(0.0, measured_rate=100.0)
    controller.sent(HOLD_SECONDS)
    controller.sent(HOLD_SECONDS + 60.0)  # nothing sent for a minute (waiting on something else)
    assert controller.rate == pytest.approx(50.0 + 9.9)


def test_with_no_cap_throttling_limits_the_task_below_what_it_sent_and_recovery_lifts_the_limit():
    pacer = Pacer(None, recovery_seconds=4.0, now=0.0)
    assert pacer.largest_send() is None and pacer.wait(500, 0.0) == 0.0
    for tick in range(20):  # 400 messages a second for a second
        pacer.sending(20, tick / 20)
        pacer.observe(PaceEvent(PaceSignal.SENT, tick / 20, 20))
    pacer.observe(PaceEvent(PaceSignal.THROTTLED, 1.0))
    assert pacer.controller.rate == pytest.approx(100.0)  # half the 200 msg/s measured over 2 s
    assert pacer.largest_send() == 25 and pacer.wait(25, 1.0) > 0  # the bucket was emptied
    now = 1.0
    while pacer.controller.rate is not None and now < 30:
        now += 0.05
        pacer.observe(PaceEvent(PaceSignal.SENT, now, 1))
    assert pacer.controller.rate is None  # back to unlimited
    assert 1.0 + HOLD_SECONDS + 1.0 <= now <= 1.0 + HOLD_SECONDS + 4.0
    stats = pacer.stats(now)
    assert (stats.throttled, stats.rate_limit, stats.cap) == (1, None, None)
    assert stats.slowed_seconds == pytest.approx(now - 1.0)


def test_the_pacers_report_and_merging_the_tasks_reports():
    pacer = Pacer(50.0, recovery_seconds=10.0, now=100.0)
    pacer.sending(10, 100.0)
    pacer.observe(PaceEvent(PaceSignal.SENT, 100.0, 10))
    pacer.observe(PaceEvent(PaceSignal.THROTTLED, 101.0))
    pacer.sending(5, 102.0)
    pacer.observe(PaceEvent(PaceSignal.SENT, 102.0, 5))
    first = pacer.stats(103.0)
    assert first == PacingStats(sent=15, first_send_at=100.0, last_send_at=102.0, throttled=1, slowed_seconds=2.0,
                                rate_limit=25.0, cap=50.0, tasks=1)  # halved; no sending since the hold
    assert first.send_rate == 7.5
    other = PacingStats(sent=100, first_send_at=99.0, last_send_at=101.0, throttled=0, slowed_seconds=0.0,
                        rate_limit=50.0, cap=50.0, tasks=1)
    merged = PacingStats().merge(first).merge(other).merge(PacingStats())
    assert (merged.sent, merged.first_send_at, merged.last_send_at, merged.throttled, merged.tasks) == \
        (115, 99.0, 102.0, 1, 2)
    assert merged.slowed_seconds == 2.0  # the tasks ran at once: the longest, not the sum
    assert merged.rate_limit == pytest.approx(first.rate_limit + 50.0) and merged.cap == 100.0
    assert merged.send_rate == pytest.approx(115 / 3)
    assert PacingStats(sent=1, first_send_at=5.0, last_send_at=5.0, tasks=1).send_rate is None


# --- the delivery state machine, paced ---------------------------------------------------------

SINK = SinkConfig(max_send_attempts=3, retry_backoff_seconds=1.0, max_retry_backoff_seconds=4.0,
                  outage_wait_seconds=60.0, throttle_recovery_seconds=5.0)


class ServerBusy(Exception):
    pass


def classify(exc, destination):
    if isinstance(exc, ServerBusy):
        return SendFailure(True, ReasonCode.SERVER_BUSY, "the primary namespace is busy")
    if isinstance(exc, QuotaExceeded):
        return SendFailure(True, ReasonCode.QUOTA_EXCEEDED, "full")
    return SendFailure(True, ReasonCode.TRANSIENT, "busy")


def test_the_failure_classes():
    assert classify(ServerBusy(), "a").failure_class is SendFailureClass.THROTTLED
    assert classify(QuotaExceeded(), "a").failure_class is SendFailureClass.THROTTLED
    assert SendFailure(True, ReasonCode.THROTTLED, "x").failure_class is SendFailureClass.THROTTLED
    assert classify(Busy(), "a").failure_class is SendFailureClass.TRANSIENT
    assert SendFailure(False, ReasonCode.UNAUTHORIZED, "x").failure_class is SendFailureClass.FINAL


class BusySender(FakeSender):
    """Refuses every send with ServerBusy while the clock is inside ``busy`` (from, to)."""

    def __init__(self, clock, busy=(0.0, 0.0), send_seconds=0.001):
        super().__init__(clock=clock, send_seconds=send_seconds)
        self.busy = busy
        self.sent_at: list[tuple[float, int]] = []
        self.refused = 0

    def send(self, destination, messages):
        now = self.clock()
        if self.busy[0] <= now < self.busy[1]:
            self.calls.append((destination, now))
            self.clock.now += self.send_seconds
            self.refused += 1
            from backlog_syphon.model import PartialSendError

            raise PartialSendError(0, ServerBusy())
        self.sent_at.append((now, len(messages)))
        return super().send(destination, messages)


def _deliver(rows, sender, clock, pacer, sink=SINK):
    return list(deliver_rows(rows, build=build, sender=sender, classify=classify, sink=sink, clock=clock,
                             sleep=clock.sleep, pacer=pacer))


def test_a_capped_task_sends_at_its_share_in_small_batches_and_in_order():
    clock = FakeClock(now=0.0)
    sender = BusySender(clock)
    rows = [row(seq, "ab"[seq % 2]) for seq in range(1, 1001)]
    results = _deliver(rows, sender, clock, Pacer(50.0, SINK.throttle_recovery_seconds, 0.0))
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 1000
    assert max(n for _, n in sender.sent_at) <= 50 * BURST_SECONDS
    assert 19.0 <= clock.now <= 20.5  # 1,000 messages at 50 a second
    assert _most_in_any_window(sender.sent_at, 5.0) <= 5 * 50 * 1.05
    for destination in "ab":
        sent = [m for d, m in sender.sent if d == destination]
        assert sent == sorted(sent, key=lambda m: int(m[1:]))


def test_server_busy_slows_the_task_spends_no_attempts_and_the_rate_recovers_after_it():
    clock = FakeClock(now=0.0)
    sender = BusySender(clock, busy=(5.0, 9.0))
    pacer = Pacer(100.0, SINK.throttle_recovery_seconds, 0.0)
    rows = [row(seq) for seq in range(1, 3001)]
    results = _deliver(rows, sender, clock, pacer)
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 3000  # nothing lost or dead-lettered
    assert {r.attempts for r in results} == {1}  # throttling spent no attempts
    assert sender.resets == [] and sender.refused >= 3  # refused on the same link, retried, waiting longer
    refusals = [t for _, t in sender.calls if 5.0 <= t < 9.0]
    gaps = [b - a for a, b in zip(refusals, refusals[1:])]
    assert gaps == sorted(gaps) and gaps[0] >= 1.0  # 1, 2, then up to max_retry_backoff_seconds
    assert not [t for t, _ in sender.sent_at if 5.0 <= t < 9.0]  # nothing went through while busy
    # after the primary recovered: sends resumed, slower at first, back to the cap within the recovery
    after = [(t, n) for t, n in sender.sent_at if t >= 9.0]
    first_after = after[0][0]
    early = sum(n for t, n in after if first_after <= t < first_after + 1)
    late = [(t, n) for t, n in after if t >= first_after + HOLD_SECONDS + SINK.throttle_recovery_seconds]
    assert early < 100 * 0.75
    assert late and sum(n for t, n in late if t < late[0][0] + 2) >= 2 * 100 * 0.9
    stats = pacer.stats(clock.now)
    assert stats.throttled == sender.refused and stats.rate_limit == 100.0 and stats.cap == 100.0
    assert 4.0 <= stats.slowed_seconds <= 4.0 + HOLD_SECONDS + SINK.throttle_recovery_seconds + 4.0


def test_throttling_past_the_outage_wait_leaves_the_messages_unsent_naming_the_namespace_and_what_to_change():
    clock = FakeClock(now=0.0)
    sender = BusySender(clock, busy=(0.0, 1e9))
    sink = SinkConfig(max_send_attempts=1, retry_backoff_seconds=1.0, max_retry_backoff_seconds=4.0,
                      outage_wait_seconds=20.0)
    results = _deliver([row(1), row(2)], sender, clock, Pacer(None, 5.0, 0.0), sink=sink)
    assert [(r.outcome, r.reason_code) for r in results] == [(Outcome.UNSENT, ReasonCode.DESTINATION_UNAVAILABLE)] * 2
    assert results[0].reason.startswith("the primary namespace throttled sends to 'orders' for 20 s (the primary "
                                        "namespace is busy) after this send task sent 0 message(s) (0 credits); set "
                                        "primary.max_credits_per_second (or sink.max_messages_per_second)")
    assert "or move it to Premium (no credit budget); nothing was lost" in results[0].reason
    assert {r.attempts for r in results} == {0} and 20.0 <= clock.now < 25.0
    assert sender.refused >= 6  # retried all along: max_send_attempts=1 did not end it


def test_the_pacer_carries_over_from_one_chunk_to_the_next():
    clock = FakeClock(now=0.0)
    sender = BusySender(clock)
    pacer = Pacer(20.0, SINK.throttle_recovery_seconds, 0.0)
    chunks = [[row(seq) for seq in range(start, start + 50)] for start in (1, 51)]
    delivered = list(deliver_chunks(chunks, build=build, sender=sender, classify=classify, sink=SINK, clock=clock,
                                    sleep=clock.sleep, pacer=pacer))
    assert [len(results) for results in delivered] == [50, 50]
    assert 4.5 <= clock.now <= 5.5  # 100 messages at 20 a second, not 2 x a fresh bucket's burst
    assert pacer.stats(clock.now).sent == 100
