"""A primary-namespace outage and continuous (processing-time trigger) runs, in-process.

- Outage: with the primary answering server-busy from the start, the syphon neither delivers nor
  dead-letters nor removes anything; it waits (health probe) and, once the primary is back,
  delivers every message exactly once.
- Continuous: with a "3 seconds" trigger on an empty backlog, messages written later arrive within
  two trigger intervals plus the measured duration of the batch that carried them.
"""

from __future__ import annotations

import collections
import json
import time

from backlog_syphon.source.window_planner import PLAN_KEY
from tools.backlog_writer import OriginalMessage, write_backlog

from .conftest import PRIMARY, SECONDARY, make_config
from .helpers import drain_destinations, wait_for

DESTINATIONS = ("orders", "payments")


def _originals(tag: str, count: int) -> list[OriginalMessage]:
    return [OriginalMessage(DESTINATIONS[index % 2], f"{tag} body {index}".encode(),
                            message_id=f"{tag}-{index:04d}", application_properties={"index": index})
            for index in range(count)]


def _arrived(emulator) -> int:
    stats = emulator.stats(PRIMARY)
    return sum(stats[destination]["in"] for destination in DESTINATIONS)


def _backlog_totals(emulator) -> tuple[int, int, int]:
    """(messages in the backlog queues, in their dead-letter queues, messages peeked so far)."""
    stats = emulator.stats(SECONDARY)
    queues = [path for path in stats if "x-servicebus-transfer/" in path and "$deadletterqueue" not in path.lower()]
    return (sum(stats[q]["total"] for q in queues), sum(stats[q].get("dead_letter_count", 0) for q in queues),
            sum(stats[q]["peeked"] for q in queues))


def _stop(run, spark) -> None:
    run.finish(spark)
    assert not run.query.isActive


def _assert_exactly_once(emulator, originals) -> None:
    received = drain_destinations(emulator, DESTINATIONS)
    expected = {message.message_id: message for message in originals}
    counts = collections.Counter()
    for destination, messages in received.items():
        for message in messages:
            original = expected[message.message_id]
            assert destination == original.destination
            assert b"".join(message.body) == original.body
            counts[message.message_id] += 1
    assert set(counts) == set(expected), f"missing: {sorted(set(expected) - set(counts))[:10]}"
    assert set(counts.values()) == {1}, f"duplicates: {[m for m, c in counts.items() if c > 1][:10]}"
    stats = emulator.stats(PRIMARY)
    for destination in DESTINATIONS:
        assert stats[destination].get("dead_letter_count", 0) == 0


def test_primary_outage_waits_then_delivers_exactly_once(spark, emulator, tmp_path):
    from backlog_syphon.run.syphon import start_syphon

    config = make_config(emulator, tmp_path, **{"run.trigger": "2 seconds", "sink.retry_backoff_seconds": 0.2,
                                                "sink.max_send_attempts": 2, "sink.outage_wait_seconds": 120})
    originals = _originals("outage", 60)
    write_backlog(config.secondary, PRIMARY, originals, queue_count=10)
    assert _backlog_totals(emulator)[:2] == (60, 0)

    emulator.set_unavailable(PRIMARY, mode="server-busy")
    started = time.monotonic()
    run = start_syphon(spark, config)
    query = run.query
    try:
        # The batch has read its window once every message was peeked; give its sends 10 s to fail.
        assert wait_for(lambda: _backlog_totals(emulator)[2] >= 60 or not query.isActive, 180), \
            "the syphon never read the backlog"
        read_at = time.monotonic()
        time.sleep(10)
        assert query.isActive, f"query died during the outage: {query.exception()}"
        assert _arrived(emulator) == 0
        total, dead, _ = _backlog_totals(emulator)
        assert (total, dead) == (60, 0), "the outage made the syphon drop or dead-letter backlog messages"

        emulator.set_available(PRIMARY)
        back_at = time.monotonic()
        assert wait_for(lambda: _arrived(emulator) >= 60 or not query.isActive, 240), \
            f"only {_arrived(emulator)} of 60 arrived after the primary came back ({query.exception()})"
        arrived_at = time.monotonic()
        # ... and the backlog is purged afterwards (next steps of the same batch).
        assert wait_for(lambda: _backlog_totals(emulator)[0] == 0 or not query.isActive, 120), \
            f"backlog not purged: {_backlog_totals(emulator)}"
        assert query.isActive, f"query failed: {query.exception()}"
    finally:
        emulator.set_available(PRIMARY)
        _stop(run, spark)
    assert _backlog_totals(emulator)[:2] == (0, 0)
    _assert_exactly_once(emulator, originals)
    audit = spark.read.format("delta").load(str(tmp_path / "audit"))
    outcomes = collections.Counter((row["message_id"], row["outcome"]) for row in audit.collect())
    assert outcomes == {(message.message_id, "delivered"): 1 for message in originals}
    print(f"\n[outage] read after {read_at - started:.1f}s; arrived {arrived_at - back_at:.1f}s after the "
          f"primary came back")


def test_continuous_trigger_delivers_new_messages_promptly(spark, emulator, tmp_path):
    from backlog_syphon.run.syphon import start_syphon

    interval = 3.0
    # idle_probe_max_seconds=1: every trigger probes every queue; with the default (120 s) an idle
    # queue is probed ever more rarely (by design, to save operations) and the latency grows with it.
    config = make_config(emulator, tmp_path, **{"run.trigger": "3 seconds", "run.idle_probe_max_seconds": 1})
    run = start_syphon(spark, config)
    query = run.query
    try:
        # Let the query start and run a few idle triggers on the empty backlog.
        assert wait_for(lambda: len(query.recentProgress) >= 2 or not query.isActive, 180), "query never triggered"
        assert query.isActive, f"query failed: {query.exception()}"
        assert _arrived(emulator) == 0

        originals = _originals("continuous", 20)
        written_at = time.monotonic()
        write_backlog(config.secondary, PRIMARY, originals, queue_count=10)
        assert wait_for(lambda: _arrived(emulator) >= 20 or not query.isActive, 300, interval=0.1), \
            f"only {_arrived(emulator)} of 20 arrived ({query.exception()})"
        latency = time.monotonic() - written_at
        assert wait_for(lambda: _backlog_totals(emulator)[0] == 0 or not query.isActive, 120), \
            "backlog not purged"
        # The batch that carried them: its whole trigger execution, as Spark measured it.
        assert wait_for(lambda: any(p["numInputRows"] > 0 for p in query.recentProgress), 60)
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
        batch_seconds = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
        assert query.isActive, f"query failed: {query.exception()}"
        # The source reports each queue's tail as its latest offset: nothing is left behind it.
        last_source = query.lastProgress["sources"][0]
        latest = json.loads(last_source["latestOffset"])
        plan = latest.pop(PLAN_KEY)
        assert set(latest) == set(json.loads(last_source["endOffset"]))
        assert all(queue["remaining"] == 0 for queue in latest.values()), latest
        # An idle continuous plan costs a probe or two per queue, not a search.
        assert 0 < plan["probes"] <= 2 * len(latest), plan
    finally:
        _stop(run, spark)
    _assert_exactly_once(emulator, originals)
    # The progress listener saw the same batches: one point each, with the sink's counts.
    points = [p for p in run.listener.points if p.stats is not None]
    assert sum(p.stats.delivered for p in points) == 20
    assert all(p.stats.dead_lettered == 0 and p.stats.skipped == 0 for p in points)
    assert run.listener.points[-1].remaining_total == 0
    assert all(p.stats.oldest_enqueued is not None for p in points), [p.stats for p in points]
    bound = 2 * interval + batch_seconds
    print(f"\n[continuous] latency={latency:.1f}s batches_with_data={len(batches)} "
          f"batch_duration={batch_seconds:.1f}s bound={bound:.1f}s")
    assert sum(p["numInputRows"] for p in batches) == 20
    assert latency <= bound, f"latency {latency:.1f}s > 2 x {interval}s + batch {batch_seconds:.1f}s"


def test_an_available_now_run_played_without_read_limits_stays_in_bounded_batches(spark, emulator, tmp_path):
    """What Spark 4.0/4.1 get (no read limits for Python sources), forced on this Spark: an available-now
    run becomes bounded batches under a processing-time trigger and stops by itself at the start's tail."""
    from backlog_syphon.run.progress import follow_progress
    from backlog_syphon.run.syphon import start_syphon

    config = make_config(emulator, tmp_path, **{"run.max_messages_per_trigger": 100, "backlog.queue_count": 2})
    originals = _originals("played", 450)
    write_backlog(config.secondary, PRIMARY, originals, queue_count=2)
    run = start_syphon(spark, config, emulate_available_now=True)
    try:
        follow_progress(run.query, run.listener, None, stop_requested=lambda: run.stop_requested)
        assert run.stop_requested, "the played available-now run did not stop at its target"
    finally:
        _stop(run, spark)
    _assert_exactly_once(emulator, originals)
    audit = spark.read.format("delta").load(str(tmp_path / "audit"))
    sizes = sorted(row["n"] for row in audit.groupBy("batch_id").count().withColumnRenamed("count", "n").collect())
    print(f"\n[played available-now] {len(sizes)} batches of {sizes}")
    assert max(sizes) <= 100 and sum(sizes) == 450 and len(sizes) >= 5
    assert _backlog_totals(emulator)[:2] == (0, 0)


def test_executors_that_cannot_reach_a_namespace_stop_the_run_before_anything_moves(spark, emulator, tmp_path):
    import dataclasses

    import pytest

    from backlog_syphon.config import Secret
    from backlog_syphon.servicebus.preflight import PreflightError, executor_preflight

    from .helpers import free_port

    config = make_config(emulator, tmp_path)
    executor_preflight(spark, config)  # both reachable: nothing to say
    port = free_port()
    nowhere = f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey=secret-k;UseDevelopmentEmulator=true"
    unreachable = dataclasses.replace(config, primary=dataclasses.replace(config.primary,
                                                                          connection_string=Secret(nowhere, "test")))
    with pytest.raises(PreflightError) as failure:
        executor_preflight(spark, unreachable, timeout_seconds=10)
    message = str(failure.value)
    assert message.startswith(f"executors cannot reach the primary namespace 127.0.0.1:{port}")
    assert "serverless network policy" in message and "secret-k" not in message
