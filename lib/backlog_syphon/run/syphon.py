"""Wire the source, the sink and the tables into one streaming query: the one code path of every run mode.

``run_syphon`` runs until an available-now run has drained what was there; ``start_syphon`` starts
the query for callers that wait themselves. The dry run is ``run.dry_run``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from backlog_syphon.config import AVAILABLE_NOW, SyphonConfig, trigger_options
from backlog_syphon.errors import SettingsError
from backlog_syphon.model import NO_MIGRATION, CreditKind, CreditUsage, JobIds, MigrationPlan, Outcome, new_run_id
from backlog_syphon.run.fence import LeaseKeeper
from backlog_syphon.run.progress import SyphonProgressListener, follow_progress
from backlog_syphon.run.run_records import AuditRecords, RunSummary, SinkRecords
from backlog_syphon.run.run_start import StartGates
from backlog_syphon.run.runs import RunRecorder
from backlog_syphon.run.start_ports import SparkStartPorts
from backlog_syphon.run.spark_session import is_connect, spark_line
from backlog_syphon.sink.foreach_batch import DeliverySink, settle_before_start
from backlog_syphon.sink.micro_batch import NO_HOOKS, NOTHING_RECORDED, Hooks
from backlog_syphon.sink.spark_ports import task_slots
from backlog_syphon.source.data_source import (
    READ_LIMITS_SUPPORTED,
    SOURCE_NAME,
    backlog_queues,
    backlog_source_options,
)
from backlog_syphon.source.options import SourceOptions
from backlog_syphon.storage import audit_table, markers
from backlog_syphon.timeline import Milestone, Timeline

logger = logging.getLogger(__name__)

EMULATED_AVAILABLE_NOW_TRIGGER = "1 second"  # between batches of a played available-now run


def start_gates(spark: SparkSession, config: SyphonConfig, keeper: LeaseKeeper, timeline: Timeline, *,
                check_access: bool, on_wait: Callable[[str], None] | None,
                migration: MigrationPlan = NO_MIGRATION) -> StartGates:
    """What must hold before the query starts (``run.run_start``), checked on Spark, Delta and Service Bus,
    its steps at once; raises what failed, having given the lease back."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="start")  # the steps, and the state's reads
    try:
        gates = StartGates(SparkStartPorts(spark, config, keeper, timeline, on_wait=on_wait, migration=migration),
                           pool.submit,
                           check_access=check_access, nothing_recorded=NOTHING_RECORDED)
        gates.wait()
    finally:
        pool.shutdown(wait=False)  # the threads end with their work
    return gates


def run_config(config: SyphonConfig, run_id: str) -> SyphonConfig:
    """The configuration a run works with. A re-drive reads the dead-letter sub-queues as they are when it
    starts, from their first message, whatever earlier re-drives left there: it gets a streaming checkpoint
    of its own (``<checkpoint_location>_redrive/<run id>``). So does a migration run
    (``<checkpoint_location>_migration/<run id>``): a dead-letter sub-queue's numbers are not in arrival order, a
    scheduled message comes back under a new number, and what an earlier run left is read again. What an
    interrupted run recorded is known from the audit and checkpoint tables, as after a deleted streaming
    checkpoint: not sent again, and settled by the next run."""
    if not config.redriving and not config.migrating:
        return config
    kind = "redrive" if config.redriving else "migration"
    location = f"{config.storage.checkpoint_location.rstrip('/')}_{kind}/{run_id}"
    return dataclasses.replace(config, storage=dataclasses.replace(config.storage, checkpoint_location=location))


def source_queues(config: SyphonConfig, migration: MigrationPlan = NO_MIGRATION) -> list[str]:
    """The queues a run reads: the configured backlog queues and, with ``backlog.discover``, every other one
    the administration API lists; in a re-drive, their dead-letter sub-queues; a migration run's sources. What
    is left in any of them is what the run leaves behind (its summary counts them all)."""
    return backlog_queues(SourceOptions.from_config(config, migration=migration))


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
    timeline: Timeline
    spark: SparkSession | None = None  # Spark Connect: how a stop request reaches the server
    migration: MigrationPlan = NO_MIGRATION  # a migration run's sources and routes
    _forwarded: bool = False
    # What this process had spent on each namespace when the run started (``credit_usage`` counts the run's).
    credits_before: tuple[dict, dict] = ({}, {})

    def credit_usage(self, config: SyphonConfig, per_destination: dict[str, dict[str, int]]) -> CreditUsage:
        """What the run spent of each namespace's credits: what this process paced (the purge, the pre-flight,
        the counts, administration reads), the planner's probes as it reports them (Spark 4.2+), a peek per
        row the windows read and a send per message sent, as the batches reported them."""
        from backlog_syphon.servicebus.throttling import spent

        def since_start(namespace, before: dict) -> dict[str, int]:
            now = spent(namespace)
            return {str(kind): now.get(kind, 0) - before.get(kind, 0) for kind in now}

        secondary = since_start(config.secondary, self.credits_before[0])
        secondary[CreditKind.PEEK] = (secondary.get(CreditKind.PEEK, 0) + self.listener.rows_read
                                      + self.listener.planner_credits)
        primary = since_start(config.primary, self.credits_before[1])
        primary[CreditKind.SEND] = primary.get(CreditKind.SEND, 0) + self.listener.sent
        moved = sum(counts.get(outcome, 0) for counts in per_destination.values()
                    for outcome in (Outcome.DELIVERED, Outcome.DEAD_LETTERED, Outcome.SKIPPED_PING))
        return CreditUsage({k: v for k, v in secondary.items() if v}, {k: v for k, v in primary.items() if v}, moved)

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
            markers.write_marker(self.spark, self.sink.stop_marker)
            self._forwarded = True
        return requested

    def finish(self, spark: SparkSession, *, meanwhile: Callable[[], object] | None = None):
        """Stop the query if it still runs, wait for its last purge, then record the purge marks and
        give the lease back while ``meanwhile`` runs; return its result."""
        from concurrent.futures import ThreadPoolExecutor

        try:
            if self.query.isActive:
                self.query.stop()
            self.sink.wait_for_purges()
            self.timeline.mark(Milestone.QUERY_STOPPED)
        finally:
            spark.streams.removeListener(self.listener)
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="finish") as pool:
                saved = pool.submit(self._save_then_release, spark)
                try:
                    result = meanwhile() if meanwhile is not None else None
                finally:
                    saved.result()
                    self.timeline.mark(Milestone.STATE_SAVED)
            try:
                os.unlink(self.stop_file)
            except OSError:
                pass
        return result

    def _save_then_release(self, spark: SparkSession) -> None:
        """The run's last commit: the checkpoint rows with the last purge marks, naming this run as ended,
        which gives the lease back too (``run.fence``): one commit, the last of the run, so none of its
        commits lands after the next run started reading the state tables (``StartGates``). Written only
        while the lease is still this run's. Without rows to write, the lease is given back by itself.
        The heartbeat stops first: a commit that hangs does not keep the lease from expiring."""
        self.lease_keeper.stop_heartbeat()
        released = False
        try:
            released = self.lease_keeper.holds(spark) and self.sink.flush(spark)
        finally:
            if released:
                self.lease_keeper.forget()
            else:
                self.lease_keeper.release(spark)


def start_syphon(spark: SparkSession, config: SyphonConfig, *, run_id: str | None = None,
                 log_progress: bool = True, on_wait: Callable[[str], None] | None = None,
                 check_access: bool = True, emulate_available_now: bool | None = None,
                 timeline: Timeline | None = None, hooks: Hooks = NO_HOOKS) -> SyphonRun:
    """Take the backlog's lease and start the streaming query; the caller waits and calls ``finish``.

    ``emulate_available_now``: play an available-now run with bounded batches (None: where Spark lacks read
    limits for Python sources, that is before 4.2).
    ``check_access``: run the pre-flight (``servicebus.preflight.preflight``) while the lease is taken, and
    start nothing if it fails (the command line runs it while Spark starts, and passes False). The
    executors' own check (``executor_preflight``) always runs (see ``StartGates``).
    ``log_progress``: log one line per micro-batch (off when the caller shows them itself).
    ``timeline``: where the run marks its steps (a new one, from the process's start, if None).
    ``hooks``: where a test harness stops or breaks the run (``sink.micro_batch.Hooks``; the tools' fault
    harness, ``tools/faulty_job.py``, gives its own): every real run has none.
    Raises ``run.lease.LeaseHeldError`` when another run holds the backlog (unless ``run.wait_for_lease``,
    then it waits, telling ``on_wait`` once).
    """
    from backlog_syphon.servicebus.throttling import pace_driver, spent

    timeline = timeline if timeline is not None else Timeline()
    run_id = run_id or new_run_id(dt.datetime.now(dt.timezone.utc))
    config = run_config(config, run_id)
    storage = config.storage
    pace_driver(config)
    credits_before = (spent(config.secondary), spent(config.primary))
    keeper = LeaseKeeper(lease_table=storage.resolved_lease_table, lease_key=lease_key(config), run_id=run_id,
                         lease_seconds=config.run.lease_seconds, checkpoint_table=storage.checkpoint_table)
    migration = prepare_migration(config)

    gates = start_gates(spark, config, keeper, timeline, check_access=check_access, on_wait=on_wait,
                        migration=migration)
    if migration.sources and not config.redriving:
        check_fan_out(config, migration, keeper, spark)
        move_states(config, migration, keeper, spark)
    stop_file = os.path.join(tempfile.gettempdir(), f"backlog-syphon-stop-{run_id}")
    sink = DeliverySink(config, run_id=run_id, lease_keeper=keeper, settle_in_batch=is_connect(spark),
                        stop_file=stop_file, timeline=timeline, state_is_new=gates.state_is_new,
                        destination_shapes=gates.destination_shapes, partitioned_queues=gates.queue_settings.partitioned,
                        lock_seconds=gates.queue_settings.lock_seconds,
                        hooks=hooks, migration=migration)
    settle_recorded(spark, config, sink, gates, run_id, migration)
    records = AuditRecords(spark, storage.audit_table, run_id) if is_connect(spark) else SinkRecords(sink)
    listener = SyphonProgressListener(records.batch_stats, query_name=config.run.query_name, log_lines=log_progress)
    spark.streams.addListener(listener)
    # Spark 4.0/4.1 have no read limits for Python sources: there an available-now run would read the
    # whole backlog as one batch. It is played instead: bounded batches, stopping at the start's tail.
    if emulate_available_now is None:
        emulate_available_now = not READ_LIMITS_SUPPORTED and not is_connect(spark)
    emulate = config.run.trigger == AVAILABLE_NOW and emulate_available_now
    if config.run.trigger == AVAILABLE_NOW and is_connect(spark) and not server_has_read_limits(spark):
        refuse_unbounded_batch(config, spark.version, migration)
    # Where earlier runs held messages for skipped destinations: the source reads those queues again from
    # their first message once (what is recorded among them is dropped by identity in the sink).
    look_back = gates.look_back
    if look_back:
        logger.info("messages held for skipped destinations wait in %d backlog queue(s): this run reads them again",
                    len(look_back))
    stream = (spark.readStream.format(SOURCE_NAME)
              .options(**backlog_source_options(config, stop_file=stop_file, emulate_available_now=emulate,
                                                look_back=look_back, migration=migration,
                                                read_slots=task_slots(spark))).load())
    writer = (stream.writeStream.foreachBatch(sink)
              .option("checkpointLocation", storage.checkpoint_location)
              .queryName(config.run.query_name)
              .trigger(**(trigger_options(EMULATED_AVAILABLE_NOW_TRIGGER) if emulate
                          else trigger_options(config.run.trigger))))
    try:
        query = start_query(writer.start)
    except BaseException:
        spark.streams.removeListener(listener)
        sink.wait_for_purges()  # nothing settles under a lease given back
        keeper.release(spark)
        raise
    timeline.mark(Milestone.QUERY_STARTED)
    logger.info("started run_id=%s query=%s trigger=%s", run_id, config.run.query_name, config.run.trigger)
    return SyphonRun(query, sink, listener, keeper, stop_file, records, timeline,
                     spark if is_connect(spark) else None, migration, credits_before=credits_before)


def prepare_migration(config: SyphonConfig) -> MigrationPlan:
    """A migration run's plan (``servicebus.listing.migration_plan``), its browse-only sources registered for this
    process's peeks; ``NO_MIGRATION`` for a backlog run."""
    if not config.migrating:
        return NO_MIGRATION
    from backlog_syphon.servicebus.clients import browse_only
    from backlog_syphon.servicebus.listing import migration_plan

    plan = migration_plan(config)
    browse_only(config.secondary, plan.browse_only)
    return plan


def check_fan_out(config: SyphonConfig, migration: MigrationPlan, keeper: LeaseKeeper, spark: SparkSession) -> None:
    """Under the lease, before anything is sent: the subscriptions each ``topic`` route drains through one lead hold
    the same messages (``migration.fan_out``: peeked now, and what earlier runs recorded of them), else the run
    gives the lease back and ends with ``FanOutError``."""
    groups = migration.fan_out_groups()
    if not groups:
        return
    from backlog_syphon.migration.fan_out import check_same_messages
    from backlog_syphon.servicebus.fan_out import live_sequence_numbers

    members = sorted({path for lead, covered in groups.items() for path in (lead, *covered)}, key=str.lower)
    try:
        live = live_sequence_numbers(config.secondary, members, browse_only=migration.browse_only,
                                     partitioned=migration.partitioned)
        check_same_messages(groups, live,
                            audit_table.recorded_sequence_numbers(spark, config.storage.audit_table, members))
    except BaseException:
        keeper.release(spark)
        raise
    logger.info("the subscriptions drained through one lead hold the same messages: %s",
                "; ".join(f"{lead} for {', '.join(covered)}" for lead, covered in groups.items()))


def move_states(config: SyphonConfig, migration: MigrationPlan, keeper: LeaseKeeper, spark: SparkSession) -> None:
    """Move the session states of the migration's session-enabled sources, under the lease, before anything is
    sent (``servicebus.session_states``); a failure gives the lease back and ends the run before its stream."""
    if not migration.session_entities:
        return
    from backlog_syphon.servicebus.session_states import move_session_states

    try:
        move_session_states(config.secondary, config.primary, migration)
    except BaseException:
        keeper.release(spark)
        raise


def settle_recorded(spark: SparkSession, config: SyphonConfig, sink: DeliverySink, gates: StartGates,
                    run_id: str, migration: MigrationPlan = NO_MIGRATION) -> None:
    """Under the lease, before the query starts: what earlier runs recorded and did not settle (what the start
    read, ``StartGates.recovery``) is purged whether or not the run finds anything new to read, so an
    available-now run after a killed one ends drained. Where the sink lives in this process (classic Spark)
    in the background, beside the first batch (``DeliverySink.begin``); where it lives in a Spark Connect
    server, here and now, its marks written for the server's first batch to read (``settle_before_start``).
    A run on fresh state pays nothing."""
    if is_connect(spark):
        waiting = settle_before_start(spark, config, gates.recovery, run_id=run_id,
                                      partitioned_queues=gates.queue_settings.partitioned,
                                      lock_seconds=gates.queue_settings.lock_seconds, migration=migration)
    else:
        waiting = sink.begin(gates.recovery)
    if waiting:
        queues = {span.backlog_queue for span in gates.recovery.unsettled}
        logger.info("earlier runs recorded up to %d message(s) in %d backlog queue(s) that may not be settled yet: "
                    "%s", waiting, len(queues), "settled before the query started" if is_connect(spark)
                    else "this run settles them first, beside its first batch")


# Spark waits a fixed 10 s (no setting changes it) for the Python process it starts for a streaming
# query's ``foreachBatch`` under Spark Connect; on a busy driver the start then fails before the query
# exists, with nothing read, sent or recorded, and a second try usually finds the driver less busy.
PYTHON_CONNECT_BACK_FAILURE = "Python worker failed to connect back"
QUERY_START_ATTEMPTS = 3


def start_query(start: Callable[[], StreamingQuery], *, attempts: int = QUERY_START_ATTEMPTS,
                sleep: Callable[[float], None] = time.sleep) -> StreamingQuery:
    """``start()``, tried again (after 2 s, then 4 s) when it failed only because Spark's Python process
    did not connect back in time; any other failure, or the last, is raised."""
    for attempt in range(1, attempts):
        try:
            return start()
        except Exception as exc:  # noqa: BLE001 - only the one failure below is tried again
            if PYTHON_CONNECT_BACK_FAILURE not in str(exc):
                raise
            logger.warning("the streaming query did not start (%s, attempt %d of %d): the driver is busy; "
                           "trying again", PYTHON_CONNECT_BACK_FAILURE, attempt, attempts)
            sleep(2.0 * attempt)
    return start()


def run_syphon(spark: SparkSession, config: SyphonConfig, *, run_id: str | None = None,
               timeout_seconds: float | None = None, on_progress: Callable[[str], None] | None = None,
               check_access: bool = True, on_start: Callable[[SyphonRun], None] | None = None,
               timeline: Timeline | None = None, job: JobIds | None = None, hooks: Hooks = NO_HOOKS) -> RunSummary:
    """Run until an available-now run has drained what was there (or the query stops); summarise.

    ``check_access``: see ``start_syphon``. ``on_progress`` receives one line per micro-batch, from
    this thread, while the run goes on; ``on_start`` gets the started run (to ask it to stop);
    ``timeline``, ``hooks``: see ``start_syphon``. Once the run has ended and given its lease back, its row goes
    to the runs table (``run.runs``; ``job``: the Databricks job run it belongs to), also when it failed.
    """
    recorder = RunRecorder(spark, config, run_id or new_run_id(dt.datetime.now(dt.timezone.utc)), job=job)
    try:
        summary = _run_syphon(spark, config, run_id=recorder.run_id, timeout_seconds=timeout_seconds,
                              on_progress=on_progress, check_access=check_access,
                              on_start=recorder.watching(on_start), timeline=timeline, hooks=hooks)
    except Exception as exc:
        recorder.failed(exc)
        raise
    recorder.ended(summary)
    return summary


def _run_syphon(spark: SparkSession, config: SyphonConfig, *, run_id: str, timeout_seconds: float | None,
                on_progress: Callable[[str], None] | None, check_access: bool,
                on_start: Callable[[SyphonRun], None], timeline: Timeline | None, hooks: Hooks) -> RunSummary:
    run = start_syphon(spark, config, run_id=run_id, log_progress=on_progress is None, on_wait=on_progress,
                       check_access=check_access, timeline=timeline, hooks=hooks)
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
    summary = run.finish(spark, meanwhile=lambda: None if run.query.exception() else summarise_run(config, run))
    if run.query.exception() is not None:
        # Classic Spark runs foreachBatch in this process: the sink kept its own error, exit code included.
        raise run.sink.failure or run.query.exception()
    return summary


def server_has_read_limits(spark: SparkSession) -> bool:
    """Whether the (Connect) server's Spark bounds Python streaming sources' batches: 4.2 and later."""
    return spark_line(spark.version) >= (4, 2)


def refuse_unbounded_batch(config: SyphonConfig, spark_version: str, migration: MigrationPlan = NO_MIGRATION) -> None:
    """On a server that reads an available-now backlog as one batch, refuse a backlog larger than
    ``run.max_single_batch_messages`` (counted in sequence numbers, an upper bound, by a few peeks)."""
    spans = backlog_spans(config.secondary, source_queues(config, migration))
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
    from backlog_syphon.errors import BacklogQueueMissingError
    from backlog_syphon.servicebus.clients import each_at_once, pooled_receiver
    from backlog_syphon.servicebus.peek import first_identity_from
    from backlog_syphon.probing import tail_end

    def span(queue: str) -> int:
        try:
            with pooled_receiver(namespace, queue) as receiver:
                first = first_identity_from(receiver, 1)
                return 0 if first is None else tail_end(first[0], lambda seq: first_identity_from(receiver, seq)) - first[0]
        except BacklogQueueMissingError:
            return 0

    return each_at_once(queues, span, name="span")


def summarise_run(config: SyphonConfig, run: SyphonRun) -> RunSummary:
    from backlog_syphon.servicebus.peek import peek_counts

    per_destination = run.records.per_destination()
    remaining = peek_counts(config.secondary, source_queues(config, run.migration))
    summary = RunSummary(run_id=run.sink.run_id, per_destination=per_destination, remaining=remaining,
                         progress=tuple(run.listener.points), earlier=run.listener.earlier, timeline=run.timeline,
                         redrive=config.redriving, stopped=os.path.exists(run.stop_file),
                         migration=bool(run.migration.sources), left_in_place=run.sink.left_in_place,
                         credits=run.credit_usage(config, per_destination))
    run.timeline.mark(Milestone.SUMMARISED)
    return summary
