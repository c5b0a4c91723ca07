"""Where a window of one queue ends, as a probe search (``probing``): the window planner's search, pure. It is
sent the answers to single-message probes ("the first message at or after x") and returns a ``WindowEnd``.

A window under an available-now target confirms an empty start before it counts: the target says a message
lies at or after it, and a peek may come back empty while messages exist. Elsewhere a wrong "nothing" only
closes a window early, and the next batch reads on from its end: no probe is spent on it.

Invariant: a search closes a window only at an end a probe proved: no message was at or after it, or one was
past it (sequence numbers only grow, so none can appear before it later).
"""

from __future__ import annotations

from dataclasses import dataclass

from backlog_syphon.probing import GALLOP_FACTOR, GALLOP_FIRST_STEP, Identity, Search, search_end_between

UNKNOWN = object()  # the first message of a window: not known without a probe


@dataclass(frozen=True)
class WindowEnd:
    """Where a window search ended."""

    end: int
    full: bool  # a message lies at or past ``end``: the queue holds more than the window
    first: int | None = None  # the window's first message (None: nothing in it)
    after: Identity | None = None  # when full and probed: the first message at or after ``end``
    tail: int | None = None  # the queue's end, when the window reached it (probed)


def search_window(start: int, grant: int, first, *, tail_hint: int | None = None, bound: int | None = None
                  ) -> Search:
    """The end of the window from ``start`` holding at most ``grant`` sequence numbers from its first message.

    ``first``: the first message at or after ``start`` when known (``UNKNOWN``: probe it; None: none).
    ``bound``: an available-now target: a message at ``bound - 1`` or later was there when it was
    fixed, so the window closes at ``min(first + grant, bound)`` without a probe; and "nothing at or after
    ``start``" contradicts it, so that answer is looked at again, and only if the second look agrees (the
    messages before the target are gone) does the window reach the target, holding nothing.
    ``tail_hint``: the queue's end as last seen. A window that reaches it costs one probe when the
    queue has not grown since; one that finds it grew gallops from there (about log2 of the growth).
    Without a hint, one probe at ``first + grant`` tells whether the queue holds more, and a tail
    inside the window is found by halving.
    """
    if first is UNKNOWN:
        first = yield start
        if first is None and bound is not None and start < bound:
            first = yield start  # a second look: the target says a message lies at or after ``start``
            if first is None:
                return WindowEnd(bound, False)
    if first is None:
        return WindowEnd(start, False)
    limit = first[0] + max(1, grant)
    if bound is not None:
        return WindowEnd(max(start, min(limit, bound)), limit < bound, first[0])
    lo = first[0]
    grew = tail_hint is not None and lo >= tail_hint  # the window starts past the tail last seen
    if tail_hint is not None and lo < tail_hint <= limit:
        found = yield tail_hint
        if found is None:
            return WindowEnd(tail_hint, False, first[0], tail=tail_hint)
        if found[0] >= limit:
            return WindowEnd(limit, True, first[0], after=found)
        lo, grew = found[0], True
    step = GALLOP_FIRST_STEP
    while grew and lo + step < limit:
        found = yield lo + step
        if found is None:
            end = yield from search_end_between(lo, lo + step)
            return WindowEnd(end, False, first[0], tail=end)
        if found[0] >= limit:
            return WindowEnd(limit, True, first[0], after=found)
        lo, step = found[0], step * GALLOP_FACTOR
    found = yield limit
    if found is not None:
        return WindowEnd(limit, True, first[0], after=found)
    end = yield from search_end_between(lo, limit)
    return WindowEnd(end, False, first[0], tail=end)
