"""The state tables' upkeep decided on plain values: which properties an existing table is given at a start
(``storage.upkeep.properties_to_set``), how maintenance retries a lost commit race (``storage.upkeep.retried``),
its report (``run.maintain``), and which audit days ``--status`` reads (``run.status_report.audit_read_floor``)."""

import dataclasses
import datetime as dt

import pytest

from backlog_syphon.model import CheckpointRow
from backlog_syphon.run.maintain import MaintenanceReport, TableUpkeep
from backlog_syphon.run.status_report import audit_read_floor
from backlog_syphon.storage import audit_table, runs_table, state_tables, upkeep

Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"
UTC = dt.timezone.utc


def mark(queue, enqueued: dt.datetime | None):
    ms = None if enqueued is None else int(enqueued.timestamp() * 1000)
    return CheckpointRow(queue, 1, 40, ms, 40, ms, 3, "run", dt.datetime(2026, 12, 1, tzinfo=UTC), 40, 0, 0)


AUDIT = upkeep.with_retention(audit_table.AUDIT_TABLE_PROPERTIES, upkeep.DEFAULT_RETENTION_DAYS)


def test_a_table_holding_every_property_as_wanted_is_given_none_so_a_start_commits_nothing():
    current = dict(AUDIT) | {"delta.minReaderVersion": "1"}
    assert upkeep.properties_to_set(current, AUDIT) == {}


def test_an_older_table_gets_only_the_properties_it_lacks_or_holds_otherwise():
    current = {"delta.dataSkippingStatsColumns": "batch_id,backlog_queue,sequence_number,enqueued_time,outcome",
               "delta.logRetentionDuration": "interval 30 days"}
    assert upkeep.properties_to_set(current, AUDIT) == {
        "delta.checkpointInterval": "10", "delta.logRetentionDuration": "interval 1 days",
        "delta.deletedFileRetentionDuration": "interval 1 days", "delta.autoOptimize.autoCompact": "true"}


def test_a_table_made_under_another_window_gets_the_configured_one():
    seven_days = dict(upkeep.with_retention(state_tables.REWRITTEN_TABLE_PROPERTIES, 7))
    assert upkeep.properties_to_set(seven_days, upkeep.with_retention(state_tables.REWRITTEN_TABLE_PROPERTIES, 1)) == {
        "delta.logRetentionDuration": "interval 1 days", "delta.deletedFileRetentionDuration": "interval 1 days"}


@pytest.mark.parametrize("days", [1, 3])
def test_the_tables_keep_one_window_for_log_and_files_and_only_the_appended_ones_compact_themselves(days):
    for properties in (audit_table.AUDIT_TABLE_PROPERTIES, state_tables.REWRITTEN_TABLE_PROPERTIES,
                       runs_table.RUNS_TABLE_PROPERTIES):
        settings = dict(upkeep.with_retention(properties, days))
        # Time travel needs both the log and the files: the same window (Delta refuses a log window shorter
        # than the files'), and VACUUM keeps at least it.
        assert settings["delta.logRetentionDuration"] == settings["delta.deletedFileRetentionDuration"] == \
            f"interval {days} days"
        # Never set: it would let Delta forget a batch's transaction version, and a replay append twice.
        assert "delta.setTransactionRetentionDuration" not in settings
    assert dict(audit_table.AUDIT_TABLE_PROPERTIES)["delta.autoOptimize.autoCompact"] == "true"
    assert dict(runs_table.RUNS_TABLE_PROPERTIES)["delta.autoOptimize.autoCompact"] == "true"
    assert "delta.autoOptimize.autoCompact" not in dict(state_tables.REWRITTEN_TABLE_PROPERTIES)  # one live file each


class Conflict(Exception):
    pass


def test_a_lost_commit_race_is_retried_and_anything_else_raised_at_once():
    calls, pauses = [], []

    def action():
        calls.append(1)
        if len(calls) < 3:
            raise Conflict("concurrent append")
        return "done"

    is_conflict = lambda exc: isinstance(exc, Conflict)  # noqa: E731
    assert upkeep.retried(action, is_conflict, "OPTIMIZE t", sleep=pauses.append) == "done"
    assert len(calls) == 3 and pauses == [upkeep.MAINTENANCE_RETRY_SECONDS] * 2

    def always_conflicts():
        raise Conflict("again")

    with pytest.raises(Conflict):
        upkeep.retried(always_conflicts, is_conflict, "OPTIMIZE t", attempts=2, sleep=pauses.append)

    def broken():
        calls.append("broken")
        raise ValueError("no such table")

    with pytest.raises(ValueError):
        upkeep.retried(broken, is_conflict, "VACUUM t", sleep=pauses.append)
    assert calls.count("broken") == 1


def test_the_maintenance_report_names_each_table_and_fails_when_one_failed():
    done = TableUpkeep("/data/audit", exists=True, window="interval 1 days", files_removed=48, files_added=1,
                       seconds=3.2)
    missing = TableUpkeep("/data/checkpoint_runs", exists=False)
    rewritten = TableUpkeep("/data/checkpoint_lease", exists=True, window="interval 1 days", compacted=False,
                            seconds=0.4)
    report = MaintenanceReport((done, missing, rewritten))
    assert not report.failed
    assert report.lines() == [
        "state tables (OPTIMIZE where the syphon appends, then VACUUM):",
        "  /data/audit: compacted 48 file(s) into 1, vacuumed files past its window (interval 1 days) (3.2 s)",
        "  /data/checkpoint_runs: does not exist yet (nothing to do)",
        "  /data/checkpoint_lease: rewritten whole by the syphon, not compacted, vacuumed files past its window "
        "(interval 1 days) (0.4 s)", "maintenance done"]
    failed = MaintenanceReport((done, dataclasses.replace(done, table="/data/checkpoint", error="IOError: denied")))
    assert failed.failed and failed.lines()[2] == "  /data/checkpoint: FAILED: IOError: denied"
    assert failed.lines()[-1].startswith("maintenance failed for some tables: run it again")


def test_status_reads_the_audit_from_the_day_before_the_oldest_purge_mark():
    checkpoint = {Q0: mark(Q0, dt.datetime(2026, 12, 1, 0, 30, tzinfo=UTC)),
                  Q1: mark(Q1, dt.datetime(2026, 11, 20, 23, 59, tzinfo=UTC))}
    assert audit_read_floor(checkpoint, [Q0, Q1]) == dt.date(2026, 11, 19)  # a day of clock skew allowed
    assert audit_read_floor({Q0: checkpoint[Q0]}, [Q0]) == dt.date(2026, 11, 30)


def test_status_reads_every_day_where_a_mark_is_missing_or_names_no_enqueue_time():
    marked = mark(Q0, dt.datetime(2026, 12, 1, tzinfo=UTC))
    assert audit_read_floor({Q0: marked}, [Q0, Q1]) is None  # Q1 has no checkpoint row yet
    assert audit_read_floor({Q0: marked, Q1: mark(Q1, None)}, [Q0, Q1]) is None  # an older version's mark
    assert audit_read_floor({}, []) is None
