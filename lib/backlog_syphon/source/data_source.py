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
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from backlog_syphon.config import NamespaceConfig, SyphonConfig
from backlog_syphon.model import NO_MIGRATION, MigrationPlan
from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.restore.amqp.decoding import AmqpDecodeError
from backlog_syphon.restore.backlog_rows import peeked_message
from backlog_syphon.rows import BACKLOG_ROW_SCHEMA
from backlog_syphon.peek_pages import PEEK_PAGE_SIZE
from backlog_syphon.source.options import SourceOptions
from backlog_syphon.source.offsets import BatchOffsets, windows
from backlog_syphon.source.window_planner import PLAN_KEY, WindowPlanner

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


@dataclass(frozen=True)
class BacklogWindow(InputPartition):
    """Messages ``start <= sequence number < end`` of one backlog queue (``batch_queues``: every queue
    of the batch, whose links a process opens together the first time). A partitioned queue's window is one
    range per partition lane (``lanes``, by partition; ``start`` and ``end`` then are the first's), read at
    once, each on a link of its own, by the one task that sends the queue's rows, and yielded partition by
    partition, each in order."""

    queue: str
    start: int
    end: int
    batch_queues: tuple[str, ...] = ()
    lanes: tuple[tuple[int, int], ...] = ()

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return self.lanes or ((self.start, self.end),)


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


def read_window(namespace: NamespaceConfig, window: BacklogWindow, *, copy: bool = False):
    """Yield the rows of one window as Arrow record batches (executor side): a queue's one per peeked page,
    as it is read; a partitioned queue's lane by lane (``_read_lanes_at_once``). ``copy``: the migration mode's
    rows (``restore.backlog_rows.copy_fields``).

    Contiguous by construction: the window ends only at its planned end, or where no message follows
    (``peek_pages.PagedRead``: a short page is read on from after its last message, an empty one is looked
    at twice before it counts, and a message the second look finds is read as a page of its own), so
    nothing of the window is skipped while the offsets count it as read. A queue that no longer exists
    has nothing left to read; a pooled link to a queue deleted and created since says "not found" too,
    so that is asked again on a fresh link.
    """
    from backlog_syphon.rows import BACKLOG_ROW_ARROW_SCHEMA, record_batch
    from backlog_syphon.servicebus.clients import open_peek_receivers

    open_peek_receivers(namespace, window.batch_queues)  # pooled: at once, the first time in this process
    if not window.lanes:
        yield from read_ahead(record_batch(rows, BACKLOG_ROW_ARROW_SCHEMA) for rows in _read_range(
            namespace, window.queue, window.queue, window.start, window.end, copy=copy))
        return
    yield from _read_lanes_at_once(namespace, window, copy)


_END = object()


def read_ahead(items: Iterator, depth: int = 1) -> Iterator:
    """``items``, produced in a thread of their own up to ``depth`` ahead of the consumer: a window's next page
    is peeked (a round trip to a namespace a region away) while Spark takes the one before, instead of after it.
    The peeks still go one after the other, on the one link; an error comes out where its item would have, and
    a consumer that stops early stops the thread at its next item."""
    import queue
    import threading

    handed: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand(item) -> bool:
        while not stop.is_set():
            try:
                handed.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not hand((item, None)):
                    return
        except BaseException as error:  # noqa: BLE001 - raised in the consumer, where the item would have been
            hand((_END, error))
            return
        finally:  # here, in the thread that iterated it: a pooled link it holds goes back at once
            close = getattr(items, "close", None)
            if close is not None:
                close()
        hand((_END, None))

    thread = threading.Thread(target=produce, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = handed.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()


# Rows per record batch of a partitioned queue's lanes. A lane's pages can be one message each (a peek
# answering one message per call, as reported of the service), and an Arrow batch costs the same half a
# millisecond of CPU to build whatever it holds (4.6 us a row in batches of 250): a lane is read whole
# before it is yielded anyway, so its rows go out in batches of a full page.
LANE_BATCH_ROWS = PEEK_PAGE_SIZE


def _read_lanes_at_once(namespace: NamespaceConfig, window: BacklogWindow, copy: bool):
    """A partitioned queue's lanes, each read on a link of its own at once, yielded partition by partition,
    each in order, in batches of ``LANE_BATCH_ROWS`` rows. A peek answers from one partition, perhaps one
    message a call (as reported of the service): one lane after the other, a window of a queue's 16 would
    cost 16 lanes' round trips end to end. The rows wait in memory until their lane's turn: a window is
    bounded by the batch's messages."""
    from concurrent.futures import ThreadPoolExecutor

    from backlog_syphon.partitions import lane_key, partition_of
    from backlog_syphon.rows import BACKLOG_ROW_ARROW_SCHEMA, record_batch
    from backlog_syphon.servicebus.clients import open_peek_receivers

    links = [lane_key(window.queue, partition_of(start)) for start, _ in window.lanes]
    open_peek_receivers(namespace, links)
    with ThreadPoolExecutor(max_workers=len(links), thread_name_prefix="lane-read") as pool:
        lanes = [pool.submit(_read_whole_range, namespace, window.queue, link, start, end, copy=copy, lane=True)
                 for link, (start, end) in zip(links, window.lanes)]
        for lane in lanes:
            rows = lane.result()
            for first in range(0, len(rows), LANE_BATCH_ROWS):
                yield record_batch(rows[first:first + LANE_BATCH_ROWS], BACKLOG_ROW_ARROW_SCHEMA)


def _read_whole_range(namespace: NamespaceConfig, queue: str, link: str, start: int, end: int, *,
                      copy: bool = False, lane: bool = False) -> list[dict]:
    return [row for rows in _read_range(namespace, queue, link, start, end, copy=copy, lane=lane) for row in rows]


def _read_range(namespace: NamespaceConfig, queue: str, link: str, start: int, end: int, *, copy: bool = False,
                lane: bool = False):
    """The rows of ``[start, end)`` of ``queue``, a list per peeked page, peeked through the pooled link ``link``
    (the queue's, or one lane's: ``lane``, a partition's range)."""
    from backlog_syphon.servicebus.clients import pooled_receiver

    reader = _WindowReader(queue, start, end, copy=copy, lane=lane)
    for fresh_link in (False, True):
        try:
            with pooled_receiver(namespace, link) as receiver:  # a failed link is dropped from the pool
                yield from reader.pages(receiver)
            return
        except BacklogQueueMissingError:
            if fresh_link:
                logger.warning("backlog=%s no longer exists: the rest of its window [%d, %d) went with it",
                               queue, reader.read.position, end)
                return


class _WindowReader:
    """Where the reading of one window (one lane's, for a partitioned queue) stands, across the links it is
    read through. Within a lane, a page from another partition is a miss, looked at again
    (``peek_pages.LANE_LOOKS``): a peek may answer from another partition while this one holds messages; only
    answers that keep missing end the lane (the next non-empty partition answers: nothing more here)."""

    def __init__(self, queue: str, start: int, end: int, *, copy: bool = False, lane: bool = False):
        from backlog_syphon.peek_pages import PagedRead

        self.queue, self.end, self.copy = queue, end, copy
        self.read = PagedRead(start, end - 1, lane=lane)

    def pages(self, receiver):
        """Each page's rows (``restore.backlog_rows.peeked_message``: one decode pass gives a message's place and
        its row), as a list, in order."""
        from backlog_syphon.servicebus.peek import peek_raw
        from backlog_syphon.worker_process import freeze_imports

        freeze_imports()  # once per process: its collections skip what it imported
        queue, read = self.queue, self.read
        while (ask := read.next_ask()) is not None:
            messages = []
            for raw in peek_raw(receiver, *ask):  # in order: once one lies past the range, the rest do too
                messages.append(placed(queue, raw, read.position, copy=self.copy))
                if messages[-1].sequence_number > read.last:
                    break
            taken = read.on_page([message.sequence_number for message in messages])
            if read.confirming:
                logger.info("backlog=%s a peek at %d before the window's end %d found nothing of its range: "
                            "looking again", queue, ask[0], self.end)
            if taken:
                yield [message.row for message in messages[:taken]]


def placed(queue: str, raw: bytes, position: int, *, copy: bool = False):
    """A peeked message decoded once (``backlog_rows.peeked_message``), which must say where the broker put it:
    its sequence number is read even when the rest is unreadable, and a message without one stops the read.
    ``copy``: the migration mode's row."""
    try:
        message = peeked_message(queue, raw, copy=copy)
    except AmqpDecodeError as error:
        why = str(error)
    else:
        if message.sequence_number is not None:
            return message
        why = "it has no x-opt-sequence-number annotation"
    # The broker writes this annotation itself: without it nothing can tell where the window is.
    raise RuntimeError(f"backlog queue {queue}: the message after sequence number {position - 1} cannot be "
                       f"placed ({why}); the broker's own annotations are unreadable")


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
