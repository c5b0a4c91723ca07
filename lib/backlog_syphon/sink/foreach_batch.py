"""The foreachBatch sink: ``DeliverySink``, what Spark calls once per micro-batch, on the driver.

At a run's start (``DeliverySink.begin``) it takes what the run read of the tables (the checkpoint table,
and the audit rows above each queue's purge mark, aggregated into recorded spans) and starts purging what
earlier runs recorded and did not settle, in the background; over Spark Connect, where the sink lives in
the server, that is settled before the query starts (``settle_before_start``). Per batch it builds the
batch's ports (``sink.spark_ports``: Spark, Delta and the send tasks) and runs the batch's state machine on
them (``sink.micro_batch``, whose order and failure cases are these):
- recover (a Connect server's first batch): the tables, as above;
- exclude: the rows those spans hold, by identity (queue, sequence number, enqueue time);
- send rounds under the lease: restore and classify (``restore.rules``; the migration mode's copy rules,
  ``migration.copy_rules``), then one send task per backlog queue (or source entity) on the executors
  (``sink.send_task``), the outcomes checkpointed once;
- aggregate: one Spark job turns every row's latest outcome into recorded spans, per-destination
  counts and the unsent destinations (``sink.outcome_aggregate``);
- record: the audit append, idempotent on the attempt's transaction version (the batch's one commit);
  when ``storage.checkpoint_interval_seconds`` has passed, the checkpoint table is rewritten meanwhile;
- purge: in the background (``sink.purge_runner``).

Between batches it keeps the run's state (``sink.micro_batch.SinkState``, what the rounds learned included:
their ports report it in their results) and what the progress reports read. A test harness's ``Hooks``
(``sink.micro_batch``) come in with the rest of its settings.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from typing import Callable, Mapping

from pyspark.sql import DataFrame, SparkSession

from backlog_syphon.config import SyphonConfig
from backlog_syphon.errors import BatchFailedError
from backlog_syphon.model import NO_MIGRATION, REPORTED_OUTCOMES, BatchStats, DestinationShape, MigrationPlan, Outcome
from backlog_syphon.restore.destination_fit import session_subscription_warning
from backlog_syphon.sink import micro_batch as machine
from backlog_syphon.sink.classifiers import Classifiers
from backlog_syphon.sink.micro_batch import NO_HOOKS, BatchAggregate, Hooks, Recovery, SinkState
from backlog_syphon.sink.purge_runner import PurgeRunner
from backlog_syphon.sink.send_shape import known_shapes
from backlog_syphon.sink.spark_ports import BatchSettings, SessionLease, SparkBatch
from backlog_syphon.storage import checkpoint_table, markers
from backlog_syphon.timeline import Milestone, Timeline

logger = logging.getLogger(__name__)


def checkpoint_app_id(checkpoint_location: str, query_id: str | None) -> str:
    """Delta transaction app id: one per streaming checkpoint, since batch ids restart with it. The
    query's id, which Spark keeps in the checkpoint, changes when the checkpoint is deleted and made
    again at the same path, so a new checkpoint never has its writes skipped as repeats."""
    digest = hashlib.sha256(f"{checkpoint_location}\0{query_id or ''}".encode()).hexdigest()[:16]
    return f"backlog-syphon-{digest}"


class DeliverySink:
    """Callable for ``foreachBatch``. Holds picklable settings and, in the process that runs it, the
    run's state between batches (``sink.micro_batch.SinkState``) and what the progress reports read.
    ``hooks``: where a test harness stops or breaks the run (``sink.micro_batch.Hooks``; none outside the tests)."""

    def __init__(self, config: SyphonConfig, *, run_id: str, lease_keeper, settle_in_batch: bool = False,
                 stop_file: str | None = None, timeline: Timeline | None = None,
                 state_is_new: bool = False,
                 destination_shapes: Mapping[str, DestinationShape] | None = None,
                 partitioned_queues: frozenset[str] = frozenset(), lock_seconds: Mapping[str, float] | None = None,
                 hooks: Hooks = NO_HOOKS, migration: MigrationPlan = NO_MIGRATION,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)):
        self.config = config
        self.run_id = run_id
        self.lease_keeper = lease_keeper  # run.fence.LeaseKeeper: sink.micro_batch.LeasePort with a session
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
        # What the destinations take (by lower-case name), where the administration API said: the restore
        # rules dead-letter what a destination would refuse before it is sent.
        self.destination_shapes = dict(destination_shapes or {})
        self.send_shapes = known_shapes(self.destination_shapes)  # the send tasks' (``sink.send_shape``)
        self.hooks = hooks  # picklable: they go with the sink (Spark Connect) and to the send tasks
        self.migration = migration  # a migration run's sources and routes (picklable: to the send tasks too)
        # The restore rules (a migration's copy rules) for this run's rows, built once in the process that runs
        # the batches.
        self.classifiers = Classifiers(config, migration, self.destination_shapes)
        self._warned_topics: set[str] = set()  # topics whose session subscriptions were warned about
        self.app_id: str | None = None  # known at the run's first batch (the checkpoint's query id)
        # Over Spark Connect the sink's copy in the server ends with the query, before the run's end could
        # write its rows: there every batch rewrites the checkpoint table.
        self.checkpoint_every = 0.0 if settle_in_batch else config.storage.checkpoint_interval_seconds
        # The backlog queues the secondary's administration API calls partitioned (with a migration's partitioned
        # sources), and their lock durations (lower-case names), for the purge; a migration's session-settled sources.
        self.state = SinkState(partitioned_queues=frozenset(partitioned_queues) | migration.partitioned,
                               lock_seconds=dict(lock_seconds or {}), session_entities=migration.session_entities)
        self._purges = PurgeRunner(config.secondary, hooks)
        self.per_destination: dict[str, dict[str, int]] = {}  # this run's outcomes, for the summary
        self.left_in_place = 0  # final outcomes whose message stays in its source (``BatchAggregate.left_in_place``)
        self.batch_stats: dict[int, BatchStats] = {}  # read (and emptied) by the progress listener
        self.failure: BaseException | None = None  # the last batch failure (classic Spark: this process)

    def begin(self, recovery: Recovery) -> int:
        """The run's start, under its lease, where the sink lives in this process for the whole run (classic
        Spark): ``recovery`` (what the start read of the tables, ``sink.spark_ports.read_recovery``) becomes the
        run's state, and the purge of what earlier runs recorded and did not settle starts in the background,
        beside the first batch, or with none (``micro_batch.begin_run``, ``settle_recorded``). Returns how many
        recorded messages it settles at most."""
        machine.begin_run(self.state, recovery, run_id=self.run_id, now=self.clock())
        return machine.settle_recorded(self.state, self._purges)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.timeline.mark(Milestone.FIRST_BATCH)
        spark = batch.sparkSession
        if self.app_id is None:
            self.app_id = checkpoint_app_id(self.config.storage.checkpoint_location,
                                            markers.streaming_query_id(spark, self.config.storage.checkpoint_location))
        started = time.monotonic()
        settings = BatchSettings(self.config, self.run_id, self.app_id, self.state_is_new, self.clock, self.migration,
                                 self.send_shapes, self.hooks)
        ports = SparkBatch(settings, self.classifiers, batch, batch_id)
        lease = SessionLease(self.lease_keeper, spark)
        try:
            report = machine.run_batch(self.state, ports, lease, self._purges, batch_id=batch_id, run_id=self.run_id,
                                       now=self.clock(), settle_now=self.settle_in_batch, hooks=self.hooks,
                                       checkpoint_every=self.checkpoint_every)
        except BatchFailedError as exc:
            self.failure = exc
            raise
        if self.settle_in_batch and self.stop_file and markers.marker_exists(spark, self.stop_marker):
            with open(self.stop_file, "a"):  # the source, next to this process, plans no more batches
                pass
        aggregate = report.aggregate
        if aggregate.first_outcome_ms is not None:
            self.timeline.mark(Milestone.FIRST_SEND, aggregate.first_outcome_ms / 1000)
        if aggregate.rows:
            self.timeline.mark(Milestone.LAST_RECORD, again=True)
        self._warn_of_session_subscriptions(aggregate)
        self.left_in_place += aggregate.left_in_place
        for (destination, outcome), n in aggregate.per_destination.items():
            if outcome in REPORTED_OUTCOMES:
                per = self.per_destination.setdefault(destination, {o.value: 0 for o in REPORTED_OUTCOMES})
                per[outcome.value] += n
        if aggregate.rows or report.replayed:
            oldest = min((span.enqueued_from_ms for span in aggregate.spans), default=None)
            skipped = aggregate.total(Outcome.SKIPPED_PING) + aggregate.total(Outcome.COVERED)  # settled, never sent
            self.batch_stats[batch_id] = BatchStats(
                aggregate.total(Outcome.DELIVERED), aggregate.total(Outcome.DEAD_LETTERED), skipped, report.replayed,
                round(time.monotonic() - started, 2),
                None if oldest is None else dt.datetime.fromtimestamp(oldest / 1000, dt.timezone.utc),
                held=aggregate.total(Outcome.HELD), pacing=ports.pacing)
            logger.info("batch_id=%s queues=%d delivered=%d dead_lettered=%d skipped=%d held=%d replayed=%d "
                        "rounds=%d seconds=%.2f (%s)", batch_id, len({span.backlog_queue for span in aggregate.spans}),
                        aggregate.total(Outcome.DELIVERED), aggregate.total(Outcome.DEAD_LETTERED),
                        skipped, aggregate.total(Outcome.HELD), report.replayed,
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

    def wait_for_purges(self) -> None:
        """At the end of a run: wait for the purge in flight, and settle what is left (``sink.micro_batch.finish``)."""
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
        checkpoint_table.write_checkpoint(spark, self.config.storage.checkpoint_table, rows)
        self.state.checkpoint_unrecorded = False
        self.hooks.reached(machine.CrashPoint.AFTER_FINAL_CHECKPOINT)
        return True


def settle_before_start(spark: SparkSession, config: SyphonConfig, recovery: Recovery, *, run_id: str,
                        partitioned_queues: frozenset[str] = frozenset(),
                        lock_seconds: Mapping[str, float] | None = None,
                        migration: MigrationPlan = NO_MIGRATION) -> int:
    """What earlier runs recorded and did not settle, settled before the query starts, where the sink runs in
    a Spark Connect server: its state there is its own, so the purge runs here, to its end (locks an earlier
    receiver left included, ``purge.lock_wait``), and the checkpoint rows get its marks (the server's first
    batch reads them). Returns how many recorded messages it settled at most; nothing to settle costs
    nothing. ``migration``: a migration run's plan (its partitioned and session-settled sources)."""
    state = SinkState(partitioned_queues=frozenset(partitioned_queues) | migration.partitioned,
                      lock_seconds=dict(lock_seconds or {}), session_entities=migration.session_entities)
    purges = PurgeRunner(config.secondary)
    now = dt.datetime.now(dt.timezone.utc)
    machine.begin_run(state, recovery, run_id=run_id, now=now)
    waiting = machine.settle_recorded(state, purges)
    if waiting:
        machine.finish(state, purges, now)
        if state.checkpoint_unrecorded:
            checkpoint_table.write_checkpoint(spark, config.storage.checkpoint_table,
                                    sorted(state.checkpoint.values(), key=lambda row: row.backlog_queue))
    return waiting
