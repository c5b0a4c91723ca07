"""Classification of backlog rows (chispa on small DataFrames) and how backlog rows are filled."""

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from chispa import assert_df_equality
from pyspark.sql.types import LongType, StringType, StructField, StructType

from backlog_syphon.restore.amqp.message import DecodedMessage, MessageHeader, MessageProperties
from backlog_syphon.restore.amqp.values import Described, Symbol, Timestamp, ULong
from backlog_syphon.model import TtlPolicy
from backlog_syphon.restore.legacy_properties import PING_CONTENT_TYPE, LegacyFields, Problem
from backlog_syphon.restore.backlog_rows import backlog_row_values, legacy_fields_to_row_values, message_id_text
from backlog_syphon.rows import BACKLOG_ROW_COLUMNS, BACKLOG_ROW_SCHEMA
from backlog_syphon.restore.rules import CLASSIFICATION_COLUMNS, classify_messages

UTC = timezone.utc
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
MINUTE_MS = 60_000

RESULT_SCHEMA = StructType([
    StructField("sequence_number", LongType()),
    StructField("action", StringType()),
    StructField("reason_code", StringType()),
    StructField("reason", StringType()),
    StructField("restored_time_to_live_ms", LongType()),
])


def backlog_row(sequence_number, **overrides):
    row = {
        "backlog_queue": "contoso/x-servicebus-transfer/0",
        "sequence_number": sequence_number,
        "enqueued_time": NOW - timedelta(minutes=10),
        "message_id": f"m-{sequence_number}",
        "content_type": "application/json",
        "body_size": 100,
        "raw_message": b"\x00",
        "destination": "orders",
        "session_id": None,
        "partition_key": None,
        "time_to_live_ms": None,
        "scheduled_enqueue_time": None,
        "decode_problem_code": None,
        "decode_problem_reason": None,
        "dead_letter_reason": None,
        "dead_letter_error_description": None,
        "message_state": None,
        "backlog_expires_time": None,
        **overrides,
    }
    return tuple(row[column] for column in BACKLOG_ROW_COLUMNS)


def classified(spark, rows, **options):
    df = spark.createDataFrame(rows, BACKLOG_ROW_SCHEMA)
    return classify_messages(df, now=NOW, **options).select(*RESULT_SCHEMA.fieldNames())


def expected(spark, rows):
    return spark.createDataFrame(rows, RESULT_SCHEMA)


def assert_classified(spark, rows, expected_rows, **options):
    assert_df_equality(classified(spark, rows, **options), expected(spark, expected_rows),
                       ignore_row_order=True, ignore_nullable=True)


# --- every class -------------------------------------------------------------------------------

def test_every_class_under_the_remaining_policy(spark):
    rows = [
        backlog_row(1),
        backlog_row(2, time_to_live_ms=60 * MINUTE_MS, session_id="s"),
        backlog_row(3, content_type=PING_CONTENT_TYPE, destination=None, decode_problem_code="missing_path",
                    decode_problem_reason="x-ms-path is missing, so the destination is unknown"),
        backlog_row(4, destination=None, decode_problem_code="missing_path",
                    decode_problem_reason="x-ms-path is missing, so the destination is unknown"),
        backlog_row(5, destination=None, decode_problem_code="invalid_destination",
                    decode_problem_reason="x-ms-path '/orders' must not start with '/'"),
        backlog_row(6, decode_problem_code="invalid_legacy_property",
                    decode_problem_reason="x-ms-sessionid must be a string, got long"),
        backlog_row(7, time_to_live_ms=5 * MINUTE_MS),
        backlog_row(8, body_size=300_000),
        backlog_row(9, destination=None),
    ]
    assert_classified(spark, rows, [
        (1, "deliver", None, None, None),
        (2, "deliver", None, None, 50 * MINUTE_MS),
        (3, "skip", "ping", f"ping message (content type {PING_CONTENT_TYPE}); pings are never delivered", None),
        (4, "dead_letter", "missing_path", "x-ms-path is missing, so the destination is unknown", None),
        (5, "dead_letter", "invalid_destination", "x-ms-path '/orders' must not start with '/'", None),
        (6, "dead_letter", "invalid_legacy_property", "x-ms-sessionid must be a string, got long", None),
        (7, "dead_letter", "expired_in_backlog",
         "expired in the backlog: time to live 300000 ms, waited 600000 ms", None),
        (8, "dead_letter", "message_too_large", "body of 300000 bytes exceeds the limit of 262144 bytes", None),
        (9, "dead_letter", "missing_path", "no destination was decoded from x-ms-path", None),
    ], max_message_size_bytes=262_144)


def test_restart_policy_keeps_the_original_ttl_and_delivers_what_expired(spark):
    rows = [
        backlog_row(1, time_to_live_ms=5 * MINUTE_MS),  # expired in the backlog: still delivered (legacy)
        backlog_row(2, time_to_live_ms=60 * MINUTE_MS),
        backlog_row(3),
        backlog_row(4, body_size=300_000, time_to_live_ms=MINUTE_MS),
    ]
    assert_classified(spark, rows, [
        (1, "deliver", None, None, 5 * MINUTE_MS),
        (2, "deliver", None, None, 60 * MINUTE_MS),
        (3, "deliver", None, None, None),
        (4, "dead_letter", "message_too_large", "body of 300000 bytes exceeds the limit of 262144 bytes", None),
    ], ttl_policy="restart", max_message_size_bytes=262_144)


def test_remaining_ttl_counts_from_a_schedule_that_already_passed_and_not_from_a_future_one(spark):
    rows = [
        # Scheduled 4 minutes ago: the clock started then, not at the backlog enqueue 10 minutes ago.
        backlog_row(1, time_to_live_ms=5 * MINUTE_MS, scheduled_enqueue_time=NOW - timedelta(minutes=4)),
        # Scheduled in the future: no time has counted yet.
        backlog_row(2, time_to_live_ms=5 * MINUTE_MS, scheduled_enqueue_time=NOW + timedelta(hours=1)),
        # Exactly used up: expired.
        backlog_row(3, time_to_live_ms=10 * MINUTE_MS),
        # No enqueue time: treated as not having waited.
        backlog_row(4, time_to_live_ms=MINUTE_MS, enqueued_time=None),
        # Enqueued "after" now (clock skew): waited nothing, not a longer TTL.
        backlog_row(5, time_to_live_ms=MINUTE_MS, enqueued_time=NOW + timedelta(seconds=30)),
    ]
    assert_classified(spark, rows, [
        (1, "deliver", None, None, MINUTE_MS),
        (2, "deliver", None, None, 5 * MINUTE_MS),
        (3, "dead_letter", "expired_in_backlog",
         "expired in the backlog: time to live 600000 ms, waited 600000 ms", None),
        (4, "deliver", None, None, MINUTE_MS),
        (5, "deliver", None, None, MINUTE_MS),
    ], ttl_policy=TtlPolicy.REMAINING)


def test_precedence_ping_then_decode_problem_then_expiry_then_size(spark):
    everything_wrong = {"destination": None, "decode_problem_code": "missing_path",
                        "decode_problem_reason": "missing", "time_to_live_ms": 1, "body_size": 10**6}
    rows = [
        backlog_row(1, content_type=PING_CONTENT_TYPE, **everything_wrong),
        backlog_row(2, **everything_wrong),
        backlog_row(3, time_to_live_ms=1, body_size=10**6),
        backlog_row(4, body_size=10**6),
        backlog_row(5, body_size=1000),  # exactly at the limit is fine
    ]
    result = classified(spark, rows, max_message_size_bytes=1000).select("sequence_number", "reason_code")
    assert_df_equality(
        result,
        spark.createDataFrame(
            [(1, "ping"), (2, "missing_path"), (3, "expired_in_backlog"), (4, "message_too_large"), (5, None)],
            "sequence_number long, reason_code string",
        ),
        ignore_row_order=True, ignore_nullable=True,
    )


def test_without_a_size_limit_nothing_is_too_large(spark):
    assert_classified(spark, [backlog_row(1, body_size=10**9)], [(1, "deliver", None, None, None)])


def test_null_content_type_is_not_a_ping(spark):
    assert_classified(spark, [backlog_row(1, content_type=None)], [(1, "deliver", None, None, None)])


def test_input_columns_are_kept_and_four_are_added(spark):
    df = spark.createDataFrame([backlog_row(1, session_id="s", time_to_live_ms=MINUTE_MS)], BACKLOG_ROW_SCHEMA)
    result = classify_messages(df, now=NOW, ttl_policy="restart")
    assert tuple(result.columns) == BACKLOG_ROW_COLUMNS + CLASSIFICATION_COLUMNS
    assert dict(result.dtypes)["restored_time_to_live_ms"] == "bigint"
    assert_df_equality(result.select(*BACKLOG_ROW_COLUMNS), df, ignore_nullable=True)


# --- argument checks ---------------------------------------------------------------------------

def test_invalid_ttl_policy_names_the_valid_values(spark):
    df = spark.createDataFrame([], BACKLOG_ROW_SCHEMA)
    with pytest.raises(ValueError, match="ttl_policy must be one of 'remaining', 'restart'; got 'forever'"):
        classify_messages(df, now=NOW, ttl_policy="forever")


@pytest.mark.parametrize("options, message", [
    ({"now": datetime(2024, 5, 1)}, "timezone-aware"),
    ({"now": NOW, "max_message_size_bytes": 0}, "positive int"),
    ({"now": NOW, "max_message_size_bytes": True}, "positive int"),
])
def test_invalid_arguments(spark, options, message):
    df = spark.createDataFrame([], BACKLOG_ROW_SCHEMA)
    with pytest.raises(ValueError, match=message):
        classify_messages(df, **options)


def test_ttl_policy_values():
    assert TtlPolicy.parse("restart") is TtlPolicy.RESTART
    assert TtlPolicy.parse(TtlPolicy.REMAINING) is TtlPolicy.REMAINING
    assert [policy.value for policy in TtlPolicy] == ["remaining", "restart"]


# --- filling rows ------------------------------------------------------------------------------

def test_legacy_fields_to_row_values():
    fields = LegacyFields(
        destination=None, session_id="s", time_to_live=timedelta(seconds=1, microseconds=1),
        scheduled_enqueue_time=NOW,
        problems=(Problem("missing_path", "x-ms-path is missing"), Problem("invalid_legacy_property", "bad ttl")),
    )
    assert legacy_fields_to_row_values(fields) == {
        "destination": None,
        "session_id": "s",
        "time_to_live_ms": 1001,  # rounded up
        "scheduled_enqueue_time": NOW,
        "decode_problem_code": "missing_path",
        "decode_problem_reason": "x-ms-path is missing; bad ttl",
    }
    assert legacy_fields_to_row_values(LegacyFields("orders")) == {
        "destination": "orders", "session_id": None, "time_to_live_ms": None, "scheduled_enqueue_time": None,
        "decode_problem_code": None, "decode_problem_reason": None,
    }


def test_backlog_row_values_from_a_raw_legacy_message(spark):
    raw = DecodedMessage(
        header=MessageHeader(ttl_ms=24 * 3600 * 1000),  # the backlog copy's own time to live: a day
        message_annotations={Symbol("x-opt-sequence-number"): 41,
                             Symbol("x-opt-enqueued-time"): Timestamp(1714560000000),
                             Symbol("x-opt-partition-key"): "s-1"},
        properties=MessageProperties(message_id="m-41", content_type=Symbol("application/json")),
        application_properties={
            "x-ms-path": "a/b/topic",
            "x-ms-sessionid": "s-1",
            "x-ms-timetolive": Described(Symbol("com.microsoft:timespan"), 15 * 60 * 10_000_000),
            "x-ms-scheduledenqueuetimeutc": Timestamp(1714566600000),
        },
        body=(b"12345", b"678"),
    ).encode()
    row = backlog_row_values("contoso/x-servicebus-transfer/2", raw)
    assert row == {
        "backlog_queue": "contoso/x-servicebus-transfer/2",
        "sequence_number": 41,
        "enqueued_time": datetime(2024, 5, 1, 10, 40, tzinfo=UTC),
        "message_id": "m-41",
        "content_type": "application/json",
        "body_size": 8,
        "raw_message": raw,
        "destination": "a/b/topic",
        "session_id": "s-1",
        "partition_key": "s-1",
        "time_to_live_ms": 15 * MINUTE_MS,
        "scheduled_enqueue_time": datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
        "decode_problem_code": None,
        "decode_problem_reason": None,
        "dead_letter_reason": None,
        "dead_letter_error_description": None,
        "message_state": None,
        "backlog_expires_time": datetime(2024, 5, 1, 10, 40, tzinfo=UTC) + timedelta(days=1),
    }
    assert list(row) == list(BACKLOG_ROW_COLUMNS)
    # The values fit the schema.
    # The values fit the schema; timestamps compared as instants (collect() returns local naive times).
    df = spark.createDataFrame([tuple(row.values())], BACKLOG_ROW_SCHEMA)
    collected = df.selectExpr("*", "unix_millis(enqueued_time) AS enq_ms",
                              "unix_millis(scheduled_enqueue_time) AS sched_ms",
                              "unix_millis(backlog_expires_time) AS expires_ms").collect()[0].asDict()
    assert (collected.pop("enq_ms"), collected.pop("sched_ms"), collected.pop("expires_ms")) == (
        1714560000000, 1714566600000, 1714560000000 + 24 * 3600 * 1000)
    timestamps = ("enqueued_time", "scheduled_enqueue_time", "backlog_expires_time")
    assert {k: v for k, v in collected.items() if k not in timestamps} == {
        **{k: v for k, v in row.items() if k not in timestamps}, "raw_message": bytearray(raw)}


def test_backlog_row_values_prefer_the_peeked_sequence_number_and_time():
    raw = DecodedMessage(message_annotations={Symbol("x-opt-sequence-number"): 1},
                         application_properties={"x-ms-path": "orders"}).encode()
    row = backlog_row_values("q", raw, sequence_number=99, enqueued_time=NOW)
    assert (row["sequence_number"], row["enqueued_time"], row["destination"]) == (99, NOW, "orders")


def test_backlog_row_values_of_an_undecodable_message_carry_a_problem():
    row = backlog_row_values("q", b"\x00\x53", sequence_number=7, enqueued_time=NOW)
    assert row["decode_problem_code"] == "undecodable_message"
    assert row["decode_problem_reason"] == "truncated: the ulong runs past the end (1 bytes missing) at byte 1"
    assert (row["sequence_number"], row["body_size"], row["destination"]) == (7, 2, None)
    assert row["raw_message"] == b"\x00\x53"
    assert list(row) == list(BACKLOG_ROW_COLUMNS)


ROUTED = DecodedMessage(application_properties={"x-ms-path": "orders"}).encode()


@pytest.mark.parametrize("raw, reason", [
    # A value body holding an invalid UTF-8 string: the message cannot be forwarded right, so it is not.
    (ROUTED + b"\x00\x53\x77\xa1\x01\xff", f"a string is not valid UTF-8 at byte {len(ROUTED) + 3}"),
    # A data section that claims more bytes than there are.
    (ROUTED + b"\x00\x53\x75\xa0\x09abc",
     f"truncated: the binary runs past the end (6 bytes missing) at byte {len(ROUTED) + 3}"),
    # The broker's enqueued time out of datetime's range.
    (DecodedMessage(message_annotations={"x-opt-enqueued-time": Timestamp(2**62)},
                    application_properties={"x-ms-path": "orders"}).encode(), "out of range"),
])
def test_backlog_row_values_of_a_partly_readable_message_carry_a_problem(raw, reason):
    row = backlog_row_values("q", raw)
    assert row["decode_problem_code"] == "undecodable_message"
    assert reason in row["decode_problem_reason"]
    assert (row["destination"], row["body_size"]) == (None, len(raw))


def test_backlog_row_body_size_of_value_and_sequence_bodies():
    value = DecodedMessage(application_properties={"x-ms-path": "orders"}, body_kind="value", body="abc")
    sequence = DecodedMessage(application_properties={"x-ms-path": "orders"}, body_kind="sequence",
                              body=([1], [2, 3]))
    assert backlog_row_values("q", value.encode())["body_size"] == value.body_size == 8
    assert backlog_row_values("q", sequence.encode())["body_size"] == sequence.body_size == 8 + 10


@pytest.mark.parametrize("message_id, text", [
    (None, None), ("abc", "abc"), (Symbol("abc"), "abc"), (ULong(5), "5"), (2**40, "1099511627776"),
    (b"\x01\xff", "01ff"), (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
])
def test_message_id_text(message_id, text):
    assert message_id_text(message_id) == text


# --- restore.destination_map and restore.skip_destinations ----------------------------------------

ROUTING_SCHEMA = StructType([
    StructField("sequence_number", LongType()),
    StructField("destination", StringType()),
    StructField("original_destination", StringType()),
    StructField("action", StringType()),
    StructField("reason_code", StringType()),
])


def test_renames_apply_once_case_insensitively_and_keep_the_old_name(spark):
    rows = [backlog_row(1, destination="orders-v1"), backlog_row(2, destination="ORDERS-V1"),
            backlog_row(3, destination="orders"), backlog_row(4, destination=None, decode_problem_code="missing_path",
                                                              decode_problem_reason="x-ms-path is missing"),
            backlog_row(5, destination="legacy/Payments")]
    df = spark.createDataFrame(rows, BACKLOG_ROW_SCHEMA)
    out = classify_messages(df, now=NOW, destination_map={"orders-v1": "orders", "legacy/payments": "payments",
                                                           "orders": "never-applied-after-a-rename"})
    # A map with a chain is refused by the config; here it shows that a new name is not looked up again.
    assert_df_equality(out.select(*ROUTING_SCHEMA.fieldNames()), spark.createDataFrame([
        (1, "orders", "orders-v1", "deliver", None),
        (2, "orders", "ORDERS-V1", "deliver", None),
        (3, "never-applied-after-a-rename", "orders", "deliver", None),
        (4, None, None, "dead_letter", "missing_path"),
        (5, "payments", "legacy/Payments", "deliver", None),
    ], ROUTING_SCHEMA), ignore_row_order=True, ignore_nullable=True)
    assert list(out.columns[-len(CLASSIFICATION_COLUMNS):]) == list(CLASSIFICATION_COLUMNS)


def test_without_a_map_nothing_is_renamed(spark):
    out = classify_messages(spark.createDataFrame([backlog_row(1)], BACKLOG_ROW_SCHEMA), now=NOW)
    assert [(r["destination"], r["original_destination"]) for r in out.collect()] == [("orders", None)]


def test_skipped_destinations_are_held_after_the_rename_before_any_other_rule_but_pings(spark):
    rows = [
        backlog_row(1, destination="payments"),
        backlog_row(2, destination="Payments-Old"),  # renamed to payments, then held
        backlog_row(3, destination="PAYMENTS", time_to_live_ms=1),  # expired, but left untouched
        backlog_row(4, destination="payments", decode_problem_code="invalid_legacy_property",
                    decode_problem_reason="x-ms-sessionid must be a string, got long"),
        backlog_row(5, destination="payments", content_type=PING_CONTENT_TYPE),  # a ping is never delivered
        backlog_row(6, destination="orders"),
    ]
    df = spark.createDataFrame(rows, BACKLOG_ROW_SCHEMA)
    out = classify_messages(df, now=NOW, destination_map={"payments-old": "payments"},
                            skip_destinations=["payments"])
    assert_df_equality(out.select(*ROUTING_SCHEMA.fieldNames()), spark.createDataFrame([
        (1, "payments", None, "hold", "destination_skipped"),
        (2, "payments", "Payments-Old", "hold", "destination_skipped"),
        (3, "PAYMENTS", None, "hold", "destination_skipped"),
        (4, "payments", None, "hold", "destination_skipped"),
        (5, "payments", None, "skip", "ping"),
        (6, "orders", None, "deliver", None),
    ], ROUTING_SCHEMA), ignore_row_order=True, ignore_nullable=True)
    reason = out.where("sequence_number = 1").first()["reason"]
    assert reason == "destination 'payments' is in restore.skip_destinations: left in the backlog for a later run"
    assert out.where("action = 'hold'").select("restored_time_to_live_ms").distinct().collect()[0][0] is None


# --- what the destination takes ----------------------------------------------------------------

def test_a_message_its_destination_would_refuse_is_dead_lettered_before_it_is_sent(spark):
    from backlog_syphon.model import DestinationShape, EntityKind
    from backlog_syphon.restore.destination_fit import by_name

    shapes = by_name([DestinationShape("Sessions-Orders", EntityKind.QUEUE, requires_session=True),
                      DestinationShape("orders", EntityKind.QUEUE),
                      DestinationShape("events", EntityKind.TOPIC, session_subscriptions=("eu",))])
    rows = [
        backlog_row(1, destination="sessions-orders", session_id="s1"),
        backlog_row(2, destination="sessions-orders"),  # no x-ms-sessionid: Service Bus would refuse it
        backlog_row(3, destination="orders"),
        backlog_row(4, destination="events"),  # a topic takes it (its session subscription dead-letters a copy)
        backlog_row(5, destination="orders", session_id="s1", partition_key="p1"),  # refused on any entity
        backlog_row(6, destination="orders", session_id="s1", partition_key="s1"),
        backlog_row(7, destination="unknown-to-the-api"),
    ]
    assert_classified(spark, rows, [
        (1, "deliver", None, None, None),
        (2, "dead_letter", "session_required",
         "destination 'sessions-orders' requires sessions and the message has no SessionId (its backlog copy carries "
         "no x-ms-sessionid), so Service Bus would refuse it: give it a SessionId, or send it to an entity without "
         "sessions (restore.destination_map), then re-drive it (--redrive-dead-letters)", None),
        (3, "deliver", None, None, None),
        (4, "deliver", None, None, None),
        (5, "dead_letter", "session_id_not_partition_key",
         "its SessionId 's1' and PartitionKey 'p1' differ, so Service Bus would refuse it on any entity: make them "
         "equal, or clear the PartitionKey, then re-drive it (--redrive-dead-letters)", None),
        (6, "deliver", None, None, None),
        (7, "deliver", None, None, None),
    ], destination_shapes=shapes)
    # without shapes (the administration API did not answer) only what every entity refuses is caught
    without = {row["sequence_number"]: row["action"] for row in classified(spark, rows[:2] + rows[4:5]).collect()}
    assert without == {1: "deliver", 2: "deliver", 5: "dead_letter"}


def test_a_backlog_copy_that_expired_in_its_queue_is_not_sent_and_pings_and_held_ones_stay_what_they_are(spark):
    past, future = NOW - timedelta(seconds=1), NOW + timedelta(minutes=1)
    rows = [
        backlog_row(1, backlog_expires_time=past),
        backlog_row(2, backlog_expires_time=past, decode_problem_code="missing_path", destination=None,
                    decode_problem_reason="x-ms-path is missing"),  # the broker collects it: not dead-lettered
        backlog_row(3, backlog_expires_time=past, content_type=PING_CONTENT_TYPE),
        backlog_row(4, backlog_expires_time=past, destination="payments"),
        backlog_row(5, backlog_expires_time=future),
    ]
    out = classify_messages(spark.createDataFrame(rows, BACKLOG_ROW_SCHEMA), now=NOW, skip_destinations=["payments"])
    got = {row["sequence_number"]: (row["action"], row["reason_code"]) for row in out.collect()}
    assert got == {1: ("expire", "backlog_copy_expired"), 2: ("expire", "backlog_copy_expired"), 3: ("skip", "ping"),
                   4: ("hold", "destination_skipped"), 5: ("deliver", None)}
    reason = out.where("sequence_number = 1").first()["reason"]
    assert reason.startswith("the backlog copy expired in its queue at ") and "not sent" in reason


def test_properties_larger_than_service_bus_takes_are_found_on_the_restored_bytes():
    from backlog_syphon.restore.destination_fit import property_size_refusal

    def encoded(**application_properties) -> bytes:
        return DecodedMessage(properties=MessageProperties(message_id="m"), body=(b"x",),
                              application_properties=application_properties).encode()

    assert property_size_refusal(encoded(p="x" * (31 * 1024)), "m", None) is None
    assert property_size_refusal(encoded(p="x" * (33 * 1024)), "m", None).startswith(
        "its property 'p' is 33,")
    three = encoded(**{f"p{i}": "x" * (30 * 1024) for i in range(3)})
    assert "properties are 92," in property_size_refusal(three, "m", None)
    assert property_size_refusal(encoded(), "i" * 129, None) == (
        "its MessageId has 129 characters, more than the 128 Service Bus takes")
    assert property_size_refusal(encoded(), "m", "s" * 129).startswith("its SessionId has 129 characters")
