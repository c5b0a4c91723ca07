"""The foreachBatch sink: the Spark, Delta and Service Bus ports of the batch state machine (``sink.batch``).

Per batch (the order and its failure cases are ``sink.batch``'s):
- recover (a run's first batch): the checkpoint table, and the audit rows above each queue's purge
  mark, aggregated into recorded spans;
- exclude: a filter dropping the rows those spans hold, by identity (queue, sequence number,
  enqueue time);
- send rounds: restore and classify (``restore.rules``, column expressions), then ``mapInArrow``,
  one task per backlog queue, in sequence-number order per destination and session, links pooled per
  process (``sink.delivery``, ``servicebus.send``). The outcomes are checkpointed on the executors
  once, so no later step can recompute (and so re-send) them;
- aggregate: one Spark job turns every row's latest outcome into recorded spans, per-destination
  counts and the unsent destinations (``aggregate_outcomes``, the one place this is computed);
- record: the executors append the outcomes to the audit table, idempotent on the attempt's
  transaction version (the batch's one commit); when ``storage.checkpoint_interval_seconds`` has
  passed, the driver rewrites the checkpoint table meanwhile;
- purge: in the background (``sink.purge_runner``).

The driver handles aggregates only: no message passes through it, so its memory does not grow
with the batch size.

``SYPHON_FAULT_PAUSE_AT=<crash point>`` (``sink.batch.CrashPoint``) makes the process stop there
(writing the file named by ``SYPHON_FAULT_MARKER``) so a test can SIGKILL it; with
``SYPHON_FAULT_PAUSE_SECONDS`` it goes on after that long instead, or as soon as the test removes the
marker. ``SYPHON_FAULT_LOSE_TASK_AT=mid_send``
ends a send task's first attempt after its first send, as a lost executor would.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from backlog_syphon.config import SyphonConfig
from backlog_syphon.errors import BatchFailedError
from backlog_syphon.model import (
    REPORTED_OUTCOMES,
    Action,
    BatchStats,
    CheckpointRow,
    DeadLetterOrder,
    DestinationShape,
    HeldSpan,
    Outcome,
    OutcomeRecord,
    PacingStats,
    ReasonCode,
    RecordedSpan,
)
from backlog_syphon.restore import redrive, rules
from backlog_syphon.restore.destination_fit import session_subscription_warning
from backlog_syphon.restore.queue_names import DEAD_LETTER_SUBQUEUE, is_dead_letter_queue_name
from backlog_syphon.restore.rows import OUTCOME_ROW_ARROW_SCHEMA, OUTCOME_ROW_SCHEMA, record_batch
from backlog_syphon.timeline import Milestone, Timeline
from backlog_syphon.sink import batch as machine
from backlog_syphon.sink import delivery
from backlog_syphon.sink.pacing import Pacer, cap_share
from backlog_syphon.sink.batch import NOTHING_RECORDED, BatchAggregate, CrashPoint, Recovery, SinkState, Unsent
from backlog_syphon.sink.purge_runner import PurgeRunner
from backlog_syphon.storage import tables

logger = logging.getLogger(__name__)

NO_DESTINATION = "(no destination)"
_paused_at: set[str] = set()


def fault_point(point: str) -> None:
    """Test hook: park the process at ``point`` so a test can kill it there (no-op unless configured).

    With ``SYPHON_FAULT_PAUSE_SECONDS`` the process pauses that long, once, and goes on; sooner if
    the marker file is removed (a test that has seen what it waited for need not wait out the pause).
    Once removed, the marker stays removed: Python workers that reach the point later (another task's
    worker, started after the first) go on without pausing.
    """
    wanted = os.environ.get("SYPHON_FAULT_PAUSE_AT")
    if wanted != point or point in _paused_at:
        return
    marker = os.environ.get("SYPHON_FAULT_MARKER")
    pause = os.environ.get("SYPHON_FAULT_PAUSE_SECONDS")
    if marker:
        if pause and os.path.exists(f"{marker}.paused") and not os.path.exists(marker):
            return  # released by the test
        with open(marker, "a") as handle:
            handle.write(f"{wanted} {os.getpid()}\n")
        if pause:
            open(f"{marker}.paused", "a").close()
    if pause:
        _paused_at.add(point)
        until = time.monotonic() + float(pause)
        while time.monotonic() < until and (not marker or os.path.exists(marker)):
            time.sleep(0.1)
        return
    while True:
        time.sleep(3600)


def lose_first_attempt(point: str) -> None:
    """Test hook: ``SYPHON_FAULT_LOSE_TASK_AT=<point>`` ends the Python worker of a task's first attempt
    there, as a lost executor would; Spark then runs the task again (``spark.task.maxFailures``)."""
    if os.environ.get("SYPHON_FAULT_LOSE_TASK_AT") != point:
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0:
        os._exit(1)


class EnvFaultHooks:
    def reached(self, point: CrashPoint) -> None:
        fault_point(point.value)


def checkpoint_app_id(checkpoint_location: str, query_id: str | None) -> str:
    """Delta transaction app id: one per streaming checkpoint, since batch ids restart with it. The
    query's id, which Spark keeps in the checkpoint, changes when the checkpoint is deleted and made
    again at the same path, so a new checkpoint never has its writes skipped as repeats."""
    digest = hashlib.sha256(f"{checkpoint_location}\0{query_id or ''}".encode()).hexdigest()[:16]
    return f"backlog-syphon-{digest}"


class DeliverySink:
    """Callable for ``foreachBatch``. Holds picklable settings and, in the process that runs it, the
    run's state between batches (``sink.batch.SinkState``) and what the progress reports read."""

    def __init__(self, config: SyphonConfig, *, run_id: str, lease_keeper, settle_in_batch: bool = False,
                 stop_file: str | None = None, timeline: Timeline | None = None,
                 state_is_new: bool = False, recovery_at_start: Recovery | None = None,
                 destination_shapes: Mapping[str, DestinationShape] | None = None,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)):
        self.config = config
        self.run_id = run_id
        self.lease_keeper = lease_keeper  # run.fence.LeaseKeeper: sink.batch.LeasePort with a session
        # Over Spark Connect foreachBatch runs in a process of the server's that ends with the query,
        # and the client cannot wait for what it leaves running: each batch settles its own purge.
        self.settle_in_batch = settle_in_batch
        # The source's stop file, and where a Spark Connect client leaves its stop request (the sink,
        # in the server's process, turns one into the other after each batch).
        self.stop_file = stop_file
        self.stop_marker = f"{config.storage.checkpoint_location.rstrip('/')}_stop/{run_id}"
        self.clock = clock
        self.timeline = timeline if timeline is not None else Timeline()  # the run's, in a classic session
        self.state_is_new = state_is_new  # nothing was ever recorded: the first batch reads nothing back
        # What the tables said at the run's start (``read_recovery``), read when it found the lease free: its
        # first batch recovers from it instead of reading the tables again. None: it reads them.
        self.recovery_at_start = recovery_at_start
        # What the destinations take (by lower-case name), where the administration API said: the restore
        # rules dead-letter what a destination would refuse before it is sent.
        self.destination_shapes = dict(destination_shapes or {})
        self._warned_topics: set[str] = set()  # topics whose session subscriptions were warned about
        self.app_id: str | None = None  # known at the run's first batch (the checkpoint's query id)
        # Over Spark Connect the sink's copy in the server ends with the query, before the run's end could
        # write its rows: there every batch rewrites the checkpoint table.
        self.checkpoint_every = 0.0 if settle_in_batch else config.storage.checkpoint_interval_seconds
        self.state = SinkState()
        self._purges = PurgeRunner(config.secondary)
        self.per_destination: dict[str, dict[str, int]] = {}  # this run's outcomes, for the summary
        self.batch_stats: dict[int, BatchStats] = {}  # read (and emptied) by the progress listener
        self.failure: BaseException | None = None  # the last batch failure (classic Spark: this process)
        self._classifiers: dict[tuple, rules.Classifier] = {}  # by the rows' columns (``classifier``)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.timeline.mark(Milestone.FIRST_BATCH)
        spark = batch.sparkSession
        if self.app_id is None:
            self.app_id = checkpoint_app_id(self.config.storage.checkpoint_location,
                                            tables.streaming_query_id(spark, self.config.storage.checkpoint_location))
        started = time.monotonic()
        ports = SparkBatch(self, batch, batch_id)
        lease = _SessionLease(self.lease_keeper, spark)
        try:
            report = machine.run_batch(self.state, ports, lease, self._purges, batch_id=batch_id, run_id=self.run_id,
                                       now=self.clock(), settle_now=self.settle_in_batch, hooks=EnvFaultHooks(),
                                       checkpoint_every=self.checkpoint_every)
        except BatchFailedError as exc:
            self.failure = exc
            raise
        if self.settle_in_batch and self.stop_file and tables.marker_exists(spark, self.stop_marker):
            with open(self.stop_file, "a"):  # the source, next to this process, plans no more batches
                pass
        aggregate = report.aggregate
        if aggregate.first_outcome_ms is not None:
            self.timeline.mark(Milestone.FIRST_SEND, aggregate.first_outcome_ms / 1000)
        if aggregate.rows:
            self.timeline.mark(Milestone.LAST_RECORD, again=True)
        self._warn_of_session_subscriptions(aggregate)
        for (destination, outcome), n in aggregate.per_destination.items():
            if outcome in REPORTED_OUTCOMES:
                per = self.per_destination.setdefault(destination, {o.value: 0 for o in REPORTED_OUTCOMES})
                per[outcome.value] += n
        if aggregate.rows or report.replayed:
            oldest = min((span.enqueued_from_ms for span in aggregate.spans), default=None)
            self.batch_stats[batch_id] = BatchStats(
                aggregate.total(Outcome.DELIVERED), aggregate.total(Outcome.DEAD_LETTERED),
                aggregate.total(Outcome.SKIPPED_PING), report.replayed, round(time.monotonic() - started, 2),
                None if oldest is None else dt.datetime.fromtimestamp(oldest / 1000, dt.timezone.utc),
                held=aggregate.total(Outcome.HELD), pacing=ports.pacing)
            logger.info("batch_id=%s queues=%d delivered=%d dead_lettered=%d skipped=%d held=%d replayed=%d "
                        "rounds=%d seconds=%.2f (%s)", batch_id, len({span.backlog_queue for span in aggregate.spans}),
                        aggregate.total(Outcome.DELIVERED), aggregate.total(Outcome.DEAD_LETTERED),
                        aggregate.total(Outcome.SKIPPED_PING), aggregate.total(Outcome.HELD), report.replayed,
                        report.rounds, time.monotonic() - started,
                        ", ".join(f"{step} {seconds:.2f}" for step, seconds in ports.seconds.items()))

    def _warn_of_session_subscriptions(self, aggregate: BatchAggregate) -> None:
        """Once per topic delivered to: its subscriptions that require sessions dead-letter session-less copies."""
        for destination, outcome in aggregate.per_destination:
            shape = self.destination_shapes.get(destination.lower())
            if outcome == Outcome.DELIVERED and shape is not None and destination.lower() not in self._warned_topics:
                warning = session_subscription_warning(shape)
                if warning:
                    self._warned_topics.add(destination.lower())
                    logger.warning("destination=%s %s", destination, warning)

    def classifier(self, columns: list[str]) -> rules.Classifier:
        """The restore rules for this run's rows, built once in the process that runs the batches."""
        key = tuple(columns)
        if key not in self._classifiers:
            restore = self.config.restore
            self._classifiers[key] = rules.Classifier(
                columns, ttl_policy=restore.ttl_policy, max_message_size_bytes=self.config.sink.max_message_size_bytes,
                destination_map=restore.destination_map, skip_destinations=restore.skip_destinations,
                destination_shapes=self.destination_shapes)
        return self._classifiers[key]

    def __getstate__(self):
        # Column expressions belong to the process that built them: a copy (Spark Connect's) builds its own.
        return {**self.__dict__, "_classifiers": {}}

    def wait_for_purges(self) -> None:
        """At the end of a run: wait for the purge in flight, and settle what is left (``sink.batch.finish``)."""
        machine.finish(self.state, self._purges, self.clock())

    def flush(self, spark: SparkSession) -> bool:
        """The run's clean end (the query has ended, nothing more is sent or settled): write the checkpoint
        rows with the last purge marks, each naming this run as ended, which frees its lease too
        (``run.fence``). False when there are no rows to write (nothing was read; or over Spark Connect,
        where they live in the server): the lease must then be given back by itself."""
        machine.finish(self.state, self._purges, self.clock())
        rows = self.state.final_checkpoint(self.run_id)
        if rows is None:
            return False
        tables.write_checkpoint(spark, self.config.storage.checkpoint_table, rows)
        self.state.checkpoint_unrecorded = False
        return True


class _SessionLease:
    """``sink.batch.LeasePort`` on the run's lease keeper, with the batch's session."""

    def __init__(self, keeper, spark: SparkSession):
        self.keeper, self.spark = keeper, spark

    def send_deadline(self) -> float:
        return float("inf") if self.keeper is None else self.keeper.send_deadline(self.spark)

    def confirm_held(self) -> None:
        if self.keeper is not None:
            self.keeper.confirm_held(self.spark)


class SparkBatch:
    """``sink.batch.BatchPorts`` for one micro-batch: its rows as DataFrames, the tables, the sends."""

    def __init__(self, sink: DeliverySink, batch: DataFrame, batch_id: int):
        self.sink, self.batch_id = sink, batch_id
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
        if self.sink.state_is_new:  # this run created the tables and is the lease's first holder
            return NOTHING_RECORDED
        storage = self.sink.config.storage
        recovery = self.sink.recovery_at_start
        if recovery is None:
            recovery, _ = read_recovery(self.spark, storage)
        # Every row earlier attempts of this batch recorded, settled or not: the attempt's transaction
        # version must lie above theirs (rows of an older checkpoint with the same batch id only raise it).
        audit = tables.existing_table(self.spark, storage.audit_table)
        this_batch = 0 if audit is None else audit.where(F.col("batch_id") == self.batch_id).count()
        return dataclasses.replace(recovery, recorded_rows_of_batch=this_batch)

    def exclude(self, spans: Sequence[RecordedSpan]) -> None:
        if spans:
            with self.timed("exclude"):
                self.pending = self.pending.where(~held_by_any(spans))

    def send_round(self, limits: delivery.RoundLimits) -> BatchAggregate:
        with self.timed("plan"):
            classified, share, reports = self._prepare_round()
        with self.timed("read+send"):
            outcomes = send_on_executors(classified, self.sink.config, run_id=self.sink.run_id, batch_id=self.batch_id,
                                         limits=limits, pace_share=share, pacing_reports=reports)
        if reports is not None:  # the tasks have run (the outcomes are checkpointed eagerly)
            self.pacing = pacing_after_round(self.pacing, reports.value)
        if self.latest is not None:
            outcomes = self.latest.where(F.col("outcome") != Outcome.UNSENT).unionByName(outcomes)
        self.latest = outcomes
        with self.timed("aggregate"):
            return aggregate_outcomes(outcomes)

    def _prepare_round(self):
        """The round's rows classified (column expressions), the send tasks' share of the rate cap, and
        where they report their pacing."""
        config, now = self.sink.config, self.sink.clock()
        rows = self.pending
        if self.latest is not None:  # a later round: only what the last one left unsent
            unsent = self.latest.where(F.col("outcome") == Outcome.UNSENT).select("backlog_queue", "sequence_number")
            # Broadcast: the rows keep the source's partitioning (one task per queue) and order.
            rows = rows.join(F.broadcast(unsent), ["backlog_queue", "sequence_number"], "left_semi")
        classified = self.sink.classifier(rows.columns)(rows, now=now)
        if config.redriving:
            classified = redrive.select_for_redrive(
                classified, config.redrive, tables.redriven_dead_letters(self.spark, config.storage.audit_table))
        cap = config.sink.max_messages_per_second
        share = cap_share(cap, concurrent_send_tasks(self.spark, classified, fallback=config.backlog.queue_count)
                          ) if cap > 0 else None
        return classified, share, pacing_accumulator(self.spark)

    def dead_letters(self) -> list[DeadLetterOrder]:
        with self.timed("dead letters"):
            return collect_dead_letters(self.latest)

    def record(self, checkpoint: list[CheckpointRow] | None, version: int) -> None:
        """The audit append (executors) and, when given, the checkpoint write (a tiny table) at once: each
        is idempotent on ``version``, so their order does not matter for a replay."""
        storage, app_id = self.sink.config.storage, self.sink.app_id
        with self.timed("record"), ThreadPoolExecutor(max_workers=2, thread_name_prefix="record") as pool:
            futures = []
            if self.latest is not None:
                futures.append(pool.submit(tables.append_audit, storage.audit_table, self.latest, app_id, version))
            if checkpoint is not None:
                futures.append(pool.submit(tables.write_checkpoint, self.spark, storage.checkpoint_table, checkpoint,
                                           app_id=app_id, version=version))
            for future in futures:
                future.result()


def read_recovery(spark: SparkSession, storage) -> tuple[Recovery, tuple[str, ...]]:
    """What the tables say is recorded and may still be in the backlog, in one read of each: the recovery
    of a run's first batch (without that batch's own rows: ``recorded_rows_of_batch`` is 0), and the
    backlog queues where it includes messages held for skipped destinations, which the run reads again
    from their first message (a purge mark never passes a held message, ``bookkeeping.mark_purged``)."""
    checkpoint = tables.read_checkpoint(spark, storage.checkpoint_table)
    recorded = tables.recorded_unsettled(spark, storage.audit_table, checkpoint)
    if recorded is None:  # no audit table yet: nothing was ever recorded
        return Recovery(checkpoint, (), (), 0), ()
    aggregate = aggregate_outcomes(recorded)
    dead_letters = tuple(collect_dead_letters(recorded)) if aggregate.total(Outcome.DEAD_LETTERED) else ()
    held_in = tuple(sorted({span.backlog_queue for span in aggregate.held}))
    return Recovery(checkpoint, aggregate.spans, dead_letters, 0), held_in


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


def aggregate_outcomes(outcomes: DataFrame) -> BatchAggregate:
    """Every outcome row aggregated: recorded spans, per-destination counts, unsent destinations.

    A span is a run of final outcomes of one queue, one batch and one attempt (run), in sequence
    order, cut wherever a message stays where it is (``cuts_span``). One Spark job; a second, with the
    runs numbered, only when some message stays. The rest is ``combine_groups``.
    """
    groups = _group_outcomes(outcomes.withColumn("island", F.lit(0)))
    if any(cuts_span(Outcome(group["outcome"]), group["backlog_queue"]) for group in groups):
        order = Window.partitionBy("run_id", "batch_id", "backlog_queue").orderBy("sequence_number", "enqueued_time")
        stays = (F.col("outcome").isin([outcome.value for outcome in Outcome if not outcome.is_final]) | (
            (F.col("outcome") == Outcome.DEAD_LETTERED)
            & F.lower(F.col("backlog_queue")).endswith("/" + DEAD_LETTER_SUBQUEUE.lower()))).cast("long")
        groups = _group_outcomes(outcomes.withColumn(
            "island", F.sum(stays).over(order.rowsBetween(Window.unboundedPreceding, 0))))
    return combine_groups(groups)


def cuts_span(outcome: Outcome, backlog_queue: str) -> bool:
    """Whether a message with this outcome stays where it is, untouched by the purge, so that no recorded
    span may hold it: every non-final outcome (left unsent, or on purpose: held or not selected,
    ``Outcome.stays``), and one a re-drive dead-lettered again (a dead-letter sub-queue cannot
    dead-letter, so the message stays in it). Pure; ``aggregate_outcomes`` says the same in Spark."""
    return not outcome.is_final or (
        outcome == Outcome.DEAD_LETTERED and is_dead_letter_queue_name(backlog_queue))


def _group_outcomes(outcomes: DataFrame) -> list[dict]:
    rows = (outcomes.groupBy("run_id", "batch_id", "backlog_queue", "island", "destination", "outcome", "reason_code")
            .agg(F.min("sequence_number").alias("first"), F.max("sequence_number").alias("last"),
                 F.min(F.unix_millis("enqueued_time")).alias("enqueued_from"),
                 F.max(F.unix_millis("enqueued_time")).alias("enqueued_to"),
                 F.count(F.lit(1)).alias("n"), F.max("reason").alias("reason"),
                 F.min(F.unix_millis("outcome_time")).alias("since"))
            .collect())
    return [row.asDict() for row in rows]


def combine_groups(groups: list[dict]) -> BatchAggregate:
    """The aggregate from group rows (run, batch, queue, island, destination, outcome, reason code)
    with their sequence and enqueue ranges and counts. Pure."""
    spans: dict[tuple, dict] = {}
    per_destination: dict[tuple[str, Outcome], int] = {}
    unsent: dict[str, Unsent] = {}
    held: dict[tuple, HeldSpan] = {}  # (run, batch, queue) -> where its held messages lie
    first_outcome_ms = None
    for group in groups:
        outcome = Outcome(group["outcome"])
        destination = group["destination"] or NO_DESTINATION
        per_destination[(destination, outcome)] = per_destination.get((destination, outcome), 0) + group["n"]
        if outcome == Outcome.HELD:
            key = (group["run_id"], group["batch_id"], group["backlog_queue"])
            found = HeldSpan(group["backlog_queue"], group["first"], group["last"], group["enqueued_from"] or 0,
                             group["enqueued_to"] or 0, group["n"])
            held[key] = found.merged(held.get(key))
            continue
        if outcome == Outcome.UNSENT:
            known = unsent.get(destination)
            since = (group["since"] or 0) / 1000
            code, reason = ReasonCode(group["reason_code"]), group["reason"] or ""
            if known is not None and code == ReasonCode.ROUND_DEADLINE:  # a final reason wins over the deadline
                code, reason = known.reason_code, known.reason
            unsent[destination] = Unsent(group["n"] + (known.count if known else 0), code, reason,
                                         min(since, known.since) if known else since)
            continue
        if cuts_span(outcome, group["backlog_queue"]):
            continue  # stays in its queue: counted, never settled
        first_outcome_ms = _min(first_outcome_ms, group["since"])
        key = (group["run_id"], group["batch_id"], group["backlog_queue"], group["island"])
        span = spans.setdefault(key, {"first": group["first"], "last": group["last"],
                                      "from": group["enqueued_from"], "to": group["enqueued_to"],
                                      Outcome.DELIVERED: 0, Outcome.DEAD_LETTERED: 0, Outcome.SKIPPED_PING: 0})
        span["first"], span["last"] = min(span["first"], group["first"]), max(span["last"], group["last"])
        span["from"] = _min(span["from"], group["enqueued_from"])
        span["to"] = _max(span["to"], group["enqueued_to"])
        span[outcome] += group["n"]
    recorded = tuple(
        RecordedSpan(queue, s["first"], s["last"], s["from"] if s["from"] is not None else 0,
                     s["to"] if s["to"] is not None else 0,
                     s[Outcome.DELIVERED] + s[Outcome.DEAD_LETTERED] + s[Outcome.SKIPPED_PING],
                     s[Outcome.DELIVERED], s[Outcome.DEAD_LETTERED], s[Outcome.SKIPPED_PING], batch_id)
        for (_, batch_id, queue, _), s in sorted(spans.items(), key=lambda item: (item[0][2], item[1]["first"])))
    return BatchAggregate(recorded, per_destination, unsent,
                          tuple(span for _, span in sorted(held.items(), key=lambda item: (item[0][2], item[1].first))),
                          first_outcome_ms)


def _min(a, b):
    return b if a is None else a if b is None else min(a, b)


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


def collect_dead_letters(outcomes: DataFrame) -> list[DeadLetterOrder]:
    """The dead-letter outcomes among ``outcomes`` (rare: collected to the driver for the purge). A re-drive's
    are left out: its message stays in the dead-letter sub-queue, which cannot dead-letter it again."""
    in_dead_letter_queue = F.lower(F.col("backlog_queue")).endswith("/" + DEAD_LETTER_SUBQUEUE.lower())
    rows = (outcomes.where((F.col("outcome") == Outcome.DEAD_LETTERED) & ~in_dead_letter_queue)
            .select("backlog_queue", "sequence_number", F.unix_millis("enqueued_time").alias("enqueued_ms"),
                    "reason_code", "reason").collect())
    return [DeadLetterOrder(row["backlog_queue"], row["sequence_number"], row["enqueued_ms"],
                            row["reason_code"] or "undeliverable", row["reason"] or "") for row in rows]


def pacing_after_round(before: PacingStats | None, this_round: PacingStats) -> PacingStats:
    """A batch's pacing over its rounds: counts and times added up; the rate limit and the cap are the
    last round's (rounds run one after the other, their tasks do not add up)."""
    if before is None:
        return this_round
    merged = before.merge(this_round)
    return dataclasses.replace(merged, rate_limit=this_round.rate_limit, cap=this_round.cap,
                               slowed_seconds=before.slowed_seconds + this_round.slowed_seconds)


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
                      pacing_reports=None) -> DataFrame:
    """Deliver on executors, one task per backlog queue, each at most at ``pace_share`` messages a second;
    the outcomes checkpointed once. Each task adds its ``PacingStats`` to ``pacing_reports`` (if any)."""
    primary, sink_config = config.primary, config.sink

    def deliver(batches):
        yield from deliver_partition(batches, primary=primary, sink=sink_config, run_id=run_id, batch_id=batch_id,
                                     limits=limits, pace_share=pace_share, pacing_reports=pacing_reports)

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


# --- executor side ------------------------------------------------------------------------------

def deliver_partition(batches, *, primary, sink, run_id: str, batch_id: int, limits: delivery.RoundLimits,
                      pace_share: float | None = None, pacing_reports=None,
                      clock: Callable[[], float] = time.time) -> Iterator:
    """Deliver one task's rows (Arrow record batches) and yield the outcomes as Arrow record batches;
    at the end, report the task's pacing (``pacing_reports``, an accumulator)."""
    from backlog_syphon.servicebus.send import DestinationSenders, classify_send_error

    mid_send = []

    def first_send() -> None:
        if not mid_send:
            mid_send.append(True)
            fault_point(CrashPoint.MID_SEND.value)
            lose_first_attempt(CrashPoint.MID_SEND.value)

    senders = DestinationSenders(primary)
    opened: set[str] = set()
    pacer = Pacer(pace_share, sink.throttle_recovery_seconds, clock())
    for results in delivery.deliver_chunks(_chunks(batches, opened, senders), build=build_outgoing, sender=senders,
                                           classify=classify_send_error, sink=sink, limits=limits, clock=clock,
                                           on_sent=first_send, pacer=pacer):
        yield record_batch([outcome_row(result, run_id, batch_id, clock()) for result in results],
                           OUTCOME_ROW_ARROW_SCHEMA)
    stats = pacer.stats(clock())
    if pacer.throttled_count:
        logger.info("send task: %d sent, throttled %d times, slowed for %.1f s, rate limit at the end %s msg/s",
                    stats.sent, stats.throttled, stats.slowed_seconds,
                    "none" if stats.rate_limit is None else f"{stats.rate_limit:.0f}")
    if pacing_reports is not None:
        pacing_reports.add(stats)


SEND_CHUNK_ROWS = 2000  # rows a send task holds as Python objects at once, whatever the window's size


def _chunks(batches, opened: set[str], senders) -> Iterator[list[dict]]:
    """A task's Arrow batches as lists of at most ``SEND_CHUNK_ROWS`` rows, in order, each as soon as it
    arrives (what arrives next is read meanwhile); the senders of each chunk's new destinations opened
    at once before it is delivered."""
    for batch in batches:
        rows = batch.to_pylist()
        for start in range(0, len(rows), SEND_CHUNK_ROWS):
            chunk = rows[start:start + SEND_CHUNK_ROWS]
            new = {row["destination"] for row in chunk if row["action"] == Action.DELIVER} - opened
            if new:
                senders.open(new)
                opened.update(new)
            yield chunk


def build_outgoing(row) -> delivery.Outgoing:
    """The restored message of a deliverable row, as the bytes to send, with the TTL its classification chose."""
    from backlog_syphon.restore.amqp.restoring import restore_message_bytes

    return delivery.Outgoing(restore_message_bytes(row["raw_message"], row["restored_time_to_live_ms"],
                                                   from_dead_letters=is_dead_letter_queue_name(row["backlog_queue"])),
                             row["message_id"], row["session_id"], row["partition_key"])


def outcome_row(result: delivery.Delivery, run_id: str, batch_id: int, now: float) -> OutcomeRecord:
    """One audit row (``OUTCOME_ROW_SCHEMA``) for a delivery result; an unsent row's time is when its
    destination started failing."""
    row = result.row
    at = result.at if result.outcome == Outcome.UNSENT and result.at is not None else now
    return {
        "run_id": run_id, "batch_id": batch_id, "backlog_queue": row["backlog_queue"],
        "sequence_number": row["sequence_number"], "message_id": row["message_id"],
        "destination": row["destination"], "session_id": row["session_id"], "outcome": result.outcome.value,
        "reason_code": None if result.reason_code is None else str(result.reason_code), "reason": result.reason,
        "body_size": row["body_size"], "enqueued_time": row["enqueued_time"],
        "scheduled_enqueue_time": row["scheduled_enqueue_time"], "time_to_live_ms": row["restored_time_to_live_ms"],
        "outcome_time": dt.datetime.fromtimestamp(at, dt.timezone.utc), "attempts": result.attempts,
        "dead_letter_reason": row.get("dead_letter_reason"),
        "dead_letter_error_description": row.get("dead_letter_error_description"),
        "original_destination": row.get("original_destination"),
    }
