"""Planning which backlog messages a micro-batch reads (``plan_windows``): pure logic, no I/O, time passed in.

A batch's window of a queue is ``[start, end)`` between two offsets (``offsets``). Window ends are found
with single-message probes ("first message at or after x") instead of downloading the messages twice. A
window is closed only at an end a probe proved: no message was at or after it, or one was past it
(sequence numbers only grow, so none can appear before it later).

Every plan probes each queue's first message (its *head*): a head that shows the queue was recreated
(``QueueOffset.recreated``) starts its offset again from the beginning, in a new incarnation. A queue
that does not exist is skipped with one warning.

A run looks back once at each queue where earlier runs held messages for a destination in
``restore.skip_destinations`` (the run finds them in the audit and passes them as ``look_back``): the
first time it plans such a queue, if its head lies below the offset in the same incarnation, that
window starts there (``QueueOffset.reread_from``), so a run without the skip delivers what an
earlier run held, and the sink drops, by identity, what is already recorded. A continuous run looks
back only when it starts: what it holds later waits for the next run.

**Round trips.** Every probe is a round trip to the secondary namespace, which after a failover is
a region away (30-80 ms). So a plan costs a constant number of probes per queue, whatever the
number of batches before it, and probes every queue at once: each queue's planning is a *search*
(a generator that yields the sequence number it wants probed and is sent the answer: ``probing``), and
``run_searches`` sends one round of every search's next probe together (``ProbeAtOnce``: the I/O
side runs them in parallel on pooled links). Per queue and batch: the head (also its oldest
message's age, for reports); where the window starts, only when neither the head nor the last
plan tells; where it ends: one probe, none when an available-now target bounds it. What the planner
learns between batches (``QueueHints``: the tail last seen, the message found at the last window's
end) only saves probes: windows are still closed where a probe proved it, a recreated queue is
still found by its head, and a window read short is still confirmed by the executor.

The plan goes in phases (``_BatchPlan``, one method each): the queues to look at, their heads, where each
window starts, the budget's shares, the window ends, what is left of the budget, the empty queues, the
tails, and the end offsets. ``window_planner.WindowPlanner`` calls it once per trigger.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.partitions import split_lane_key
from backlog_syphon.probing import (
    Identity,
    ProbeAtOnce,
    ProbeCount,
    Search,
    probe_once,
    run_searches,
    search_tail,
    search_tail_from,
)
from backlog_syphon.source.offsets import QueueOffset
from backlog_syphon.source.window_search import UNKNOWN, WindowEnd, search_window

logger = logging.getLogger(__name__)


# --- budgets --------------------------------------------------------------------------------------

def share_budget(total: int, queues: list[str]) -> dict[str, int]:
    """Split a batch's message budget evenly over the queues that have data.

    The shares add up to ``total`` (the first queues get the remainder), except that every queue
    gets at least 1 so none starves when there are more queues than budget.
    """
    if not queues:
        return {}
    each, extra = divmod(total, len(queues))
    return {queue: max(1, each + (1 if index < extra else 0)) for index, queue in enumerate(queues)}


def split_budget(total: int, demands: Mapping[str, int | None]) -> dict[str, int]:
    """Share ``total`` over queues that each hold at most their demand (None: not known): none gets more
    than its demand, and what one cannot use goes evenly to the others (a backlog left in one queue of
    ten still fills a batch). Every queue gets at least 1, as in ``share_budget``."""
    grants: dict[str, int] = {}
    open_queues = [queue for queue, demand in demands.items() if demand is None or demand > 0]
    left = total
    while open_queues:
        shares = share_budget(left, open_queues)
        capped = [queue for queue in open_queues if demands[queue] is not None and demands[queue] <= shares[queue]]
        if not capped:
            grants.update(shares)
            break
        for queue in capped:
            grants[queue] = demands[queue]
            left -= demands[queue]
        open_queues = [queue for queue in open_queues if queue not in capped]
    return grants


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


# --- a batch's plan ---------------------------------------------------------------------------------

TAIL_REFRESH_SECONDS = 30.0  # a queue's tail beyond its window is probed again for reports after this long
_REDISTRIBUTION_ROUNDS = 3


@dataclass
class QueueHints:
    """What earlier plans learnt about one incarnation of a queue: saves probes, decides nothing."""

    incarnation: int
    tail: int | None = None  # the queue's end when last seen (nothing at or after it then)
    tail_seen_at: float | None = None  # when (the planner's clock)
    after: tuple[int, Identity] | None = None  # (x, the first message at or after x) at the last window's end
    head: Identity | None = None  # the queue's first message when last probed (None: it was empty)
    # The newest enqueue time probed in this incarnation, anywhere in the queue (what a recreated queue's
    # messages come after): a window closed without a probe (at its target) still moves ``seen_ms`` past
    # every message it holds.
    newest_ms: int | None = None

    def saw(self, identities) -> None:
        times = [identity[1] for identity in identities if identity[1] is not None]
        if times:
            self.newest_ms = max(times + ([self.newest_ms] if self.newest_ms is not None else []))


@dataclass(frozen=True)
class WindowPlan:
    """The next micro-batch: each queue's (planner key's) offset at the window's end, and each probed queue's
    tail as last seen. ``restarted``: queues found recreated, whose windows start from the beginning."""

    end: dict[str, QueueOffset]
    tails: dict[str, int]
    restarted: tuple[str, ...] = ()
    looked: tuple[str, ...] = ()  # queues this plan looked at (probed): a run looks back at each once
    count: ProbeCount = field(default_factory=ProbeCount)  # the plan's round trips


@dataclass
class _Window:
    """One queue's window while a batch is planned."""

    offset: QueueOffset
    end: int
    used: int  # sequence numbers from its first message to its end (what counts against the budget)
    full: bool
    after: Identity | None
    bound: int | None  # its available-now target (None: unbounded)
    closed: bool = False  # the queue went missing meanwhile: the window stays as it is

    @property
    def hungry(self) -> bool:
        return self.full and not self.closed and (self.bound is None or self.end < self.bound)


def plan_windows(start: Mapping[str, QueueOffset], queues: Sequence[str], budget: int, probe_at_once: ProbeAtOnce, *,
                 backoff: IdleBackoff, now: float, target: Mapping[str, int] | None = None,
                 missing: set[str] | None = None, look_back: Collection[str] = (),
                 hints: dict[str, QueueHints] | None = None) -> WindowPlan:
    """Plan the next batch's windows from ``start``: which queues to look at, how far each window goes.

    - Continuous runs look only at queues whose idle back-off is due; an available-now run (with a
      ``target``) at every queue of its target (one at its target costs one probe: it may have been
      recreated), and never past the target.
    - Round 1 probes every queue's head: a recreated queue starts again in a new incarnation, a
      queue in ``look_back`` whose head lies below its offset (same incarnation) is read from that
      message (``QueueOffset.reread_from``), and an empty one backs off.
    - The budget is shared over the queues with something to read, none getting more than it is
      known to hold (an available-now target, the tail last seen); what is left after the windows
      are found goes to the queues that filled theirs, in a few rounds.
    - A queue that does not exist is left out (``missing`` collects it; one warning when it goes missing).
    - ``hints`` (updated here) carries what the plans learn between batches; a queue's tail is
      reported from it, probed again when the window passed it or it is ``TAIL_REFRESH_SECONDS`` old.
    ``probe_at_once`` is the only I/O, injected; every search of one round goes to it together.
    """
    offsets = {queue: QueueOffset() for queue in queues}
    offsets.update(start)
    plan = _BatchPlan(probe_at_once, backoff, now, target, set() if missing is None else missing,
                      {} if hints is None else hints, offsets)
    # Where a queue stays if no window moves it: exactly its start, a look back included, so that Spark
    # sees no change (and plans no empty batch) and ``windows`` no window for it.
    unmoved = dict(offsets)
    candidates = plan.candidates()
    firsts = plan.read_heads(candidates, plan.probe_heads(candidates), look_back)
    planned = plan.find_window_ends(split_budget(budget, plan.demands(firsts)), firsts)
    plan.share_what_is_left(planned, budget)
    empty = [queue for queue, first in firsts.items() if first is None]
    plan.close_empty(planned, empty)
    tails = plan.tails(planned, empty)
    looked = tuple(queue for queue in candidates if queue not in plan.missing)
    return WindowPlan(plan.end_offsets(planned, unmoved), tails, tuple(plan.restarted), looked, plan.count)


@dataclass
class _BatchPlan:
    """One ``plan_windows`` call, phase by phase: what the phases share (each queue's offset, the hints, the
    probes' cost). Every search goes through ``search``, one per queue, all queues at once."""

    probe_at_once: ProbeAtOnce
    backoff: IdleBackoff
    now: float
    target: Mapping[str, int] | None
    missing: set[str]
    hints: dict[str, QueueHints]
    offsets: dict[str, QueueOffset]  # each queue's start, moved by its head (a recreation, a look back)
    count: ProbeCount = field(default_factory=ProbeCount)
    seen: dict[str, list] = field(default_factory=dict)  # every identity probed, per queue
    restarted: list[str] = field(default_factory=list)  # queues found recreated
    reread: dict[str, int] = field(default_factory=dict)  # queue -> where its look back starts

    def search(self, searches: Mapping[str, Search]) -> dict[str, object]:
        return run_searches(searches, self.probe_at_once, self.count, self.seen)

    def bound_of(self, queue: str) -> int | None:
        """The queue's available-now target (None: unbounded; a recreated queue is read to its new end)."""
        return None if self.target is None or queue in self.restarted else self.target.get(queue, 0)

    def candidates(self) -> list[str]:
        """The queues to look at: every queue of an available-now target, else those whose back-off is due."""
        if self.target is not None:
            return [queue for queue in self.offsets if queue in self.target]
        return [queue for queue in self.offsets if self.backoff.due(queue, self.now)]

    def probe_heads(self, candidates: list[str]) -> dict[str, object]:
        """Every candidate's first message, all at once. An empty queue that its available-now target says
        holds messages gets a second look before it counts (a peek may come back empty while messages
        exist; the common case, a queue at its target, needs none)."""
        heads = self.search({queue: probe_once(_head_at(queue)) for queue in candidates})
        doubtful = [queue for queue in candidates if heads[queue] is None and self.target is not None
                    and self.offsets[queue].next < self.target.get(queue, 0)]
        if doubtful:
            heads.update(self.search({queue: probe_once(_head_at(queue)) for queue in doubtful}))
        return heads

    def read_heads(self, candidates: list[str], heads: Mapping[str, object], look_back: Collection[str]
                   ) -> dict[str, object]:
        """Each existing candidate's first message at or after its start (None: none; ``UNKNOWN``: a probe
        tells), from its head and the hints; a missing queue is left out and backs off."""
        firsts: dict[str, object] = {}
        for queue in candidates:
            head = heads[queue]
            if isinstance(head, BacklogQueueMissingError):
                if queue not in self.missing:
                    if _said_once(queue):
                        logger.warning("backlog=%s does not exist: skipped (the other backlog queues drain); it is "
                                       "read as soon as it exists", split_lane_key(queue)[0])
                    self.missing.add(queue)
                self.backoff.record(queue, False, self.now)
                continue
            if queue in self.missing:
                if _said_once(queue):
                    logger.info("backlog=%s exists again", split_lane_key(queue)[0])
                self.missing.discard(queue)
            offset = self.offsets[queue] = self._start_from_head(queue, head, look_back)
            hint = self.hints.get(queue)
            if hint is None or hint.incarnation != offset.incarnation:
                hint = self.hints[queue] = QueueHints(offset.incarnation)
            hint.head = head
            if head is None:
                firsts[queue] = None
            elif head[0] >= offset.next:
                firsts[queue] = head  # nothing left below the offset: the head is where the window starts
            elif hint.after is not None and hint.after[0] == offset.next:
                firsts[queue] = hint.after[1]
            else:
                firsts[queue] = UNKNOWN
        return firsts

    def _start_from_head(self, queue: str, head: Identity | None, look_back: Collection[str]) -> QueueOffset:
        """The queue's start as its head shows it: a new incarnation's beginning if it was recreated, the head
        if a look back is due and something lies below the offset, else its offset."""
        offset = self.offsets[queue]
        if offset.next > 1 and offset.recreated(head):
            logger.warning("backlog=%s was recreated (it numbers from 1 again, with messages enqueued after "
                           "every one read before): reading it from its start, incarnation %d",
                           queue, offset.incarnation + 1)
            self.restarted.append(queue)
            return QueueOffset(offset.incarnation + 1, 0, None)
        if queue in look_back and offset.next > 1 and offset.left_behind(head):
            logger.info("backlog=%s holds messages below its offset %d (from %d): earlier runs left them; this "
                        "batch reads them again (what is recorded is not sent again)", queue, offset.next, head[0])
            self.reread[queue] = head[0]
            return dataclasses.replace(offset, next=head[0], reread_from=None)
        return offset

    def demands(self, firsts: Mapping[str, object]) -> dict[str, int | None]:
        """What each queue asks of the budget: at most what it is known to hold (None: not known)."""
        demands: dict[str, int | None] = {}
        for queue, first in firsts.items():
            bound, offset, hint = self.bound_of(queue), self.offsets[queue], self.hints[queue]
            from_ = offset.next if first is UNKNOWN or first is None else first[0]
            if first is None or (bound is not None and offset.next >= bound):
                demands[queue] = 0  # empty, or at its available-now target: only checked for a recreation
            elif bound is not None:
                demands[queue] = max(1, bound - from_)
            elif hint.tail is not None and hint.tail > from_:
                demands[queue] = hint.tail - from_  # may have grown: a full window asks for more below
            else:
                demands[queue] = None
        return demands

    def find_window_ends(self, grants: Mapping[str, int], firsts: Mapping[str, object]) -> dict[str, _Window]:
        """Each granted queue's window, searched from its start, all at once."""
        planned: dict[str, _Window] = {}
        found = self.search({queue: search_window(self.offsets[queue].next, grant, firsts[queue],
                                                  tail_hint=self.hints[queue].tail, bound=self.bound_of(queue))
                             for queue, grant in grants.items()})
        for queue, result in found.items():
            if isinstance(result, BacklogQueueMissingError):  # deleted since its head was probed
                self.backoff.record(queue, False, self.now)
                continue
            planned[queue] = _Window(self.offsets[queue], result.end, _used(result), result.full, result.after,
                                     self.bound_of(queue))
            _learn(self.hints[queue], result, self.now)
        return planned

    def share_what_is_left(self, planned: dict[str, _Window], budget: int) -> None:
        """The budget the windows did not use goes to the queues that filled theirs, in a few rounds."""
        for _ in range(_REDISTRIBUTION_ROUNDS):
            unused = budget - sum(window.used for window in planned.values())
            hungry = [queue for queue, window in planned.items() if window.hungry]
            if unused < 1 or not hungry:
                break
            # Fewer left than hungry queues: one each to the first, so that a batch takes its whole budget.
            more = self.search({queue: search_window(planned[queue].end, grant, planned[queue].after or UNKNOWN,
                                                     tail_hint=self.hints[queue].tail, bound=planned[queue].bound)
                                for queue, grant in share_budget(unused, hungry[:unused]).items()})
            for queue, result in more.items():
                window = planned[queue]
                if isinstance(result, BacklogQueueMissingError):  # deleted meanwhile: its window so far stands
                    window.closed = True
                    continue
                window.used += _used(result)
                window.end, window.full, window.after = max(window.end, result.end), result.full, result.after
                _learn(self.hints[queue], result, self.now)

    def close_empty(self, planned: dict[str, _Window], empty: list[str]) -> None:
        """The queues found empty back off, except one with nothing at all left before its available-now
        target (emptied by someone else): its window reaches the target, or the run would wait forever."""
        for queue in empty:
            bound = self.bound_of(queue)
            if bound is not None and self.offsets[queue].next < bound:
                planned[queue] = _Window(self.offsets[queue], bound, 0, False, None, bound)
            else:
                self.backoff.record(queue, False, self.now)

    def tails(self, planned: dict[str, _Window], empty: list[str]) -> dict[str, int]:
        """Each planned queue's tail, for reports (and, for a queue recreated during an available-now run, its
        new target): from the hints, probed again only when the window passed the tail last seen or it is
        ``TAIL_REFRESH_SECONDS`` old. Under a target the rest of a queue beyond it does not matter. An empty
        queue's tail is its start."""
        tails: dict[str, int] = {}
        searches: dict[str, Search] = {}
        for queue, window in planned.items():
            hint = self.hints[queue]
            if not window.full:
                tails[queue] = max(window.end, hint.tail or 0)
            elif self.target is not None and queue not in self.restarted:
                tails[queue] = max(window.end, hint.tail or 0, self.target.get(queue, 0))
            elif hint.tail is not None and hint.tail > window.end:
                fresh = hint.tail_seen_at is not None and self.now - hint.tail_seen_at < TAIL_REFRESH_SECONDS
                if fresh:
                    tails[queue] = hint.tail
                else:
                    searches[queue] = search_tail_from(hint.tail)
            elif window.after is not None:
                searches[queue] = search_tail(window.after)
            else:
                searches[queue] = search_tail_from(window.end)
        for queue, tail in self.search(searches).items():
            if isinstance(tail, BacklogQueueMissingError):
                tails[queue] = planned[queue].end
                continue
            self.hints[queue].tail, self.hints[queue].tail_seen_at = tail, self.now
            tails[queue] = max(tail, planned[queue].end)
        for queue in empty:
            tails.setdefault(queue, self.offsets[queue].next)
        return tails

    def end_offsets(self, planned: dict[str, _Window], unmoved: Mapping[str, QueueOffset]) -> dict[str, QueueOffset]:
        """The batch's end offset of every queue: moved only with its window (Spark plans a batch whenever an
        offset changes), carrying the newest enqueue time probed and a look back's start."""
        for queue, identities in self.seen.items():
            if queue in self.hints and queue not in self.missing:
                self.hints[queue].saw(identities)
        end = dict(unmoved)
        for queue, window in planned.items():
            offset = window.offset
            self.backoff.record(queue, window.end > offset.next, self.now)
            if window.end > offset.next or queue in self.restarted:
                hint = self.hints[queue]
                newest = max((ms for ms in (offset.seen_ms, hint.newest_ms) if ms is not None), default=None)
                end[queue] = QueueOffset(offset.incarnation, window.end, newest,
                                         self.reread.get(queue) if queue not in self.restarted else None)
        return end


def _said_once(key: str) -> bool:
    """Whether a line about a queue is said for this planner key: a queue's own, or its first lane's (a
    partitioned queue's 16 lanes are one queue to an operator)."""
    return split_lane_key(key)[1] in (None, 0)


def _head_at(key: str) -> int:
    """Where a queue's head is probed: at 1 (the first number a queue gives), a lane's at its start (local 0:
    a partition may number from 0)."""
    return 1 if split_lane_key(key)[1] is None else 0


def _used(result: WindowEnd) -> int:
    """Sequence numbers a window search took from the budget: from its first message to its end."""
    return 0 if result.first is None else max(0, result.end - result.first)


def _learn(hint: QueueHints, result: WindowEnd, now: float) -> None:
    """What a window search tells about its queue for the next plans."""
    if result.tail is not None:
        hint.tail, hint.tail_seen_at = result.tail, now
    if result.after is not None:
        hint.after = (result.end, result.after)
        if hint.tail is not None and hint.tail <= result.after[0]:
            hint.tail = None  # the queue grew past the tail last seen
