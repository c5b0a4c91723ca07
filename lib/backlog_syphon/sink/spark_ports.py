"""The Spark and Delta ports of the micro-batch state machine (``sink.micro_batch``), for one batch.

- ``SparkBatch`` (``BatchPorts``): the batch's rows as DataFrames; recover from the tables (the
  checkpoint table, and the audit rows above each queue's purge mark aggregated into recorded spans:
  ``read_recovery``, which a run's start calls too);
  exclude what those spans hold, by identity (queue, sequence number, enqueue time); send rounds
  (restore rules as column expressions, then ``mapInArrow``, one send task per backlog queue,
  ``sink.send_task``), the outcomes checkpointed on the executors once, so no later step can recompute
  (and so re-send) them; aggregate every row's latest outcome in one Spark job
  (``aggregate_outcomes``, the pure rest in ``sink.outcome_aggregate``); record: the executors append
  the outcomes to the audit table, idempotent on the attempt's transaction version, while the driver
  rewrites the checkpoint table when asked to.
- ``SessionLease`` (``LeasePort``): the run's lease keeper with the batch's session.

The purge's port is ``sink.purge_runner``. The driver handles aggregates only: no message passes
through it, so its memory does not grow with the batch size.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import (
    NO_MIGRATION,
    CheckpointRow,
    DeadLetterOrder,
    MessageState,
    MigrationPlan,
    Outcome,
    PacingStats,
    RecordedSpan,
    SendShape,
    SettleOrder,
    settle_kind,
)
from backlog_syphon.partitions import PARTITION_SHIFT
from backlog_syphon.restore import redrive
from backlog_syphon.restore.queue_names import DEAD_LETTER_SUBQUEUE
from backlog_syphon.rows import OUTCOME_ROW_SCHEMA
from backlog_syphon.sink import delivery
from backlog_syphon.sink.classifiers import Classifiers
from backlog_syphon.sink.micro_batch import NO_HOOKS, NOTHING_RECORDED, BatchAggregate, Hooks, Recovery
from backlog_syphon.sink.outcome_aggregate import STAYING_WHERE_THEY_ARE, combine_groups, cuts_span, pacing_after_round
from backlog_syphon.sink.pacing import cap_share, send_cap
from backlog_syphon.sink.send_task import deliver_partition
from backlog_syphon.storage import audit_table, checkpoint_table, delta


@dataclass(frozen=True)
class BatchSettings:
    """What a batch's ports are given by the run's sink (``sink.foreach_batch.DeliverySink``): values they only
    read. What the rounds learn goes back in their results (``BatchAggregate``), never into the sink."""

    config: SyphonConfig
    run_id: str
    app_id: str | None  # the Delta transaction app id (``foreach_batch.checkpoint_app_id``)
    state_is_new: bool  # nothing was ever recorded: the first batch reads nothing back
    clock: Callable[[], dt.datetime]  # a round's rows are classified at its time
    migration: MigrationPlan = NO_MIGRATION  # a migration run's sources and routes
    # The send shapes the administration API decided, by lower-case destination name (``send_shape.known_shapes``).
    known_shapes: Mapping[str, SendShape] = field(default_factory=dict)
    hooks: Hooks = NO_HOOKS  # a test harness's (to the send tasks, in their closure)


class SessionLease:
    """``sink.micro_batch.LeasePort`` on the run's lease keeper, with the batch's session."""

    def __init__(self, keeper, spark: SparkSession):
        self.keeper, self.spark = keeper, spark

    def send_deadline(self) -> float:
        return float("inf") if self.keeper is None else self.keeper.send_deadline(self.spark)

    def confirm_held(self) -> None:
        if self.keeper is not None:
            self.keeper.confirm_held(self.spark)


class SparkBatch:
    """``sink.micro_batch.BatchPorts`` for one micro-batch: its rows as DataFrames, the tables, the sends."""

    def __init__(self, settings: BatchSettings, classifiers: Classifiers, batch: DataFrame, batch_id: int):
        self.settings, self.classifiers, self.batch_id = settings, classifiers, batch_id
        self.spark = batch.sparkSession
        self.pending = batch
        self.latest: DataFrame | None = None  # every row sent so far, in its latest state
        self.pacing: PacingStats | None = None  # what the send tasks reported (classic Spark only)
        self.seconds: dict[str, float] = {}  # where the batch's time went, per step (logged with the batch)

    @contextmanager
    def timed(self, step: str):
        began = time.monotonic()
        try:
            yield
        finally:
            self.seconds[step] = self.seconds.get(step, 0.0) + time.monotonic() - began

    def recover(self) -> Recovery:
        with self.timed("recover"):
            return self._recover()

    def _recover(self) -> Recovery:
        if self.settings.state_is_new:  # this run created the tables and is the lease's first holder
            return NOTHING_RECORDED
        return read_recovery(self.spark, self.settings.config.storage, self.settings.migration)[0]

    def recorded_rows_of_batch(self) -> int:
        """Every row earlier attempts of this batch recorded, settled or not: the attempt's transaction version
        must lie above theirs (rows of an older checkpoint with the same batch id only raise it)."""
        if self.settings.state_is_new:
            return 0
        with self.timed("recover"):
            audit = delta.existing_table(self.spark, self.settings.config.storage.audit_table)
            return 0 if audit is None else audit.where(F.col("batch_id") == self.batch_id).count()

    def exclude(self, spans: Sequence[RecordedSpan]) -> None:
        if spans:
            with self.timed("exclude"):
                self.pending = self.pending.where(~held_by_any(spans))

    def send_round(self, limits: delivery.RoundLimits, single_message_destinations: frozenset[str]) -> BatchAggregate:
        """``single_message_destinations``: what earlier rounds' refusals taught (they report it through the pacing
        accumulator; over Spark Connect each Python worker keeps what it learned itself,
        ``send_task.LEARNED_SHAPES``). The aggregate carries what this round's tasks learned."""
        settings = self.settings
        shapes = {**settings.known_shapes, **dict.fromkeys(single_message_destinations, SendShape.SINGLE_MESSAGES)}
        with self.timed("plan"):
            classified, share, reports = self._prepare_round()
        with self.timed("read+send"):
            outcomes = send_on_executors(classified, settings.config, run_id=settings.run_id, batch_id=self.batch_id,
                                         limits=limits, pace_share=share, pacing_reports=reports,
                                         hooks=settings.hooks, send_shapes=shapes, migration=settings.migration)
        learned: frozenset[str] = frozenset()
        if reports is not None:  # the tasks have run (the outcomes are checkpointed eagerly)
            self.pacing = pacing_after_round(self.pacing, reports.value)
            learned = frozenset(reports.value.single_message_destinations)
        if self.latest is not None:
            outcomes = self.latest.where(F.col("outcome") != Outcome.UNSENT).unionByName(outcomes)
        self.latest = outcomes
        with self.timed("aggregate"):
            aggregate = aggregate_outcomes(outcomes, settings.migration.session_entities)
        return dataclasses.replace(aggregate, single_message_destinations=learned)

    def _prepare_round(self):
        """The round's rows classified (column expressions), the send tasks' share of the rate cap, and
        where they report their pacing."""
        config, now = self.settings.config, self.settings.clock()
        rows = self.pending
        if self.latest is not None:  # a later round: only what the last one left unsent
            unsent = self.latest.where(F.col("outcome") == Outcome.UNSENT).select("backlog_queue", "sequence_number")
            # Broadcast: the rows keep the source's partitioning (one task per queue) and order.
            rows = rows.join(F.broadcast(unsent), ["backlog_queue", "sequence_number"], "left_semi")
        classified = self.classifiers.for_columns(rows.columns)(rows, now=now)
        if config.redriving:
            classified = redrive.select_for_redrive(
                classified, config.redrive, audit_table.redriven_dead_letters(self.spark, config.storage.audit_table))
        cap = send_cap(config)
        share = cap_share(cap, concurrent_send_tasks(self.spark, classified, fallback=config.backlog.queue_count)
                          ) if cap > 0 else None
        return classified, share, pacing_accumulator(self.spark)

    def dead_letters(self) -> list[DeadLetterOrder]:
        with self.timed("dead letters"):
            return collect_dead_letters(self.latest)

    def settle_orders(self) -> list[SettleOrder]:
        with self.timed("settle orders"):
            return collect_settle_orders(self.latest)

    def record(self, checkpoint: list[CheckpointRow] | None, version: int) -> None:
        """The audit append (executors) and, when given, the checkpoint write (a tiny table) at once: each
        is idempotent on ``version``, so their order does not matter for a replay."""
        storage, app_id = self.settings.config.storage, self.settings.app_id
        with self.timed("record"), ThreadPoolExecutor(max_workers=2, thread_name_prefix="record") as pool:
            futures = []
            if self.latest is not None:
                futures.append(pool.submit(audit_table.append_audit, storage.audit_table, self.latest, app_id, version))
            if checkpoint is not None:
                futures.append(pool.submit(checkpoint_table.write_checkpoint, self.spark, storage.checkpoint_table,
                                           checkpoint, app_id=app_id, version=version))
            for future in futures:
                future.result()


def read_recovery(spark: SparkSession, storage, migration: MigrationPlan = NO_MIGRATION, *,
                  since=None) -> tuple[Recovery, tuple[str, ...]]:
    """What the tables say is recorded and may still be in the backlog, in one read of each: the recovery
    a run begins with, and the backlog queues where it includes messages held for skipped destinations,
    which the run reads again from their first message (a purge mark never passes a held message,
    ``queue_marks.mark_purged``). ``migration``: a migration run's plan (its sources settled session by
    session). ``since``: the audit's outcome dates read (``storage.audit_table.recorded_unsettled``).
    The dry run and the status count what waits to be settled from it (``queue_marks.awaiting_settlement``)."""
    checkpoint = checkpoint_table.read_checkpoint(spark, storage.checkpoint_table)
    recorded = audit_table.recorded_unsettled(spark, storage.audit_table, checkpoint, since)
    if recorded is None:  # no audit table yet: nothing was ever recorded
        return Recovery(checkpoint, (), ()), ()
    aggregate = aggregate_outcomes(recorded, migration.session_entities)
    dead_letters = tuple(collect_dead_letters(recorded)) if aggregate.total(Outcome.DEAD_LETTERED) else ()
    orders = tuple(collect_settle_orders(recorded)) if aggregate.special else ()
    held_in = tuple(sorted({span.backlog_queue for span in aggregate.held}))
    return Recovery(checkpoint, aggregate.spans, dead_letters, orders, aggregate.sessions), held_in


def held_by_any(spans: Sequence[RecordedSpan]):
    """A column: true for rows one of ``spans`` holds (same queue, sequence number and enqueue time inside).

    Written as one SQL expression: built with column functions it cost a dozen calls into the JVM per
    span (a fifth of a second for twenty spans) at every batch."""
    def quoted(text: str) -> str:
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"

    held = " OR ".join(f"(backlog_queue = {quoted(span.backlog_queue)} AND sequence_number BETWEEN {int(span.first)} "
                       f"AND {int(span.last)} AND unix_millis(enqueued_time) BETWEEN {int(span.enqueued_from_ms)} AND "
                       f"{int(span.enqueued_to_ms)})" for span in spans)
    return F.expr(f"coalesce({held or 'false'}, false)")


def aggregate_outcomes(outcomes: DataFrame, session_entities: frozenset[str] = frozenset()) -> BatchAggregate:
    """Every outcome row aggregated: recorded spans, per-destination counts, unsent destinations, and (the
    migration mode) per session-settled source its recorded messages per session (``session_entities``: their
    lower-case names).

    A span is a run of final outcomes of one queue, one batch and one attempt (run), in sequence
    order, cut wherever a message stays where it is (``cuts_span``). One Spark job; a second, with the
    runs numbered, only when some message stays. The rest is ``combine_groups``.
    """
    # A span never crosses a partitioned queue's partitions (``partitions``: the top 16 bits): the purge
    # looks at what is left of a span with a peek at its first number, which answers from its partition.
    lane = F.shiftright(F.col("sequence_number"), PARTITION_SHIFT) * F.lit(1 << 40)
    session_key = (F.when(F.lower(F.col("backlog_queue")).isin(sorted(session_entities)), F.col("session_id"))
                   if session_entities else F.lit(None)).cast("string")
    outcomes = outcomes.withColumn("session_key", session_key)
    groups = _group_outcomes(outcomes.withColumn("island", lane))
    if any(cuts_span(Outcome(group["outcome"]), group["backlog_queue"], group["message_state"]) for group in groups):
        order = Window.partitionBy("run_id", "batch_id", "backlog_queue").orderBy("sequence_number", "enqueued_time")
        in_dead_letters = F.lower(F.col("backlog_queue")).endswith("/" + DEAD_LETTER_SUBQUEUE.lower())
        scheduled = F.coalesce(F.col("message_state") == MessageState.SCHEDULED, F.lit(False))
        stays = (F.col("outcome").isin([outcome.value for outcome in Outcome if not outcome.is_final]) | (
            F.col("outcome").isin([outcome.value for outcome in STAYING_WHERE_THEY_ARE])
            & (in_dead_letters | scheduled))).cast("long")
        groups = _group_outcomes(outcomes.withColumn(
            "island", lane + F.sum(stays).over(order.rowsBetween(Window.unboundedPreceding, 0))))
    return combine_groups(groups)


def _group_outcomes(outcomes: DataFrame) -> list[dict]:
    rows = (outcomes.groupBy("run_id", "batch_id", "backlog_queue", "island", "destination", "outcome", "reason_code",
                             "message_state", "session_key")
            .agg(F.min("sequence_number").alias("first"), F.max("sequence_number").alias("last"),
                 F.min(F.unix_millis("enqueued_time")).alias("enqueued_from"),
                 F.max(F.unix_millis("enqueued_time")).alias("enqueued_to"),
                 F.count(F.lit(1)).alias("n"), F.max("reason").alias("reason"),
                 F.min(F.unix_millis("outcome_time")).alias("since"))
            .collect())
    return [row.asDict() for row in rows]


def collect_dead_letters(outcomes: DataFrame) -> list[DeadLetterOrder]:
    """The dead-letter outcomes among ``outcomes`` (rare: collected to the driver for the purge). A re-drive's
    are left out: its message stays in the dead-letter sub-queue, which cannot dead-letter it again; and so is a
    scheduled message's (the migration mode), which no receive brings."""
    in_dead_letter_queue = F.lower(F.col("backlog_queue")).endswith("/" + DEAD_LETTER_SUBQUEUE.lower())
    scheduled = F.coalesce(F.col("message_state") == MessageState.SCHEDULED, F.lit(False))
    rows = (outcomes.where((F.col("outcome") == Outcome.DEAD_LETTERED) & ~in_dead_letter_queue & ~scheduled)
            .select("backlog_queue", "sequence_number", F.unix_millis("enqueued_time").alias("enqueued_ms"),
                    "reason_code", "reason").collect())
    return [DeadLetterOrder(row["backlog_queue"], row["sequence_number"], row["enqueued_ms"],
                            row["reason_code"] or "undeliverable", row["reason"] or "") for row in rows]


def collect_settle_orders(outcomes: DataFrame) -> list[SettleOrder]:
    """The recorded messages among ``outcomes`` that a receive does not bring (the migration mode's scheduled and
    deferred messages with a final outcome the purge carries out; an expired one the broker collects itself),
    collected to the driver for the purge."""
    rows = (outcomes.where(F.col("message_state").isin(MessageState.SCHEDULED.value, MessageState.DEFERRED.value)
                           & (F.col("outcome") != Outcome.EXPIRED))
            .select("backlog_queue", "sequence_number", F.unix_millis("enqueued_time").alias("enqueued_ms"), "outcome",
                    "message_state", "session_id").collect())
    return [SettleOrder(row["backlog_queue"], row["sequence_number"], row["enqueued_ms"],
                        settle_kind(MessageState(row["message_state"])), row["session_id"])
            for row in rows if not cuts_span(Outcome(row["outcome"]), row["backlog_queue"], row["message_state"])]


def task_slots(spark: SparkSession) -> int:
    """How many tasks the cluster runs at once (``defaultParallelism``), 0 where that is not known: over Spark
    Connect (no SparkContext), or with dynamic allocation (the slots grow while a batch runs)."""
    try:
        context = spark.sparkContext
        if context.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true":
            return 0
        return max(0, int(context.defaultParallelism))
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
        return 0


def concurrent_send_tasks(spark: SparkSession, classified: DataFrame, *, fallback: int) -> int:
    """How many send tasks of a round may run at once: its partitions (one per backlog queue with rows),
    at most the cluster's task slots. ``sink.max_messages_per_second`` is shared among that many, so the
    shares of the tasks running at any moment sum to at most the cap.

    Over Spark Connect neither is known to the sink (no SparkContext, no RDD): ``fallback`` (the
    configured ``backlog.queue_count``) is taken as the number of tasks. With dynamic allocation the
    slots can grow while the round runs: only the partitions bound it then.
    """
    try:
        context = spark.sparkContext
        partitions = classified.rdd.getNumPartitions()
    except Exception:  # noqa: BLE001 - Spark Connect has neither
        return max(1, fallback)
    if context.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        return max(1, partitions)
    return max(1, min(partitions, context.defaultParallelism))


class PacingStatsParam(AccumulatorParam):
    """Adds up the send tasks' ``PacingStats`` (``PacingStats.merge``) into one for the driver."""

    def zero(self, value: PacingStats) -> PacingStats:
        return PacingStats()

    def addInPlace(self, first: PacingStats, second: PacingStats) -> PacingStats:
        return first.merge(second)


def pacing_accumulator(spark: SparkSession):
    """Where the send tasks report their pacing to the driver: an accumulator on classic Spark. Over Spark
    Connect there is none (no SparkContext where foreachBatch runs): None, and the progress line shows
    the batch's average rate without the throttling."""
    try:
        context = spark.sparkContext
    except Exception:  # noqa: BLE001 - Spark Connect
        return None
    return context.accumulator(PacingStats(), PacingStatsParam())


def send_on_executors(classified: DataFrame, config: SyphonConfig, *, run_id: str, batch_id: int,
                      limits: delivery.RoundLimits, pace_share: float | None = None,
                      pacing_reports=None, hooks: Hooks = NO_HOOKS,
                      send_shapes: Mapping[str, SendShape] | None = None,
                      migration: MigrationPlan = NO_MIGRATION) -> DataFrame:
    """Deliver on executors, one task per backlog queue (``sink.send_task``), each at most at ``pace_share``
    messages a second; the outcomes checkpointed once. Each task adds its ``PacingStats`` to
    ``pacing_reports`` (if any); ``hooks`` (a test harness's) and ``send_shapes`` (the destinations known to take
    single messages only) go to the tasks in their closure."""
    primary, sink_config = config.primary, config.sink

    def deliver(batches):
        yield from deliver_partition(batches, primary=primary, sink=sink_config, run_id=run_id, batch_id=batch_id,
                                     limits=limits, pace_share=pace_share, pacing_reports=pacing_reports,
                                     hooks=hooks, send_shapes=send_shapes, migration=migration)

    # localCheckpoint, not cache: a lost partition fails the batch (replayed safely) instead of
    # being computed, and so sent, a second time. Then one partition: the outcome rows are small (no
    # bodies), and every job that reads them (the aggregate, the dead letters, the audit append) pays
    # a fixed cost per task (generated code, a Delta file and its statistics), not per row.
    with arrow_batch_rows(classified.sparkSession, SEND_INPUT_BATCH_ROWS):
        return classified.mapInArrow(deliver, OUTCOME_ROW_SCHEMA).localCheckpoint(eager=True).coalesce(1)


# Rows a send task is handed per Arrow batch: a peek page's worth, so that it starts sending once its
# first page is read, and the next page is read while it sends. With Spark's default (10,000) a task read
# its whole window, a round trip to the far namespace per page, before its first send.
SEND_INPUT_BATCH_ROWS = 250
_ARROW_BATCH_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"


@contextmanager
def arrow_batch_rows(spark: SparkSession, rows: int):
    """Spark's Arrow batch size set to ``rows`` for the jobs started meanwhile, then put back (a session
    setting: the syphon's own jobs run one at a time)."""
    before = spark.conf.get(_ARROW_BATCH_ROWS, None)
    spark.conf.set(_ARROW_BATCH_ROWS, str(rows))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_ARROW_BATCH_ROWS)
        else:
            spark.conf.set(_ARROW_BATCH_ROWS, before)
