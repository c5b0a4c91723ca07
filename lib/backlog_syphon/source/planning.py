"""Planning which backlog messages a micro-batch reads: pure logic, no I/O, time passed in.

Offsets are ``{backlog queue name: {"incarnation": n, "next": next sequence number to read,
"seen_ms": newest enqueue time probed}}`` (``QueueOffset``; a bare number, as older versions wrote,
reads as the first incarnation). A window ``[start, end)`` of one queue is immutable once planned
(new messages always get higher sequence numbers), so a replayed batch peeks exactly the same
messages again. Window ends are found with single-message probes ("first message at or after x")
instead of downloading the messages twice. A window is closed only at an end a probe proved: no
message was at or after it, or one was past it (sequence numbers only grow, so none can appear
before it later).

Sequence numbers mean something only within one incarnation of a queue: a queue deleted and
created again numbers from 1 again. Every plan probes each queue's first message (its *head*); a
head below the offset that entered the backlog after every message probed so far cannot belong to
the same incarnation, so the queue was recreated: its offset starts again from the beginning, in a
new incarnation. A queue that does not exist is skipped with one warning.

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

``WindowPlanner`` holds what the stream reader remembers between triggers, so the reader itself
only translates between Spark and this module.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from backlog_syphon.errors import BacklogQueueMissingError
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
from backlog_syphon.source.window_search import UNKNOWN, WindowEnd, search_window

logger = logging.getLogger(__name__)



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


def normalise_offsets(offsets: Mapping[str, QueueOffset]) -> dict[str, dict]:
    """Offsets as Spark stores them, with a stable key order: Spark compares serialised offsets as strings."""
    return {queue: QueueOffset.parse(offsets[queue]).to_json() if not isinstance(offsets[queue], QueueOffset)
            else offsets[queue].to_json() for queue in sorted(offsets)}


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
    """The next micro-batch: each queue's offset at the window's end, and each probed queue's tail as
    last seen. ``restarted``: queues found recreated, whose windows start from the beginning."""

    end: dict[str, dict]
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


def plan_windows(start: Mapping[str, object], queues: Sequence[str], budget: int, probe_at_once: ProbeAtOnce, *,
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
    missing = set() if missing is None else missing
    hints = {} if hints is None else hints
    count = ProbeCount()
    seen: dict[str, list] = {}
    offsets = {queue: QueueOffset() for queue in queues}
    offsets.update({queue: QueueOffset.parse(value) for queue, value in start.items()})
    # Where a queue stays if no window moves it: exactly its start, a look back included, so that Spark
    # sees no change (and plans no empty batch) and ``windows`` no window for it.
    unmoved = dict(offsets)
    if target is not None:
        candidates = [queue for queue in offsets if queue in target]
    else:
        candidates = [queue for queue in offsets if backoff.due(queue, now)]

    heads = run_searches({queue: probe_once(1) for queue in candidates}, probe_at_once, count, seen)
    # An empty queue that its available-now target says holds messages: a second look before it counts
    # (a peek may come back empty while messages exist; the common case, a queue at its target, needs none).
    doubtful = [queue for queue in candidates
                if heads[queue] is None and target is not None and offsets[queue].next < target.get(queue, 0)]
    if doubtful:
        heads.update(run_searches({queue: probe_once(1) for queue in doubtful}, probe_at_once, count, seen))
    restarted: list[str] = []
    reread: dict[str, int] = {}
    firsts: dict[str, object] = {}
    for queue in candidates:
        head = heads[queue]
        if isinstance(head, BacklogQueueMissingError):
            if queue not in missing:
                logger.warning("backlog=%s does not exist: skipped (the other backlog queues drain); it is read "
                               "as soon as it exists", queue)
                missing.add(queue)
            backoff.record(queue, False, now)
            continue
        if queue in missing:
            logger.info("backlog=%s exists again", queue)
            missing.discard(queue)
        offset = offsets[queue]
        if offset.next > 1 and offset.recreated(head):
            logger.warning("backlog=%s was recreated (it numbers from 1 again, with messages enqueued after "
                           "every one read before): reading it from its start, incarnation %d",
                           queue, offset.incarnation + 1)
            offset = QueueOffset(offset.incarnation + 1, 0, None)
            restarted.append(queue)
        elif queue in look_back and offset.next > 1 and offset.left_behind(head):
            logger.info("backlog=%s holds messages below its offset %d (from %d): earlier runs left them; this "
                        "batch reads them again (what is recorded is not sent again)", queue, offset.next, head[0])
            reread[queue] = head[0]
            offset = dataclasses.replace(offset, next=head[0], reread_from=None)
        offsets[queue] = offset
        hint = hints.get(queue)
        if hint is None or hint.incarnation != offset.incarnation:
            hint = hints[queue] = QueueHints(offset.incarnation)
        hint.head = head
        if head is None:
            firsts[queue] = None
        elif head[0] >= offset.next:
            firsts[queue] = head  # nothing left below the offset: the head is where the window starts
        elif hint.after is not None and hint.after[0] == offset.next:
            firsts[queue] = hint.after[1]
        else:
            firsts[queue] = UNKNOWN

    def bound_of(queue: str) -> int | None:
        return None if target is None or queue in restarted else target.get(queue, 0)

    empty = [queue for queue, first in firsts.items() if first is None]
    demands: dict[str, int | None] = {}
    for queue, first in firsts.items():
        bound, offset, hint = bound_of(queue), offsets[queue], hints[queue]
        from_ = offset.next if first is UNKNOWN or first is None else first[0]
        if first is None or (bound is not None and offset.next >= bound):
            demands[queue] = 0  # empty, or at its available-now target: only checked for a recreation
        elif bound is not None:
            demands[queue] = max(1, bound - from_)
        elif hint.tail is not None and hint.tail > from_:
            demands[queue] = hint.tail - from_  # may have grown: a full window asks for more below
        else:
            demands[queue] = None
    grants = split_budget(budget, demands)

    planned: dict[str, _Window] = {}
    found = run_searches({queue: search_window(offsets[queue].next, grant, firsts[queue],
                                               tail_hint=hints[queue].tail, bound=bound_of(queue))
                          for queue, grant in grants.items()}, probe_at_once, count, seen)
    for queue, result in found.items():
        if isinstance(result, BacklogQueueMissingError):  # deleted since its head was probed
            backoff.record(queue, False, now)
            continue
        planned[queue] = _Window(offsets[queue], result.end, _used(result), result.full, result.after, bound_of(queue))
        _learn(hints[queue], result, now)

    for _ in range(_REDISTRIBUTION_ROUNDS):
        unused = budget - sum(window.used for window in planned.values())
        hungry = [queue for queue, window in planned.items() if window.hungry]
        if unused < 1 or not hungry:
            break
        # Fewer left than hungry queues: one each to the first, so that a batch takes its whole budget.
        more = run_searches({queue: search_window(planned[queue].end, grant, planned[queue].after or UNKNOWN,
                                                  tail_hint=hints[queue].tail, bound=planned[queue].bound)
                             for queue, grant in share_budget(unused, hungry[:unused]).items()},
                            probe_at_once, count, seen)
        for queue, result in more.items():
            window = planned[queue]
            if isinstance(result, BacklogQueueMissingError):  # deleted meanwhile: its window so far stands
                window.closed = True
                continue
            window.used += _used(result)
            window.end, window.full, window.after = max(window.end, result.end), result.full, result.after
            _learn(hints[queue], result, now)

    for queue in empty:
        bound = bound_of(queue)
        if bound is not None and offsets[queue].next < bound:
            # Nothing at all left before its available-now target (emptied by someone else): the offset
            # moves there, or the run would wait for it forever.
            planned[queue] = _Window(offsets[queue], bound, 0, False, None, bound)
        else:
            backoff.record(queue, False, now)
    tails = _tails(planned, hints, restarted, target, probe_at_once, count, seen, now)
    for queue in empty:
        tails.setdefault(queue, offsets[queue].next)
    for queue, identities in seen.items():
        if queue in hints and queue not in missing:
            hints[queue].saw(identities)
    end = dict(unmoved)
    for queue, window in planned.items():
        offset = window.offset
        backoff.record(queue, window.end > offset.next, now)
        # An offset moves only with its window: Spark plans a batch whenever an offset changes.
        if window.end > offset.next or queue in restarted:
            hint = hints[queue]
            newest = max((ms for ms in (offset.seen_ms, hint.newest_ms) if ms is not None), default=None)
            end[queue] = QueueOffset(offset.incarnation, window.end, newest,
                                     reread.get(queue) if queue not in restarted else None)
    looked = tuple(queue for queue in candidates if queue not in missing)
    return WindowPlan(normalise_offsets(end), tails, tuple(restarted), looked, count)


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


def _tails(planned: dict[str, _Window], hints: dict[str, QueueHints], restarted: list[str],
           target: Mapping[str, int] | None, probe_at_once: ProbeAtOnce, count: ProbeCount, seen: dict,
           now: float) -> dict[str, int]:
    """Each planned queue's tail, for reports (and, for a queue recreated during an available-now run, its
    new target): from the hints, probed again only when the window passed the tail last seen or it is
    ``TAIL_REFRESH_SECONDS`` old. Under a target the rest of a queue beyond it does not matter."""
    tails: dict[str, int] = {}
    searches: dict[str, Search] = {}
    for queue, window in planned.items():
        hint = hints[queue]
        if not window.full:
            tails[queue] = max(window.end, hint.tail or 0)
            continue
        if target is not None and queue not in restarted:
            tails[queue] = max(window.end, hint.tail or 0, target.get(queue, 0))
            continue
        fresh = hint.tail_seen_at is not None and now - hint.tail_seen_at < TAIL_REFRESH_SECONDS
        if hint.tail is not None and hint.tail > window.end and fresh:
            tails[queue] = hint.tail
        elif hint.tail is not None and hint.tail > window.end:
            searches[queue] = search_tail_from(hint.tail)
        elif window.after is not None:
            searches[queue] = search_tail(window.after)
        else:
            searches[queue] = search_tail_from(window.end)
    for queue, tail in run_searches(searches, probe_at_once, count, seen).items():
        if isinstance(tail, BacklogQueueMissingError):
            tails[queue] = planned[queue].end
            continue
        hints[queue].tail, hints[queue].tail_seen_at = tail, now
        tails[queue] = max(tail, planned[queue].end)
    return tails


ALL_AVAILABLE_BUDGET = 1 << 40  # "no limit": more sequence numbers than any queue holds
PLAN_KEY = "(last plan)"  # in the reported latest offset: the probes and rounds of the plan behind it


class WindowPlanner:
    """The stream reader's driver-side planning: its start, the available-now target, each queue's
    window end per trigger, and each queue's tail and head as last seen (for progress reports).

    ``probe_at_once`` probes one sequence number in each of several queues, together.
    ``max_messages`` bounds a batch unless Spark passes its own read limit; ``available_now`` without
    a read limit from Spark (Spark 4.0/4.1) means one batch of everything, since those versions have
    no available-now target for Python sources.
    """

    def __init__(self, probe_at_once: ProbeAtOnce, *, max_messages: int, available_now: bool,
                 idle_probe_max_seconds: float, look_back: Collection[str] = ()):
        self.probe_at_once = probe_at_once
        self.max_messages = max_messages
        self.available_now = available_now
        self.backoff = IdleBackoff(max_seconds=idle_probe_max_seconds)
        self.target: dict[str, int] | None = None  # available-now: stop here
        self.target_wanted = False  # an available-now run: the target is fixed by the next plan
        self.last_end: dict[str, dict] | None = None  # Spark 4.0/4.1 ask for the latest offset without a start
        self.tails: dict[str, int] = {}  # queue -> end of what was in it when last probed
        self.hints: dict[str, QueueHints] = {}
        self.missing: set[str] = set()  # configured queues that do not exist (warned about once)
        self.last_count = ProbeCount()  # the last plan's round trips (the target's included)
        # Queues where earlier runs held messages for skipped destinations: looked back at once, when this
        # run first plans them (``looked_back``). Only those: a look back elsewhere would only re-read
        # recorded messages the purge has not settled yet.
        self.look_back = frozenset(look_back)
        self.looked_back: set[str] = set()
        # Queues whose target rests on one answer "nothing at or after the offset": the plan's head probe is
        # their second look (``_confirm_targets``).
        self.unconfirmed: set[str] = set()

    @staticmethod
    def initial_offset(queues: Sequence[str]) -> dict[str, dict]:
        return normalise_offsets({queue: QueueOffset() for queue in queues})

    def prepare_available_now(self) -> None:
        """An available-now run: the next plan fixes the target, every queue's tail then (its probes start
        at the batch's start offsets, so a drained backlog costs one probe per queue)."""
        self.target_wanted = True

    def fix_target(self, start: Mapping[str, object], queues: Sequence[str], count: ProbeCount) -> dict[str, int]:
        """Every queue's tail now, all queues at once, each searched from its offset (a missing queue: 0). An
        end found past a message is looked at twice (``probing.search_tail``); a queue found empty from its
        offset is looked at again by the plan's head probe (``_confirm_targets``), which costs nothing more."""
        offsets = {queue: QueueOffset.parse(start.get(queue, 0)) for queue in queues}
        seen: dict[str, list] = {}
        tails = run_searches({queue: search_tail_from(offsets[queue].next, confirm=True) for queue in queues},
                             self.probe_at_once, count, seen)
        self.unconfirmed = {queue for queue in queues if tails[queue] == offsets[queue].next}
        self.target = {}
        for queue in queues:
            tail = tails[queue]
            if isinstance(tail, BacklogQueueMissingError):
                if queue not in self.missing:
                    logger.warning("backlog=%s does not exist: skipped (the other backlog queues drain)", queue)
                    self.missing.add(queue)
                tail = 0
            else:
                hint = self.hints.get(queue)
                if hint is None or hint.incarnation != offsets[queue].incarnation:
                    hint = self.hints[queue] = QueueHints(offsets[queue].incarnation)
                hint.saw(seen.get(queue, ()))  # the target's messages: a window closed at it holds none newer
            self.target[queue] = tail
        logger.info("available-now target: %s (%d probes in %d rounds)", self.target, count.probes, count.rounds)
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
        count = ProbeCount()
        if self.target_wanted and self.target is None:
            self.fix_target(start, queues, count)
        plan = self._plan(start, queues, budget, now)
        count.add(plan.count)
        if self.unconfirmed and self._confirm_targets(plan, count):
            plan = self._plan(start, queues, budget, now)  # the target was wrong: plan again with the right one
            count.add(plan.count)
        self.last_count = count
        self.looked_back.update(plan.looked)
        for queue in plan.restarted:
            self.tails.pop(queue, None)
            if self.target is not None:  # an available-now run drains what the new queue holds now
                self.target[queue] = max(plan.tails.get(queue, 0), position(plan.end[queue]))
        for queue, tail in plan.tails.items():
            self.tails[queue] = max(tail, self.tails.get(queue, 0))
        self.last_end = plan.end
        return self.last_end

    def _plan(self, start: Mapping[str, object], queues: Sequence[str], budget: int, now: float) -> WindowPlan:
        return plan_windows(start, queues, budget, self.probe_at_once, backoff=self.backoff, now=now,
                            target=self.target, missing=self.missing, look_back=self.look_back - self.looked_back,
                            hints=self.hints)

    def _confirm_targets(self, plan: WindowPlan, count: ProbeCount) -> bool:
        """The second look at the queues the target found empty from their offsets: the plan's head probe
        (nothing at all: confirmed; a message at or past the target: it was wrong), or, where the head lies
        below the offset, one probe at the target. A wrong target is searched again from the message found
        (``search_tail``, confirmed); True when one was."""
        unconfirmed, self.unconfirmed = self.unconfirmed - set(plan.restarted) - self.missing, set()
        found, ask = {}, {}
        for queue in sorted(unconfirmed):
            head = self.hints[queue].head
            if head is not None and head[0] >= self.target[queue]:
                found[queue] = head
            elif head is not None:
                ask[queue] = self.target[queue]
        answers = run_searches({queue: probe_once(at) for queue, at in ask.items()}, self.probe_at_once, count)
        found.update({queue: answer for queue, answer in answers.items() if isinstance(answer, tuple)})
        if not found:
            return False
        seen: dict[str, list] = {}
        tails = run_searches({queue: search_tail(head, confirm=True) for queue, head in found.items()},
                             self.probe_at_once, count, seen)
        for queue, tail in tails.items():
            if isinstance(tail, BacklogQueueMissingError):
                continue
            logger.warning("backlog=%s: a peek came back empty from %d although messages were there; the "
                           "available-now target moves from %d to %d", queue, self.target[queue],
                           self.target[queue], tail)
            self.target[queue] = tail
            self.hints[queue].saw(seen.get(queue, ()))
        return True

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

    def reported_latest(self, now_ms: int) -> dict[str, dict] | None:
        """Each queue's backlog as last probed, or None before any probe: its tail (``next``, never behind the
        planned end), the sequence numbers left behind the planned end (``remaining``, an upper bound), and
        the age of its oldest message (``oldest_age_seconds``, the head's; messages delivered and not yet
        settled included); and under ``PLAN_KEY`` (no queue is named so) what the last plan cost. Nothing
        here costs a probe."""
        if not self.tails:
            return None
        ends = self.last_end or {}
        reported = {}
        for queue, tail in sorted(self.tails.items()):
            planned = position(ends.get(queue, 0))
            head = self.hints[queue].head if queue in self.hints else None
            oldest = None if head is None or head[1] is None else max(0.0, (now_ms - head[1]) / 1000)
            reported[queue] = {"next": max(tail, planned), "remaining": max(0, tail - planned),
                               "oldest_age_seconds": None if oldest is None else round(oldest, 1)}
        reported[PLAN_KEY] = {"probes": self.last_count.probes, "rounds": self.last_count.rounds}
        return reported


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
