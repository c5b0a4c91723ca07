"""Searching a queue's sequence numbers with single-message probes ("the first message at or after x"): where
a queue ends, found with gallop-and-halve. Pure: the probe is passed in. Both the window planner
(``source``) and the status's counts (``servicebus.counts``) search with it.

A search is a generator that yields the sequence number it wants probed and is sent the answer (an identity,
or None for "nothing at or after it"); it returns its result. So one search runs against one probe
(``run_search``), or every queue's search runs at once, one round of probes together (``run_searches``):
the backlog is a region away (30-80 ms a round trip), and a round costs one round trip whatever the number
of queues.

A probe's "nothing at or after x" can be wrong: Service Bus may answer a peek with no messages while
messages exist. Where such an answer would close something for good, a search looks again before it
commits (``confirm``). Elsewhere a wrong "nothing" only closes a window early, and the next batch reads on
from its end: no probe is spent on it.

Invariants:
- A tail search returns an end a probe proved: nothing was at or after it, and a message was just before
  it (sequence numbers only grow, so none can appear before it later), or, where messages arrived during
  the search, the end just past the newest one it found.
- A confirming search commits "nothing at or after x" only after two answers in a row say so at x (one
  second look, as ``peek_pages`` reads: an empty answer while messages exist is a transient
  fault, so two in a row is the end); what a look finds is searched on from.
- A search asks one probe at a time; its cost is counted in probes and rounds (``ProbeCount``).
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


def run_search(search: Search, probe: Probe, count: ProbeCount | None = None) -> object:
    """One search against one queue's probe, its probes one after the other. A ``BacklogQueueMissingError``
    the probe raises is raised (unless the search handles it)."""
    result = run_searches({"queue": search}, probe_one_at_a_time(lambda _: probe),
                          ProbeCount() if count is None else count)["queue"]
    if isinstance(result, BacklogQueueMissingError):
        raise result
    return result


def probe_once(sequence_number: int) -> Search:
    """The first message at or after ``sequence_number`` (one probe)."""
    return (yield sequence_number)


def search_tail(known: Identity, *, confirm: bool = False) -> Search:
    """The end (exclusive) of everything in a queue, from a message ``known`` to be there: a gallop (64
    past it, then 8 times further each time) until nothing is found, then halving. About
    log8(n) + log2(n) probes for a tail n messages on; a handful when it is near.

    ``confirm``: the end found is probed again before it is returned, until two answers in a row at it
    say "nothing" (one probe where the halving's last answer was that "nothing", two otherwise); a
    message a look finds was hidden by a wrong "nothing" somewhere in the search, and the search goes on
    from it. Looks at the end suffice: "nothing at or after the end" covers every position an earlier
    answer may have hidden."""
    lo, step = known[0], GALLOP_FIRST_STEP
    while True:
        found = yield lo + step
        if found is not None:
            lo, step = found[0], step * GALLOP_FACTOR
            continue
        end, closed_at_end = yield from _halve(lo, lo + step)
        if not confirm:
            return end
        found = yield end
        if found is None and not closed_at_end:
            # The "nothing" that closed the halving was at another number, perhaps long ago and wrong: a
            # single look at the end would make one wrong answer in two the end (every fifth answer
            # wrongly empty, a million messages: an end of 561). Two answers in a row at the end commit it.
            found = yield end
        if found is None:
            return end
        # Gallop on from the step it had reached: from the first step again, every wrong "nothing" cost
        # a new gallop, each probe a round trip to the far namespace (a million messages with every
        # seventh answer wrongly empty: 176 probes against 82).
        lo = found[0]


def search_tail_from(end: int, *, confirm: bool = False) -> Search:
    """The end of everything in a queue now, from ``end``, an end seen before (nothing was at or after it,
    something before it was) or 0: one probe when nothing came since (that "nothing" is not looked at again
    here: the window planner confirms it with the head probe that follows). ``confirm``: see
    ``search_tail``."""
    found = yield end
    if found is None:
        return end
    return (yield from search_tail(found, confirm=confirm))


def search_end_between(lo: int, hi: int) -> Search:
    """The end of the messages between ``lo`` (one is there) and ``hi`` (none was at or after it), by halving."""
    end, _ = yield from _halve(lo, hi)
    return end


def _halve(lo: int, hi: int) -> Search:
    """``search_end_between``'s halving; it also returns whether its last answer was "nothing" at the end."""
    closed_at_end = False
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = yield mid
        if found is None:
            hi, closed_at_end = mid, True
        else:
            lo, closed_at_end = found[0], False  # past hi only if messages arrived meanwhile
    return lo + 1, closed_at_end and hi == lo + 1


def tail_end(start: int, probe: Probe) -> int:
    """End (exclusive) of everything in the queue now, from ``start`` (see ``search_tail_from``): one queue,
    its probes one after the other."""
    return run_search(search_tail_from(start), probe)
