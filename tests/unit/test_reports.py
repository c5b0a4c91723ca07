"""Audit table reports over a small in-memory audit DataFrame."""

import datetime as dt

from backlog_syphon.run.reports import audit_summary, dead_letter_reasons, moved_over_time, text_chart
from backlog_syphon.storage.audit_table import AUDIT_ROW_SCHEMA

T0 = dt.datetime(2024, 5, 1, 12, 0, 5)


def audit_row(run_id, seq, destination, outcome, reason_code=None, size=10, seconds=0):
    values = {"run_id": run_id, "batch_id": 0, "backlog_queue": "q/x-servicebus-transfer/0", "sequence_number": seq,
              "message_id": f"m{seq}", "destination": destination, "session_id": None, "outcome": outcome,
              "reason_code": reason_code, "reason": reason_code, "body_size": size, "enqueued_time": T0,
              "scheduled_enqueue_time": None, "time_to_live_ms": None,
              "outcome_time": T0 + dt.timedelta(seconds=seconds), "attempts": 1, "dead_letter_reason": None,
              "dead_letter_error_description": None, "original_destination": None,
              "message_state": None}
    return tuple(values[field.name] for field in AUDIT_ROW_SCHEMA.fields)


def audit(spark):
    return spark.createDataFrame([
        audit_row("r1", 1, "orders", "delivered", size=10),
        audit_row("r1", 2, "orders", "delivered", size=20, seconds=70),
        audit_row("r1", 3, "orders", "dead_lettered", "message_too_large", size=999, seconds=70),
        audit_row("r1", 4, None, "dead_lettered", "missing_path", seconds=75),
        audit_row("r2", 5, "payments", "delivered", seconds=200),
    ], AUDIT_ROW_SCHEMA)


def test_summary_per_run_and_destination(spark):
    rows = [row.asDict() for row in audit_summary(audit(spark)).collect()]
    assert [(r["run_id"], r["destination"], r["delivered"], r["dead_lettered"], r["skipped_ping"], r["delivered_bytes"])
            for r in rows] == [("r1", "(no destination)", 0, 1, 0, 0), ("r1", "orders", 2, 1, 0, 30),
                               ("r2", "payments", 1, 0, 0, 10)]
    only_r2 = audit_summary(audit(spark), run_id="r2").collect()
    assert [(r["destination"], r["delivered"]) for r in only_r2] == [("payments", 1)]


def test_dead_letter_reasons_and_moved_over_time(spark):
    reasons = {(r["destination"], r["reason_code"]): r["count"] for r in dead_letter_reasons(audit(spark)).collect()}
    assert reasons == {("orders", "message_too_large"): 1, (None, "missing_path"): 1}
    buckets = [(r["bucket_start"], r["moved"], r["delivered"]) for r in moved_over_time(audit(spark), run_id="r1").collect()]
    assert buckets == [(dt.datetime(2024, 5, 1, 12, 0), 1, 1), (dt.datetime(2024, 5, 1, 12, 1), 3, 1)]


def test_text_chart_scales_bars_to_the_peak():
    assert text_chart([("12:00", 10), ("12:01", 5), ("12:02", 0)], width=10) == [
        "12:00 ########## 10", "12:01 #####      5", "12:02            0"]
    assert text_chart([]) == ["(no data)"]


def test_a_run_that_left_only_what_skipped_destinations_hold_has_drained():
    """restore.skip_destinations is what the operator asked for: held messages do not make an available-now
    run fail (exit code 4); anything else left does."""
    from backlog_syphon.run.run_records import RunSummary

    counts = {"delivered": 5, "dead_lettered": 0, "skipped_ping": 0, "held": 0}
    per_destination = {"orders": counts, "payments": {**counts, "delivered": 0, "held": 3}}
    summary = RunSummary("r1", per_destination, remaining={"q/0": 2, "q/1": 1})
    assert summary.held == {"payments": 3} and summary.drained
    assert not RunSummary("r1", per_destination, remaining={"q/0": 4}).drained
    plain = RunSummary("r1", {"orders": counts}, remaining={"q/0": 1})
    assert not plain.drained
    # Without restore.skip_destinations at work the summary keeps its columns (scripts read them).
    assert plain.lines()[1].split() == ["destination", "delivered", "dead-lettered", "skipped"]
    assert plain.lines()[2].split() == ["orders", "5", "0", "0"]
    lines = summary.lines()
    assert lines[1].split()[-1] == "held" and lines[3].split()[-1] == "3"
    assert lines[-1] == ("  left in the backlog for restore.skip_destinations: 3 message(s) (payments 3); "
                         "a run without the skip delivers them")



def test_what_a_run_leaves_on_purpose_held_or_not_selected_counts_as_drained_and_a_redrive_has_its_column():
    from backlog_syphon.run.run_records import RunSummary

    counts = {"delivered": 1, "dead_lettered": 0, "skipped_ping": 0, "held": 1, "not_selected": 2}
    summary = RunSummary("r1", {"orders": counts}, remaining={"q/0": 3})
    assert summary.stayed == {"orders": 3} and summary.drained
    assert "not selected" not in summary.lines()[1]  # a backlog run's summary: no re-drive column
    redrive = RunSummary("r1", {"orders": counts}, remaining={"q/0/$DeadLetterQueue": 9}, redrive=True)
    assert redrive.drained  # what a re-drive leaves (or dead-letters again) stays by design
    assert redrive.lines()[1].split()[-2:] == ["not", "selected"] and redrive.lines()[2].split()[-1] == "2"


def test_a_migration_has_drained_when_its_entities_hold_only_what_stays_and_its_dead_letter_sources_are_audited():
    from backlog_syphon.run.run_records import RunSummary

    counts = {"delivered": 5, "dead_lettered": 1, "expired": 1, "covered": 2}
    dead_lettered_into_a_source = RunSummary("r1", {"orders": counts}, remaining={
        "orders": 0, "orders/$DeadLetterQueue": 2}, migration=True, left_in_place=1)
    assert dead_lettered_into_a_source.drained
    assert "covered" in dead_lettered_into_a_source.lines()[1]
    assert not RunSummary("r1", {"orders": counts}, remaining={"orders": 2, "orders/$DeadLetterQueue": 0},
                          migration=True, left_in_place=1).drained
