"""The streaming source ``servicebus-backlog``: every backlog queue of the secondary namespace.

``spark.readStream.format("servicebus-backlog").options(**backlog_source_options(config)).load()``

- One partition per backlog queue with new messages; offsets are ``{queue: {incarnation, next
  sequence number, newest enqueue time seen}}`` (``offsets.QueueOffset``): a recreated queue is
  noticed and read again from its start.
- Reads are peeks (non-destructive, addressable by sequence number), so a batch replayed after a
  crash reads exactly the same messages; nothing here removes or locks a message (the sink
  settles them only after delivery is recorded).
- Rows carry the raw stored message (for verbatim forwarding) and its decoded legacy fields, and
  travel as Arrow record batches (one per peeked page), not as Python tuples.
- Batches are bounded by ``maxMessagesPerTrigger`` (read limits on Spark 4.2+, own capping
  before); ``availableNow`` runs stop at the tail seen when the run started.
- Idle queues are probed with exponential back-off (``planning.IdleBackoff``).
- Planning costs a constant number of probes per queue and batch, all queues probed at once
  (``probing.run_searches`` over ``servicebus.peek.probe_at_once``): the backlog is a region away.
- ``reportLatestOffset`` gives each queue's tail, what is left behind the planned end and its oldest
  message's age, as last probed, so ``lastProgress`` shows the backlog (like Kafka's
  ``*OffsetsBehindLatest``), and the probes the last plan took.
- A polite stop: once the file named by the ``stopFile`` option exists, no new batch is planned
  (``latestOffset`` returns its start), so the batch in flight is the last one; an available-now run
  then ends by itself.
- ``spark.read.format("servicebus-backlog")`` (batch) is a snapshot of every message in the
  backlog queues, for the dry run: the same rows, nothing settled.
- The migration mode reads the entities its options name (``SourceOptions.sources``) the same way, with rows of
  the messages as they were (``copy``); a session-enabled entity and a topic are peeked through a
  management-only link (``servicebus.clients.browse_only``).

Driver-side methods run in one long-lived Python process per query run; ``read`` runs on a
pickled copy in executors, so SDK clients are created lazily and never pickled. The decisions are
``window_planner``'s and ``planning``'s; this module translates between Spark and them and does the
peeks. ``stop()`` closes the links the driver side opened.
"""

from __future__ import annotations

import logging
import os
import time

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader

from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import NO_MIGRATION, MigrationPlan
from backlog_syphon.rows import BACKLOG_ROW_SCHEMA
from backlog_syphon.source.options import SourceOptions
from backlog_syphon.source.offsets import BatchOffsets, windows
from backlog_syphon.source.window_planner import PLAN_KEY, WindowPlanner
from backlog_syphon.source.window_reader import BacklogWindow, read_window

try:  # Spark 4.2+: read limits and Trigger.AvailableNow for Python sources (SPARK-55304)
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # Spark 4.0/4.1 (e.g. Databricks runtimes): own capping, no AvailableNow target
    ReadAllAvailable = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

logger = logging.getLogger(__name__)

SOURCE_NAME = "servicebus-backlog"
_DISCOVERY_INTERVAL_SECONDS = 3600.0  # one administration call per namespace an hour
_END_OF_QUEUE = (1 << 63) - 1  # a window end past any sequence number: read to the tail


READ_LIMITS_SUPPORTED = ReadMaxRows is not None  # Spark 4.2+


def backlog_source_options(config: SyphonConfig, *, stop_file: str | None = None,
                           emulate_available_now: bool = False, look_back: tuple[str, ...] = (),
                           migration: MigrationPlan = NO_MIGRATION, read_slots: int = 0) -> dict[str, str]:
    """The reader options for a syphon configuration (all strings, as Spark wants them); ``migration``: a
    migration run's plan (its sources are read instead of backlog queues); ``read_slots``: the cluster's task
    slots, where known (``SourceOptions.read_slots``)."""
    return SourceOptions.from_config(config, stop_file=stop_file, emulate_available_now=emulate_available_now,
                                     look_back=look_back, migration=migration, read_slots=read_slots).to_spark()


# A batch read of no queue at all: nothing is listed or peeked, and planning it starts Spark's Python
# planner processes (``start_planners``).
_NO_QUEUE_OPTIONS = {"primaryNamespace": "no-queue", "queueCount": "0", "discover": "false"}
# The Spark applications whose planners were started here: they stay for the application's life, and
# planning again in a warm session would only cost (about 0.15 CPU-seconds a run).
_PLANNERS_STARTED: set[str] = set()


def start_planners(spark) -> None:
    """Have Spark start the Python processes it creates and plans a Python source in, by planning a batch
    read of no queue (no task runs, nothing is peeked). The source must be registered in ``spark``.

    Spark starts each such process the first time a session needs it: one to look up installed sources
    (at the first registration), one to create a source, one to plan its reads. Each is a Python start
    with pyarrow's and this library's imports, about a second on a small machine, and a query's start
    would wait for them one after the other. Started here, alongside the run's other start-up work, they
    stay, and the query's own steps reuse them (``spark.python.worker.reuse``, on by default): once per
    Spark application."""
    application = spark.sparkContext.applicationId
    if application in _PLANNERS_STARTED:
        return
    try:
        spark.read.format(SOURCE_NAME).options(**_NO_QUEUE_OPTIONS).load().rdd.getNumPartitions()
    except Exception as exc:  # noqa: BLE001 - only time is at stake: the query starts them itself
        logger.info("Spark's Python planners were not started early (%s); the query starts them", type(exc).__name__)
        return
    _PLANNERS_STARTED.add(application)


class BacklogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self):
        return BACKLOG_ROW_SCHEMA

    def streamReader(self, schema):
        return BacklogStreamReader(self.options)

    def reader(self, schema):
        return BacklogSnapshotReader(self.options)


class BacklogSnapshotReader(DataSourceReader):
    """Batch read: everything in the configured backlog queues now, one partition per queue."""

    def __init__(self, options):
        self.options = SourceOptions.from_spark(options)

    def partitions(self):
        queues = backlog_queues(self.options)
        return [BacklogWindow(queue, 0, _END_OF_QUEUE, tuple(queues)) for queue in queues]

    def read(self, partition: BacklogWindow):
        yield from read_options_window(self.options, partition)


def read_options_window(options: SourceOptions, window: BacklogWindow):
    """``read_window`` in a process that knows the source only by its options: which entities peek through a
    management-only link is registered first (the executor's pool serves them so), and the read is paced at the
    reads' share of the secondary's credits (``_pace_reads``)."""
    from backlog_syphon.servicebus.clients import browse_only

    browse_only(options.secondary, options.browse_only)
    _pace_reads(options, window)
    yield from read_window(options.secondary, window, copy=options.copy)


def _pace_reads(options: SourceOptions, window: BacklogWindow) -> None:
    """A window's read paces the secondary at the reads' share of its budget, split among the batch's windows
    that are read at once (at most the task slots)."""
    from backlog_syphon.credits import SHARES
    from backlog_syphon.servicebus.throttling import pace

    pace(options.secondary, options.credit_terms(SHARES.reads, options.windows_at_once(len(window.batch_queues))))


class BacklogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options):
        self.options = SourceOptions.from_spark(options)
        self.planner = WindowPlanner(self._probe_at_once, max_messages=self.options.max_messages_per_trigger,
                                     available_now=self.options.available_now,
                                     idle_probe_max_seconds=self.options.idle_probe_max_seconds,
                                     look_back=self.options.look_back)
        self._queues: list[str] | None = None
        self._discovered_at = 0.0
        from backlog_syphon.credits import SHARES
        from backlog_syphon.servicebus.throttling import pace

        pace(self.options.secondary, self.options.credit_terms(SHARES.planner))  # the planner's share: its probes
        self._credits_before = self._credits_spent()  # the process may have planned earlier queries

    # --- driver: offsets ----------------------------------------------------------------------
    # Spark's offsets are JSON values: typed here once (``offsets.BatchOffsets``), written back once.

    def initialOffset(self) -> dict:
        return self.planner.initial_offset(self._backlog_queues()).to_spark()

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.options.max_messages_per_trigger) if ReadMaxRows is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()  # the target is fixed by the next plan, from its start offsets

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        stopping = bool(self.options.stop_file) and os.path.exists(self.options.stop_file)
        if self.options.emulate_available_now:
            self.planner.prepare_available_now()
            budget = self.options.max_messages_per_trigger
        else:
            budget = self.planner.budget(
                max_rows=limit.max_rows if ReadMaxRows is not None and isinstance(limit, ReadMaxRows) else None,
                all_available=ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable),
                limits_supported=ReadMaxRows is not None)
        end = self.planner.latest_offset(None if start is None else BatchOffsets.from_spark(start),
                                         self._backlog_queues(), budget, now=time.monotonic(), stopping=stopping)
        count = self.planner.last_count
        if count.probes:
            logger.debug("planned %s: %d probes in %d rounds", end, count.probes, count.rounds)
        if self.options.emulate_available_now and not stopping and self.planner.reached_target(end):
            # Everything there at the start is planned: stop once the batches in flight are done.
            logger.info("available-now target reached: the run stops after the batch in flight")
            with open(self.options.stop_file, "a"):
                pass
        return end.to_spark()

    def reportLatestOffset(self) -> dict | None:
        """Each queue's backlog as last probed (Spark 4.2+ shows it as the source's ``latestOffset`` in
        ``lastProgress`` and to listeners): its tail, what is left behind the planned end, and the age of
        its oldest message; nothing is probed for it (``WindowPlanner.reported_latest``); and the credits the
        planning spent on the secondary so far (what a drain cost: ``run.credit_usage``)."""
        reported = self.planner.reported_latest(int(time.time() * 1000))
        if reported is not None and PLAN_KEY in reported:
            reported[PLAN_KEY]["credits"] = self._credits_spent() - self._credits_before
        return reported

    def _credits_spent(self) -> int:
        from backlog_syphon.servicebus.throttling import spent

        return sum(spent(self.options.secondary).values())

    def partitions(self, start: dict, end: dict):
        start, end = BatchOffsets.from_spark(start), BatchOffsets.from_spark(end)
        self.planner.resume(end)
        by_queue: dict[str, list[tuple[int, int]]] = {}
        for queue, first, stop in windows(start, end):  # a partitioned queue's lanes by partition
            by_queue.setdefault(queue, []).append((first, stop))
        queues = tuple(by_queue)
        planned = [BacklogWindow(queue, ranges[0][0], ranges[0][1], queues, tuple(ranges) if len(ranges) > 1 else ())
                   for queue, ranges in by_queue.items()]
        # The largest windows first: a batch waits for its longest send task, which should not start last.
        return sorted(planned, key=lambda window: -sum(stop - first for first, stop in window.ranges))

    def commit(self, end: dict) -> None:
        # Settlement happens in the sink after delivery is recorded: Spark calls commit() only once
        # the next batch is planned, and never for the last batch of an available-now run.
        pass

    def stop(self) -> None:
        """The query stopped: close the peek links the driver side opened (executors keep their pools)."""
        from backlog_syphon.servicebus.clients import close_peek_receivers

        if self._queues:  # and a partitioned queue's lanes' links (``servicebus.clients``: one per lane)
            close_peek_receivers(self.options.secondary,
                                 list(dict.fromkeys([*self._queues, *self.planner.keys(self._queues)])))

    # --- executors: rows ----------------------------------------------------------------------

    def read(self, partition: BacklogWindow):
        yield from read_options_window(self.options, partition)

    # --- helpers --------------------------------------------------------------------------------

    def _backlog_queues(self) -> list[str]:
        now = time.monotonic()
        if self._queues is None or (self.options.discover and now - self._discovered_at > _DISCOVERY_INTERVAL_SECONDS):
            from backlog_syphon.servicebus.clients import browse_only, open_peek_receivers

            from backlog_syphon.servicebus.entities import partitioned_queues

            self._queues = backlog_queues(self.options)
            self._discovered_at = now
            browse_only(self.options.secondary, self.options.browse_only)
            # Best effort: where the administration API does not answer, a probe's partition bits tell. A migration
            # run knows its sources' partitioning from the listing it selected them in.
            self.planner.partitioned.update(set(self.options.partitioned) if self.options.sources else
                                            partitioned_queues(self.options.secondary, self._queues))
            # A partitioned queue's lanes are probed at once, each on a link of its own: opened together here.
            open_peek_receivers(self.options.secondary,
                                list(dict.fromkeys([*self._queues, *self.planner.keys(self._queues)])))
        return self._queues

    def _probe_at_once(self, asks: dict[str, int]) -> dict:
        """One probe in each of several queues, in parallel on their pooled peek links."""
        from backlog_syphon.servicebus.peek import probe_at_once

        return probe_at_once(self.options.secondary, asks)


def backlog_queues(options: SourceOptions) -> list[str]:
    """The configured backlog queues and, with ``discover``, every other one the namespace lists (in a
    re-drive, their dead-letter sub-queues: the peeks address ``<queue>/$DeadLetterQueue`` as an entity)."""
    queues = set(options.configured_queues)
    if options.discover and not options.sources:
        from backlog_syphon.servicebus.peek import list_backlog_queues

        queues.update(options.entities(list_backlog_queues(options.secondary, options.primary_namespace) or []))
    return sorted(queues)
