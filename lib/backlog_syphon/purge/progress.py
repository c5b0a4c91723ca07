"""The purge of one queue as a state machine (``PurgeProgress``): how many messages to ask for, what to do
with each received page (complete, dead-letter, release or pass over), and when the round ends. Pure: the
receiving and settling is ``servicebus.purge``'s; what to settle is the plan's (``purge.plan``, whose
docstring states the invariants).

A round that *misses* recorded messages (a receive brings none of those it expects: it comes back empty, or
with other messages) does not end on that alone: the I/O side first looks (peeks) how many recorded ones are
still there (``on_look``). None: the round ends. Some: another receiver holds their locks (a run killed while
its purge held them), and the round waits for those locks to end, within one lock duration
(``purge.lock_wait``), before it gives up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from backlog_syphon.partitions import LANES, partition_of
from backlog_syphon.purge.lock_wait import LockWait
from backlog_syphon.purge.plan import (
    PARTITIONED_IDLE_RECEIVES,
    RECEIVE_PAGE,
    Identity,
    PurgePlan,
    PurgeResult,
    span_after_peek,
)
from backlog_syphon.purge.settle_timing import SettleTiming, page_size


def latest_of_each(sequence_numbers: list[int]) -> tuple[list[int], list[int]]:
    """Positions in a received page to settle and to give back: each message once, its latest delivery
    (the last in the page). Under load a page can hold a message twice, an earlier delivery whose lock was
    given up beside its redelivery; settling both would send one lock token twice in one request, which
    the broker refuses whole."""
    last = {seq: position for position, seq in enumerate(sequence_numbers)}
    keep = sorted(last.values())
    return keep, [position for position in range(len(sequence_numbers)) if last[sequence_numbers[position]] != position]

@dataclass(frozen=True)
class PageActions:
    """What to do with one page of received messages (by sequence number)."""

    complete: tuple[int, ...]
    dead_letter: tuple[tuple[int, str, str], ...]  # (sequence number, reason code, reason)
    release: tuple[int, ...]
    stop: bool  # ask for nothing more (unless a look finds recorded messages still there: ``look``)
    pass_over: tuple[int, ...] = ()  # messages that stay: keep locked until the round ends, then release
    look: bool = False  # the page missed recorded messages: count those still there (``PurgeProgress.on_look``)


def dead_letter_groups(orders: tuple[tuple[int, str, str], ...]) -> list[tuple[tuple[str, str], tuple[int, ...]]]:
    """``PageActions.dead_letter`` as one group per distinct (reason code, reason), the largest first: each
    group is one bulk request (every message of it gets the same DeadLetterReason and description)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for seq, code, reason in orders:
        groups.setdefault((code, reason), []).append(seq)
    return sorted(((key, tuple(seqs)) for key, seqs in groups.items()), key=lambda group: -len(group[1]))

class PurgeProgress:
    """The purge of one queue as a state machine: ``credit`` -> receive -> ``on_page`` -> settle ->
    ``on_settled`` -> ... -> ``result``. ``timing`` (what this queue's purges measured, updated by the I/O
    side) sizes each page to what its locks can settle (``settle_timing.page_size``)."""

    def __init__(self, plan: PurgePlan, page: int = RECEIVE_PAGE, timing: SettleTiming | None = None):
        self.plan = plan
        self.max_page = page
        self.timing = timing if timing is not None else SettleTiming()
        self.expected = plan.expected  # recorded messages still there, at most (a look counts them again)
        self.seen = 0  # recorded messages received and settled, or lost (lost ones come back only later)
        self.completed = 0
        self.dead_lettered = 0
        self.released = 0
        self.passed = 0  # messages that stay, passed over (locked until the round ends)
        self._passed_over: set[int] = set()
        self._dead_letters_left = dict(plan.dead_letters)  # -> (reason code, reason): not dead-lettered yet
        self._page: dict[int, Identity] = {}  # the last page's recorded messages, by sequence number
        self._halted = False  # the round ends, whatever is left (see ``stopped``)
        self._missed = False  # the last receive missed recorded messages: the round ends unless a look says
        self.idle_receives = 0  # receives in a row that brought nothing recorded (a partitioned queue's bound)
        self.late_only = False  # a page ended the round having settled nothing before its deadline
        self.came_up_empty = False  # a look found no recorded message still there (``on_look``)
        self._settled: set[Identity] = set()  # what this round settled, by identity
        self.lock_wait: LockWait | None = None  # waiting for recorded messages locked elsewhere (``on_look``)
        self._brought_recorded = True  # the last receive brought recorded messages (or nothing at all)
        # Per partition, the first unrecorded message received since the last look: recorded ones before it
        # were skipped by the receives (locked elsewhere), those after it lie behind it.
        self._first_other: dict[int, int] = {}

    @property
    def stopped(self) -> bool:
        """Whether the round is over: every recorded message was seen, or something ended it (an unrecorded
        message at the head, a passed-over one back, nothing received, nothing settled, locks running out),
        or a receive missed recorded messages (until ``on_look`` says some are still there)."""
        return self._halted or self._missed or self.seen >= self.expected

    @property
    def wants_look(self) -> bool:
        """A receive missed recorded messages the round still expects: before it ends, the I/O side counts
        how many are still there (``on_look``)."""
        return self._missed and not self._halted and self.seen < self.expected

    def on_look(self, present: Sequence[Identity], now: float) -> None:
        """``present``: the messages peeked in the plan's ranges now (those this round settled are gone).

        The recorded ones among them that the receives skipped (nothing came, or only messages after them in
        their partition) are locked by a receiver this round cannot see (``purge.lock_wait``): the round
        receives on, waiting for them until one lock duration and a round trip after its first miss, then
        ends. Recorded ones behind an unrecorded message end the round as always (the purge stops there
        until it is recorded), and so does finding none."""
        self._missed = False
        self.idle_receives = 0
        # A recorded message no receive brings (``PurgePlan.special``: settled by its own means) is not waited for.
        recorded = [identity for identity in present if self.plan.holds(identity) and identity not in self.plan.special]
        skipped = [identity for identity in recorded
                   if identity[0] < self._first_other.get(partition_of(identity[0]), identity[0] + 1)]
        self._first_other = {}
        self.expected = self.completed + self.dead_lettered + len(recorded)
        self.came_up_empty = not recorded
        if not skipped:
            self._halted = True
        elif self.lock_wait is None:
            self.lock_wait = LockWait.start(now, len(skipped), queue_lock=self.plan.lock_seconds,
                                            seen_lock=self.timing.lock_seconds, round_trip=self.timing.round_trip)
        elif self.lock_wait.over(now):
            self._halted = True  # someone alive holds them: a later round tries again

    def receive_wait(self, now: float, default: float) -> float:
        """How long the next receive may wait for a message: ``default``, or while waiting for locks held
        elsewhere, until that wait ends (a receive answers as soon as one is available)."""
        return default if self.lock_wait is None else max(default, self.lock_wait.receive_wait(now))

    def pause_before_receive(self, now: float) -> float:
        """Seconds to pause before the next receive: while waiting for locks held elsewhere, after a receive
        that brought only other messages (released: they would come again at once); else none."""
        if self.lock_wait is None or self._brought_recorded:
            return 0.0
        return self.lock_wait.pause(now)

    @property
    def page(self) -> int:
        """Messages the next page may hold so that its locks can settle it (``credit`` then bounds it by what is
        left to receive)."""
        left = self._dead_letters_left
        return min(self.max_page, page_size(self.timing.requests_per_page(), max_page=self.max_page,
                                            remaining=max(1, self.expected - self.seen),
                                            dead_letters=len(left), reasons=len(set(left.values()))))

    @property
    def left(self) -> int:
        """Recorded messages the round still expects to receive."""
        return max(0, self.expected - self.seen)

    def requests_needed(self) -> int:
        """Requests the next page needs at most: its completion, and one per dead-letter reason left (no more
        than fit inside its locks: the page is sized so)."""
        needed = 1 + len(set(self._dead_letters_left.values()))
        fits = self.timing.requests_per_page()
        return needed if fits is None else max(1, min(fits, needed))

    def credit(self) -> int:
        """How many messages the next receive call may ask for; 0 means the purge is over.

        Messages that stay may lie in front of the recorded ones: as many as the held span counts (less
        those passed already) may be asked for on top; any that turn out to lie behind are released.
        In a dead-letter sub-queue their count is unknown: a page."""
        if self.stopped:
            return 0
        page = self.page
        if page < 1:
            return 0  # not even one request fits inside a lock at this round trip (the I/O side says so)
        if self.plan.passing:
            return page
        held_left = max(0, self.plan.held.count - self.passed) if self.plan.held is not None else 0
        wanted = self.expected - self.seen + held_left
        if self.plan.interleaved:
            # A receive takes each partition's next message in turn: asked for fewer than the partitions, it can
            # bring only partitions whose recorded messages are all settled (their unrecorded ones, released),
            # again and again, and never reach the few recorded ones left elsewhere.
            wanted = max(wanted, LANES)
        return min(page, wanted)

    def locks_running_out(self) -> None:
        """The locks of the messages passed over are about to end: this round stops (they are released)."""
        self._halted = True

    def on_page(self, received: list[Identity]) -> PageActions:
        """``received``: the identities of the messages one receive call brought, in any order."""
        self._page = {}
        self._brought_recorded = not received
        if not received:
            if self.plan.interleaved:  # a partitioned queue's receive can come back empty while messages exist
                self.idle_receives += 1
                self._missed = self.idle_receives >= PARTITIONED_IDLE_RECEIVES
            else:
                self._missed = True  # nothing came within the wait: what is planned is not there, or locked
            return PageActions((), (), (), self.stopped, look=self.wants_look)
        complete, dead_letter, release, pass_over = [], [], [], []
        for identity in sorted(received, key=lambda item: item[0]):
            seq = identity[0]
            if not self.plan.holds(identity):
                (pass_over if self.plan.passes_over(identity) else release).append(seq)
                continue
            self.seen += 1
            self._page[seq] = identity
            reason = self.plan.dead_letters.get(identity)
            if reason is None:
                complete.append(seq)
            else:
                dead_letter.append((seq, reason[0], reason[1]))
        self._brought_recorded = bool(self._page)
        for seq in release:
            lane = partition_of(seq)
            self._first_other[lane] = min(seq, self._first_other.get(lane, seq))
        self.released += len(release)
        self.passed += len(pass_over)
        # A passed-over message that comes back was not kept locked after all: stop rather than go round
        # again. One past the plan's last sequence number has nothing recorded behind it.
        again = self._passed_over.intersection(pass_over)
        self._passed_over.update(pass_over)
        passed_last = any(seq > self.plan.last for seq in pass_over)
        if self.plan.interleaved:
            # Another partition's message says nothing about this one's: go on while receives bring recorded
            # ones, up to a bound of those that bring none (what was released comes round again).
            self.idle_receives = 0 if self._page else self.idle_receives + 1
            self._halted = bool(again)
            self._missed = self.idle_receives >= PARTITIONED_IDLE_RECEIVES
        else:
            # Something unrecorded at the head: the recorded ones before it are gone, or locked elsewhere.
            self._halted = bool(again) or passed_last
            self._missed = bool(release)
        return PageActions(tuple(complete), tuple(dead_letter), tuple(release), self.stopped, tuple(pass_over),
                           look=self.wants_look)

    def on_settled(self, completed: int, dead_lettered=(), *, given_back: int = 0, completed_numbers=()) -> None:
        """The last page's settlement: ``completed`` messages completed (``completed_numbers``, where the caller
        knows which), the sequence numbers ``dead_lettered`` dead-lettered, and ``given_back`` recorded ones
        released unsettled because their locks would have ended first (received again next). A page that
        settled nothing ends the round: the next one would fare no better."""
        self.completed += completed
        self.dead_lettered += len(dead_lettered)
        for seq in dead_lettered:
            self._dead_letters_left.pop(self._page.get(seq), None)
        self._settled.update(self._page[seq] for seq in (*completed_numbers, *dead_lettered) if seq in self._page)
        self.seen -= given_back
        if self._page and not completed and not dead_lettered:
            self._halted = True
            self.late_only = given_back > 0

    def settled_whole(self, span) -> bool:
        """Whether this round settled every recorded message of ``span``: it is settled, no look needed."""
        return sum(1 for identity in self._settled if span.holds(*identity)) >= span.count

    def throttled_result(self) -> PurgeResult:
        """The result of a round a throttled receive ended: no look was made, so a span it did not settle whole
        stays as it was (its first message may have gone: the next plan verifies, see ``after_purge``)."""
        settled = tuple(span for span in self.plan.spans if self.settled_whole(span))
        remaining = tuple(span for span in self.plan.spans if not self.settled_whole(span))
        return PurgeResult(self.completed, self.dead_lettered, self.released, remaining, settled, throttled=True)

    def result(self, heads: dict[int, Identity | None]) -> PurgeResult:
        """``heads[span.first]``: the first message at or after each span's first sequence number now (none
        needed for a span this round settled whole: ``settled_whole``)."""
        remaining, settled = [], []
        for span in self.plan.spans:
            left = None if self.settled_whole(span) else span_after_peek(span, heads.get(span.first))
            (settled if left is None else remaining).append(left or span)
        return PurgeResult(self.completed, self.dead_lettered, self.released, tuple(remaining), tuple(settled))
