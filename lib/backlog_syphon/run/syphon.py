"""Wire the source, the sink and the tables into one streaming query: the one code path of every run mode.

``run_syphon`` runs until an available-now run has drained what was there; ``start_syphon`` starts
the query for callers that wait themselves. The dry run is ``run.dry_run``.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Callable

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from backlog_syphon.config import AVAILABLE_NOW, SyphonConfig, trigger_options
from backlog_syphon.errors import SettingsError
from backlog_syphon.model import Outcome
from backlog_syphon.restore.queue_names import backlog_queue_names
from backlog_syphon.run import reports
from backlog_syphon.run.fence import LeaseKeeper
from backlog_syphon.run.progress import BatchStats, ProgressPoint, SyphonProgressListener, follow_progress
from backlog_syphon.run.spark_session import is_connect
from backlog_syphon.sink.foreach_batch import DeliverySink
from backlog_syphon.source.data_source import (
    READ_LIMITS_SUPPORTED,
    SOURCE_NAME,
    BacklogDataSource,
    backlog_source_options,
)
from backlog_syphon.storage import tables

logger = logging.getLogger(__name__)

EMULATED_AVAILABLE_NOW_TRIGGER = "1 second"  # between batches of a played available-now run


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    per_destination: dict[str, dict[str, int]]  # destination -> outcome (an Outcome's value) -> count
    remaining: dict[str, int]  # backlog queue -> messages still there
    progress: tuple[ProgressPoint, ...] = ()  # one point per micro-batch, as the listener saw it

    @property
    def held(self) -> dict[str, int]:
        """Per destination, the messages this run left in the backlog because ``restore.skip_destinations``
        names it (``Outcome.HELD``)."""
        return {destination: counts.get(Outcome.HELD, 0) for destination, counts in self.per_destination.items()
                if counts.get(Outcome.HELD, 0)}

    @property
    def drained(self) -> bool:
        """Nothing is left in the backlog but what skipped destinations hold: a skip is what the operator
        asked for, so a scheduled run that honours it has drained (exit code 0), not fallen short."""
        return sum(self.remaining.values()) <= sum(self.held.values())

    def lines(self) -> list[str]:
        out = [f"run {self.run_id}"]
        out.append(f"  {'destination':<32} {'delivered':>10} {'dead-lettered':>14} {'skipped':>8} {'held':>8}")
        for destination, counts in self.per_destination.items():
            out.append(f"  {destination:<32} {counts[Outcome.DELIVERED]:>10} {counts[Outcome.DEAD_LETTERED]:>14} "
                       f"{counts[Outcome.SKIPPED_PING]:>8} {counts.get(Outcome.HELD, 0):>8}")
        if not self.per_destination:
            out.append("  (nothing moved)")
        out.append(f"  {'backlog queue':<40} {'remaining':>10}")
        for queue, count in self.remaining.items():
            out.append(f"  {queue:<40} {count:>10}")
        held = self.held
        if held:
            out.append(f"  left in the backlog for restore.skip_destinations: {sum(held.values())} message(s) "
                       f"({', '.join(f'{d} {n}' for d, n in held.items())}); a run without the skip delivers them")
        return out


class SinkRecords:
    """What the run did, as the sink counted it: a classic session runs ``foreachBatch`` in this process."""

    def __init__(self, sink: DeliverySink):
        self.sink = sink

    def batch_stats(self, batch_id: int) -> BatchStats | None:
        return self.sink.batch_stats.pop(batch_id, None)

    def per_destination(self) -> dict[str, dict[str, int]]:
        return dict(sorted(self.sink.per_destination.items()))


class AuditRecords:
    """What the run did, read from the audit table: under Spark Connect ``foreachBatch`` runs in a
    process of the server's, so nothing the sink object counts comes back to the client.

    A replayed batch shows what this run recorded for it (a replay's rows are those of the
    attempt that recorded them first, under that run's id).
    """

    def __init__(self, spark: SparkSession, audit_table: str, run_id: str):
        self.spark, self.audit_table, self.run_id = spark, audit_table, run_id

    def batch_stats(self, batch_id: int) -> BatchStats | None:
        audit = tables.existing_table(self.spark, self.audit_table)
        if audit is None:
            return None
        row = reports.batch_totals(audit, self.run_id, batch_id).first()
        if row is None or not row["rows"]:
            return None
        oldest = row["oldest_enqueued"]
        return BatchStats(row[Outcome.DELIVERED], row[Outcome.DEAD_LETTERED], row[Outcome.SKIPPED_PING], 0,
                          (row["last_outcome"] - row["first_outcome"]).total_seconds(),
                          None if oldest is None else oldest.astimezone(dt.timezone.utc), held=row[Outcome.HELD])

    def per_destination(self) -> dict[str, dict[str, int]]:
        audit = tables.existing_table(self.spark, self.audit_table)
        if audit is None:
            return {}
        rows = reports.audit_summary(audit, self.run_id).collect()
        return {row["destination"]: {outcome.value: row[outcome] for outcome in Outcome} for row in rows}


def lease_key(config: SyphonConfig) -> str:
    """Which backlog a lease fences: the secondary namespace's endpoint and the primary namespace's name."""
    return f"{config.secondary.endpoint}/{config.primary.namespace}"


@dataclass
class SyphonRun:
    """A started syphon query with its sink (what moved), progress listener (how it went) and lease."""

    query: StreamingQuery
    sink: DeliverySink
    listener: SyphonProgressListener
    lease_keeper: LeaseKeeper
    stop_file: str
    records: SinkRecords | AuditRecords
    spark: SparkSession | None = None  # Spark Connect: how a stop request reaches the server
    _forwarded: bool = False

    def request_stop(self) -> None:
        """Stop after the batch in flight: no new batch is planned from now on (see the source). Safe in
        a signal handler: it only writes a local file (``stop_requested`` forwards it to a Connect server)."""
        with open(self.stop_file, "a"):
            pass

    @property
    def stop_requested(self) -> bool:
        requested = os.path.exists(self.stop_file)
        if requested and self.spark is not None and not self._forwarded:
            # Over Spark Connect the source runs on the server, which cannot see this process's files:
            # the request goes there through Spark, and the sink passes it to the source after its batch.
            tables.write_marker(self.spark, self.sink.stop_marker)
            self._forwarded = True
        return requested

    def finish(self, spark: SparkSession, *, meanwhile: Callable[[], object] | None = None):
        """Stop the query if it still runs, wait for its last purge, then record the purge marks and
        give the lease back (two Delta commits, at once) while ``meanwhile`` runs; return its result."""
        from concurrent.futures import ThreadPoolExecutor

        try:
            if self.query.isActive:
                self.query.stop()
            self.sink.wait_for_purges()
        finally:
            spark.streams.removeListener(self.listener)
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="finish") as pool:
                flushed = pool.submit(self.sink.flush, spark)
                released = pool.submit(self.lease_keeper.release, spark)
                try:
                    result = meanwhile() if meanwhile is not None else None
                finally:
                    released.result()
                    flushed.result()
            try:
                os.unlink(self.stop_file)
            except OSError:
                pass
        return result


def start_syphon(spark: SparkSession, config: SyphonConfig, *, run_id: str | None = None,
                 log_progress: bool = True, on_wait: Callable[[str], None] | None = None,
                 check_access: bool = True, emulate_available_now: bool | None = None) -> SyphonRun:
    """Take the backlog's lease and start the streaming query; the caller waits and calls ``finish``.

    ``emulate_available_now``: play an available-now run with bounded batches (None: where Spark lacks read
    limits for Python sources, that is before 4.2).
    ``check_access``: run the pre-flight (``servicebus.probes.preflight``) while the lease is taken, and
    start nothing if it fails (the command line runs it while Spark starts, and passes False). The
    executors' own check (``executor_preflight``) always runs.
    ``log_progress``: log one line per micro-batch (off when the caller shows them itself).
    Raises ``run.lease.LeaseHeldError`` when another run holds the backlog (unless ``run.wait_for_lease``,
    then it waits, telling ``on_wait`` once).
    """
    from concurrent.futures import ThreadPoolExecutor

    from backlog_syphon.servicebus.probes import executor_preflight, preflight

    spark.dataSource.register(BacklogDataSource)
    storage = config.storage
    run_id = run_id or f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    keeper = LeaseKeeper(lease_table=storage.resolved_lease_table, lease_key=lease_key(config), run_id=run_id,
                         lease_seconds=config.run.lease_seconds)

    def check() -> None:
        if check_access:
            preflight(config)
        executor_preflight(spark, config)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight") as pool:
        # The pre-flights (round trips to both namespaces, from the driver and from an executor) overlap
        # taking the lease (Delta commits).
        checked = pool.submit(check)
        try:
            tables.create_tables(spark, storage.audit_table, storage.checkpoint_table, storage.resolved_lease_table)
            keeper.acquire(spark, wait=config.run.wait_for_lease, on_wait=on_wait)
        finally:
            try:
                checked.result()
            except BaseException:
                keeper.release(spark)
                raise
    keeper.start_heartbeat(spark)
    stop_file = os.path.join(tempfile.gettempdir(), f"backlog-syphon-stop-{run_id}")
    sink = DeliverySink(config, run_id=run_id, lease_keeper=keeper, settle_in_batch=is_connect(spark),
                        stop_file=stop_file)
    records = AuditRecords(spark, storage.audit_table, run_id) if is_connect(spark) else SinkRecords(sink)
    listener = SyphonProgressListener(records.batch_stats, query_name=config.run.query_name, log_lines=log_progress)
    spark.streams.addListener(listener)
    # Spark 4.0/4.1 have no read limits for Python sources: there an available-now run would read the
    # whole backlog as one batch. It is played instead: bounded batches, stopping at the start's tail.
    if emulate_available_now is None:
        emulate_available_now = not READ_LIMITS_SUPPORTED and not is_connect(spark)
    emulate = config.run.trigger == AVAILABLE_NOW and emulate_available_now
    if config.run.trigger == AVAILABLE_NOW and is_connect(spark) and not server_has_read_limits(spark):
        refuse_unbounded_batch(config, spark.version)
    # Where earlier runs held messages for skipped destinations: the source reads those queues again from
    # their first message once (what is recorded among them is dropped by identity in the sink).
    look_back = tuple(tables.queues_with_held(spark, storage.audit_table,
                                              tables.read_checkpoint(spark, storage.checkpoint_table)))
    if look_back:
        logger.info("messages held for skipped destinations wait in %d backlog queue(s): this run reads them again",
                    len(look_back))
    stream = (spark.readStream.format(SOURCE_NAME)
              .options(**backlog_source_options(config, stop_file=stop_file, emulate_available_now=emulate,
                                                look_back=look_back)).load())
    try:
        query = (stream.writeStream.foreachBatch(sink)
                 .option("checkpointLocation", storage.checkpoint_location)
                 .queryName(config.run.query_name)
                 .trigger(**(trigger_options(EMULATED_AVAILABLE_NOW_TRIGGER) if emulate
                             else trigger_options(config.run.trigger)))
                 .start())
    except BaseException:
        spark.streams.removeListener(listener)
        keeper.release(spark)
        raise
    logger.info("started run_id=%s query=%s trigger=%s", run_id, config.run.query_name, config.run.trigger)
    return SyphonRun(query, sink, listener, keeper, stop_file, records, spark if is_connect(spark) else None)


def run_syphon(spark: SparkSession, config: SyphonConfig, *, run_id: str | None = None,
               timeout_seconds: float | None = None, on_progress: Callable[[str], None] | None = None,
               check_access: bool = True, on_start: Callable[[SyphonRun], None] | None = None) -> RunSummary:
    """Run until an available-now run has drained what was there (or the query stops); summarise.

    ``check_access``: see ``start_syphon``. ``on_progress`` receives one line per micro-batch, from
    this thread, while the run goes on; ``on_start`` gets the started run (to ask it to stop).
    """
    run = start_syphon(spark, config, run_id=run_id, log_progress=on_progress is None, on_wait=on_progress,
                       check_access=check_access)
    try:
        if on_start is not None:
            on_start(run)
        follow_progress(run.query, run.listener, on_progress, timeout_seconds=timeout_seconds,
                        stop_requested=lambda: run.stop_requested, request_stop=run.request_stop)
    except BaseException as exc:
        run.finish(spark)
        if run.sink.failure is not None and exc is not run.sink.failure:
            # Classic Spark runs foreachBatch in this process: the sink's own error carries its exit code.
            raise run.sink.failure from exc
        raise
    # What is left is counted (peeks) while the last records are written.
    summary = run.finish(spark, meanwhile=lambda: None if run.query.exception() else summarise_run(
        config, run))
    if run.query.exception() is not None:
        # Classic Spark runs foreachBatch in this process: the sink kept its own error, exit code included.
        raise run.sink.failure or run.query.exception()
    return summary


def server_has_read_limits(spark: SparkSession) -> bool:
    """Whether the (Connect) server's Spark bounds Python streaming sources' batches: 4.2 and later."""
    major, minor = (int(part) for part in spark.version.split(".")[:2])
    return (major, minor) >= (4, 2)


def refuse_unbounded_batch(config: SyphonConfig, spark_version: str) -> None:
    """On a server that reads an available-now backlog as one batch, refuse a backlog larger than
    ``run.max_single_batch_messages`` (counted in sequence numbers, an upper bound, by a few peeks)."""
    spans = backlog_spans(config.secondary, backlog_queue_names(config.primary.namespace, config.backlog.queue_count))
    total = sum(spans.values())
    limit = config.run.max_single_batch_messages
    logger.warning("Spark %s reads an available-now backlog as one batch here: about %d messages", spark_version,
                   total)
    if total > limit:
        raise SettingsError(
            f"Spark {spark_version} on this Connect server reads an available-now backlog as one batch, and this "
            f"one holds up to {total} messages, more than run.max_single_batch_messages ({limit}): run it on a "
            f"classic cluster or Spark 4.2+, or raise run.max_single_batch_messages to accept a duplicate window "
            f"of the whole backlog")


def backlog_spans(namespace, queues) -> dict[str, int]:
    """Per queue, how many sequence numbers lie between its first message and its last (an upper bound
    on the messages in it), found with a few single-message peeks each; a missing queue holds none."""
    from concurrent.futures import ThreadPoolExecutor

    from backlog_syphon.errors import BacklogQueueMissingError
    from backlog_syphon.servicebus.clients import pooled_receiver
    from backlog_syphon.servicebus.peek import first_identity_from
    from backlog_syphon.source.planning import tail_end

    def span(queue: str) -> int:
        try:
            with pooled_receiver(namespace, queue) as receiver:
                first = first_identity_from(receiver, 1)
                return 0 if first is None else tail_end(first[0], lambda seq: first_identity_from(receiver, seq)) - first[0]
        except BacklogQueueMissingError:
            return 0

    queues = list(queues)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(queues))), thread_name_prefix="span") as pool:
        return dict(zip(queues, pool.map(span, queues)))


def summarise_run(config: SyphonConfig, run: SyphonRun) -> RunSummary:
    from backlog_syphon.servicebus.peek import peek_counts

    return RunSummary(run_id=run.sink.run_id, per_destination=run.records.per_destination(),
                      remaining=peek_counts(config.secondary, backlog_queue_names(config.primary.namespace,
                                                                                    config.backlog.queue_count)),
                      progress=tuple(run.listener.points))
