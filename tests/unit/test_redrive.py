"""The re-drive of dead-lettered messages, its pure parts: settings, the selection (column expressions on small
frames), what stays out of the recorded spans, the purge of a dead-letter sub-queue in passing mode, the
restored message without the broker's dead-letter properties, and the dry run's summary."""

import datetime as dt
import re
import textwrap

import pytest
from chispa import assert_df_equality

from backlog_syphon.config import ConfigError, RedriveConfig, load_config
from backlog_syphon.model import Action, Outcome, RecordedSpan, ReasonCode
from backlog_syphon.restore.amqp.message_decoding import decode_message
from backlog_syphon.restore.restored_message import restore_message_bytes
from backlog_syphon.restore.queue_names import dead_letter_queue_name, is_dead_letter_queue_name
from backlog_syphon.restore.redrive import matches_filters, select_for_redrive
from backlog_syphon.restore.backlog_rows import backlog_row_values
from backlog_syphon.purge.plan import PurgePlan
from backlog_syphon.purge.progress import PurgeProgress
from backlog_syphon.sink import queue_marks
from backlog_syphon.sink.outcome_aggregate import combine_groups, cuts_span
from backlog_syphon.source.options import SourceOptions

UTC = dt.timezone.utc
SECRET = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=Root;SharedAccessKey=k=;UseDevelopmentEmulator=true"
ENV = {"P": SECRET, "S": SECRET}
BASE = """
primary: {namespace: contoso, connection_string: {env: P}}
secondary: {connection_string: {env: S}}
storage: {audit_table: /t/audit, checkpoint_table: /t/cp, checkpoint_location: /t/stream}
"""
Q0 = "contoso/x-servicebus-transfer/0"
DLQ0 = f"{Q0}/$DeadLetterQueue"
T0 = 1_700_000_000_000


def config_of(tmp_path, text="", **overrides):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE) + textwrap.dedent(text))
    return load_config(path, environ=ENV, overrides=overrides)


# --- names and settings -----------------------------------------------------------------------------

def test_a_dead_letter_sub_queue_is_named_by_its_path():
    assert dead_letter_queue_name(Q0) == DLQ0
    assert is_dead_letter_queue_name(DLQ0) and is_dead_letter_queue_name(DLQ0.lower())
    assert not is_dead_letter_queue_name(Q0)


def test_redrive_settings_from_yaml_and_from_overrides(tmp_path):
    config = config_of(tmp_path, """
        run: {source: dead_letters}
        redrive:
          reason_codes: [destination_not_found]
          dead_letter_reasons: [MaxDeliveryCountExceeded, TTLExpiredException]
          destinations: [orders]
          enqueued_after: 2026-11-26T10:00:00Z
          enqueued_before: "2026-11-27T00:00:00+01:00"
          retry_dead_lettered: true
        """)
    assert config.redriving
    assert config.redrive == RedriveConfig(
        ("destination_not_found",), ("MaxDeliveryCountExceeded", "TTLExpiredException"), ("orders",),
        "2026-11-26T10:00:00+00:00", "2026-11-27T00:00:00+01:00", True)
    assert config.redrive.enqueued_window == (dt.datetime(2026, 11, 26, 10, tzinfo=UTC),
                                              dt.datetime(2026, 11, 26, 23, tzinfo=UTC))
    flags = config_of(tmp_path, **{"run.source": "dead_letters", "redrive.destinations": "orders, payments",
                                   "redrive.reason_codes": "destination_not_found"})
    assert flags.redrive.destinations == ("orders", "payments") and flags.redrive.filters
    assert not config_of(tmp_path).redriving and RedriveConfig().filters is False


@pytest.mark.parametrize("text, overrides, message", [
    ("", {"run.source": "dead_letter"}, "run.source must be one of backlog, dead_letters, migration, got 'dead_letter'"),
    ("", {"redrive.destinations": "orders"}, "redrive.* settings apply to a re-drive only: set run.source: "
                                             "dead_letters"),
    ("", {"run.source": "dead_letters", "redrive.reason_codes": "MaxDeliveryCountExceeded"},
     "redrive.reason_codes: unknown reason code 'MaxDeliveryCountExceeded'; the syphon dead-letters with missing_path"),
    ("", {"run.source": "dead_letters", "redrive.enqueued_after": "yesterday"},
     "redrive.enqueued_after must be an ISO 8601 time such as 2026-11-26T10:00:00Z, got 'yesterday'"),
    ("", {"run.source": "dead_letters", "redrive.enqueued_after": "2026-11-26T10:00:00"}, "needs its time zone"),
    ("", {"run.source": "dead_letters", "redrive.enqueued_after": "2026-11-27T00:00:00Z",
          "redrive.enqueued_before": "2026-11-26T00:00:00Z"}, "must lie before redrive.enqueued_before"),
    ("", {"run.source": "dead_letters", "run.trigger": "10 seconds"}, "run.trigger must be 'available_now'"),
    ("redrive: {destinations: 7}\nrun: {source: dead_letters}\n", {},
     "expected a list of texts (in YAML [a, b], or a,b), got int"),
    ("redrive: {colour: red}\n", {}, "unknown key 'redrive.colour'; known keys in 'redrive': reason_codes"),
])
def test_bad_redrive_settings_say_what_is_wrong_and_what_to_do(tmp_path, text, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_of(tmp_path, text, **overrides)


def test_the_source_reads_the_dead_letter_sub_queues_of_a_redrive(tmp_path):
    options = SourceOptions.from_config(config_of(tmp_path, **{"run.source": "dead_letters",
                                                               "backlog.queue_count": "2"}))
    assert options.configured_queues == [DLQ0, "contoso/x-servicebus-transfer/1/$DeadLetterQueue"]
    assert SourceOptions.from_spark(options.to_spark()).dead_letters
    backlog = SourceOptions.from_config(config_of(tmp_path, **{"backlog.queue_count": "1"}))
    assert backlog.configured_queues == [Q0] and "deadLetters" not in backlog.to_spark()


# --- what the re-drive selects (column expressions) ------------------------------------------------

CLASSIFIED = ("backlog_queue string, sequence_number long, enqueued_time timestamp, destination string, "
              "dead_letter_reason string, action string, reason_code string, reason string, "
              "restored_time_to_live_ms long")
AT = dt.datetime(2026, 11, 26, 12, tzinfo=UTC)


def classified(spark, *rows):
    return spark.createDataFrame([(DLQ0, seq, AT + dt.timedelta(hours=hours), destination, why, action, None, None,
                                   1000 if action == Action.DELIVER else None)
                                  for seq, hours, destination, why, action in rows], CLASSIFIED)


def test_every_filter_must_match_and_what_does_not_match_is_left_with_its_reason(spark):
    rows = classified(spark,
                      (1, 0, "orders", "destination_not_found", Action.DELIVER),
                      (2, 0, "payments", "destination_not_found", Action.DELIVER),  # wrong destination
                      (3, 0, "orders", "MaxDeliveryCountExceeded", Action.DELIVER),
                      (4, 0, "orders", "missing_path", Action.DELIVER),  # wrong reason
                      (5, 5, "orders", "destination_not_found", Action.DELIVER),  # too late
                      (6, 0, None, None, Action.DEAD_LETTER))  # no reason, no destination: not matched
    redrive = RedriveConfig(reason_codes=("destination_not_found",), dead_letter_reasons=("MaxDeliveryCountExceeded",),
                            destinations=("orders",), enqueued_before=(AT + dt.timedelta(hours=1)).isoformat())
    result = select_for_redrive(rows, redrive).orderBy("sequence_number")
    left_reason = "not selected by the redrive filters; left in the dead-letter queue"
    expected = spark.createDataFrame([
        (DLQ0, 1, AT, "orders", "destination_not_found", Action.DELIVER.value, None, None, 1000),
        (DLQ0, 2, AT, "payments", "destination_not_found", Action.LEAVE.value, "filtered_out", left_reason, None),
        (DLQ0, 3, AT, "orders", "MaxDeliveryCountExceeded", Action.DELIVER.value, None, None, 1000),
        (DLQ0, 4, AT, "orders", "missing_path", Action.LEAVE.value, "filtered_out", left_reason, None),
        (DLQ0, 5, AT + dt.timedelta(hours=5), "orders", "destination_not_found", Action.LEAVE.value, "filtered_out",
         left_reason, None),
        (DLQ0, 6, AT, None, None, Action.LEAVE.value, "filtered_out", left_reason, None),
    ], CLASSIFIED)
    assert_df_equality(result, expected, ignore_nullable=True)


def test_without_filters_everything_is_selected_and_keeps_what_the_rules_decided(spark):
    rows = classified(spark, (1, 0, "orders", "x", Action.DELIVER), (2, 0, None, None, Action.DEAD_LETTER))
    assert_df_equality(select_for_redrive(rows, RedriveConfig()).orderBy("sequence_number"), rows,
                       ignore_nullable=True)
    assert rows.where(~matches_filters(RedriveConfig(enqueued_after=AT.isoformat()))).count() == 0


def test_a_message_an_earlier_redrive_dead_lettered_again_is_left_unless_retrying(spark):
    rows = classified(spark, (1, 0, "orders", "destination_not_found", Action.DELIVER),
                      (2, 0, "orders", "destination_not_found", Action.DELIVER))
    tried = spark.createDataFrame([(DLQ0, 2, int(AT.timestamp() * 1000)), (DLQ0, 2, int(AT.timestamp() * 1000)),
                                   (DLQ0, 1, 0)],  # another message with sequence number 1 (another incarnation)
                                  "backlog_queue string, sequence_number long, enqueued_ms long")
    left = {row["sequence_number"]: (row["action"], row["reason_code"])
            for row in select_for_redrive(rows, RedriveConfig(), tried).collect()}
    assert left == {1: (Action.DELIVER, None), 2: (Action.LEAVE, ReasonCode.REDRIVEN_BEFORE)}
    retried = select_for_redrive(rows, RedriveConfig(retry_dead_lettered=True), tried)
    assert {row["action"] for row in retried.collect()} == {Action.DELIVER}
    assert retried.columns == rows.columns


# --- spans: what stays in a dead-letter queue is never held by one --------------------------------

def group(queue, island, outcome, first, last, n, reason_code=None):
    return {"run_id": "r1", "batch_id": 0, "backlog_queue": queue, "island": island, "destination": "orders",
            "outcome": outcome, "reason_code": reason_code, "first": first, "last": last,
            "enqueued_from": T0 + first, "enqueued_to": T0 + last, "n": n, "reason": None, "since": 0}


def test_what_a_redrive_leaves_or_dead_letters_again_cuts_the_spans_and_is_counted():
    assert all(cuts_span(outcome, Q0) for outcome in (Outcome.NOT_SELECTED, Outcome.HELD, Outcome.UNSENT))
    assert cuts_span(Outcome.DEAD_LETTERED, DLQ0) and not cuts_span(Outcome.DEAD_LETTERED, Q0)
    aggregate = combine_groups([
        group(DLQ0, 0, "delivered", 1, 2, 2),
        group(DLQ0, 1, "not_selected", 3, 3, 1, "filtered_out"),
        group(DLQ0, 1, "delivered", 4, 4, 1),
        group(DLQ0, 2, "dead_lettered", 5, 5, 1, "destination_not_found"),
        group(DLQ0, 2, "delivered", 6, 7, 2),
    ])
    assert aggregate.spans == (RecordedSpan(DLQ0, 1, 2, T0 + 1, T0 + 2, 2, 2, 0, 0, 0),
                               RecordedSpan(DLQ0, 4, 4, T0 + 4, T0 + 4, 1, 1, 0, 0, 0),
                               RecordedSpan(DLQ0, 6, 7, T0 + 6, T0 + 7, 2, 2, 0, 0, 0))
    assert aggregate.per_destination == {("orders", Outcome.DELIVERED): 5, ("orders", Outcome.NOT_SELECTED): 1,
                                         ("orders", Outcome.DEAD_LETTERED): 1}
    assert not aggregate.unsent  # nothing to wait for: the batch does not fail


def test_the_aggregate_of_a_redrive_batch_cuts_its_spans_around_what_stays(spark):
    from backlog_syphon.rows import OUTCOME_ROW_SCHEMA
    from backlog_syphon.sink.spark_ports import aggregate_outcomes

    def row(seq, outcome):
        values = {name: None for name in OUTCOME_ROW_SCHEMA.fieldNames()}
        values.update(run_id="r1", batch_id=0, backlog_queue=DLQ0, sequence_number=seq, destination="orders",
                      outcome=outcome, reason_code=None if outcome == "delivered" else "filtered_out",
                      enqueued_time=dt.datetime.fromtimestamp((T0 + seq) / 1000, UTC), outcome_time=AT, attempts=1)
        return tuple(values[name] for name in OUTCOME_ROW_SCHEMA.fieldNames())

    frame = spark.createDataFrame([row(1, "delivered"), row(2, "not_selected"), row(3, "delivered"),
                                   row(4, "dead_lettered"), row(5, "delivered")], OUTCOME_ROW_SCHEMA)
    assert [(s.first, s.last, s.count) for s in aggregate_outcomes(frame).spans] == [(1, 1, 1), (3, 3, 1), (5, 5, 1)]


# --- the purge of a dead-letter sub-queue: past what stays ------------------------------------------

def test_the_purge_of_a_dead_letter_queue_is_planned_in_passing_mode():
    spans = {queue: queue_marks.Unpurged((RecordedSpan(queue, 1, 1, T0 + 1, T0 + 1, 1, 1),)) for queue in (Q0, DLQ0)}
    plans = queue_marks.purge_plans(spans)
    assert plans[DLQ0].passing and not plans[Q0].passing


def msg(seq):
    return seq, T0 + seq


def test_passing_mode_passes_over_what_no_span_holds_and_completes_the_recorded_messages_behind_it():
    spans = (RecordedSpan(DLQ0, 3, 4, T0 + 3, T0 + 4, 2), RecordedSpan(DLQ0, 6, 6, T0 + 6, T0 + 6, 1))
    progress = PurgeProgress(PurgePlan(DLQ0, spans, 3, passing=True), page=3)
    assert progress.credit() == 3  # a page: messages that stay take some of the credit
    first = progress.on_page([msg(1), msg(2), msg(3)])  # 1 and 2 stay (left by the re-drive, or earlier ones)
    assert (first.complete, first.pass_over, first.release, first.stop) == ((3,), (1, 2), (), False)
    second = progress.on_page([msg(5), msg(4), msg(6)])
    assert (second.complete, second.pass_over, second.stop) == ((4, 6), (5,), True)  # every recorded one was seen
    assert progress.credit() == 0
    assert (progress.passed, progress.released) == (3, 0)  # passed over, released unchanged at the end


def test_passing_mode_stops_past_the_plans_last_message_or_at_an_empty_receive():
    plan = PurgePlan(DLQ0, (RecordedSpan(DLQ0, 3, 4, T0 + 3, T0 + 4, 2),), 2, passing=True)
    past = PurgeProgress(plan)
    assert past.on_page([msg(3), msg(9)]).stop and past.credit() == 0  # 4 is gone already
    empty = PurgeProgress(plan)
    assert empty.on_page([]).stop
    backlog = PurgeProgress(PurgePlan(Q0, (RecordedSpan(Q0, 3, 4, T0 + 3, T0 + 4, 2),), 2))
    actions = backlog.on_page([msg(1)])  # a backlog queue's purge stops at the first unrecorded message
    assert (actions.release, actions.pass_over, actions.stop) == ((1,), (), True)


# --- the message sent again -----------------------------------------------------------------------

def test_a_redriven_message_loses_the_brokers_dead_letter_properties_and_keeps_everything_else():
    from tests.unit.test_amqp_message import legacy_backlog_message

    original = legacy_backlog_message()
    dead_lettered = original.__class__(**{**original.__dict__, "application_properties": {
        **original.application_properties, "DeadLetterReason": "destination_not_found",
        "DeadLetterErrorDescription": "no queue 'orders'"}}).encode()
    row = backlog_row_values(DLQ0, dead_lettered)
    assert (row["dead_letter_reason"], row["dead_letter_error_description"]) == ("destination_not_found",
                                                                               "no queue 'orders'")
    assert row["destination"] == "orders"
    redriven = decode_message(restore_message_bytes(dead_lettered, 60_000, from_dead_letters=True))
    direct = decode_message(restore_message_bytes(original.encode(), 60_000))
    assert redriven == direct
    kept = decode_message(restore_message_bytes(dead_lettered, 60_000))  # a backlog run keeps what a sender wrote
    assert kept.application_properties["DeadLetterReason"] == "destination_not_found"
    assert backlog_row_values(Q0, original.encode())["dead_letter_reason"] is None


# --- the dry run -----------------------------------------------------------------------------------

def test_the_dry_run_shows_what_would_move_per_destination_and_reason(spark):
    from backlog_syphon.run.dry_run_plan import redrive_summary

    planned = classified(spark,
                         (1, 0, "orders", "destination_not_found", Action.DELIVER),
                         (2, 0, "orders", "destination_not_found", Action.DELIVER),
                         (3, 0, "orders", "destination_not_found", Action.DEAD_LETTER),
                         (4, 0, "orders", "missing_path", Action.LEAVE),
                         (5, 0, None, None, Action.LEAVE))
    rows = [(r["destination"], r["dead_letter_reason"], r["messages"], r["to_move"], r["to_stay"], r["not_selected"])
            for r in redrive_summary(planned).collect()]
    assert rows == [("(no destination)", "(no reason)", 1, 0, 0, 1),
                    ("orders", "destination_not_found", 3, 2, 1, 0),
                    ("orders", "missing_path", 1, 0, 0, 1)]


def test_delivery_leaves_a_not_selected_row_unsent_and_says_why():
    from backlog_syphon.config import SinkConfig
    from backlog_syphon.sink.delivery import deliver_rows

    row = {"backlog_queue": DLQ0, "sequence_number": 1, "message_id": "m1", "destination": "orders",
           "session_id": None, "action": Action.LEAVE, "reason_code": ReasonCode.FILTERED_OUT, "reason": "filtered"}

    class NoSends:
        def send(self, destination, messages):
            raise AssertionError("a row left in place is never sent")

        def reset(self, destination):
            pass

    [result] = deliver_rows([row], build=lambda r: None, sender=NoSends(), classify=None, sink=SinkConfig())
    assert (result.outcome, result.reason_code, result.attempts) == (Outcome.NOT_SELECTED, ReasonCode.FILTERED_OUT, 0)
