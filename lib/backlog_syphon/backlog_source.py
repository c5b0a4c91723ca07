"""The streaming source ``servicebus-backlog``: every backlog queue of the secondary namespace.

``spark.readStream.format("servicebus-backlog").options(**backlog_source_options(config)).load()``

- One partition per backlog queue with new messages; offsets are ``{queue: next sequence number}``.
- Reads are peeks (non-destructive, addressable by sequence number), so a batch replayed after a
  crash reads exactly the same messages; nothing here removes or locks a message (the sink
  settles them only after delivery is recorded).
- Rows carry the raw stored message (for verbatim forwarding) and its decoded legacy fields, and
  travel as Arrow record batches (one per peeked page), not as Python tuples.
- Batches are bounded by ``maxMessagesPerTrigger`` (read limits on Spark 4.2+, own capping
  before); ``availableNow`` runs stop at the tail seen when the run started.
- Idle queues are probed with exponential back-off (``offset_planning.IdleBackoff``).
- ``reportLatestOffset`` gives each queue's tail as last seen, so ``lastProgress`` shows the
  backlog still behind each queue's offset (like Kafka's ``*OffsetsBehindLatest``).
- A polite stop: once the file named by the ``stopFile`` option exists, no new batch is planned
  (``latestOffset`` returns its start), so the batch in flight is the last one; an available-now run
  then ends by itself.
- ``spark.read.format("servicebus-backlog")`` (batch) is a snapshot of every message in the
  backlog queues, for the dry run: the same rows, nothing settled.

Driver-side methods run in one long-lived Python process per query run; ``read`` runs on a
pickled copy in executors, so SDK clients are created lazily and never pickled.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from backlog_syphon import offset_planning
from backlog_syphon.backlog_rows import BACKLOG_ROW_SCHEMA
from backlog_syphon.config import NamespaceConfig, Secret, SyphonConfig
from backlog_syphon.legacy_properties import backlog_queue_names

try:  # Spark 4.2+: read limits and Trigger.AvailableNow for Python sources (SPARK-55304)
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # Spark 4.0/4.1 (e.g. Databricks runtimes): own capping, no AvailableNow target
    ReadAllAvailable = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

logger = logging.getLogger(__name__)

SOURCE_NAME = "servicebus-backlog"
# Option names containing "secret" are redacted by Spark's default spark.redaction.regex, so the
# connection string never shows in plans, the Spark UI or event logs.
_SECRET_OPTION = "connection_string_secret"
_DISCOVERY_INTERVAL_SECONDS = 3600.0  # one administration call per namespace an hour
_END_OF_QUEUE = (1 << 63) - 1  # a window end past any sequence number: read to the tail


def backlog_source_options(config: SyphonConfig, *, stop_file: str | None = None) -> dict[str, str]:
    """The reader options for a syphon configuration (all strings, as Spark wants them)."""
    options = {
        "primaryNamespace": config.primary.namespace,
        "queueCount": str(config.backlog.queue_count),
        "discover": str(config.backlog.discover).lower(),
        "maxMessagesPerTrigger": str(config.run.max_messages_per_trigger),
        "idleProbeMaxSeconds": str(config.run.idle_probe_max_seconds),
        "availableNow": str(config.run.trigger == "available_now").lower(),
    }
    if config.secondary.connection_string is not None:
        options[_SECRET_OPTION] = config.secondary.connection_string.reveal()
    if config.secondary.fully_qualified_namespace:
        options["fullyQualifiedNamespace"] = config.secondary.fully_qualified_namespace
    if stop_file:
        options["stopFile"] = stop_file
    return options


@dataclass(frozen=True)
class BacklogWindow(InputPartition):
    """Messages ``start <= sequence number < end`` of one backlog queue (``batch_queues``: every queue
    of the batch, whose links a process opens together the first time)."""

    queue: str
    start: int
    end: int
    batch_queues: tuple[str, ...] = ()


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


def _namespace_from_options(options) -> NamespaceConfig:
    secret = options.get(_SECRET_OPTION)
    return NamespaceConfig(connection_string=Secret(secret, "source option") if secret else None,
                           fully_qualified_namespace=options.get("fullyQualifiedNamespace") or None)


def _configured_queues(options) -> list[str]:
    return backlog_queue_names(options["primaryNamespace"], int(options.get("queueCount", "10")))


def read_window(namespace: NamespaceConfig, window: BacklogWindow):
    """Yield the rows of one window as Arrow record batches, one per peeked page (executor side)."""
    from backlog_syphon.backlog_rows import BACKLOG_ROW_ARROW_SCHEMA, backlog_row_values, record_batch
    from backlog_syphon.servicebus_io import PEEK_PAGE_SIZE, open_peek_receivers, peek_raw, pooled_receiver

    open_peek_receivers(namespace, window.batch_queues)  # pooled: at once, the first time in this process
    position = window.start
    with pooled_receiver(namespace, window.queue) as receiver:
        while position < window.end:
            page = peek_raw(receiver, position, min(PEEK_PAGE_SIZE, window.end - position))
            rows = []
            for raw in page:
                seq = broker_sequence_number(window.queue, raw, position)
                if seq >= window.end:
                    break
                rows.append(backlog_row_values(window.queue, raw, sequence_number=seq))
                position = seq + 1
            if rows:
                yield record_batch(rows, BACKLOG_ROW_ARROW_SCHEMA)
            if len(rows) < len(page) or not page:
                return


def broker_sequence_number(queue: str, raw: bytes, position: int) -> int:
    """The sequence number the broker gave a peeked message (read even when the rest is unreadable)."""
    from backlog_syphon.amqp_codec import AmqpDecodeError, sequence_number

    try:
        seq = sequence_number(raw)
    except AmqpDecodeError as error:
        seq, why = None, str(error)
    else:
        why = "it has no x-opt-sequence-number annotation"
    if seq is None:
        # The broker writes this annotation itself: without it nothing can tell where the window is.
        raise RuntimeError(f"backlog queue {queue}: the message after sequence number {position - 1} cannot be "
                           f"placed ({why}); the broker's own annotations are unreadable")
    return seq


class BacklogSnapshotReader(DataSourceReader):
    """Batch read: everything in the configured backlog queues now, one partition per queue."""

    def __init__(self, options):
        self.namespace = _namespace_from_options(options)
        self.options = options

    def partitions(self):
        queues = set(_configured_queues(self.options))
        if self.options.get("discover", "true") == "true":
            from backlog_syphon.servicebus_io import list_backlog_queues

            queues.update(list_backlog_queues(
                self.namespace, f"{self.options['primaryNamespace']}/x-servicebus-transfer/") or [])
        return [BacklogWindow(queue, 0, _END_OF_QUEUE) for queue in sorted(queues)]

    def read(self, partition: BacklogWindow):
        yield from read_window(self.namespace, partition)


class BacklogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options):
        self.namespace = _namespace_from_options(options)
        self.primary_namespace = options["primaryNamespace"]
        self.configured_queues = _configured_queues(options)
        self.discover = options.get("discover", "true") == "true"
        self.max_messages = int(options.get("maxMessagesPerTrigger", "1000"))
        self.available_now = options.get("availableNow", "false") == "true"
        self.backoff = offset_planning.IdleBackoff(max_seconds=float(options.get("idleProbeMaxSeconds", "900")))
        self.stop_file = options.get("stopFile")
        self._target: dict[str, int] | None = None  # available-now: stop here
        self._queues: list[str] | None = None
        self._discovered_at = 0.0
        self._last_end: dict | None = None  # Spark 4.0/4.1 call latestOffset() without a start
        self._tails: dict[str, int] = {}  # queue -> end of what was in it when last probed
    # --- driver: offsets ----------------------------------------------------------------------

    def initialOffset(self) -> dict:
        return offset_planning.normalise_offsets({queue: 0 for queue in self._backlog_queues()})

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_messages) if ReadMaxRows is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {queue: offset_planning.tail_end(0, self._probe_fn(queue)) for queue in self._backlog_queues()}
        logger.info("available-now target: %s", self._target)

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        if start is None:
            start = self._last_end or self.initialOffset()
        if self.stop_file and os.path.exists(self.stop_file):
            return offset_planning.normalise_offsets({queue: int(seq) for queue, seq in start.items()})
        budget = self.max_messages
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        elif ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable) or (
                ReadMaxRows is None and self.available_now):
            budget = 1 << 40
        plan = offset_planning.plan_windows(start, self._backlog_queues(), budget, self._probe_fn,
                                            backoff=self.backoff, now=time.monotonic(), target=self._target)
        for queue, tail in plan.tails.items():
            self._tails[queue] = max(tail, self._tails.get(queue, 0))
        self._last_end = plan.end
        return self._last_end

    def reportLatestOffset(self) -> dict | None:
        """Each queue's tail as last probed (Spark 4.2+ shows it as the source's ``latestOffset``)."""
        if not self._tails:
            return None
        ends = self._last_end or {}
        return offset_planning.normalise_offsets({queue: max(tail, int(ends.get(queue, 0)))
                                                  for queue, tail in self._tails.items()})

    def partitions(self, start: dict, end: dict):
        windows = [(queue, int(start.get(queue, 0)), int(stop)) for queue, stop in sorted(end.items())
                   if int(stop) > int(start.get(queue, 0))]
        queues = tuple(queue for queue, _, _ in windows)
        return [BacklogWindow(queue, first, stop, queues) for queue, first, stop in windows]

    def commit(self, end: dict) -> None:
        # Settlement happens in the sink after delivery is recorded; commit() comes too late and
        # not at all for the last batch of a run (see the reference on commit timing).
        pass

    # --- executors: rows ----------------------------------------------------------------------

    def read(self, partition: BacklogWindow):
        yield from read_window(self.namespace, partition)

    # --- helpers --------------------------------------------------------------------------------

    def _backlog_queues(self) -> list[str]:
        now = time.monotonic()
        if self._queues is None or (self.discover and now - self._discovered_at > _DISCOVERY_INTERVAL_SECONDS):
            from backlog_syphon.servicebus_io import list_backlog_queues

            queues = set(self.configured_queues)
            if self.discover:
                found = list_backlog_queues(self.namespace, f"{self.primary_namespace}/x-servicebus-transfer/")
                queues.update(found or [])
            self._queues = sorted(queues)
            self._discovered_at = now
            from backlog_syphon.servicebus_io import open_peek_receivers

            open_peek_receivers(self.namespace, self._queues)
        return self._queues

    def _probe_fn(self, queue: str):
        from backlog_syphon.servicebus_io import first_sequence_number_from, pooled_receiver

        def probe(sequence_number: int) -> int | None:
            with pooled_receiver(self.namespace, queue) as receiver:
                return first_sequence_number_from(receiver, sequence_number)

        return probe
