"""Progress lines and backlog-behind-latest from Spark's offsets (plain values, no Spark)."""

import dataclasses
import datetime as dt
import json

from backlog_syphon.model import BatchStats, PacingStats
from backlog_syphon.run.progress import (
    ProgressPoint,
    SyphonProgressListener,
    behind_latest,
    follow_progress,
    progress_fields,
    progress_line,
    send_rate_text,
)

NOW = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"


def test_behind_latest_is_tail_minus_end_per_queue():
    end = json.dumps({Q0: 101, Q1: 7})
    latest = json.dumps({Q0: 351, Q1: 7})
    assert behind_latest(end, latest) == {Q0: 250, Q1: 0}


def test_behind_latest_reads_the_offsets_of_incarnations():
    # The source's end offsets are {queue: {"incarnation", "next", "seen_ms"}}; its latest offsets
    # (the tails it reports) are plain sequence numbers.
    end = json.dumps({Q0: {"incarnation": 1, "next": 101, "seen_ms": 1_000},
                      Q1: {"incarnation": 2, "next": 7, "seen_ms": None}})
    latest = json.dumps({Q0: 351, Q1: 7})
    assert behind_latest(end, latest) == {Q0: 250, Q1: 0}


def test_behind_latest_mixes_old_and_new_offsets_and_a_missing_tail_is_not_measured():
    end = json.dumps({Q0: 101, Q1: {"incarnation": 1, "next": 4, "seen_ms": 5}})
    latest = json.dumps({Q0: {"incarnation": 1, "next": 120, "seen_ms": 9},
                         Q1: {"next": 9, "remaining": 5, "oldest_age_seconds": 3.0}, "(last plan)": {"probes": 2}})
    assert behind_latest(end, latest) == {Q0: 19, Q1: 5}
    # Q1 has no tail reported: what is behind it was not measured, so neither is the total
    assert behind_latest(end, json.dumps({Q0: 120})) is None


def test_behind_latest_without_a_reported_tail_is_not_measured_never_zero():
    """The first batch of a resumed run is a replay Spark runs before the source probed anything (no reported
    latest offset), and Spark before 4.2 reports none at all: their remaining is unknown, not 0."""
    assert behind_latest(json.dumps({Q0: 5}), None) is None
    assert behind_latest(json.dumps({Q0: 9}), "null") is None
    assert behind_latest(None, None) is None
    assert behind_latest("not json", json.dumps({Q0: 3})) is None
    assert behind_latest(json.dumps({Q0: 9}), json.dumps({Q0: 3})) == {Q0: 0}  # a stale tail never goes negative


def test_progress_line_names_counts_age_rate_and_the_queues_behind():
    stats = BatchStats(delivered=300, dead_lettered=2, skipped=1, replayed=0, send_seconds=1.5,
                       oldest_enqueued=NOW - dt.timedelta(minutes=5))
    line = progress_line(ProgressPoint(4, NOW, stats, {Q0: 250, Q1: 0}))
    assert line == ("batch 4: delivered 300, dead-lettered 2, skipped 1, replayed 0; oldest message age 300s; "
                    "send rate 200 msg/s; remaining 250 (0:250)")


def test_progress_line_shows_the_tasks_measured_rate_the_cap_and_the_throttling():
    paced = PacingStats(sent=3000, first_send_at=1000.0, last_send_at=1015.0, throttled=0, rate_limit=200.0,
                        cap=200.0, tasks=2)
    stats = BatchStats(delivered=3000, dead_lettered=0, skipped=0, replayed=0, send_seconds=30.0,
                       oldest_enqueued=NOW - dt.timedelta(seconds=40), pacing=paced)
    line = progress_line(ProgressPoint(0, NOW, stats, {Q0: 0}))
    assert line == ("batch 0: delivered 3000, dead-lettered 0, skipped 0, replayed 0; oldest message age 40s; "
                    "send rate 200 msg/s (cap 200); remaining 0")
    throttled = dataclasses.replace(paced, throttled=7, slowed_seconds=12.34, rate_limit=150.0)
    assert send_rate_text(dataclasses.replace(stats, pacing=throttled)) == (
        "send rate 200 msg/s (cap 200), throttled 7 times, slowed for 12.3 s, now 150 msg/s")
    uncapped = PacingStats(sent=10, first_send_at=0.0, last_send_at=2.0, throttled=1, slowed_seconds=2.0,
                           rate_limit=None, cap=None, tasks=1)
    assert send_rate_text(dataclasses.replace(stats, pacing=uncapped)) == (
        "send rate 5 msg/s, throttled 1 time, slowed for 2.0 s, now unlimited")
    # a batch refused for its shape (a partitioned destination with duplicate detection): said once, with who
    learned = dataclasses.replace(paced, shape_refusals=2, single_message_destinations=("partitioned-dedupe-orders",))
    assert send_rate_text(dataclasses.replace(stats, pacing=learned)) == (
        "send rate 200 msg/s (cap 200), 2 batches refused for their shape, single messages now to "
        "partitioned-dedupe-orders")
    # one send only (no measured span): the batch's average
    single = PacingStats(sent=3000, first_send_at=5.0, last_send_at=5.0, tasks=1)
    assert send_rate_text(dataclasses.replace(stats, pacing=single)) == "send rate 100 msg/s"


def test_progress_line_of_an_empty_batch():
    point = ProgressPoint(9, NOW, None, {Q0: 0})
    assert progress_line(point) == "batch 9: idle; remaining 0"
    assert point.remaining_total == 0


def test_a_progress_line_whose_remaining_was_not_measured_leaves_it_out():
    stats = BatchStats(delivered=200, dead_lettered=0, skipped=0, replayed=200, send_seconds=1.0,
                       oldest_enqueued=NOW - dt.timedelta(seconds=40))
    point = ProgressPoint(7, NOW, stats, None)  # a resumed run's first batch: a replay, nothing probed yet
    assert progress_line(point) == ("batch 7: delivered 200, dead-lettered 0, skipped 0, replayed 200; oldest "
                                    "message age 40s; send rate 200 msg/s")
    assert point.remaining_total is None
    assert (progress_fields(point)["remaining"], progress_fields(point)["remaining_total"]) == (None, None)
    assert progress_line(ProgressPoint(8, NOW, None, None)) == "batch 8: idle"


class FakeQuery:
    """A streaming query whose trigger is active for the first ``busy_polls`` status reads."""

    def __init__(self, busy_polls=0, last_batch_id=None):
        self.isActive = True
        self.busy_polls = busy_polls
        self.lastProgress = None if last_batch_id is None else {"batchId": last_batch_id}
        self.waits = []

    @property
    def status(self):
        self.busy_polls -= 1
        return {"isTriggerActive": self.busy_polls >= 0}

    def awaitTermination(self, seconds):
        self.waits.append(seconds)


def test_follow_progress_requests_a_stop_at_its_timeout_and_returns_at_a_batch_boundary():
    listener = SyphonProgressListener(lambda batch_id: None, query_name="syphon", log_lines=False)
    listener.points.append(ProgressPoint(3, NOW, None, {Q0: 0}))
    query, stops, lines = FakeQuery(busy_polls=2, last_batch_id=3), [], []
    follow_progress(query, listener, lines.append, poll_seconds=1.0, timeout_seconds=0,
                    stop_requested=lambda: bool(stops), request_stop=lambda: stops.append(True))
    assert stops == [True]  # asked once, never again
    assert query.waits == [0.5, 0.5, 0.5]  # two polls in a running batch, one idle; the second idle one ends it
    assert lines == ["batch 3: idle; remaining 0"]


def test_follow_progress_ends_with_the_query_without_asking_for_a_stop():
    listener = SyphonProgressListener(lambda batch_id: None, query_name="syphon", log_lines=False)
    query, stops, lines = FakeQuery(), [], []
    query.isActive = False
    follow_progress(query, listener, lines.append, stop_requested=lambda: bool(stops),
                    request_stop=lambda: stops.append(True))
    assert (stops, lines, query.waits) == ([], [], [])


def test_a_long_runs_listener_keeps_its_last_points_and_folds_the_older_ones_into_what_its_row_needs():
    from types import SimpleNamespace

    from backlog_syphon.model import EarlierBatches, JobIds
    from backlog_syphon.run.run_end import RunEnd, run_row

    paced = PacingStats(sent=10, first_send_at=0.0, last_send_at=1.0, slowed_seconds=0.5, tasks=1)
    stats = BatchStats(delivered=10, dead_lettered=0, skipped=0, replayed=0, send_seconds=1.0,
                       oldest_enqueued=NOW, pacing=paced)
    # Odd batches carry messages; even ones are empty.
    listener = SyphonProgressListener(lambda batch_id: stats if batch_id % 2 else None, query_name="syphon",
                                      log_lines=False, clock=lambda: NOW, retained=10)
    offsets = json.dumps({Q0: 5})
    for batch_id in range(35):
        listener.onQueryProgress(SimpleNamespace(progress=SimpleNamespace(
            name="syphon", batchId=batch_id, sources=[SimpleNamespace(endOffset=offsets, latestOffset=offsets)])))
    listener.wait_for(34, timeout=10)
    held = listener.points_since(0)
    assert 1 <= len(held) <= 10 and held[-1].batch_id == 34
    assert [point.batch_id for point in listener.points_since(30)] == [30, 31, 32, 33, 34]
    first_held = held[0].batch_id
    folded = len([b for b in range(first_held) if b % 2])
    assert listener.earlier == EarlierBatches(batches=folded, paced=folded, slowed_seconds=0.5 * folded)
    # The runs-table row counts every batch of the run, held or folded.
    row = run_row(run_id="r", source="backlog", trigger="2 seconds", job=JobIds(), started_at=NOW, ended_at=NOW,
                  end=RunEnd(0, "drained"), per_destination={}, remaining={}, batches=[p.stats for p in held],
                  earlier=listener.earlier)
    assert row.batches == 17 and row.throttled_seconds == 17 * 0.5
