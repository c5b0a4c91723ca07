"""The foreachBatch sink: deliver a micro-batch of backlog messages, record it, then purge it.

Steps per batch:
1. on a run's first batch, drop rows whose outcome is already recorded (a batch replayed after a
   crash sends them no more): an anti-join with the audit table's keys, done by Spark;
2. restore and classify (pure column transforms in ``restore.rules``);
3. send on executors (``mapInArrow``): one task per backlog queue, in sequence-number order per
   destination and session, a destination's messages batched, links pooled per process; transient
   errors retried with back-off, an unreachable primary waited for; final errors and messages that
   cannot be built become dead-letter outcomes (``sink.delivery``). The outcomes are checkpointed on the
   executors once, so no later step can recompute (and so re-send) them;
4. the executors append the outcomes to the audit table (idempotent on the batch id), while
5. the driver, from one aggregate per queue (and the rare dead-letters), writes the checkpoint table
   (delivered-through per queue, the purge marks of earlier batches; idempotent on the batch id);
6. purge: complete what was delivered or skipped, dead-letter what was rejected, touch nothing else.
   It runs in the background, overlapping the next batch (``sink.purge_runner.PurgeRunner``).

The driver handles per-queue aggregates only: no message passes through it, so its memory does not
grow with the batch size.

Invariant: a backlog message is settled only in step 6, after its outcome was recorded in 4-5.
The duplicate window is a crash between a send (3) and the audit append (4): those messages are
sent again on replay, with the same MessageId.

Before sending, the sink checks that this run still holds the backlog's lease (``run.fence``): a run
whose lease was lost fails the batch before sending anything.

A batch that fails raises ``BatchFailedError``: one line naming the batch, the step and the cause,
which the command line shows instead of Spark's trace.

``SYPHON_FAULT_PAUSE_AT=<step>`` makes the process stop at that step (writing the file named by
``SYPHON_FAULT_MARKER``) so crash tests can SIGKILL it there; with ``SYPHON_FAULT_PAUSE_SECONDS`` it
goes on after that long instead. Steps: before_send, mid_send, after_send, after_audit, after_checkpoint.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import Action, CheckpointRow, Outcome, OutcomeRecord, QueueOutcomes
from backlog_syphon.restore import rules
from backlog_syphon.restore.rows import OUTCOME_ROW_ARROW_SCHEMA, OUTCOME_ROW_SCHEMA, record_batch
from backlog_syphon.run.lease import LeaseLostError
from backlog_syphon.run.progress import BatchStats
from backlog_syphon.run.spark_session import is_connect
from backlog_syphon.sink import bookkeeping, delivery
from backlog_syphon.sink.purge_runner import PurgeRunner
from backlog_syphon.storage import tables

logger = logging.getLogger(__name__)


_paused_at: set[str] = set()


def fault_point(step: str) -> None:
    """Test hook: park the process at ``step`` so a test can kill it there (no-op unless configured).

    With ``SYPHON_FAULT_PAUSE_SECONDS`` the process pauses that long, once, and goes on.
    """
    if os.environ.get("SYPHON_FAULT_PAUSE_AT") != step or step in _paused_at:
        return
    marker = os.environ.get("SYPHON_FAULT_MARKER")
    if marker:
        with open(marker, "a") as handle:
            handle.write(f"{step} {os.getpid()}\n")
    pause = os.environ.get("SYPHON_FAULT_PAUSE_SECONDS")
    if pause:
        _paused_at.add(step)
        time.sleep(float(pause))
        return
    while True:
        time.sleep(3600)


BATCH_FAILED_MARK = "syphon batch failed:"


class BatchFailedError(RuntimeError):
    """A micro-batch failed. Its message is one line: ``syphon batch failed: batch N, step S: cause``."""

    def __init__(self, batch_id: int, step: str, cause: BaseException):
        self.batch_id, self.step = batch_id, step
        super().__init__(f"{BATCH_FAILED_MARK} batch {batch_id}, step {step}: {describe_failure(cause)}")


def describe_failure(exc: BaseException) -> str:
    """The cause of a failure in one line: our own errors say it all, others by type and first line."""
    if isinstance(exc, (LeaseLostError, BatchFailedError)):
        return str(exc)
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__


class DeliverySink:
    """Callable for ``foreachBatch``. Holds picklable settings and, in the process that runs it, the
    run's bookkeeping: per-queue checkpoint rows, what is recorded but not purged, per-destination counts."""

    def __init__(self, config: SyphonConfig, *, run_id: str, app_id: str, lease_keeper=None,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)):
        self.config = config
        self.run_id = run_id
        self.app_id = app_id  # Delta transaction app id: one per streaming checkpoint
        self.lease_keeper = lease_keeper  # fence.LeaseKeeper; None only in tests of the sink alone
        self.clock = clock
        # The sink is the only writer of both tables, so after the first batch of a run it keeps
        # what it needs of them in memory instead of reading Delta every batch.
        self._checkpoint: dict[str, CheckpointRow] | None = None
        self._unpurged: dict[str, bookkeeping.Unpurged] = {}
        self._marks_unrecorded = False  # purge marks newer than the checkpoint table
        self._purges = PurgeRunner(config.secondary)
        self.per_destination: dict[str, dict[str, int]] = {}  # this run's outcomes, for the summary
        self.batch_stats: dict[int, BatchStats] = {}  # read (and emptied) by the progress listener

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        timings: dict[str, float] = {}
        mark = time.monotonic()
        step = "read_tables"

        def step_done(next_step: str) -> None:
            nonlocal mark, step
            now_mark = time.monotonic()
            timings[step] = round(now_mark - mark, 2)
            mark, step = now_mark, next_step

        try:
            replayed: list[QueueOutcomes] = []
            pending = batch
            if self._checkpoint is None:  # first batch of this run: maybe a replay after a crash
                replayed, pending = self._recover(spark, batch, batch_id)
            step_done("send")
            now = self.clock()
            classified = rules.classify_messages(                                                        # 2
                pending, now=now, ttl_policy=self.config.restore.ttl_policy,
                max_message_size_bytes=self.config.sink.max_message_size_bytes)
            if self.lease_keeper is not None:
                self.lease_keeper.check_before_send(spark)
            fault_point("before_send")
            outcomes = self._send(classified, batch_id)                                                  # 3
            counts = outcomes.groupBy("backlog_queue", "destination", "outcome").agg(
                F.min("sequence_number").alias("first"), F.max("sequence_number").alias("through"),
                F.count(F.lit(1)).alias("n"), F.min("enqueued_time").alias("oldest")).collect()
            new = list(queue_outcomes(counts).values())
            if not new and not replayed:
                return  # an empty batch (a fresh query's first one): nothing to record
            fault_point("after_send")
            dead_letters = []
            if any(item.dead_lettered for item in new):
                dead_letters = [tuple(row) for row in outcomes.where(F.col("outcome") == Outcome.DEAD_LETTERED)
                                .select("backlog_queue", "sequence_number", "reason_code", "reason").collect()]
            self._record_marks(self._purges.finished())
            self._checkpoint = bookkeeping.advance_checkpoint(
                self._checkpoint, bookkeeping.merge_outcomes(new, replayed).values(), batch_id=batch_id,
                run_id=self.run_id, now=now)
            step_done("record")
            self._record(spark, outcomes, batch_id)                                                        # 4, 5
            self._marks_unrecorded = False
            self._unpurged = bookkeeping.add_recorded(self._unpurged, new, dead_letters)
            step_done("purge")
            fault_point("after_audit")
            fault_point("after_checkpoint")
            self._purges.submit(bookkeeping.purge_plans(self._unpurged, self._checkpoint))                # 6
            if is_connect(spark):
                # foreachBatch runs in a process of the Connect server that ends with the query, and
                # the client cannot wait for it: settle now. The last batch's marks stay unrecorded,
                # which only makes the next run peek messages that are already gone.
                self._record_marks(self._purges.wait())
            step_done("report")
            for row in counts:
                per = self.per_destination.setdefault(row["destination"] or "(no destination)",
                                                      {o.value: 0 for o in Outcome})
                per[row["outcome"]] += row["n"]
            totals = {o: sum(item_count(item, o) for item in new) for o in Outcome}
            self.batch_stats[batch_id] = BatchStats(
                totals[Outcome.DELIVERED], totals[Outcome.DEAD_LETTERED], totals[Outcome.SKIPPED_PING],
                sum(item.count for item in replayed), timings["send"],
                min((item.oldest_enqueued for item in new if item.oldest_enqueued), default=None))
            logger.info("batch_id=%s queues=%d delivered=%d dead_lettered=%d skipped=%d replayed=%d seconds=%s",
                        batch_id, len(new), totals[Outcome.DELIVERED], totals[Outcome.DEAD_LETTERED],
                        totals[Outcome.SKIPPED_PING], sum(item.count for item in replayed), timings)
        except Exception as exc:
            logger.error("batch_id=%s failed in step %s", batch_id, step, exc_info=True)
            raise BatchFailedError(batch_id, step, exc) from exc

    def wait_for_purges(self) -> None:
        """Wait for the purges still running (when the query has ended)."""
        self._record_marks(self._purges.wait())

    def flush(self, spark: SparkSession) -> None:
        """Record the last purge marks in the checkpoint table (when the query has ended; it waits for
        a purge still running, which ``wait_for_purges`` normally has already done)."""
        self._record_marks(self._purges.wait())
        if self._marks_unrecorded and self._checkpoint:
            tables.write_checkpoint(spark, self.config.storage.checkpoint_table, list(self._checkpoint.values()))
            self._marks_unrecorded = False

    def _recover(self, spark: SparkSession, batch: DataFrame, batch_id: int
                 ) -> tuple[list[QueueOutcomes], DataFrame]:
        """Read the tables once per run: the checkpoint, and what is recorded above each purge mark.

        Returns this batch's outcomes recorded by an interrupted earlier attempt, and the batch
        without the rows they cover (step 1).
        """
        storage = self.config.storage
        self._checkpoint = tables.read_checkpoint(spark, storage.checkpoint_table)
        purged = {queue: row.purged_through for queue, row in self._checkpoint.items()}
        recorded = tables.recorded_above(spark, storage.audit_table, purged)
        if recorded is None:  # no audit table yet: nothing was ever recorded
            self._unpurged = {}
            return [], batch
        rows = recorded.groupBy("backlog_queue", "destination", "outcome", (F.col("batch_id") == batch_id)
                                .alias("this_batch")).agg(
            F.min("sequence_number").alias("first"), F.max("sequence_number").alias("through"),
            F.count(F.lit(1)).alias("n"), F.min("enqueued_time").alias("oldest")).collect()
        leftovers = queue_outcomes(rows)
        replayed = list(queue_outcomes([row for row in rows if row["this_batch"]]).values())
        dead_letters = []
        if any(item.dead_lettered for item in leftovers.values()):
            dead_letters = [tuple(row) for row in recorded.where(F.col("outcome") == Outcome.DEAD_LETTERED)
                            .select("backlog_queue", "sequence_number", "reason_code", "reason").collect()]
        # Some leftovers may be settled already (by a run that crashed before it recorded its purge).
        self._unpurged = bookkeeping.add_recorded({}, leftovers.values(), dead_letters, verify=True)
        pending = batch
        for queue, through in purged.items():
            pending = pending.where(~((F.col("backlog_queue") == queue) & (F.col("sequence_number") <= through)))
        if leftovers:
            keys = recorded.select("backlog_queue", "sequence_number")
            pending = pending.join(F.broadcast(keys), ["backlog_queue", "sequence_number"], "left_anti")
        return replayed, pending

    def _record(self, spark: SparkSession, outcomes: DataFrame, batch_id: int) -> None:
        """Steps 4 and 5 at once: the audit append (executors) and the checkpoint write (a tiny table).

        They are two Delta tables, each written idempotently on the batch id, so their order does not
        matter for a replay: whichever a crash left unwritten is written by the replayed batch, which
        sends only what the audit does not record.
        """
        storage = self.config.storage
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="record") as pool:
            audit = pool.submit(tables.append_audit, storage.audit_table, outcomes, self.app_id, batch_id)
            checkpoint = pool.submit(tables.write_checkpoint, spark, storage.checkpoint_table,
                                     list(self._checkpoint.values()), app_id=self.app_id, batch_id=batch_id)
            audit.result()
            checkpoint.result()

    def _record_marks(self, settled: dict[str, int]) -> None:
        # Recorded with the next checkpoint write (or by flush() at the end of a run): a crash before
        # then only makes a restart check again, by peeking, messages that are already gone.
        if settled:
            self._checkpoint = bookkeeping.mark_purged(self._checkpoint, settled, now=self.clock())
            self._unpurged = bookkeeping.after_purge(self._unpurged, settled)
            self._marks_unrecorded = True

    def _send(self, classified: DataFrame, batch_id: int) -> DataFrame:
        """Deliver on executors, one task per backlog queue; the outcomes checkpointed once."""
        primary, sink, run_id, clock = self.config.primary, self.config.sink, self.run_id, self.clock

        def deliver(batches):
            yield from deliver_partition(batches, primary=primary, sink=sink, run_id=run_id, batch_id=batch_id,
                                         clock=clock)

        # localCheckpoint, not cache: a lost partition fails the batch (replayed safely) instead of
        # being computed, and so sent, a second time.
        return classified.mapInArrow(deliver, OUTCOME_ROW_SCHEMA).localCheckpoint(eager=True)


def queue_outcomes(rows) -> dict[str, QueueOutcomes]:
    """Per queue: the outcomes of (queue, destination, outcome) aggregate rows added up."""
    items = []
    for row in rows:
        n = row["n"]
        items.append(QueueOutcomes(
            row["backlog_queue"], row["first"], row["through"],
            n if row["outcome"] == Outcome.DELIVERED else 0, n if row["outcome"] == Outcome.DEAD_LETTERED else 0,
            n if row["outcome"] == Outcome.SKIPPED_PING else 0,
            # Spark hands timestamps to Python as naive local times; astimezone reads them as such.
            row["oldest"].astimezone(dt.timezone.utc) if row["oldest"] else None))
    return bookkeeping.merge_outcomes(items)


def item_count(item: QueueOutcomes, outcome: Outcome) -> int:
    return {Outcome.DELIVERED: item.delivered, Outcome.DEAD_LETTERED: item.dead_lettered,
            Outcome.SKIPPED_PING: item.skipped}[outcome]


# --- executor side ------------------------------------------------------------------------------

def deliver_partition(batches, *, primary, sink, run_id: str, batch_id: int,
                      clock: Callable[[], dt.datetime]) -> Iterator:
    """Deliver one task's rows (Arrow record batches) and yield the outcomes as Arrow record batches."""
    from backlog_syphon.servicebus.send import DestinationSenders, classify_send_error

    mid_send = []

    def first_send() -> None:
        if not mid_send:
            mid_send.append(True)
            fault_point("mid_send")

    rows = [row for batch in batches for row in batch.to_pylist()]
    senders = DestinationSenders(primary)
    senders.open({row["destination"] for row in rows if row["action"] == Action.DELIVER})
    results = delivery.deliver_rows(rows, build=build_outgoing, sender=senders, classify=classify_send_error,
                                    sink=sink, on_sent=first_send)
    outcomes = [outcome_row(result, run_id, batch_id, clock()) for result in results]
    for start in range(0, len(outcomes), 5000):
        yield record_batch(outcomes[start:start + 5000], OUTCOME_ROW_ARROW_SCHEMA)


def build_outgoing(row) -> delivery.Outgoing:
    """The restored message of a deliverable row, as the bytes to send, with the TTL its classification chose."""
    from backlog_syphon.restore.amqp_message import restore_message_bytes

    return delivery.Outgoing(restore_message_bytes(row["raw_message"], row["restored_time_to_live_ms"]),
                             row["message_id"], row["session_id"], row["partition_key"])


def outcome_row(result: delivery.Delivery, run_id: str, batch_id: int, now: dt.datetime) -> OutcomeRecord:
    """One audit row (``OUTCOME_ROW_SCHEMA``) for a delivery result."""
    row = result.row
    return {
        "run_id": run_id, "batch_id": batch_id, "backlog_queue": row["backlog_queue"],
        "sequence_number": row["sequence_number"], "message_id": row["message_id"],
        "destination": row["destination"], "session_id": row["session_id"], "outcome": result.outcome.value,
        "reason_code": None if result.reason_code is None else str(result.reason_code), "reason": result.reason,
        "body_size": row["body_size"], "enqueued_time": row["enqueued_time"],
        "scheduled_enqueue_time": row["scheduled_enqueue_time"], "time_to_live_ms": row["restored_time_to_live_ms"],
        "outcome_time": now, "attempts": result.attempts,
    }
