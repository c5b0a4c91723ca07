"""One queue's probe searches for the window planner: where a queue ends, where a window ends. Pure: each
search is a generator that yields the sequence number it wants probed ("the first message at or after
x") and is sent the answer; ``run_searches`` sends one round of every queue's next probe together.

A probe's "nothing at or after x" can be wrong: Service Bus may answer a peek with no messages while
messages exist. Where such an answer would close something for good, the search looks again before it
commits: a tail search fixing an available-now target confirms the end it found (``confirm``), and a
window under a target confirms that nothing is left before the target. Elsewhere a wrong "nothing" only
closes a window early, and the next batch reads on from its end: no probe is spent on it.

Invariants:
- A search closes a window only at an end a probe proved: no message was at or after it, or one was past
  it (sequence numbers only grow, so none can appear before it later).
- A confirming search commits "nothing at or after x" only after two answers in a row say so (one second
  look, as ``servicebus.peek_pages`` reads: an empty answer while messages exist is a transient fault, so
  two in a row is the end); what the second look finds is searched on from.
- A search asks one probe at a time; its cost is counted per round (``ProbeCount``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, Mapping

from backlog_syphon.errors import BacklogQueueMissingError

Identity = tuple  # (sequence number, enqueue time in ms or None) of a message
Probe = Callable[[int], "Identity | None"]  # the first message at or after x, or None when there is none
# One probe per queue, all at once: each answer is an identity, None, or the queue's BacklogQueueMissingError.
ProbeAtOnce = Callable[[Mapping[str, int]], Mapping[str, "Identity | None | BacklogQueueMissingError"]]
# A search yields the sequence number it wants probed, is sent the answer, and returns its result.
Search = Generator[int, "Identity | None", object]

GALLOP_FIRST_STEP = 64  # a tail search probes 64 past a known message first, then 8 times further each time
GALLOP_FACTOR = 8


@dataclass
class ProbeCount:
    """The round trips of a plan: probes, and rounds of probes sent together (the time they cost)."""

    probes: int = 0
    rounds: int = 0

    def add(self, other: ProbeCount) -> None:
        self.probes += other.probes
        self.rounds += other.rounds


def run_searches(searches: Mapping[str, Search], probe_at_once: ProbeAtOnce, count: ProbeCount,
                 seen: dict[str, list] | None = None) -> dict[str, object]:
    """Run one search per queue, all at once: each round probes the next sequence number of every search
    still going, together. A search's result is what it returns, or its queue's ``BacklogQueueMissingError``
    (when the search does not handle it). ``seen`` collects every identity probed, per queue."""
    results: dict[str, object] = {}
    asks: dict[str, int] = {}

    def advance(queue: str, answer=None) -> None:
        search = searches[queue]
        try:
            if isinstance(answer, BacklogQueueMissingError):
                asks[queue] = search.throw(answer)
            else:
                asks[queue] = search.send(answer)
        except StopIteration as stop:
            results[queue] = stop.value
        except BacklogQueueMissingError as missing:
            results[queue] = missing

    for queue in searches:
        advance(queue)
    while asks:
        round_asks = dict(asks)
        asks.clear()
        answers = probe_at_once(round_asks)
        count.rounds += 1
        count.probes += len(round_asks)
        for queue in round_asks:
            answer = answers[queue]
            if seen is not None and isinstance(answer, tuple):
                seen.setdefault(queue, []).append(answer)
            advance(queue, answer)
    return results


def probe_one_at_a_time(probe_for: Callable[[str], Probe]) -> ProbeAtOnce:
    """A ``ProbeAtOnce`` made of single probes, one after the other."""
    def probe_at_once(asks: Mapping[str, int]) -> dict:
        answers = {}
        for queue, sequence_number in asks.items():
            try:
                answers[queue] = probe_for(queue)(sequence_number)
            except BacklogQueueMissingError as missing:
                answers[queue] = missing
        return answers

    return probe_at_once


def probe_once(sequence_number: int) -> Search:
    """The first message at or after ``sequence_number`` (one probe)."""
    return (yield sequence_number)


def search_tail(known: Identity, *, confirm: bool = False) -> Search:
    """The end (exclusive) of everything in a queue, from a message ``known`` to be there: a gallop (64
    past it, then 8 times further each time) until nothing is found, then halving. About
    log8(n) + log2(n) probes for a tail n messages on; a handful when it is near.

    ``confirm``: the end found is probed once more before it is returned (one probe, at the end of the
    search); a message that second look finds was hidden by a wrong "nothing" somewhere in the search,
    and the search goes on from it. One look suffices: "nothing at or after the end" covers every
    position an earlier answer may have hidden."""
    lo, step = known[0], GALLOP_FIRST_STEP
    while True:
        found = yield lo + step
        if found is not None:
            lo, step = found[0], step * GALLOP_FACTOR
            continue
        end = yield from _halve(lo, lo + step)
        if not confirm:
            return end
        found = yield end
        if found is None:
            return end
        lo, step = found[0], GALLOP_FIRST_STEP


def search_tail_from(end: int, *, confirm: bool = False) -> Search:
    """The end of everything in a queue now, from ``end``, an end seen before (nothing was at or after it,
    something before it was) or 0: one probe when nothing came since (that "nothing" is not looked at again
    here: ``planning.WindowPlanner`` confirms it with the head probe that follows). ``confirm``: see
    ``search_tail``."""
    found = yield end
    if found is None:
        return end
    return (yield from search_tail(found, confirm=confirm))


def _halve(lo: int, hi: int) -> Search:
    """The end of the messages between ``lo`` (one is there) and ``hi`` (none was at or after it)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = yield mid
        if found is None:
            hi = mid
        else:
            lo = found[0]  # past hi only if messages arrived meanwhile: the end then follows this one
    return lo + 1


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
            end = yield from _halve(lo, lo + step)
            return WindowEnd(end, False, first[0], tail=end)
        if found[0] >= limit:
            return WindowEnd(limit, True, first[0], after=found)
        lo, step = found[0], step * GALLOP_FACTOR
    found = yield limit
    if found is not None:
        return WindowEnd(limit, True, first[0], after=found)
    end = yield from _halve(lo, limit)
    return WindowEnd(end, False, first[0], tail=end)


def tail_end(start: int, probe: Probe) -> int:
    """End (exclusive) of everything in the queue now, from ``start`` (see ``search_tail_from``): one queue,
    its probes one after the other."""
    return run_searches({"queue": search_tail_from(start)}, probe_one_at_a_time(lambda _: probe), ProbeCount())["queue"]

