"""How a run ended, its runs-table row, and the status command's verdict and report (plain values)."""

import dataclasses
import datetime as dt

import pytest

from backlog_syphon.errors import BatchFailedError, DestinationUnavailableError, LeaseHeldError, SettingsError
from backlog_syphon.model import (BacklogState, BatchStats, BrokerCount, CheckpointRow, JobIds, PacingStats,
                                  RunRow)
from backlog_syphon.run.lease import new_lease, released
from backlog_syphon.run.verdict import (STOPPED_LINE, QueueStatus, StatusReport, ago, failure_end, lease_text,
                                        run_end, run_row)

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)
Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"
DLQ0, DLQ1 = f"{Q0}/$DeadLetterQueue", f"{Q1}/$DeadLetterQueue"


# --- how a run ended ------------------------------------------------------------------------------

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
                         remaining_total=4, batches=2, throttled_seconds=1.75)
    # A failed run: nothing counted at its end. Over Spark Connect the tasks' pacing never reaches the driver.
    connect = run_row(run_id="r2", source="dead_letters", trigger="available_now", job=JobIds(), started_at=NOW,
                      ended_at=NOW, end=failure_end(RuntimeError("x")), per_destination={}, remaining=None,
                      batches=[BatchStats(1, 0, 0, 0, 1.0, None)])
    assert (connect.remaining, connect.remaining_total, connect.throttled_seconds, connect.job_run_id) == (
        None, None, None, None)
    assert run_row(run_id="r3", source="backlog", trigger="available_now", job=JobIds(), started_at=NOW, ended_at=NOW,
                   end=failure_end(RuntimeError("x")), per_destination={}, remaining=None,
                   batches=[]).throttled_seconds == 0


# --- the status command ---------------------------------------------------------------------------

def count(messages=0, *, exact=True, oldest_minutes=None, reasons=None, complete=True, exists=True):
    oldest = None if oldest_minutes is None else NOW - dt.timedelta(minutes=oldest_minutes)
    return BrokerCount(messages, exact, oldest, reasons or {}, complete, exists)


def mark(queue, minutes_ago=180, through=40):
    return CheckpointRow(queue, 1, through, None, through, None, 3, "earlier-run",
                         NOW - dt.timedelta(minutes=minutes_ago), through, 0, 0)


def report(backlog=(), dead=(), lease=None, runs=(), held=None, ended_run_id=None):
    return StatusReport(at=NOW, backlog=tuple(backlog), dead_letters=tuple(dead), lease=lease, runs=tuple(runs),
                        held=held or {}, counted_by="peeks", runs_table="/data/checkpoint_runs",
                        ended_run_id=ended_run_id)


def test_a_backlog_with_nothing_in_it_is_drained():
    verdict = report([QueueStatus(Q0, count(), mark(Q0)), QueueStatus(Q1, count(exists=False))],
                     [QueueStatus(DLQ0, count())]).verdict
    assert (verdict.state, verdict.exit_code, verdict.line) == (BacklogState.DRAINED, 0, "drained")


def test_messages_that_nobody_delivers_wait_with_the_time_of_the_last_progress():
    waiting = report([QueueStatus(Q0, count(12, oldest_minutes=200), mark(Q0)), QueueStatus(Q1, count(3))]).verdict
    assert (waiting.state, waiting.exit_code, waiting.line) == (
        BacklogState.WAITING, 4, "15 waiting, last progress 3 h ago")
    bound = report([QueueStatus(Q0, count(5000, exact=False))], [QueueStatus(DLQ0, count(1, reasons={"x": 1}))]).verdict
    assert bound.line == "at most 5000 waiting, last progress never; dead-letters: 1 (x 1)"


def test_dead_letters_alone_say_how_many_and_why():
    verdict = report([QueueStatus(Q0, count())], [
        QueueStatus(DLQ0, count(3, reasons={"missing_path": 1, "destination_not_found": 2})),
        QueueStatus(DLQ1, count(250, reasons={"MaxDeliveryCountExceeded": 100}, complete=False))]).verdict
    assert (verdict.state, verdict.exit_code) == (BacklogState.DEAD_LETTERS, 5)
    assert verdict.line == ("dead-letters: 253 (reasons of the first 103: MaxDeliveryCountExceeded 100, "
                            "destination_not_found 2, missing_path 1)")


def test_messages_held_for_a_skipped_destination_wait_on_purpose():
    held = report([QueueStatus(Q0, count(7), mark(Q0, minutes_ago=2))], held={"payments": 7}).verdict
    assert (held.state, held.exit_code, held.line) == (
        BacklogState.DRAINED, 0, "drained; 7 message(s) held for restore.skip_destinations")
    more = report([QueueStatus(Q0, count(9), mark(Q0, minutes_ago=2))], held={"payments": 7}).verdict
    assert (more.state, more.line) == (
        BacklogState.WAITING, "9 (7 held for restore.skip_destinations) waiting, last progress 2 min ago")


def test_a_live_lease_says_who_holds_it_since_when_and_what_waits():
    lease = new_lease("sb/contoso", "run-a", "worker-1", 4242, NOW - dt.timedelta(minutes=10), 120)
    lease = dataclasses.replace(lease, expires_at=NOW + dt.timedelta(seconds=90))
    verdict = report([QueueStatus(Q0, count(40), mark(Q0, minutes_ago=1))], lease=lease).verdict
    assert (verdict.state, verdict.exit_code) == (BacklogState.LEASE_HELD, 3)
    assert verdict.line == ("lease held by run run-a on worker-1 (pid 4242) since 2026-11-27 11:50:00 UTC; 40 waiting, "
                            "last progress 60 s ago")


def test_the_lease_line_tells_a_released_lease_from_a_crashed_holders():
    lease = new_lease("sb/contoso", "run-a", "worker-1", 4242, NOW - dt.timedelta(minutes=10), 120)
    assert lease_text(None, NOW) == "never taken"
    assert lease_text(released(lease, NOW - dt.timedelta(minutes=5)), NOW) == (
        "free (released by run run-a at 2026-11-27 11:55:00 UTC)")
    assert lease_text(lease, NOW) == ("free (run run-a's lease expired at 2026-11-27 11:52:00 UTC without being "
                                      "released: that run crashed or was killed)")
    assert report(lease=lease).verdict.state == BacklogState.DRAINED  # a crashed holder holds nothing


def test_a_lease_whose_run_the_checkpoint_table_names_as_ended_is_free_before_it_expires():
    lease = new_lease("sb/contoso", "run-a", "worker-1", 4242, NOW - dt.timedelta(minutes=1), 120)
    assert lease.expires_at > NOW
    assert lease_text(lease, NOW, "run-a") == "free (given back by run run-a with its last commit)"
    assert report(lease=lease, ended_run_id="run-a").verdict.state == BacklogState.DRAINED
    # An earlier run's end frees nothing of a later run's lease.
    assert report(lease=lease, ended_run_id="run-0").verdict.state == BacklogState.LEASE_HELD


def test_the_report_shows_queues_marks_lease_runs_and_ends_with_the_verdict():
    run = RunRow("20261127T110000Z-ab", "backlog", "available_now", "11", "22", NOW, NOW, 0, "drained", 40, 1, 0, 0, 0,
                 {Q0: 0}, 0, 1, 0.0)
    text = report([QueueStatus(Q0, count(), mark(Q0)), QueueStatus(Q1, count(120, exact=False, oldest_minutes=30))],
                  [QueueStatus(DLQ0, count(1, oldest_minutes=5, reasons={"missing_path": 1})),
                   QueueStatus(DLQ1, count())],
                  runs=[run]).lines()
    assert text[0].startswith("backlog status at 2026-11-27 12:00:00 UTC (read only")
    assert text[2].split() == [Q0, "0", "-", "1", "40", "40", "2026-11-27", "09:00:00", "(3", "h", "ago)"]
    assert text[3].split()[:3] == [Q1, "<=120", "30"]
    assert [line.split()[:4] for line in text if DLQ0 in line] == [[DLQ0, "1", "5", "min"]]
    assert "  (1 other dead-letter queue(s) empty)" in text and "  lease: never taken" in text
    assert any(line.startswith("    20261127T110000Z-ab  backlog") and "exit 0" in line and "job run 22" in line
               for line in text)
    assert text[-1] == "verdict: at most 120 waiting, last progress 3 h ago; dead-letters: 1 (missing_path 1)"
    fields = report([QueueStatus(Q0, count(), mark(Q0))], runs=[run]).as_dict()
    assert (fields["state"], fields["exit_code"], fields["backlog"][0]["delivered_through"]) == ("drained", 0, 40)
    assert fields["runs"][0]["job_run_id"] == "22"


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (42, "42 s"), (300, "5 min"), (3 * 3600, "3 h"),
                                           (3 * 86400, "3 d"), (-5, "0 s")])
def test_ages_read_in_the_unit_people_use(seconds, text):
    assert ago(NOW + dt.timedelta(seconds=seconds), NOW) == text
