"""Planning which backlog messages a micro-batch reads: pure logic, no I/O, time passed in.

Offsets are ``{backlog queue name: next sequence number to read}``. A window ``[start, end)`` of
one queue is immutable once planned (new messages always get higher sequence numbers), so a
replayed batch peeks exactly the same messages again. Window ends are found with single-message
probes ("first sequence number at or after x") instead of downloading the messages twice.

The probes are the only I/O, injected (``Probe``); ``WindowPlanner`` holds what the stream reader
remembers between triggers, so the reader itself only translates between Spark and this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

Probe = Callable[[int], "int | None"]  # first sequence number >= x, or None when there is none


def window_end(start: int, budget: int, probe: Probe) -> int:
    """End (exclusive) of the next window from ``start`` holding at most ``budget`` sequence numbers.

    Returns ``start`` when nothing is there. Costs 2 probes when the queue holds more than the
    budget, and about log2(budget) when the window reaches the queue's tail.
    """
    first = probe(start)
    if first is None:
        return start
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
            lo = found
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


def normalise_offsets(offsets: Mapping[str, int]) -> dict[str, int]:
    """Offsets with a stable key order: Spark compares serialised offsets as strings."""
    return {queue: int(offsets[queue]) for queue in sorted(offsets)}


@dataclass(frozen=True)
class WindowPlan:
    """The next micro-batch: each queue's window end, and each probed queue's tail as last seen."""

    end: dict[str, int]
    tails: dict[str, int]


def plan_windows(start: Mapping[str, int], queues: Sequence[str], budget: int, probe_for: Callable[[str], Probe], *,
                 backoff: IdleBackoff, now: float, target: Mapping[str, int] | None = None) -> WindowPlan:
    """Plan the next batch's windows from ``start``: which queues to look at, how far each window goes.

    - Continuous runs look only at queues whose idle back-off is due; an available-now run (with a
      ``target``) at every queue still short of its target, and never past it.
    - The budget is shared evenly over the queues looked at.
    - A window that stopped short of its share reached the queue's tail; a full one costs one probe
      more when the tail is right there, about log2(backlog) when it is not (for progress reports).
    ``probe_for(queue)`` gives that queue's probe (``Probe``): the only I/O, injected.
    """
    offsets = {queue: int(start.get(queue, 0)) for queue in queues}
    offsets.update({queue: int(seq) for queue, seq in start.items()})
    if target is not None:
        candidates = [queue for queue in offsets if offsets[queue] < target.get(queue, 0)]
    else:
        candidates = [queue for queue in offsets if backoff.due(queue, now)]
    shares = share_budget(budget, candidates)
    end, tails = dict(offsets), {}
    for queue in candidates:
        probe = probe_for(queue)
        queue_end = window_end(offsets[queue], shares[queue], probe)
        if target is not None:
            queue_end = min(queue_end, target.get(queue, queue_end))
        backoff.record(queue, queue_end > offsets[queue], now)
        end[queue] = queue_end
        tails[queue] = queue_end if queue_end - offsets[queue] < shares[queue] else tail_end(queue_end, probe)
    return WindowPlan(normalise_offsets(end), tails)


ALL_AVAILABLE_BUDGET = 1 << 40  # "no limit": more sequence numbers than any queue holds


class WindowPlanner:
    """The stream reader's driver-side planning: its start, the available-now target, each queue's
    window end per trigger, and each queue's tail as last seen (for progress reports).

    ``probe_for(queue)`` gives that queue's probe. ``max_messages`` bounds a batch unless Spark passes
    its own read limit; ``available_now`` without a read limit from Spark (Spark 4.0/4.1) means one
    batch of everything, since those versions have no available-now target for Python sources.
    """

    def __init__(self, probe_for: Callable[[str], Probe], *, max_messages: int, available_now: bool,
                 idle_probe_max_seconds: float):
        self.probe_for = probe_for
        self.max_messages = max_messages
        self.available_now = available_now
        self.backoff = IdleBackoff(max_seconds=idle_probe_max_seconds)
        self.target: dict[str, int] | None = None  # available-now: stop here
        self.last_end: dict[str, int] | None = None  # Spark 4.0/4.1 ask for the latest offset without a start
        self.tails: dict[str, int] = {}  # queue -> end of what was in it when last probed

    @staticmethod
    def initial_offset(queues: Sequence[str]) -> dict[str, int]:
        return normalise_offsets({queue: 0 for queue in queues})

    def prepare_available_now(self, queues: Sequence[str]) -> dict[str, int]:
        """Fix the target of an available-now run: every queue's tail now."""
        self.target = {queue: tail_end(0, self.probe_for(queue)) for queue in queues}
        return self.target

    def budget(self, *, max_rows: int | None = None, all_available: bool = False,
               limits_supported: bool = True) -> int:
        """Messages the next batch may read, from Spark's read limit (``max_rows`` or ``all_available``)."""
        if max_rows is not None:
            return max_rows
        if all_available or (not limits_supported and self.available_now):
            return ALL_AVAILABLE_BUDGET
        return self.max_messages

    def latest_offset(self, start: Mapping[str, int] | None, queues: Sequence[str], budget: int, *, now: float,
                      stopping: bool = False) -> dict[str, int]:
        """The end of the next batch from ``start`` (the last end, or the initial offset, when None).

        ``stopping``: a polite stop was requested, so no new batch is planned (the end is the start).
        """
        if start is None:
            start = self.last_end or self.initial_offset(queues)
        if stopping:
            return normalise_offsets({queue: int(seq) for queue, seq in start.items()})
        plan = plan_windows(start, queues, budget, self.probe_for, backoff=self.backoff, now=now, target=self.target)
        for queue, tail in plan.tails.items():
            self.tails[queue] = max(tail, self.tails.get(queue, 0))
        self.last_end = plan.end
        return self.last_end

    def reported_latest(self) -> dict[str, int] | None:
        """Each queue's tail as last probed (never behind the planned end), or None before any probe."""
        if not self.tails:
            return None
        ends = self.last_end or {}
        return normalise_offsets({queue: max(tail, int(ends.get(queue, 0))) for queue, tail in self.tails.items()})


def windows(start: Mapping[str, int], end: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """``(queue, first, stop)`` of every queue with something between ``start`` and ``end``, by queue."""
    return [(queue, int(start.get(queue, 0)), int(stop)) for queue, stop in sorted(end.items())
            if int(stop) > int(start.get(queue, 0))]
