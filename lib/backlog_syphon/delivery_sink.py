"""The foreachBatch sink: deliver a micro-batch of backlog messages, record it, then purge it.

Steps per batch (see the design's data flow):
1. drop rows whose outcome is already recorded (a replayed batch sends them no more);
2. restore and classify (pure transforms in ``restore_rules``);
3. send on executors: one task per backlog queue, in sequence-number order per destination and
   session, a destination's messages batched, one client per task; transient errors retried with back-off, an
   unreachable primary waited for; final errors turn into dead-letter outcomes;
4. append the audit rows (idempotent on the batch id);
5. write the checkpoint table (delivered-through per queue, and the purge marks of the batches
   before; idempotent on the batch id);
6. purge: complete what was delivered or skipped, dead-letter what was rejected, leave the rest.

Invariant: a backlog message is settled only in step 6, after its outcome was recorded in 4-5.
The duplicate window is a crash between a send (3) and the audit append (4): those messages are
sent again on replay, with the same MessageId.

Before sending, the sink checks that this run still holds the backlog's lease (``fence``): a run
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
from typing import Callable, Iterable, Iterator

from pyspark.sql import DataFrame, SparkSession

from backlog_syphon import delivery, delivery_plan, delta_tables, restore_rules
from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import Outcome
from backlog_syphon.lease import LeaseLostError
from backlog_syphon.progress import BatchStats

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
    """Callable for ``foreachBatch``; holds only picklable settings."""

    def __init__(self, config: SyphonConfig, *, run_id: str, app_id: str, lease_keeper=None,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)):
        self.config = config
        self.run_id = run_id
        self.app_id = app_id  # Delta transaction app id: one per streaming checkpoint
        self.lease_keeper = lease_keeper  # fence.LeaseKeeper; None only in tests of the sink alone
        self.clock = clock
        self.totals: list[dict] = []  # every outcome of this run (driver side), for the summary
        # The sink is the only writer of both tables, so after the first batch of a run it keeps
        # what it needs of them in memory instead of reading Delta every batch.
        self._checkpoint: dict[str, dict] | None = None  # queue -> checkpoint row
        self._unpurged: list[dict] = []  # outcomes recorded whose backlog message may still be there
        self._purges_unrecorded = False
        self.batch_stats: dict[int, BatchStats] = {}  # read (and emptied) by the progress listener

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        storage = self.config.storage
        batch = batch.persist()  # the window is peeked once, whatever the steps below do
        timings: dict[str, float] = {}
        mark = time.monotonic()
        step = "peek"

        def step_done(name: str, next_step: str) -> None:
            nonlocal mark, step
            now_mark = time.monotonic()
            timings[name] = round(now_mark - mark, 2)
            mark, step = now_mark, next_step

        try:
            queues = sorted(row[0] for row in batch.select("backlog_queue").distinct().collect())
            if not queues:
                return
            step_done("peek", "read_tables")
            first_batch = self._checkpoint is None
            if first_batch:  # first batch of this run: maybe a replay after a crash
                self._checkpoint = delta_tables.read_checkpoint(spark, storage.checkpoint_table)
                self._unpurged = delta_tables.recorded_outcomes(
                    spark, storage.audit_table, {q: self._purged_through(q) for q in set(queues) | set(self._checkpoint)})
                step_done("read_tables", "restore")
            purged_through = {q: self._purged_through(q) for q in queues}
            recorded = list(self._unpurged)  # also settles leftovers of queues absent from this batch
            now = self.clock()

            pending = _drop_recorded(spark, batch, purged_through, delivery_plan.recorded_keys(recorded))  # 1
            classified = restore_rules.classify_messages(                                                # 2
                pending, now=now, ttl_policy=self.config.restore.ttl_policy,
                max_message_size_bytes=self.config.sink.max_message_size_bytes)
            step = "send"
            if self.lease_keeper is not None:
                self.lease_keeper.check_before_send(spark)
            fault_point("before_send")
            new_outcomes = self._send(classified, batch_id)                                              # 3
            step_done("send", "audit")
            fault_point("after_send")
            delta_tables.append_audit(spark, storage.audit_table,                                        # 4
                                      [_audit_tuple(row) for row in new_outcomes], self.app_id, batch_id)
            step_done("audit", "checkpoint")
            fault_point("after_audit")
            outcomes = recorded + new_outcomes
            self._checkpoint = delivery_plan.advance_checkpoint(self._checkpoint, outcomes, batch_id=batch_id,
                                                                run_id=self.run_id, now=now)
            delta_tables.write_checkpoint(spark, storage.checkpoint_table, list(self._checkpoint.values()),  # 5
                                          app_id=self.app_id, batch_id=batch_id)
            self._purges_unrecorded = False
            step_done("checkpoint", "purge")
            fault_point("after_checkpoint")
            purged = self._purge(delivery_plan.purge_plans(                                                # 6
                outcomes, {queue: self._purged_through(queue) for queue in self._checkpoint}, verify=first_batch))
            # Recorded with the next batch's checkpoint (or by flush() at the end of a run): one
            # Delta commit less per batch. A crash before then only makes a restart re-check
            # messages that are already gone (see servicebus_io.purge_backlog).
            self._checkpoint = delivery_plan.mark_purged(self._checkpoint, purged, now=self.clock())
            self._purges_unrecorded = bool(purged)
            self._unpurged = [row for row in self._unpurged + new_outcomes
                              if int(row["sequence_number"]) > self._purged_through(row["backlog_queue"])]
            step_done("purge", "report")
            self.totals.extend(new_outcomes)
            counts = {o: sum(1 for r in new_outcomes if r["outcome"] == o) for o in Outcome}
            self.batch_stats[batch_id] = BatchStats(
                counts[Outcome.DELIVERED], counts[Outcome.DEAD_LETTERED], counts[Outcome.SKIPPED_PING], len(recorded),
                timings["send"],
                _oldest(row["enqueued_time"] for row in new_outcomes))
            logger.info("batch_id=%s queues=%d delivered=%d dead_lettered=%d skipped=%d replayed=%d seconds=%s",
                        batch_id, len(queues), counts[Outcome.DELIVERED], counts[Outcome.DEAD_LETTERED], counts[Outcome.SKIPPED_PING],
                        len(recorded), timings)
        except Exception as exc:
            logger.error("batch_id=%s failed in step %s", batch_id, step, exc_info=True)
            raise BatchFailedError(batch_id, step, exc) from exc
        finally:
            batch.unpersist()

    def flush(self, spark: SparkSession) -> None:
        """Record the last batch's purge marks in the checkpoint table (call when the query ends)."""
        if self._purges_unrecorded and self._checkpoint:
            delta_tables.write_checkpoint(spark, self.config.storage.checkpoint_table, list(self._checkpoint.values()))
            self._purges_unrecorded = False

    def _purged_through(self, queue: str) -> int:
        return int(self._checkpoint[queue]["purged_through"]) if queue in self._checkpoint else 0

    def _send(self, classified: DataFrame, batch_id: int) -> list[dict]:
        primary = self.config.primary
        sink = self.config.sink
        run_id = self.run_id
        clock = self.clock

        def deliver(rows: Iterable) -> Iterator[dict]:
            yield from deliver_partition(rows, primary=primary, sink=sink, run_id=run_id, batch_id=batch_id,
                                         clock=clock)

        return classified.rdd.mapPartitions(deliver).collect()

    def _purge(self, plans: dict) -> dict[str, int]:
        """Settle each queue's planned messages, queues in parallel threads on the driver.

        Settling is a few small broker calls per queue; a Spark job would cost more than it does.
        """
        from concurrent.futures import ThreadPoolExecutor

        from backlog_syphon.servicebus_io import purge_backlog

        if not plans:
            return {}
        with ThreadPoolExecutor(max_workers=min(8, len(plans)), thread_name_prefix="purge") as pool:
            results = dict(zip(plans, pool.map(lambda queue: purge_backlog(self.config.secondary, plans[queue]),
                                               plans)))
        for queue, result in results.items():
            if result.settled_through < plans[queue].through:
                logger.warning("backlog=%s purge incomplete: settled through %s of %s (completed=%d "
                               "dead_lettered=%d released=%d); retried with the next batch", queue,
                               result.settled_through, plans[queue].through, result.completed,
                               result.dead_lettered, result.released)
        return {queue: result.settled_through for queue, result in results.items()}


def _drop_recorded(spark: SparkSession, batch: DataFrame, purged_through: dict[str, int],
                   recorded: set[tuple[str, int]]) -> DataFrame:
    """Step 1: rows already purged or with a recorded outcome are not sent again."""
    from pyspark.sql import functions as F

    condition = F.lit(True)
    for queue, through in purged_through.items():
        condition = condition & ~((F.col("backlog_queue") == queue) & (F.col("sequence_number") <= through))
    if recorded:
        keys = spark.createDataFrame(sorted(recorded), "backlog_queue string, sequence_number long")
        return batch.where(condition).join(F.broadcast(keys), ["backlog_queue", "sequence_number"], "left_anti")
    return batch.where(condition)


def _oldest(times: Iterable[dt.datetime | None]) -> dt.datetime | None:
    # Spark hands timestamps to Python as naive local times; astimezone reads them as such.
    return min((t.astimezone(dt.timezone.utc) for t in times if t is not None), default=None)


def _audit_tuple(row: dict) -> tuple:
    return tuple(row[field.name] for field in delta_tables.AUDIT_ROW_SCHEMA.fields)


# --- executor side ------------------------------------------------------------------------------

def deliver_partition(rows: Iterable, *, primary, sink, run_id: str, batch_id: int,
                      clock: Callable[[], dt.datetime]) -> Iterator[dict]:
    """Deliver one task's rows in (queue, sequence number) order; yield one outcome per row."""
    from backlog_syphon.servicebus_io import DestinationSenders, classify_send_error

    mid_send = []

    def first_send() -> None:
        if not mid_send:
            mid_send.append(True)
            fault_point("mid_send")

    for result in delivery.deliver_rows((row.asDict() for row in rows), build=build_outgoing,
                                        sender=DestinationSenders(primary), classify=classify_send_error, sink=sink,
                                        on_sent=first_send):
        yield _outcome(result, run_id, batch_id, clock)


def build_outgoing(row) -> delivery.Outgoing:
    """The restored message of a deliverable row, as the bytes to send, with the TTL its classification chose."""
    from backlog_syphon.amqp_message import restore_message_bytes

    return delivery.Outgoing(restore_message_bytes(row["raw_message"], row["restored_time_to_live_ms"]),
                             row["message_id"], row["session_id"], row["partition_key"])


def _outcome(result: delivery.Delivery, run_id: str, batch_id: int, clock) -> dict:
    row = result.row
    return {
        "run_id": run_id, "batch_id": batch_id, "backlog_queue": row["backlog_queue"],
        "sequence_number": row["sequence_number"], "message_id": row["message_id"],
        "destination": row["destination"], "session_id": row["session_id"], "outcome": str(result.outcome),
        "reason_code": None if result.reason_code is None else str(result.reason_code), "reason": result.reason,
        "body_size": row["body_size"], "enqueued_time": row["enqueued_time"],
        "scheduled_enqueue_time": row["scheduled_enqueue_time"], "time_to_live_ms": row["restored_time_to_live_ms"],
        "outcome_time": clock(), "attempts": result.attempts,
    }
