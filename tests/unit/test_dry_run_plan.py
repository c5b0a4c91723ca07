"""The dry run's plan from classified rows: destination refusals, link size limits, summaries (chispa)."""

from datetime import timedelta, timezone

from chispa import assert_df_equality
from pyspark.sql.types import LongType, StringType, StructField, StructType

from backlog_syphon.rows import BACKLOG_ROW_SCHEMA
from backlog_syphon.run.dry_run_plan import (DestinationProblem, apply_destination_checks, dead_letter_plan,
                                         destination_summary)
from backlog_syphon.restore.rules import classify_messages

from .test_rules import MINUTE_MS, NOW, backlog_row

PLAN_SCHEMA = StructType([StructField("sequence_number", LongType()), StructField("action", StringType()),
                          StructField("reason_code", StringType())])


def planned(spark, rows, problems=None, max_sizes=None):
    classified = classify_messages(spark.createDataFrame(rows, BACKLOG_ROW_SCHEMA), now=NOW)
    return apply_destination_checks(classified, problems or {}, max_sizes or {})


def test_refused_destinations_and_oversized_messages_become_dead_letters(spark):
    rows = [
        backlog_row(1),
        backlog_row(2, destination="gone"),
        backlog_row(3, destination="small", raw_message=b"x" * 50),
        backlog_row(4, destination="small", raw_message=b"x" * 51),
        backlog_row(5, destination="gone", content_type="application/vnd.ms-servicebus-ping"),  # stays skipped
        backlog_row(6, destination=None, decode_problem_code="missing_path", decode_problem_reason="no path"),
    ]
    result = planned(spark, rows, problems={"gone": DestinationProblem("destination_not_found", "no 'gone'")},
                     max_sizes={"small": 50, "orders": 1000})
    assert_df_equality(
        result.select(*PLAN_SCHEMA.fieldNames()),
        spark.createDataFrame([(1, "deliver", None), (2, "dead_letter", "destination_not_found"),
                               (3, "deliver", None), (4, "dead_letter", "message_too_large"),
                               (5, "skip", "ping"), (6, "dead_letter", "missing_path")], PLAN_SCHEMA),
        ignore_row_order=True, ignore_nullable=True)
    reasons = {row["sequence_number"]: row["reason"] for row in dead_letter_plan(result).collect()}
    assert reasons[2] == "no 'gone'"
    assert reasons[4] == "stored message of 51 bytes exceeds the 50 bytes 'small' accepts"
    assert [row["sequence_number"] for row in dead_letter_plan(result).collect()] == [2, 4, 6]


def test_destination_summary_counts_sizes_sessions_times_schedules_and_expiry(spark):
    early, late = NOW - timedelta(hours=2), NOW - timedelta(minutes=1)
    rows = [
        backlog_row(1, enqueued_time=early, session_id="a", body_size=10),
        backlog_row(2, enqueued_time=late, session_id="a", body_size=20,
                    scheduled_enqueue_time=NOW + timedelta(hours=1)),
        backlog_row(3, session_id="b", body_size=30, time_to_live_ms=MINUTE_MS),  # waited 10 min: expired
        backlog_row(4, destination="payments", body_size=5),
        backlog_row(5, destination=None, decode_problem_code="missing_path", decode_problem_reason="no path"),
    ]
    summary = {row["destination"]: row.asDict() for row in destination_summary(planned(spark, rows), now=NOW).collect()}
    orders = summary["orders"]
    assert (orders["messages"], orders["body_bytes"], orders["sessions"]) == (3, 60, 2)
    assert (orders["oldest_enqueued"].astimezone(timezone.utc), orders["newest_enqueued"].astimezone(timezone.utc)) \
        == (early, late)
    assert (orders["scheduled"], orders["expired"]) == (1, 1)
    assert (orders["to_deliver"], orders["to_dead_letter"], orders["to_skip"]) == (2, 1, 0)
    assert (summary["payments"]["messages"], summary["payments"]["to_deliver"]) == (1, 1)
    assert summary["(no destination)"]["to_dead_letter"] == 1
    assert list(summary) == sorted(summary)


def test_the_plan_shows_renames_and_what_skipped_destinations_would_leave(spark):
    from backlog_syphon.run.dry_run_plan import renamed_destinations

    rows = [backlog_row(1, destination="orders-v1"), backlog_row(2, destination="Orders-V1"),
            backlog_row(3, destination="orders"), backlog_row(4, destination="payments"),
            backlog_row(5, destination="payments")]
    classified = classify_messages(spark.createDataFrame(rows, BACKLOG_ROW_SCHEMA), now=NOW,
                                   destination_map={"orders-v1": "orders"}, skip_destinations=["payments"])
    summary = {row["destination"]: row for row in destination_summary(classified, now=NOW).collect()}
    assert (summary["orders"]["messages"], summary["orders"]["to_deliver"], summary["orders"]["to_hold"]) == (3, 3, 0)
    assert summary["orders"]["renamed_from"] == "Orders-V1, orders-v1"
    assert (summary["payments"]["to_hold"], summary["payments"]["to_deliver"]) == (2, 0)
    assert summary["payments"]["renamed_from"] == ""
    assert [tuple(row) for row in renamed_destinations(classified).collect()] == [
        ("Orders-V1", "orders", 1), ("orders-v1", "orders", 1)]
