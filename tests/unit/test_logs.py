"""JSON log lines (``--log-format json``): one object per line, the run's ids on each, a record's facts as
fields, secrets masked as in text."""

import datetime as dt
import json
import logging

import pytest

from backlog_syphon.config import Secret
from backlog_syphon.model import BatchStats, PacingStats
from backlog_syphon.run import logs
from backlog_syphon.run.progress import ProgressPoint, progress_fields

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)
Q0 = "contoso/x-servicebus-transfer/0"


@pytest.fixture
def context():
    logs.set_context(run_id="20261127T120000Z-ab12cd34", job_id="11", job_run_id="22")
    yield
    logs.set_context(run_id=None, job_id=None, job_run_id=None)


def formatted(message, *args, tracebacks=True, exc_info=None, **extra):
    record = logging.LogRecord("backlog_syphon.sink", logging.WARNING, __file__, 1, message, args, exc_info)
    record.__dict__.update(extra)
    return json.loads(logs.JsonFormatter(tracebacks=tracebacks).format(record))


def test_every_line_carries_the_ids_and_names_its_batch_and_backlog_queue(context):
    line = formatted("backlog=%s purge round failed (%s) in batch_id=%d", Q0, "ServiceBusError", 7)
    assert line["message"] == f"backlog={Q0} purge round failed (ServiceBusError) in batch_id=7"
    assert {key: line[key] for key in ("level", "logger", "run_id", "job_id", "job_run_id", "batch_id",
                                       "backlog_queue")} == {
        "level": "WARNING", "logger": "backlog_syphon.sink", "run_id": "20261127T120000Z-ab12cd34", "job_id": "11",
        "job_run_id": "22", "batch_id": 7, "backlog_queue": Q0}
    assert dt.datetime.fromisoformat(line["time"]).tzinfo is not None
    other = formatted("took the lease on %s", "sb/contoso")
    assert (other["batch_id"], other["backlog_queue"], other["run_id"]) == (None, None, "20261127T120000Z-ab12cd34")
    assert formatted("batch 3: delivered 5, ...")["batch_id"] == 3
    assert formatted(f"backlog={Q0}: gone")["backlog_queue"] == Q0


def test_a_records_own_fields_are_fields_and_secrets_stay_masked(context):
    line = formatted("run summary", event="run_summary", remaining={Q0: 0}, at=NOW, secret=Secret("Endpoint=sb://x;"
                     "SharedAccessKey=abc", "env X"))
    assert line["event"] == "run_summary" and line["remaining"] == {Q0: 0} and line["at"] == NOW.isoformat()
    assert "abc" not in json.dumps(line) and "masked" in line["secret"]


def test_a_traceback_goes_where_tracebacks_are_wanted():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys
        exc_info = sys.exc_info()
    assert "RuntimeError: boom" in formatted("failed", exc_info=exc_info)["exception"]
    assert "exception" not in formatted("failed", exc_info=exc_info, tracebacks=False)


def test_the_context_takes_only_the_ids_it_knows():
    with pytest.raises(ValueError, match="unknown log context keys"):
        logs.set_context(batch_id="1")


def test_the_progress_lines_facts_become_fields():
    paced = PacingStats(sent=300, first_send_at=0.0, last_send_at=1.5, throttled=2, slowed_seconds=3.25, cap=250.0,
                        rate_limit=125.0, tasks=1)
    point = ProgressPoint(4, NOW, BatchStats(300, 2, 1, 0, 1.5, NOW - dt.timedelta(minutes=5), held=3, pacing=paced),
                          {Q0: 250})
    assert progress_fields(point) == {
        "event": "batch", "batch_id": 4, "remaining": {Q0: 250}, "remaining_total": 250, "delivered": 300,
        "dead_lettered": 2, "skipped": 1, "held": 3, "replayed": 0, "send_seconds": 1.5,
        "oldest_message_age_seconds": 300.0, "send_rate": 200.0, "send_rate_cap": 250.0, "throttled": 2,
        "slowed_seconds": 3.2, "rate_limit": 125.0, "batch_shape_refused": 0}
    assert progress_fields(ProgressPoint(5, NOW, None, {Q0: 0})) == {
        "event": "batch", "batch_id": 5, "remaining": {Q0: 0}, "remaining_total": 0, "idle": True}
