"""Watching a run: one progress line per micro-batch, and the history behind the notebook's chart.

``SyphonProgressListener`` is a ``StreamingQueryListener``: for each batch of the syphon's query
it joins Spark's progress (the source's end and latest offsets, so the backlog still behind each
queue, like Kafka's ``*OffsetsBehindLatest``) with what the sink recorded for the batch (counted by
the sink itself in a classic session, read from the audit table under Spark Connect) and logs one line. ``follow_progress`` replays those lines from the caller's thread until the
query ends, which is how finite command-line runs and notebooks show them.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from pyspark.sql.streaming import StreamingQueryListener

from backlog_syphon.model import BatchStats, EarlierBatches
from backlog_syphon.source.offsets import BatchOffsets
from backlog_syphon.source.window_planner import PLAN_KEY

logger = logging.getLogger(__name__)

# The progress points a listener holds: a continuous run's last hours (a point per batch, a batch every
# few seconds for months would otherwise grow without end). Older ones are folded into ``earlier``, all
# the runs-table row needs of them; a tenth goes at a time, so the trimming is rare.
RETAINED_POINTS = 5000


@dataclass(frozen=True)
class ProgressPoint:
    batch_id: int
    at: dt.datetime
    stats: BatchStats | None  # None: the batch had no messages
    # backlog queue -> sequence numbers behind its tail; None: not measured (no tail reported for every queue)
    remaining: dict[str, int] | None

    @property
    def remaining_total(self) -> int | None:
        return None if self.remaining is None else sum(self.remaining.values())


def behind_latest(end_offset: str | None, latest_offset: str | None) -> dict[str, int] | None:
    """Per queue, how many sequence numbers lie between the batch's end and the queue's tail.

    An upper bound on the messages left (sequence numbers of removed messages count too). None where the
    source has not reported a tail for every queue of the batch: Spark before 4.2 (no reported latest
    offset), and the first batch of a resumed run, which Spark replays before the source has probed
    anything. A zero nobody measured would tell an operator the backlog is drained.
    """
    end, latest = _offsets(end_offset), _offsets(latest_offset)
    if not end or any(queue not in latest for queue in end):
        return None
    # The reported latest names each queue's tail as ``next``, which reads as an offset's.
    ends, tails = BatchOffsets.from_spark(end), BatchOffsets.from_spark({queue: latest[queue] for queue in end})
    return {queue: max(0, tails[queue].next - offset.next) for queue, offset in ends.items()}


def _offsets(text: str | None) -> dict:
    """A source offset as Spark reports it: JSON of {queue: sequence number}, or null/absent."""
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def progress_line(point: ProgressPoint) -> str:
    """The batch's line; ``remaining`` only where it was measured (``behind_latest``)."""
    left = ""
    if point.remaining is not None:
        behind = ", ".join(f"{queue.rsplit('/', 1)[-1]}:{count}" for queue, count in point.remaining.items() if count)
        left = f"; remaining {point.remaining_total}" + (f" ({behind})" if behind else "")
    stats = point.stats
    if stats is None:
        return f"batch {point.batch_id}: idle{left}"
    age = "-" if stats.oldest_enqueued is None else f"{(point.at - stats.oldest_enqueued).total_seconds():.0f}s"
    return (f"batch {point.batch_id}: delivered {stats.delivered}, dead-lettered {stats.dead_lettered}, "
            f"skipped {stats.skipped}, " + (f"held {stats.held}, " if stats.held else "")
            + f"replayed {stats.replayed}; oldest message age {age}; {send_rate_text(stats)}{left}")


def progress_fields(point: ProgressPoint) -> dict:
    """The progress line's facts, as fields of its JSON log line (``run.logs``)."""
    fields = {"event": "batch", "batch_id": point.batch_id,
              "remaining": None if point.remaining is None else dict(point.remaining),
              "remaining_total": point.remaining_total}
    stats = point.stats
    if stats is None:
        return {**fields, "idle": True}
    pacing = stats.pacing
    measured = pacing.send_rate if pacing is not None else None
    if measured is None and stats.send_seconds > 0:
        measured = stats.delivered / stats.send_seconds
    fields.update(
        delivered=stats.delivered, dead_lettered=stats.dead_lettered, skipped=stats.skipped, held=stats.held,
        replayed=stats.replayed, send_seconds=round(stats.send_seconds, 3),
        oldest_message_age_seconds=None if stats.oldest_enqueued is None else
        round((point.at - stats.oldest_enqueued).total_seconds(), 1),
        send_rate=None if measured is None else round(measured, 1))
    if pacing is not None:
        fields.update(send_rate_cap=pacing.cap, throttled=pacing.throttled,
                      slowed_seconds=round(pacing.slowed_seconds, 1), rate_limit=pacing.rate_limit,
                      batch_shape_refused=pacing.shape_refusals)
    return fields


def send_rate_text(stats: BatchStats) -> str:
    """``send rate 198 msg/s (cap 200)``, and when the primary throttled: how often, for how long, and
    the rate allowed at the end; when a destination refused a batch for its shape, how often, and which
    destinations get single messages now. The send tasks' own measure (first to last send) where they
    reported one (classic Spark); else delivered over the batch's time (Spark Connect)."""
    pacing = stats.pacing
    measured = pacing.send_rate if pacing is not None else None
    if measured is None:
        measured = stats.delivered / stats.send_seconds if stats.send_seconds > 0 else 0.0
    text = f"send rate {measured:.0f} msg/s"
    if pacing is None:
        return text
    if pacing.cap is not None:
        text += f" (cap {pacing.cap:.0f})"
    if pacing.throttled:
        limit = "unlimited" if pacing.rate_limit is None else f"{pacing.rate_limit:.0f} msg/s"
        text += (f", throttled {pacing.throttled} time{'s' if pacing.throttled != 1 else ''}, "
                 f"slowed for {pacing.slowed_seconds:.1f} s, now {limit}")
    if pacing.shape_refusals:
        text += (f", {pacing.shape_refusals} batch{'es' if pacing.shape_refusals != 1 else ''} refused for their "
                 f"shape, single messages now to {', '.join(pacing.single_message_destinations)}")
    return text


class SyphonProgressListener(StreamingQueryListener):
    """Logs one line per batch of one query and keeps the recent history (``points``: the last
    ``retained`` of them; what the older ones counted is in ``earlier``).

    Spark calls it from its listener bus; it only queues the event there. Its own thread then asks
    ``batch_stats`` what the sink recorded, which under Spark Connect is a query of the audit table:
    a query issued from inside the client's listener callback stalls the client's event stream.
    """

    def __init__(self, batch_stats: Callable[[int], BatchStats | None], *, query_name: str, log_lines: bool = True,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
                 retained: int = RETAINED_POINTS):
        self.batch_stats = batch_stats  # what the sink recorded for a batch id (None: nothing)
        self.query_name = query_name
        self.log_lines = log_lines  # off when follow_progress shows the lines instead
        self.clock = clock
        self.points: list[ProgressPoint] = []
        self.retained = retained
        self.earlier = EarlierBatches()  # the points let go of, folded
        self._dropped = 0  # how many points were let go of: ``points_since`` counts from the run's first
        self.terminated = threading.Event()
        self._lock = threading.Lock()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        # What the run's batches cost the namespaces, as the driver learns it (``run.syphon``'s credit usage):
        # the rows the windows read (a peek each), the messages sent, and the planner's own count of its probes.
        self.rows_read = 0
        self.sent = 0
        self.planner_credits = 0

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        if progress.name != self.query_name or not progress.sources:
            return
        source = progress.sources[0]
        self._events.put((progress.batchId, self.clock(), source.endOffset, source.latestOffset))
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._report, name="syphon-progress", daemon=True)
                self._worker.start()

    def _report(self) -> None:
        while True:
            batch_id, at, end_offset, latest_offset = self._events.get()
            try:
                point = ProgressPoint(batch_id, at, self.batch_stats(batch_id), behind_latest(end_offset, latest_offset))
            except Exception:  # noqa: BLE001 - watching a run must never disturb it
                logger.warning("progress of batch %s not reported", batch_id, exc_info=True)
                continue
            with self._lock:
                self.points.append(point)
                self._count_credits(point, latest_offset)
                self._let_go_of_old_points()
            if self.log_lines:
                logger.info("%s", progress_line(point), extra=progress_fields(point))

    def _count_credits(self, point: ProgressPoint, latest_offset: str | None) -> None:
        stats = point.stats
        if stats is not None:
            self.rows_read += stats.delivered + stats.dead_lettered + stats.skipped + stats.held + stats.replayed
            self.sent += stats.pacing.sent if stats.pacing is not None else stats.delivered
        planned = _offsets(latest_offset).get(PLAN_KEY)
        if isinstance(planned, dict) and isinstance(planned.get("credits"), int):  # Spark 4.2+ reports it
            self.planner_credits = max(self.planner_credits, planned["credits"])

    def _let_go_of_old_points(self) -> None:
        if len(self.points) <= self.retained:
            return
        cut = len(self.points) - self.retained + max(1, self.retained // 10)
        self.earlier = self.earlier.plus([point.stats for point in self.points[:cut] if point.stats is not None])
        del self.points[:cut]
        self._dropped += cut

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        self.terminated.set()

    def wait_for(self, batch_id: int | None, timeout: float) -> None:
        """Wait (at most ``timeout``) until the point of ``batch_id`` has arrived."""
        deadline = time.monotonic() + timeout
        while batch_id is not None and time.monotonic() < deadline:
            with self._lock:
                if any(point.batch_id >= batch_id for point in self.points):
                    return
            time.sleep(0.05)

    def points_since(self, index: int) -> list[ProgressPoint]:
        """The points from the run's ``index``-th on (those still held)."""
        with self._lock:
            return self.points[max(0, index - self._dropped):]


def follow_progress(query, listener: SyphonProgressListener, emit: Callable[[str], None] | None = print, *,
                    poll_seconds: float = 1.0, timeout_seconds: float | None = None,
                    stop_requested: Callable[[], bool] = lambda: False,
                    request_stop: Callable[[], None] = lambda: None) -> None:
    """Wait until the query ends or a requested stop reaches a batch boundary, emitting each batch's
    line (unless ``emit`` is None) from this thread. When ``timeout_seconds`` pass, a stop is requested:
    the batch in flight finishes and is recorded, as on SIGTERM."""
    shown = 0
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    idle_polls = 0  # consecutive polls without a running trigger since a stop was requested
    while True:
        if deadline is not None and time.monotonic() >= deadline and not stop_requested():
            request_stop()
        if stop_requested():
            idle_polls = idle_polls + 1 if not trigger_active(query) else 0
        finished = not query.isActive or idle_polls >= 2
        if finished:
            listener.wait_for(_last_batch_id(query), timeout=5.0)  # its progress point may still be on its way
        for point in listener.points_since(shown):
            if emit is not None:
                emit(progress_line(point))
            shown += 1
        if finished:
            return
        query.awaitTermination(poll_seconds if not stop_requested() else min(poll_seconds, 0.5))


def _last_batch_id(query) -> int | None:
    try:
        progress = query.lastProgress
    except Exception:  # noqa: BLE001 - a query that failed may have none
        return None
    return None if not progress else progress["batchId"]


def trigger_active(query) -> bool:
    """Whether a trigger (planning or running a batch) is under way. After a stop was requested no new
    batch is planned, so a query without an active trigger can be stopped between batches."""
    try:
        return bool(query.status.get("isTriggerActive", False))
    except Exception:  # noqa: BLE001 - a query that just ended has no status
        return False
