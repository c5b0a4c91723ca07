"""How a run ended (``run.run_end``): its exit code, closing line and runs-table row (plain values)."""

import datetime as dt

import pytest

from backlog_syphon.errors import BatchFailedError, DestinationUnavailableError, LeaseHeldError, SettingsError
from backlog_syphon.model import BatchStats, JobIds, PacingStats, RunRow
from backlog_syphon.run.run_end import STOPPED_LINE, failure_end, run_end, run_row

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)
Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"
DLQ0, DLQ1 = f"{Q0}/$DeadLetterQueue", f"{Q1}/$DeadLetterQueue"


@pytest.mark.parametrize("trigger, drained, stopped, remaining, held, redrive, code, line", [
    ("available_now", True, False, {Q0: 0}, 0, False, 0, "drained"),
    ("available_now", True, False, {Q0: 7}, 7, False, 0,
     "drained; 7 message(s) left in the backlog for restore.skip_destinations"),
    ("available_now", False, False, {Q0: 3, Q1: 2}, 0, False, 4,
     "5 message(s) remain in the backlog (see 'remaining'): run again, or look at why"),
    ("available_now", False, True, {Q0: 3}, 0, False, 0, STOPPED_LINE),  # a stop on request is done, not short
    ("30 seconds", False, True, {Q0: 3}, 0, False, 0, STOPPED_LINE),
    ("available_now", True, False, {DLQ0: 4}, 0, True, 0, "re-drive done; 4 message(s) stay in the dead-letter queues"),
])
def test_a_run_that_ran_through_ends_with_its_exit_code_and_line(trigger, drained, stopped, remaining, held, redrive,
                                                                  code, line):
    end = run_end(trigger, drained=drained, stopped=stopped, remaining=remaining, held=held, redrive=redrive)
    assert (end.exit_code, end.line) == (code, line)


def test_a_failed_run_ends_with_its_errors_exit_code_and_one_line():
    batch = failure_end(BatchFailedError(3, "send", DestinationUnavailableError("'payments' unavailable")))
    assert batch.exit_code == 1
    assert batch.line == ("batch 3, step send: 'payments' unavailable. Nothing was lost: the next run resumes "
                          "safely from the audit and checkpoint tables")
    assert failure_end(LeaseHeldError("another run is delivering from this backlog")).exit_code == 3
    assert failure_end(SettingsError("check primary.namespace")) == type(batch)(2, "check primary.namespace")
    # Spark Connect hands the client only the text of Spark's streaming exception: the sink's line is in it.
    connect = failure_end(RuntimeError("StreamingQueryException: ... syphon batch failed: batch 1, step record: boom\n"
                                       "  at org.apache.spark..."))
    assert (connect.exit_code, connect.line.split(".")[0]) == (1, "batch 1, step record: boom")
    assert failure_end(ValueError("bad\nmore")).line == "the run failed: ValueError: bad"


def test_the_runs_row_sums_outcomes_over_destinations_and_the_throttling_over_batches():
    paced = [BatchStats(10, 1, 0, 0, 2.0, None, pacing=PacingStats(sent=10, slowed_seconds=1.5, tasks=1)),
             None,  # an idle batch
             BatchStats(5, 0, 0, 0, 1.0, None, held=2, pacing=PacingStats(sent=5, slowed_seconds=0.25, tasks=1))]
    row = run_row(run_id="r1", source="backlog", trigger="available_now", job=JobIds("11", "22"),
                  started_at=NOW, ended_at=NOW + dt.timedelta(minutes=1), end=run_end(
                      "available_now", drained=False, stopped=False, remaining={Q0: 4, Q1: 0}, held=2,
                      redrive=False),
                  per_destination={"orders": {"delivered": 10, "dead_lettered": 1, "skipped_ping": 0, "held": 0},
                                   "payments": {"delivered": 5, "held": 2}},
                  remaining={Q0: 4, Q1: 0}, batches=paced)
    assert row == RunRow(run_id="r1", source="backlog", trigger="available_now", job_id="11", job_run_id="22",
                         started_at=NOW, ended_at=NOW + dt.timedelta(minutes=1), exit_code=4,
                         closing_line="4 message(s) remain in the backlog (see 'remaining'): run again, or look at why",
                         delivered=15, dead_lettered=1, skipped=0, held=2, not_selected=0, remaining={Q0: 4, Q1: 0},
                         remaining_total=4, batches=2, throttled_seconds=1.75, mode="syphon")
    # A failed run: nothing counted at its end. Over Spark Connect the tasks' pacing never reaches the driver.
    connect = run_row(run_id="r2", source="dead_letters", trigger="available_now", job=JobIds(), started_at=NOW,
                      ended_at=NOW, end=failure_end(RuntimeError("x")), per_destination={}, remaining=None,
                      batches=[BatchStats(1, 0, 0, 0, 1.0, None)])
    assert (connect.remaining, connect.remaining_total, connect.throttled_seconds, connect.job_run_id) == (
        None, None, None, None)
    assert run_row(run_id="r3", source="backlog", trigger="available_now", job=JobIds(), started_at=NOW, ended_at=NOW,
                   end=failure_end(RuntimeError("x")), per_destination={}, remaining=None,
                   batches=[]).throttled_seconds == 0
