"""The migration mode's decision per row (column expressions, on a local Spark session): where it goes, and
whether it is delivered as it was, held, expired or dead-lettered, in precedence order."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from backlog_syphon.migration.copy_rules import CopyClassifier
from backlog_syphon.model import Action, DestinationShape, EntityKind, MessageState, ReasonCode, Route
from backlog_syphon.rows import BACKLOG_ROW_COLUMNS, BACKLOG_ROW_SCHEMA

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
ROUTES = {"orders": Route("orders", "orders-v2"), "sessions": Route("sessions", "sessions"),
          "alerts": Route("alerts", "alerts")}


def row(sequence_number, queue="Orders", **overrides):
    values = dict.fromkeys(BACKLOG_ROW_COLUMNS)
    values.update({"backlog_queue": queue, "sequence_number": sequence_number, "enqueued_time": NOW - timedelta(minutes=10),
                   "message_id": f"m-{sequence_number}", "body_size": 100, "raw_message": b"\x00",
                   "message_state": MessageState.ACTIVE.value, **overrides})
    return tuple(values[column] for column in BACKLOG_ROW_COLUMNS)


def classify(spark, rows, **options):
    frame = spark.createDataFrame(rows, BACKLOG_ROW_SCHEMA)
    classifier = CopyClassifier(frame.columns, routes=ROUTES, max_message_size_bytes=1000, scheduled_margin_seconds=60,
                                destination_shapes={"sessions": DestinationShape("sessions", EntityKind.QUEUE, True)},
                                topics=["alerts"], **options)
    return {r["sequence_number"]: (r["destination"], r["action"], r["reason_code"], r["restored_time_to_live_ms"])
            for r in classifier(frame, now=NOW).collect()}


def test_each_row_goes_along_its_route_and_gets_one_action_in_precedence_order(spark):
    got = classify(spark, [
        row(1, time_to_live_ms=3_600_000),
        row(2, time_to_live_ms=600_000),  # exactly ten minutes: expired now
        row(3, decode_problem_code=ReasonCode.UNDECODABLE_MESSAGE.value, decode_problem_reason="broken",
            time_to_live_ms=1),
        row(4, message_state=MessageState.SCHEDULED.value, scheduled_enqueue_time=NOW + timedelta(seconds=30),
            time_to_live_ms=1),
        row(5, message_state=MessageState.SCHEDULED.value, scheduled_enqueue_time=NOW + timedelta(hours=1),
            time_to_live_ms=5_000),
        row(6, body_size=1001),
        row(7, queue="sessions"),
        row(8, queue="sessions", session_id="s-1", message_state=MessageState.DEFERRED.value),
        row(9, queue="alerts"),
        row(10, queue="alerts", message_state=MessageState.SCHEDULED.value,
            scheduled_enqueue_time=NOW + timedelta(hours=1)),
    ])
    assert got == {
        1: ("orders-v2", Action.DELIVER, None, 3_000_000),  # what is left of its time to live
        2: ("orders-v2", Action.EXPIRE, ReasonCode.EXPIRED_IN_SOURCE, None),
        3: ("orders-v2", Action.DEAD_LETTER, ReasonCode.UNDECODABLE_MESSAGE, None),
        4: ("orders-v2", Action.HOLD, ReasonCode.SCHEDULED_SOON, None),
        5: ("orders-v2", Action.DELIVER, None, 5_000),  # a scheduled message keeps its whole time to live
        6: ("orders-v2", Action.DEAD_LETTER, ReasonCode.MESSAGE_TOO_LARGE, None),
        7: ("sessions", Action.DEAD_LETTER, ReasonCode.SESSION_REQUIRED, None),
        8: ("sessions", Action.DELIVER, None, None),
        9: ("alerts", Action.HOLD, ReasonCode.IN_TRANSIT, None),  # a topic's active message: read in a subscription
        10: ("alerts", Action.DELIVER, None, None),
    }


def test_a_covered_subscriptions_copy_is_covered_unless_expired_and_only_the_leads_is_judged(spark):
    lead, other = "events/Subscriptions/all", "events/Subscriptions/eu"
    routes = {lead.lower(): Route(lead, "events"), other.lower(): Route(other, "events", covered_by=lead)}
    frame = spark.createDataFrame([row(1, queue=lead), row(1, queue=other), row(2, queue=other, time_to_live_ms=1),
                                   row(3, queue=other, body_size=1001)], BACKLOG_ROW_SCHEMA)
    classifier = CopyClassifier(frame.columns, routes=routes, max_message_size_bytes=1000, scheduled_margin_seconds=60)
    got = {(r["backlog_queue"], r["sequence_number"]): (r["action"], r["reason_code"], r["reason"])
           for r in classifier(frame, now=NOW).collect()}
    assert got[(lead, 1)][:2] == (Action.DELIVER, None)
    assert got[(other, 1)] == (Action.COVER, ReasonCode.FANNED_OUT, f"sent to the topic events once, from {lead}, "
                                                                     f"whose copy the topic gives this subscription again")
    assert got[(other, 2)][0] == Action.EXPIRE and got[(other, 3)][0] == Action.COVER
