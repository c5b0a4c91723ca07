"""Progress lines and backlog-behind-latest from Spark's offsets (plain values, no Spark)."""

import datetime as dt
import json

from backlog_syphon.run.progress import BatchStats, ProgressPoint, behind_latest, progress_line

NOW = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"


def test_behind_latest_is_tail_minus_end_per_queue():
    end = json.dumps({Q0: 101, Q1: 7})
    latest = json.dumps({Q0: 351, Q1: 7})
    assert behind_latest(end, latest) == {Q0: 250, Q1: 0}


def test_behind_latest_without_a_reported_tail_is_zero_not_an_error():
    assert behind_latest(json.dumps({Q0: 5}), None) == {Q0: 0}
    assert behind_latest(None, None) == {}
    assert behind_latest(json.dumps({Q0: 9}), json.dumps({Q0: 3})) == {Q0: 0}  # a stale tail never goes negative
    assert behind_latest(json.dumps({Q0: 9}), "null") == {Q0: 0}
    assert behind_latest("not json", json.dumps({Q0: 3})) == {}


def test_progress_line_names_counts_age_rate_and_the_queues_behind():
    stats = BatchStats(delivered=300, dead_lettered=2, skipped=1, replayed=0, send_seconds=1.5,
                       oldest_enqueued=NOW - dt.timedelta(minutes=5))
    line = progress_line(ProgressPoint(4, NOW, stats, {Q0: 250, Q1: 0}))
    assert line == ("batch 4: delivered 300, dead-lettered 2, skipped 1, replayed 0; oldest message age 300s; "
                    "send rate 200 msg/s; remaining 250 (0:250)")


def test_progress_line_of_an_empty_batch():
    point = ProgressPoint(9, NOW, None, {Q0: 0})
    assert progress_line(point) == "batch 9: idle; remaining 0"
    assert point.remaining_total == 0
