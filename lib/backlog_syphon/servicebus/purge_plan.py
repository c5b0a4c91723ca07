"""Planning the purge of one backlog queue: which received message to complete, dead-letter or give
back, and how many to ask for. Pure: the receiving and settling is ``settle.purge_backlog``.

A purge settles the messages of a backlog queue whose outcome is recorded, by identity: a received
message is settled only if one of the plan's ``RecordedSpan``s holds it (its sequence number *and*
its enqueue time), never because its sequence number falls inside a range. Recorded dead-letters
carry their reason; every other recorded message is completed.

Invariants:
- Only recorded messages are settled. A message no span holds (a queue recreated since, a message
  that was left unsent, anything unexpected at the head of the queue) is *released*: its lock is
  dropped without raising its delivery count, and the purge stops and says so.
- Except a message that *stays*: one the syphon left in the queue on purpose, which may lie before
  and between the recorded ones, where a receive meets it first. Stopping there would leave
  everything recorded behind it unsettled for the whole run, so such a message is *passed over*:
  kept locked (so the next receive goes past it; not settled, its delivery count untouched) while
  the purge settles what lies behind it, and released unchanged when the round ends. Which
  messages may stay (``PurgePlan.passes_over``):
  - in a backlog queue, those in the plan's ``HeldSpan`` (held for ``restore.skip_destinations``);
  - in a dead-letter sub-queue (a re-drive's, ``PurgePlan.passing``), any message no span holds:
    the re-drive did not select it, or an earlier re-drive dead-lettered it again.
  The I/O side ends the round before the first of those locks could run out (in a backlog queue an
  expired lock would raise the delivery count); a passed-over message that comes back, or one past
  the plan's last sequence number (nothing recorded lies behind it), ends the round too.
- Never ask for more messages than recorded ones are still there, and the ones that may stay on
  top, so the broker has no credit to fill with messages that are not recorded. After a crash some
  may be gone already: such a plan is verified (the recorded messages still there counted by
  peeking, which locks nothing) first. In a dead-letter sub-queue the count of messages that stay
  is unknown: the credit is a page there.
- What is left is decided by looking, not by counting: after the purge, each span is settled when
  the first message at or after its first sequence number is not one of its messages
  (``span_after_peek``).
- A partitioned queue (``PurgePlan.partitioned``) is not one ordered log: its receives interleave
  partitions and can come back empty while messages exist, so neither an empty receive nor an unrecorded
  message (another partition's, read by no batch yet) says that the recorded ones are gone. There the
  round goes on, releasing at once what no span holds (no delivery count, never settled), until every
  recorded message was seen or ``PARTITIONED_IDLE_RECEIVES`` receives in a row brought nothing recorded;
  and each receive asks for at least one message per partition (``LANES``), since one that asks for fewer
  can keep bringing the released messages of partitions that are done. Its verification peeks partition
  by partition (``PurgePlan.ranges``), never across partitions.
  What is left is still decided by looking: a peek at a span's first number answers from that span's
  partition while it holds anything there, and spans never cross partitions.
- Settling never outlives the locks (``settle_timing``): a page holds no more messages than the requests
  that fit inside its locks at the measured round trip can settle (one bulk completion, one bulk
  dead-lettering per distinct reason: ``dead_letter_groups``); a bulk request that fails is split and
  tried again within the locks (``BulkSettlement``), never walked one message at a time past them; what
  a page could not settle in time is released (no delivery count) and received again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from backlog_syphon.model import HeldSpan, RecordedSpan
from backlog_syphon.partitions import LANES, is_partitioned_number, partition_of
from backlog_syphon.servicebus.settle_timing import SettleTiming, page_size

RECEIVE_PAGE = 100  # messages asked for per receive call, at most
# A partitioned queue's round ends after this many receives in a row that brought nothing recorded (empty, or
# only other partitions' messages): each waits up to the purge's receive wait, and the next round goes on.
PARTITIONED_IDLE_RECEIVES = 4


def latest_of_each(sequence_numbers: list[int]) -> tuple[list[int], list[int]]:
    """Positions in a received page to settle and to give back: each message once, its latest delivery
    (the last in the page). Under load a page can hold a message twice, an earlier delivery whose lock was
    given up beside its redelivery; settling both would send one lock token twice in one request, which
    the broker refuses whole."""
    last = {seq: position for position, seq in enumerate(sequence_numbers)}
    keep = sorted(last.values())
    return keep, [position for position in range(len(sequence_numbers)) if last[sequence_numbers[position]] != position]


class BulkSettlement:
    """Settling received messages the same way (completing them, or dead-lettering them with one reason) in
    as few requests as possible, within their locks.

    All of them in one request first. A request refused because a lock was lost (one of its messages
    was settled already, or its lock ran out) is split in two and each half tried again, down to single
    messages, whose refusal is final: their lock is lost, and the next round receives them again. Any
    other failure ends it (the link is broken; the locks end by themselves). No request goes out once
    ``deadline`` (epoch seconds: ``settle_timing.SettleTiming.deadline``) has passed: what is left is
    released by the caller and received again. So a failed request costs about log2(n) requests more,
    never n round trips.
    """

    def __init__(self, items, deadline: float):
        self._pending: list[tuple] = [tuple(items)] if items else []
        self.deadline = deadline
        self.completed: list = []
        self.lost: list = []  # refused one by one: their lock is lost
        self.left: list = []  # not tried: the deadline passed, the link broke, or every lock seemed gone
        # Refusals in a row a few lost locks explain (each costs one path down the halves); past that,
        # every lock seems gone (the link that took them lost them all): no use splitting further.
        self._refusals_allowed = 2 * max(1, len(self._pending[0]) if self._pending else 1).bit_length()
        self._refusals = 0
        self.all_lost = False

    def next_request(self, now: float) -> tuple | None:
        """The next items to complete in one request, or None when done."""
        if self._pending and now >= self.deadline:
            self.stop()
        return self._pending[-1] if self._pending else None

    def succeeded(self, request: tuple) -> None:
        self._pending.remove(request)
        self.completed.extend(request)
        self._refusals = 0

    def lock_lost(self, request: tuple) -> None:
        self._pending.remove(request)
        self._refusals += 1
        if len(request) == 1:
            self.lost.extend(request)
        else:  # the second half is tried first: the last pushed is the next asked for
            half = len(request) // 2
            self._pending += [request[half:], request[:half]]
        if self._refusals > self._refusals_allowed:
            self.all_lost = True
            self.stop()

    def stop(self) -> None:
        """Send nothing more (the link broke, or the locks are about to end)."""
        for request in self._pending:
            self.left.extend(request)
        self._pending.clear()

    @property
    def unsettled(self) -> list:
        return self.lost + self.left

Identity = tuple[int, int | None]  # (sequence number, enqueue time in ms) of a message in one queue


@dataclass(frozen=True)
class PurgePlan:
    """What to settle in one backlog queue."""

    queue: str
    spans: tuple[RecordedSpan, ...]
    expected: int  # recorded messages still there, at most
    dead_letters: dict[Identity, tuple[str, str]] = field(default_factory=dict)  # -> (reason code, reason)
    # Some recorded messages may be gone already (settled by a run that crashed before it recorded
    # the purge): count what is still there before asking for that many.
    verify: bool = False
    # Where messages that stay may lie (the module docstring): passed over, never settled.
    held: HeldSpan | None = None  # a backlog queue's messages held for skipped destinations
    passing: bool = False  # a dead-letter sub-queue: any message no span holds may be one that stays
    # Receives interleave partitions (the module docstring): known from the administration API
    # (``sink.queue_marks.purge_plans``), else from the partition bits of the recorded numbers (``interleaved``).
    partitioned: bool = False

    def __post_init__(self):
        if self.expected < 0 or any(span.backlog_queue != self.queue for span in self.spans):
            raise ValueError(f"invalid purge plan for {self.queue}: expected={self.expected}")

    @property
    def last(self) -> int:
        return max((span.last for span in self.spans), default=0)

    def holds(self, identity: Identity) -> bool:
        return any(span.holds(*identity) for span in self.spans)

    def passes_over(self, identity: Identity) -> bool:
        """Whether ``identity`` (which no span holds) may be a message that stays in the queue: held for a
        skipped destination, or left in a dead-letter sub-queue by a re-drive."""
        return self.passing or (self.held is not None and self.held.holds(*identity))

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Where the recorded messages lie, ``(first, last)`` per partition (one range for a queue that is one
        ordered log): what a verification peeks. A peek walk from the first partition's first to the last
        one's last would page through every message of every partition between, recorded or not."""
        by_partition: dict[int, tuple[int, int]] = {}
        for span in self.spans:
            first, last = by_partition.get(partition_of(span.first), (span.first, span.last))
            by_partition[partition_of(span.first)] = (min(first, span.first), max(last, span.last))
        return tuple(by_partition[partition] for partition in sorted(by_partition))

    @property
    def interleaved(self) -> bool:
        """Whether receives may bring this queue's messages out of order: a partitioned queue's."""
        return self.partitioned or any(is_partitioned_number(span.last) for span in self.spans)

    def verified(self, present: list[Identity]) -> PurgePlan:
        """The plan once the messages present in its range are known (peeked): expect only those it holds."""
        return dataclasses.replace(self, expected=sum(1 for identity in present if self.holds(identity)),
                                   verify=False)


@dataclass(frozen=True)
class PageActions:
    """What to do with one page of received messages (by sequence number)."""

    complete: tuple[int, ...]
    dead_letter: tuple[tuple[int, str, str], ...]  # (sequence number, reason code, reason)
    release: tuple[int, ...]
    stop: bool  # the head of the queue left the plan: ask for nothing more
    pass_over: tuple[int, ...] = ()  # messages that stay: keep locked until the round ends, then release


def dead_letter_groups(orders: tuple[tuple[int, str, str], ...]) -> list[tuple[tuple[str, str], tuple[int, ...]]]:
    """``PageActions.dead_letter`` as one group per distinct (reason code, reason), the largest first: each
    group is one bulk request (every message of it gets the same DeadLetterReason and description)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for seq, code, reason in orders:
        groups.setdefault((code, reason), []).append(seq)
    return sorted(((key, tuple(seqs)) for key, seqs in groups.items()), key=lambda group: -len(group[1]))


@dataclass(frozen=True)
class PurgeResult:
    completed: int
    dead_lettered: int
    released: int
    remaining: tuple[RecordedSpan, ...]  # spans with messages still there (their counts unknown)
    settled: tuple[RecordedSpan, ...]  # spans whose messages are all gone


class PurgeProgress:
    """The purge of one queue as a state machine: ``credit`` -> receive -> ``on_page`` -> settle ->
    ``on_settled`` -> ... -> ``result``. ``timing`` (what this queue's purges measured, updated by the I/O
    side) sizes each page to what its locks can settle (``settle_timing.page_size``)."""

    def __init__(self, plan: PurgePlan, page: int = RECEIVE_PAGE, timing: SettleTiming | None = None):
        self.plan = plan
        self.max_page = page
        self.timing = timing if timing is not None else SettleTiming()
        self.seen = 0  # recorded messages received and settled, or lost (lost ones come back only later)
        self.completed = 0
        self.dead_lettered = 0
        self.released = 0
        self.passed = 0  # messages that stay, passed over (locked until the round ends)
        self._passed_over: set[int] = set()
        self._dead_letters_left = dict(plan.dead_letters)  # -> (reason code, reason): not dead-lettered yet
        self._page: dict[int, Identity] = {}  # the last page's recorded messages, by sequence number
        self._halted = False  # the round ends, whatever is left (see ``stopped``)
        self.idle_receives = 0  # receives in a row that brought nothing recorded (a partitioned queue's bound)
        self.late_only = False  # a page ended the round having settled nothing before its deadline

    @property
    def stopped(self) -> bool:
        """Whether the round is over: every recorded message was seen, or something ended it (an unrecorded
        message at the head, a passed-over one back, nothing received, nothing settled, locks running out)."""
        return self._halted or self.seen >= self.plan.expected

    @property
    def page(self) -> int:
        """Messages the next page may hold so that its locks can settle it (``credit`` then bounds it by what is
        left to receive)."""
        left = self._dead_letters_left
        return min(self.max_page, page_size(self.timing.requests_per_page(), max_page=self.max_page,
                                            remaining=max(1, self.plan.expected - self.seen),
                                            dead_letters=len(left), reasons=len(set(left.values()))))

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
        wanted = self.plan.expected - self.seen + held_left
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
        if not received:
            if self.plan.interleaved:  # a partitioned queue's receive can come back empty while messages exist
                self.idle_receives += 1
                self._halted = self.idle_receives >= PARTITIONED_IDLE_RECEIVES
                return PageActions((), (), (), self.stopped)
            self._halted = True  # nothing came within the wait: what is planned is not there (now)
            return PageActions((), (), (), True)
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
            self._halted = bool(again) or self.idle_receives >= PARTITIONED_IDLE_RECEIVES
        else:
            self._halted = bool(release) or bool(again) or passed_last
        return PageActions(tuple(complete), tuple(dead_letter), tuple(release), self.stopped, tuple(pass_over))

    def on_settled(self, completed: int, dead_lettered=(), *, given_back: int = 0) -> None:
        """The last page's settlement: ``completed`` messages completed, the sequence numbers ``dead_lettered``
        dead-lettered, and ``given_back`` recorded ones released unsettled because their locks would have
        ended first (received again next). A page that settled nothing ends the round: the next one would
        fare no better."""
        self.completed += completed
        self.dead_lettered += len(dead_lettered)
        for seq in dead_lettered:
            self._dead_letters_left.pop(self._page.get(seq), None)
        self.seen -= given_back
        if self._page and not completed and not dead_lettered:
            self._halted = True
            self.late_only = given_back > 0

    def result(self, heads: dict[int, Identity | None]) -> PurgeResult:
        """``heads[span.first]``: the first message at or after each span's first sequence number now."""
        remaining, settled = [], []
        for span in self.plan.spans:
            left = span_after_peek(span, heads.get(span.first))
            (settled if left is None else remaining).append(left or span)
        return PurgeResult(self.completed, self.dead_lettered, self.released, tuple(remaining), tuple(settled))


def span_after_peek(span: RecordedSpan, head: Identity | None) -> RecordedSpan | None:
    """What is left of ``span`` when ``head`` is the first message at or after its first sequence number.

    None (settled) when there is no such message, when it lies past the span, or when it is not one
    of the span's messages (its queue was recreated: the span's messages went with the old queue).
    """
    if head is None or not span.holds(*head):
        return None
    return dataclasses.replace(span, first=head[0])
