"""Planning which backlog messages a micro-batch reads: pure logic, no I/O, time passed in.

Offsets are ``{backlog queue name: {"incarnation": n, "next": next sequence number to read,
"seen_ms": newest enqueue time probed}}`` (``QueueOffset``; a bare number, as older versions wrote,
reads as the first incarnation). A window ``[start, end)`` of one queue is immutable once planned
(new messages always get higher sequence numbers), so a replayed batch peeks exactly the same
messages again. Window ends are found with single-message probes ("first message at or after x")
instead of downloading the messages twice.

Sequence numbers mean something only within one incarnation of a queue: a queue deleted and
created again numbers from 1 again. Before each window, a probe from the queue's start finds
its first message; one below the offset that entered the backlog after every message probed so
far cannot belong to the same incarnation, so the queue was recreated: its offset starts again
from the beginning, in a new incarnation. A queue that does not exist is skipped with one warning.

A run looks back once at each queue where earlier runs held messages for a destination in
``restore.skip_destinations`` (the run finds them in the audit and passes them as ``look_back``): the
first time it plans such a queue, if its first message lies below the offset in the same incarnation,
that window starts there (``QueueOffset.reread_from``), so a run without the skip delivers what an
earlier run held, and the sink drops, by identity, what is already recorded. A continuous run looks
back only when it starts: what it holds later waits for the next run.

The probes are the only I/O, injected (``Probe``); ``WindowPlanner`` holds what the stream reader
remembers between triggers, so the reader itself only translates between Spark and this module.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping, Sequence

from backlog_syphon.errors import BacklogQueueMissingError

logger = logging.getLogger(__name__)

Identity = tuple  # (sequence number, enqueue time in ms or None) of a message
Probe = Callable[[int], "Identity | None"]  # the first message at or after x, or None when there is none


@dataclass(frozen=True)
class QueueOffset:
    """Where a queue's reading stands: its incarnation, the next sequence number, and the newest
    enqueue time seen in this incarnation (what a recreated queue's messages come after)."""

    incarnation: int = 1
    next: int = 0
    seen_ms: int | None = None
    # In a batch's end offset only: that batch's window of this queue starts here, below the start
    # offset (a run looking back at what earlier runs left in the queue). Part of the offset, so a
    # replayed batch reads the same window.
    reread_from: int | None = None

    @classmethod
    def parse(cls, value) -> QueueOffset:
        if isinstance(value, Mapping):
            return cls(int(value.get("incarnation", 1)), int(value.get("next", 0)),
                       None if value.get("seen_ms") is None else int(value["seen_ms"]),
                       None if value.get("reread_from") is None else int(value["reread_from"]))
        return cls(next=int(value))  # an offset written by an older version

    def to_json(self) -> dict:
        out = {"incarnation": self.incarnation, "next": self.next, "seen_ms": self.seen_ms}
        if self.reread_from is not None:  # only then: offsets without it keep the form older versions wrote
            out["reread_from"] = self.reread_from
        return out

    def left_behind(self, head: Identity | None) -> bool:
        """Whether ``head``, the queue's first message now, lies below this offset in the same incarnation:
        something earlier batches read is still there (held for a skipped destination, or not yet settled)."""
        return head is not None and head[0] < self.next and not self.recreated(head)

    def recreated(self, head: Identity | None) -> bool:
        """Whether ``head``, the queue's first message now, shows the queue was created again."""
        if head is None or self.seen_ms is None or head[1] is None:
            return False
        return head[0] < self.next and head[1] > self.seen_ms


def position(value) -> int:
    """The next sequence number an offset value names (either format)."""
    return QueueOffset.parse(value).next


def window_end(start: int, budget: int, probe: Probe) -> int:
    """End (exclusive) of the next window from ``start`` holding at most ``budget`` sequence numbers.

    Returns ``start`` when nothing is there. Costs 2 probes when the queue holds more than the
    budget, and about log2(budget) when the window reaches the queue's tail.
    """
    found = probe(start)
    if found is None:
        return start
    first = found[0]
    limit = first + max(1, budget)
    if probe(limit) is not None:
        return limit
    lo, hi = first, limit  # a message exists at lo; none at or after hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = probe(mid)
        if found is None:
            hi = mid
        else:
            lo = found[0]
    return lo + 1


def tail_end(start: int, probe: Probe, chunk: int = 1 << 20) -> int:
    """End (exclusive) of everything in the queue now: the target of an available-now run."""
    end = start
    while True:
        next_end = window_end(end, chunk, probe)
        if next_end == end:
            return end
        end = next_end


def share_budget(total: int, queues: list[str]) -> dict[str, int]:
    """Split a batch's message budget evenly over the queues that have data.

    The shares add up to ``total`` (the first queues get the remainder), except that every queue
    gets at least 1 so none starves when there are more queues than budget.
    """
    if not queues:
        return {}
    each, extra = divmod(total, len(queues))
    return {queue: max(1, each + (1 if index < extra else 0)) for index, queue in enumerate(queues)}


@dataclass
class IdleBackoff:
    """When to probe an empty queue again: doubling pauses up to ``max_seconds``, reset by data.

    With the defaults an idle queue costs 4 probes an hour once the pause reached its maximum (the
    legacy syphon's 15-minute long poll cost the same), instead of one per trigger.
    """

    min_seconds: float = 1.0
    max_seconds: float = 900.0
    _next_probe: dict[str, float] = field(default_factory=dict)
    _pause: dict[str, float] = field(default_factory=dict)

    def due(self, queue: str, now: float) -> bool:
        return now >= self._next_probe.get(queue, 0.0)

    def record(self, queue: str, had_data: bool, now: float) -> None:
        if had_data:
            self._pause.pop(queue, None)
            self._next_probe.pop(queue, None)
            return
        pause = min(self.max_seconds, max(self.min_seconds, self._pause.get(queue, 0.0) * 2))
        self._pause[queue] = pause
        self._next_probe[queue] = now + pause


def normalise_offsets(offsets: Mapping[str, QueueOffset]) -> dict[str, dict]:
    """Offsets as Spark stores them, with a stable key order: Spark compares serialised offsets as strings."""
    return {queue: QueueOffset.parse(offsets[queue]).to_json() if not isinstance(offsets[queue], QueueOffset)
            else offsets[queue].to_json() for queue in sorted(offsets)}


@dataclass(frozen=True)
class WindowPlan:
    """The next micro-batch: each queue's offset at the window's end, and each probed queue's tail as
    last seen. ``restarted``: queues found recreated, whose windows start from the beginning."""

    end: dict[str, dict]
    tails: dict[str, int]
    restarted: tuple[str, ...] = ()
    looked: tuple[str, ...] = ()  # queues this plan looked at (probed): a run looks back at each once


class _SeenProbe:
    """A probe that remembers the newest enqueue time it saw (for the offset's ``seen_ms``)."""

    def __init__(self, probe: Probe, seen_ms: int | None):
        self.probe, self.seen_ms = probe, seen_ms

    def __call__(self, sequence_number: int) -> Identity | None:
        found = self.probe(sequence_number)
        if found is not None and found[1] is not None:
            self.seen_ms = found[1] if self.seen_ms is None else max(self.seen_ms, found[1])
        return found


@dataclass
class _Window:
    """One queue's window while a batch is planned."""

    offset: QueueOffset
    probe: _SeenProbe
    end: int
    granted: int  # sequence numbers the window was allowed
    closed: bool = False  # the queue went missing meanwhile: the window stays as it is

    @property
    def full(self) -> bool:
        """The window used all it was granted: the queue may hold more."""
        return not self.closed and self.end - self.offset.next >= self.granted


_REDISTRIBUTION_ROUNDS = 3


def plan_windows(start: Mapping[str, object], queues: Sequence[str], budget: int, probe_for: Callable[[str], Probe], *,
                 backoff: IdleBackoff, now: float, target: Mapping[str, int] | None = None,
                 missing: set[str] | None = None, look_back: Collection[str] = ()) -> WindowPlan:
    """Plan the next batch's windows from ``start``: which queues to look at, how far each window goes.

    - Continuous runs look only at queues whose idle back-off is due; an available-now run (with a
      ``target``) at every queue of its target (one at its target costs one probe: it may have been
      recreated), and never past the target.
    - Each queue looked at is first checked for a recreation (its first message, one probe).
    - The budget is shared evenly over the queues looked at; what a queue leaves unused (it held
      less than its share) goes to the queues that filled theirs, in a few rounds, so a backlog
      left in one queue of ten still moves a whole budget per batch.
    - A window that stopped short of what it was granted reached the queue's tail; a full one costs
      one probe more when the tail is right there, about log2(backlog) when it is not (for progress reports).
    - A queue that does not exist is left out (``missing`` collects it; one warning when it goes missing).
    - A queue in ``look_back`` whose first message lies below its offset (same incarnation) is read from
      that message (``QueueOffset.reread_from``): what earlier runs left there (one probe more).
    ``probe_for(queue)`` gives that queue's probe (``Probe``): the only I/O, injected.
    """
    missing = set() if missing is None else missing
    offsets = {queue: QueueOffset() for queue in queues}
    offsets.update({queue: QueueOffset.parse(value) for queue, value in start.items()})
    # Where a queue stays if no window moves it: exactly its start, a look back included, so that Spark
    # sees no change (and plans no empty batch) and ``windows`` no window for it.
    unmoved = dict(offsets)
    if target is not None:
        candidates = [queue for queue in offsets if queue in target]
    else:
        candidates = [queue for queue in offsets if backoff.due(queue, now)]
    reread: dict[str, int] = {}
    for queue in candidates:
        offset = offsets[queue]
        if queue not in look_back or offset.next <= 1:
            continue
        try:
            head = probe_for(queue)(1)
        except BacklogQueueMissingError:
            continue  # the planning below finds it missing and says so
        if offset.left_behind(head):
            logger.info("backlog=%s holds messages below its offset %d (from %d): earlier runs left them; this "
                        "batch reads them again (what is recorded is not sent again)", queue, offset.next, head[0])
            reread[queue] = head[0]
            offsets[queue] = dataclasses.replace(offset, next=head[0], reread_from=None)
    # The budget goes to the queues with something left to read; one already at its available-now
    # target is only checked for a recreation (and then gets a share of its own).
    active = [queue for queue in candidates if target is None or offsets[queue].next < target.get(queue, 0)]
    shares = share_budget(budget, active)
    restarted: list[str] = []

    def extend(queue: str, window: _Window, grant: int) -> None:
        end = window_end(window.end, grant, window.probe)
        if target is not None and queue not in restarted:
            end = min(end, max(window.offset.next, target.get(queue, end)))
        window.end, window.granted = max(window.end, end), window.granted + grant

    planned: dict[str, _Window] = {}
    for queue in candidates:
        offset = offsets[queue]
        probe = _SeenProbe(probe_for(queue), offset.seen_ms)
        try:
            if offset.next > 1 and offset.recreated(probe.probe(1)):
                logger.warning("backlog=%s was recreated (it numbers from 1 again, with messages enqueued after "
                               "every one read before): reading it from its start, incarnation %d",
                               queue, offset.incarnation + 1)
                offset = QueueOffset(offset.incarnation + 1, 0, None)
                probe.seen_ms = None
                restarted.append(queue)
            if queue not in shares and queue not in restarted:
                continue  # at its target, and the same queue as before: nothing to plan
            window = planned[queue] = _Window(offset, probe, offset.next, 0)
            extend(queue, window, shares.get(queue) or max(1, budget // (len(active) + 1)))
        except BacklogQueueMissingError:
            if queue not in missing:
                logger.warning("backlog=%s does not exist: skipped (the other backlog queues drain); it is read "
                               "as soon as it exists", queue)
                missing.add(queue)
            backoff.record(queue, False, now)
            planned.pop(queue, None)
            continue
        if queue in missing:
            logger.info("backlog=%s exists again", queue)
            missing.discard(queue)

    for _ in range(_REDISTRIBUTION_ROUNDS):
        unused = budget - sum(window.end - window.offset.next for window in planned.values())
        hungry = [queue for queue, window in planned.items() if window.full and
                  (target is None or queue in restarted or window.end < target.get(queue, 0))]
        if unused < 1 or not hungry:
            break
        # Fewer left than hungry queues: one each to the first, so that a batch takes its whole budget.
        for queue, grant in share_budget(unused, hungry[:unused]).items():
            try:
                extend(queue, planned[queue], grant)
            except BacklogQueueMissingError:  # deleted meanwhile: its window so far stands
                planned[queue].closed = True

    end = dict(unmoved)
    tails: dict[str, int] = {}
    for queue, window in planned.items():
        offset = window.offset
        try:
            tails[queue] = tail_end(window.end, window.probe) if window.full else window.end
        except BacklogQueueMissingError:
            tails[queue] = window.end
        backoff.record(queue, window.end > offset.next, now)
        # An offset moves only with its window: Spark plans a batch whenever an offset changes.
        if window.end > offset.next or queue in restarted:
            end[queue] = QueueOffset(offset.incarnation, window.end, window.probe.seen_ms,
                                     reread.get(queue) if queue not in restarted else None)
    looked = tuple(queue for queue in candidates if queue not in missing)
    return WindowPlan(normalise_offsets(end), tails, tuple(restarted), looked)


ALL_AVAILABLE_BUDGET = 1 << 40  # "no limit": more sequence numbers than any queue holds


class WindowPlanner:
    """The stream reader's driver-side planning: its start, the available-now target, each queue's
    window end per trigger, and each queue's tail as last seen (for progress reports).

    ``probe_for(queue)`` gives that queue's probe. ``max_messages`` bounds a batch unless Spark passes
    its own read limit; ``available_now`` without a read limit from Spark (Spark 4.0/4.1) means one
    batch of everything, since those versions have no available-now target for Python sources.
    """

    def __init__(self, probe_for: Callable[[str], Probe], *, max_messages: int, available_now: bool,
                 idle_probe_max_seconds: float, look_back: Collection[str] = ()):
        self.probe_for = probe_for
        self.max_messages = max_messages
        self.available_now = available_now
        self.backoff = IdleBackoff(max_seconds=idle_probe_max_seconds)
        self.target: dict[str, int] | None = None  # available-now: stop here
        self.last_end: dict[str, dict] | None = None  # Spark 4.0/4.1 ask for the latest offset without a start
        self.tails: dict[str, int] = {}  # queue -> end of what was in it when last probed
        self.missing: set[str] = set()  # configured queues that do not exist (warned about once)
        # Queues where earlier runs held messages for skipped destinations: looked back at once, when this
        # run first plans them (``looked_back``). Only those: a look back elsewhere would only re-read
        # recorded messages the purge has not settled yet.
        self.look_back = frozenset(look_back)
        self.looked_back: set[str] = set()

    @staticmethod
    def initial_offset(queues: Sequence[str]) -> dict[str, dict]:
        return normalise_offsets({queue: QueueOffset() for queue in queues})

    def prepare_available_now(self, queues: Sequence[str]) -> dict[str, int]:
        """Fix the target of an available-now run: every queue's tail now (a missing queue: nothing)."""
        self.target = {}
        for queue in queues:
            try:
                self.target[queue] = tail_end(0, self.probe_for(queue))
            except BacklogQueueMissingError:
                if queue not in self.missing:
                    logger.warning("backlog=%s does not exist: skipped (the other backlog queues drain)", queue)
                    self.missing.add(queue)
                self.target[queue] = 0
        return self.target

    def budget(self, *, max_rows: int | None = None, all_available: bool = False,
               limits_supported: bool = True) -> int:
        """Messages the next batch may read, from Spark's read limit (``max_rows`` or ``all_available``)."""
        if max_rows is not None:
            return max_rows
        if all_available or (not limits_supported and self.available_now):
            return ALL_AVAILABLE_BUDGET
        return self.max_messages

    def latest_offset(self, start: Mapping[str, object] | None, queues: Sequence[str], budget: int, *, now: float,
                      stopping: bool = False) -> dict[str, dict]:
        """The end of the next batch from ``start`` (the last end, or the initial offset, when None).

        ``stopping``: a polite stop was requested, so no new batch is planned (the end is the start).
        """
        if start is None:
            start = self.last_end or self.initial_offset(queues)
        if stopping:
            return normalise_offsets(start)
        plan = plan_windows(start, queues, budget, self.probe_for, backoff=self.backoff, now=now, target=self.target,
                            missing=self.missing, look_back=self.look_back - self.looked_back)
        self.looked_back.update(plan.looked)
        for queue in plan.restarted:
            self.tails.pop(queue, None)
            if self.target is not None:  # an available-now run drains what the new queue holds now
                self.target[queue] = max(plan.tails.get(queue, 0), position(plan.end[queue]))
        for queue, tail in plan.tails.items():
            self.tails[queue] = max(tail, self.tails.get(queue, 0))
        self.last_end = plan.end
        return self.last_end

    def resume(self, end: Mapping[str, object]) -> None:
        """Spark runs a batch that ends at ``end``: the next one starts there. Spark before 4.2 asks for the
        latest offset without a start, and after a restart it first replays the last planned batch
        without asking this planner: without this, the next batch would be planned from each queue's
        head again, and a queue emptied meanwhile would look as if it were never read."""
        self.last_end = normalise_offsets(end)

    def reached_target(self, end: Mapping[str, object]) -> bool:
        """Whether ``end`` covers the available-now target of every queue (a missing queue has none)."""
        if self.target is None:
            return False
        return all(queue in self.missing or position(end.get(queue, 0)) >= through
                   for queue, through in self.target.items())

    def reported_latest(self) -> dict[str, int] | None:
        """Each queue's tail as last probed (never behind the planned end), or None before any probe."""
        if not self.tails:
            return None
        ends = self.last_end or {}
        return {queue: max(tail, position(ends.get(queue, 0))) for queue, tail in sorted(self.tails.items())}


def windows(start: Mapping[str, object], end: Mapping[str, object]) -> list[tuple[str, int, int]]:
    """``(queue, first, stop)`` of every queue with something between ``start`` and ``end``, by queue.
    A queue whose incarnation changed is read from its beginning; one whose end offset changed and
    carries ``reread_from`` (a look back) from there."""
    planned = []
    for queue, value in sorted(end.items()):
        stop, begin = QueueOffset.parse(value), QueueOffset.parse(start.get(queue, 0))
        if stop == begin:
            continue  # unmoved (a look back it carries belonged to the batch that ended there)
        first = begin.next if begin.incarnation == stop.incarnation else 0
        if stop.reread_from is not None and begin.incarnation == stop.incarnation:
            first = stop.reread_from  # a look back at what earlier runs left below the offset
        if stop.next > first:
            planned.append((queue, first, stop.next))
    return planned
