"""Draining politely, end to end against the emulator (real AMQP, the unmodified SDK), in-process.

- Rate cap: 3,000 messages over two backlog queues with ``sink.max_messages_per_second: 200``. The send
  rate measured at the destination (the emulator's enqueue times) stays, over every 5-second window,
  within 10 % of the cap; a generous lower bound on the overall rate makes sure the cap is not
  throttling far more than it should (this machine is shared: only a wide tolerance is meaningful).
- Throttling: the primary answers every send with ``com.microsoft:server-busy`` (the emulator's
  ``throttled`` switch) for a few seconds in the middle of the drain. Nothing is lost, duplicated or
  dead-lettered, throttling spends none of ``sink.max_send_attempts``, sends resume once the switch is
  off, and the rate climbs back to the cap.
"""

from __future__ import annotations

import collections
import threading
import time

from tools.backlog_writer import OriginalMessage, write_backlog
from tools.testing import backlog_dead_letters

from .conftest import PRIMARY, SECONDARY, make_config
from .helpers import drain_destinations, wait_for

DESTINATIONS = ("orders", "payments")
BACKLOG_QUEUES = 2
WINDOW_SECONDS = 5.0


def _originals(tag: str, count: int) -> list[OriginalMessage]:
    return [OriginalMessage(DESTINATIONS[index % 2], f"{tag} body {index}".encode(), message_id=f"{tag}-{index:05d}")
            for index in range(count)]


def _arrived(emulator) -> int:
    stats = emulator.stats(PRIMARY)
    return sum(stats[destination]["in"] for destination in DESTINATIONS)


def _received_exactly_once(emulator, originals) -> list[float]:
    """Drain the destinations, check every message arrived once where it belongs; their enqueue times."""
    received = drain_destinations(emulator, DESTINATIONS)
    expected = {message.message_id: message.destination for message in originals}
    counts = collections.Counter()
    enqueued = []
    for destination, messages in received.items():
        for message in messages:
            assert expected[message.message_id] == destination
            counts[message.message_id] += 1
            enqueued.append(message.enqueued_time_utc.timestamp())
    assert set(counts) == set(expected), f"missing: {sorted(set(expected) - set(counts))[:10]}"
    assert set(counts.values()) == {1}, f"duplicates: {[m for m, c in counts.items() if c > 1][:10]}"
    return sorted(enqueued)


def _most_in_a_window(times: list[float], window: float) -> int:
    """The most messages enqueued within any ``window`` seconds (two pointers over sorted times)."""
    most, start = 0, 0
    for end, at in enumerate(times):
        while times[start] <= at - window:
            start += 1
        most = max(most, end - start + 1)
    return most


def _no_dead_letters(emulator, config) -> None:
    queues = [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(BACKLOG_QUEUES)]
    assert backlog_dead_letters(config.secondary, queues) == []
    stats = emulator.stats(PRIMARY)
    assert all(stats[destination].get("dead_letter_count", 0) == 0 for destination in DESTINATIONS)
    backlog = emulator.stats(SECONDARY)
    assert sum(backlog[f"{PRIMARY}/x-servicebus-transfer/{index}"]["total"] for index in range(BACKLOG_QUEUES)) == 0


def test_the_rate_cap_holds_over_every_5_second_window(spark, emulator, tmp_path):
    from backlog_syphon.run.syphon import run_syphon

    cap = 200
    config = make_config(emulator, tmp_path, **{"sink.max_messages_per_second": cap, "backlog.queue_count": BACKLOG_QUEUES,
                                                "run.max_messages_per_trigger": 10000})
    originals = _originals("capped", 3000)
    per_queue = write_backlog(config.secondary, PRIMARY, originals, queue_count=BACKLOG_QUEUES)
    lines: list[str] = []
    summary = run_syphon(spark, config, on_progress=lines.append)
    assert summary.drained and summary.per_destination["orders"]["delivered"] == 1500

    enqueued = _received_exactly_once(emulator, originals)
    _no_dead_letters(emulator, config)
    most = _most_in_a_window(enqueued, WINDOW_SECONDS)
    span = enqueued[-1] - enqueued[0]
    overall = len(enqueued) / span
    print(f"\n[rate cap] {len(enqueued)} messages in {span:.1f} s: {overall:.0f} msg/s overall; most in "
          f"{WINDOW_SECONDS:.0f} s: {most} ({most / WINDOW_SECONDS:.0f} msg/s) against a cap of {cap}; backlog "
          f"queues {per_queue}; {lines}")
    assert most <= 1.1 * cap * WINDOW_SECONDS, f"{most} messages within {WINDOW_SECONDS} s: over the cap"
    # Generous: the cap must not slow the drain to a crawl. Each task has half the cap, so once the
    # smaller backlog queue is done the other one goes on alone at its half (the shares are fixed per round).
    assert overall >= 0.5 * cap, f"{overall:.0f} msg/s: the cap throttled far more than it should"

    # The progress line shows the send tasks' measured rate and the cap they shared (2 tasks x 100).
    (point,) = [p for p in summary.progress if p.stats is not None]
    pacing = point.stats.pacing
    assert (pacing.sent, pacing.tasks, pacing.cap, pacing.throttled) == (3000, BACKLOG_QUEUES, cap, 0)
    assert any(f"(cap {cap})" in line for line in lines), lines


def test_server_busy_slows_the_drain_loses_nothing_and_the_rate_recovers(spark, emulator, tmp_path):
    from backlog_syphon.run.syphon import run_syphon

    cap, count, busy_seconds = 100, 1000, 4.0
    config = make_config(emulator, tmp_path, **{
        "sink.max_messages_per_second": cap, "backlog.queue_count": BACKLOG_QUEUES,
        "run.max_messages_per_trigger": 10000, "sink.max_send_attempts": 1, "sink.retry_backoff_seconds": 0.5,
        "sink.max_retry_backoff_seconds": 2, "sink.throttle_recovery_seconds": 3, "sink.outage_wait_seconds": 120})
    originals = _originals("busy", count)
    write_backlog(config.secondary, PRIMARY, originals, queue_count=BACKLOG_QUEUES)

    switch: dict[str, float] = {}

    def throttle_for_a_while() -> None:
        # Once sends flow, the primary answers server-busy to every send for busy_seconds.
        if not wait_for(lambda: _arrived(emulator) >= 100, 240, interval=0.05):
            return
        emulator.set_unavailable(PRIMARY, mode="throttled")
        switch["on"], switch["arrived_on"] = time.time(), _arrived(emulator)
        time.sleep(busy_seconds)
        switch["arrived_before_off"] = _arrived(emulator)
        emulator.set_available(PRIMARY)
        switch["off"] = time.time()

    switcher = threading.Thread(target=throttle_for_a_while, name="throttle-switch", daemon=True)
    switcher.start()
    lines: list[str] = []
    try:
        summary = run_syphon(spark, config, on_progress=lines.append)
    finally:
        switcher.join(timeout=busy_seconds + 5)
        emulator.set_available(PRIMARY)
    assert "off" in switch, "the sends never started, or finished before the switch"
    assert switch["arrived_before_off"] == switch["arrived_on"], "a message was accepted while throttled"
    assert switch["arrived_on"] < count, "the drain ended before the primary throttled it"
    assert summary.drained

    enqueued = _received_exactly_once(emulator, originals)
    _no_dead_letters(emulator, config)
    after = [at for at in enqueued if at >= switch["off"]]
    assert len(after) == count - switch["arrived_on"], "sends did not resume after the switch went off"
    assert _most_in_a_window(enqueued, WINDOW_SECONDS) <= 1.1 * cap * WINDOW_SECONDS

    audit = spark.read.format("delta").load(str(tmp_path / "audit")).collect()
    assert collections.Counter(row["outcome"] for row in audit) == {"delivered": count}
    # max_send_attempts is 1: throttling spent no attempt (else it would have waited for the outage)
    assert {row["attempts"] for row in audit} == {1}

    (point,) = [p for p in summary.progress if p.stats is not None]
    pacing = point.stats.pacing
    print(f"\n[throttled] server-busy for {busy_seconds:.0f} s after {switch['arrived_on']} messages; "
          f"{len(after)} arrived after it ended; pacing {pacing}; {lines}")
    # (the SDK retries a ServerBusy twice before the syphon sees it: the tasks see fewer refusals than sends)
    assert pacing.throttled >= 1 and pacing.slowed_seconds > 0
    assert pacing.rate_limit == cap  # recovered: every task back at its share of the cap
    assert any("throttled" in line and "slowed for" in line for line in lines), lines
