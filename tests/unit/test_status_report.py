"""How a backlog stands (``run.status_report``): the status command's verdict and report (plain values)."""

import dataclasses
import datetime as dt

import pytest

from backlog_syphon.model import BacklogState, BrokerCount, CheckpointRow, RunMode, RunRow
from backlog_syphon.run.lease import new_lease, released
from backlog_syphon.run.status_report import QueueStatus, StatusReport, ago, lease_text, removed_by_decommission

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)
Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"
DLQ0, DLQ1 = f"{Q0}/$DeadLetterQueue", f"{Q1}/$DeadLetterQueue"


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


def test_a_backlog_whose_queues_a_decommission_removed_says_so_and_exits_0():
    removal = RunRow("20261201T090000Z-cd", "backlog", "decommission", None, None, NOW, NOW - dt.timedelta(hours=1), 0,
                     "removed 2 backlog queue(s)", 0, 0, 0, 0, 0, None, None, 0, None,
                     mode=RunMode.DECOMMISSION, removed_queues=[Q0, Q1])
    gone = [QueueStatus(Q0, count(exists=False)), QueueStatus(Q1, count(exists=False))]
    verdict = report(gone, runs=[removal]).verdict
    assert (verdict.state, verdict.exit_code, verdict.line) == (
        BacklogState.DECOMMISSIONED, 0,
        "decommissioned: no backlog queue is left (2 removed by run 20261201T090000Z-cd at 2026-11-27 11:00:00 UTC)")
    # A queue that exists again (created anew by a legacy client still running) is no longer decommissioned.
    again = report([QueueStatus(Q0, count()), gone[1]], runs=[removal]).verdict
    assert (again.state, again.line) == (BacklogState.DRAINED, "drained")
    assert removed_by_decommission([]) is None
