"""The micro-batch's Spark and Delta ports (``sink.spark_ports``): what a run's first batch recovers from the
tables, the rows a replay drops, and how the send tasks' pacing adds up (on small in-memory frames)."""

import datetime as dt
from types import SimpleNamespace

from backlog_syphon.model import NO_MIGRATION, CheckpointRow, PacingStats, RecordedSpan
from backlog_syphon.sink.micro_batch import Recovery
from backlog_syphon.sink.outcome_aggregate import pacing_after_round
from backlog_syphon.sink.spark_ports import BatchSettings, PacingStatsParam, SparkBatch, held_by_any, read_recovery

T0 = 1_700_000_000_000
Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"


# --- recovery from the tables (Spark, no Delta: the tables are in-memory frames) --------------------------

def batch_settings(*, state_is_new: bool, config) -> BatchSettings:
    """A batch's settings as the sink gives them, the configuration a stand-in (only its storage is read)."""
    return BatchSettings(config, "r3", "app", state_is_new, clock=lambda: at(T0), migration=NO_MIGRATION)


def at(ms):
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def audit_row(run_id, seq, outcome, destination="orders", batch_id=4):
    from backlog_syphon.storage.audit_table import AUDIT_ROW_SCHEMA

    values = {"run_id": run_id, "batch_id": batch_id, "backlog_queue": Q0, "sequence_number": seq,
              "message_id": f"m{seq}", "destination": destination, "session_id": None, "outcome": outcome,
              "reason_code": "destination_unavailable" if outcome == "unsent" else None, "reason": None,
              "body_size": 10, "enqueued_time": at(T0 + 10 * seq), "scheduled_enqueue_time": None,
              "time_to_live_ms": None, "outcome_time": at(1_800_000_000_000), "attempts": 1,
              "dead_letter_reason": None, "dead_letter_error_description": None, "original_destination": None,
              "message_state": None}
    return tuple(values[field.name] for field in AUDIT_ROW_SCHEMA.fields)


def test_recovery_reads_the_spans_above_the_marks_and_counts_every_row_earlier_attempts_of_the_batch_recorded(
        spark, monkeypatch):
    """What a run begins with (``read_recovery``): the checkpoint rows and the audit rows above each queue's
    purge mark, aggregated. And an attempt's Delta transaction version is the number of rows earlier attempts
    of its batch recorded (``SparkBatch.recorded_rows_of_batch``), so that it is above every earlier
    attempt's: Delta skips a write whose version is not above the last one. Rows below the purge mark count
    too."""
    from backlog_syphon.storage import audit_table, checkpoint_table, delta

    checkpoint = CheckpointRow(Q0, 1, 4, T0 + 40, 2, T0 + 20, 4, "r2", at(1_800_000_000_000), 3, 0, 0)
    audit = [audit_row("r1", 1, "delivered"), audit_row("r1", 2, "delivered"), audit_row("r1", 3, "unsent"),
             audit_row("r1", 4, "unsent"), audit_row("r2", 3, "delivered"), audit_row("r2", 4, "unsent"),
             audit_row("r0", 1, "delivered", batch_id=3)]
    frames = {"/state/audit": spark.createDataFrame(audit, audit_table.AUDIT_ROW_SCHEMA),
              "/state/checkpoint": spark.createDataFrame(
                  [tuple(getattr(checkpoint, name) for name in checkpoint_table.CHECKPOINT_SCHEMA.fieldNames())],
                  checkpoint_table.CHECKPOINT_SCHEMA)}
    monkeypatch.setattr(delta, "existing_table", lambda spark, table: frames.get(table))
    monkeypatch.setattr(delta, "read_table", lambda spark, table: frames[table])
    storage = SimpleNamespace(audit_table="/state/audit", checkpoint_table="/state/checkpoint")
    recovery, held_in = read_recovery(spark, storage)
    assert held_in == () and recovery.checkpoint == {Q0: checkpoint}
    # above the purge mark (enqueued after message 2): 3 and 4 of both attempts; r2 delivered 3
    assert recovery.unsettled == (RecordedSpan(Q0, 3, 3, T0 + 30, T0 + 30, 1, 1, 0, 0, 4),)
    assert recovery.dead_letters == ()

    settings = batch_settings(state_is_new=False, config=SimpleNamespace(storage=storage))
    del frames["/state/checkpoint"]  # the batch reads no more than the audit's rows of its own batch
    assert SparkBatch(settings, None, spark.range(0), 4).recorded_rows_of_batch() == 6  # both attempts', any mark


def test_the_start_finds_the_queues_where_held_messages_lie_above_the_purge_marks(spark, monkeypatch):
    """Held rows above a queue's purge mark (or of a queue without a checkpoint row) make the run read
    that queue again from its first message; held rows below the mark are settled history."""
    from backlog_syphon.storage import audit_table, checkpoint_table, delta

    checkpoint = CheckpointRow(Q0, 1, 4, T0 + 40, 2, T0 + 20, 4, "r2", at(1_800_000_000_000), 3, 0, 0)
    audit = [audit_row("r1", 1, "held"), audit_row("r1", 2, "delivered"), audit_row("r1", 3, "delivered")]
    other = list(audit_row("r1", 1, "held"))
    other[audit_table.AUDIT_ROW_SCHEMA.fieldNames().index("backlog_queue")] = Q1
    frames = {"/state/audit": spark.createDataFrame(audit + [tuple(other)], audit_table.AUDIT_ROW_SCHEMA),
              "/state/checkpoint": spark.createDataFrame(
                  [tuple(getattr(checkpoint, name) for name in checkpoint_table.CHECKPOINT_SCHEMA.fieldNames())],
                  checkpoint_table.CHECKPOINT_SCHEMA)}
    monkeypatch.setattr(delta, "existing_table", lambda spark, table: frames.get(table))
    storage = SimpleNamespace(audit_table="/state/audit", checkpoint_table="/state/checkpoint")
    recovery, held_in = read_recovery(spark, storage)
    assert held_in == (Q1,)  # Q0's held message 1 lies below its mark (message 2)
    assert [(span.backlog_queue, span.first, span.last) for span in recovery.unsettled] == [(Q0, 3, 3)]

    frames["/state/audit"] = spark.createDataFrame(audit + [audit_row("r1", 4, "held")], audit_table.AUDIT_ROW_SCHEMA)
    assert read_recovery(spark, storage)[1] == (Q0,)  # above the mark: read again
    del frames["/state/audit"]
    assert read_recovery(spark, storage) == (Recovery({Q0: checkpoint}, (), ()), ())  # no audit yet


def test_a_run_that_created_its_state_tables_reads_nothing_back():
    """``state_is_new`` (the run created the tables and is the lease's first holder): the first batch's
    recovery is empty without a single table read (the fake session would fail any)."""
    class NoSession:
        def __getattr__(self, name):
            raise AssertionError(f"the recovery touched the session ({name})")

    settings = batch_settings(state_is_new=True, config=None)
    batch = SimpleNamespace(sparkSession=NoSession())
    assert SparkBatch(settings, None, batch, 0).recover() == Recovery({}, (), ())
    assert SparkBatch(settings, None, batch, 0).recorded_rows_of_batch() == 0


def test_the_send_tasks_pacing_adds_up_per_round_and_over_the_rounds_of_a_batch():
    param = PacingStatsParam()
    task_a = PacingStats(sent=10, first_send_at=1.0, last_send_at=3.0, throttled=2, slowed_seconds=2.0,
                         rate_limit=40.0, cap=50.0, tasks=1)
    task_b = PacingStats(sent=20, first_send_at=2.0, last_send_at=4.0, throttled=0, slowed_seconds=0.0,
                         rate_limit=50.0, cap=50.0, tasks=1)
    first_round = param.addInPlace(param.addInPlace(param.zero(PacingStats()), task_a), task_b)
    assert first_round == PacingStats(30, 1.0, 4.0, 2, 2.0, 90.0, 100.0, 2)
    second_round = PacingStats(sent=5, first_send_at=10.0, last_send_at=11.0, throttled=1, slowed_seconds=1.0,
                               rate_limit=25.0, cap=50.0, tasks=1)
    batch = pacing_after_round(pacing_after_round(None, first_round), second_round)
    # counts add up; one round after the other: their slowed times add up, the limit and cap are the last's
    assert batch == PacingStats(35, 1.0, 11.0, 3, 3.0, 25.0, 50.0, 3)


def test_a_replayed_batch_drops_exactly_the_rows_a_recorded_span_holds(spark):
    """``held_by_any``, one SQL expression: the queue, the sequence numbers and the enqueue times must all fall
    inside one span (a recreated queue's message with the same number is not held); a queue name with a
    quote in it is matched as it is."""
    odd = "contoso/it's-x"
    at = dt.datetime.fromtimestamp(T0 / 1000, dt.timezone.utc)
    rows = [(Q0, 5, at + dt.timedelta(milliseconds=5)), (Q0, 9, at + dt.timedelta(milliseconds=9)),
            (Q0, 5, at + dt.timedelta(days=1)),  # a new incarnation's message 5
            (Q1, 5, at + dt.timedelta(milliseconds=5)), (odd, 2, at + dt.timedelta(milliseconds=2))]
    frame = spark.createDataFrame(rows, "backlog_queue string, sequence_number long, enqueued_time timestamp")
    spans = [RecordedSpan(Q0, 1, 6, T0 + 1, T0 + 6, 6), RecordedSpan(odd, 1, 3, T0, T0 + 3, 3)]
    kept = frame.where(~held_by_any(spans)).collect()
    assert sorted((row[0], row[1]) for row in kept) == [(Q0, 5), (Q0, 9), (Q1, 5)]
    assert [row[2].astimezone(dt.timezone.utc) for row in kept if row[0] == Q0 and row[1] == 5] == [
        at + dt.timedelta(days=1)]
    assert frame.where(~held_by_any([])).count() == 5
