"""When Azure pushes back, end to end against the emulator (real AMQP, the unmodified SDK), in-process.

A Standard secondary out of its credits answers ``com.microsoft:server-busy`` to every operation (peeks,
receives, settlements, the administration API), and a Standard primary to sends. Here both are throttled
twice in one run, each time for longer than the SDK's own retries (1 + 2 + 4 s), while the run reads, sends
and purges: the run ends 0, every message arrives once and in order per backlog queue, nothing is
dead-lettered, and the summary says what the drain cost in credits.
"""

from __future__ import annotations

import collections
import threading
import time

from tools.backlog_writer import OriginalMessage, send_legacy_backlog
from tools.testing import backlog_dead_letters

from .conftest import PRIMARY, SECONDARY, make_config
from .helpers import drain_destinations

QUEUES = 3
PER_QUEUE = 150
BUSY_SECONDS = 8.5  # longer than the SDK's retries of a busy answer (1, 2 and 4 s apart)


def test_throttled_namespaces_slow_the_drain_and_lose_or_repeat_nothing(spark, emulator, tmp_path):
    from backlog_syphon.model import NamespaceRole
    from backlog_syphon.run.syphon import run_syphon

    config = make_config(emulator, tmp_path, **{
        "backlog.queue_count": QUEUES, "run.max_messages_per_trigger": 150, "sink.outage_wait_seconds": 60,
        "sink.retry_backoff_seconds": 0.5, "sink.max_retry_backoff_seconds": 2, "sink.throttle_recovery_seconds": 3})
    per_queue = {f"{PRIMARY}/x-servicebus-transfer/{q}": [
        OriginalMessage("orders" if n % 2 else "payments", f"q{q} {n}".encode(), message_id=f"q{q}-{n:04d}")
        for n in range(PER_QUEUE)] for q in range(QUEUES)}
    send_legacy_backlog(config.secondary, per_queue)

    throttled: list[tuple[float, float]] = []
    batches = threading.Semaphore(0)

    def throttle_twice() -> None:
        # After the first batch and after the second, both namespaces push back for BUSY_SECONDS: the secondary
        # to everything, the primary to sends.
        for _ in range(2):
            if not batches.acquire(timeout=300):
                return
            emulator.set_unavailable(SECONDARY, mode="server-busy")
            emulator.set_unavailable(PRIMARY, mode="throttled")
            began = time.monotonic()
            time.sleep(BUSY_SECONDS)
            emulator.set_available(SECONDARY)
            emulator.set_available(PRIMARY)
            throttled.append((began, time.monotonic()))

    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if line.startswith("batch ") and "idle" not in line:
            batches.release()

    switcher = threading.Thread(target=throttle_twice, name="throttle-switch", daemon=True)
    switcher.start()
    try:
        summary = run_syphon(spark, config, on_progress=progress)
    finally:
        batches.release(), batches.release()
        switcher.join(timeout=2 * BUSY_SECONDS + 5)
        emulator.set_available(SECONDARY)
        emulator.set_available(PRIMARY)
    assert len(throttled) == 2, f"the run ended before both throttlings: {lines}"
    assert summary.drained and not summary.stopped, summary.lines()

    received = drain_destinations(emulator, ["orders", "payments"])
    ids = [message.message_id for messages in received.values() for message in messages]
    assert collections.Counter(ids) == collections.Counter(m.message_id for ms in per_queue.values() for m in ms)
    for destination, messages in received.items():  # each backlog queue's messages in their order
        by_queue = collections.defaultdict(list)
        for message in sorted(messages, key=lambda m: m.sequence_number):
            by_queue[message.message_id.split("-")[0]].append(message.message_id)
        assert all(order == sorted(order) for order in by_queue.values()), destination
    assert backlog_dead_letters(config.secondary, list(per_queue)) == []
    backlog = emulator.stats(SECONDARY)
    assert sum(backlog[queue]["total"] for queue in per_queue) == 0
    audit = spark.read.format("delta").load(str(tmp_path / "audit")).collect()
    assert collections.Counter(row["outcome"] for row in audit) == {"delivered": QUEUES * PER_QUEUE}

    refused = emulator.credit_stats(SECONDARY)["throttled"]
    assert refused.get("peek", 0) + refused.get("receive", 0) + refused.get("settle", 0) > 0, refused
    credits = summary.credits
    moved = QUEUES * PER_QUEUE
    assert credits.moved == moved
    # a peek, a receive and a settlement per message on the secondary (and probes); a send on the primary
    assert 3 * moved <= credits.total(NamespaceRole.SECONDARY) <= 4 * moved, credits
    assert moved <= credits.total(NamespaceRole.PRIMARY) <= 1.2 * moved, credits
    assert any(line.startswith("  credits spent: secondary") for line in summary.lines())
    print(f"\n[throttled twice for {BUSY_SECONDS} s] {credits.line()}; refused by the secondary: {refused}")
