"""Planning which backlog messages a micro-batch reads: pure logic, no I/O, time passed in.

Offsets are ``{backlog queue name: next sequence number to read}``. A window ``[start, end)`` of
one queue is immutable once planned (new messages always get higher sequence numbers), so a
replayed batch peeks exactly the same messages again. Window ends are found with single-message
probes ("first sequence number at or after x") instead of downloading the messages twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

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

    With the defaults an idle queue costs about 30 probes an hour, like the legacy syphon's
    receive polling, instead of one per trigger.
    """

    min_seconds: float = 1.0
    max_seconds: float = 120.0
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
