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
- Never ask for more messages than recorded ones are still there, so the broker has no credit to
  fill with messages that are not recorded. After a crash some may be gone already: such a plan is
  verified (the recorded messages still there counted by peeking, which locks nothing) first.
- What is left is decided by looking, not by counting: after the purge, each span is settled when
  the first message at or after its first sequence number is not one of its messages
  (``span_after_peek``).

A dead-letter sub-queue (a re-drive's) is purged in *passing* mode (``PurgePlan.passing``): messages
the re-drive left there (not selected, or still undeliverable) stay, and they can lie before and
between the recorded ones, where a receive meets them first. So a message no span holds is *kept*
locked (not settled, its delivery count untouched) while the receives go on past it, and all kept
messages are released together at the end; the purge stops once every recorded message still there
was seen, a message past the plan's last sequence number came, or a receive came back empty. Locking
them briefly is harmless there: a dead-letter queue has no maximum delivery count, never
dead-letters, and a release does not count as a delivery. The credit is a page, not the count of
recorded messages, since the kept ones take some of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from backlog_syphon.model import RecordedSpan

RECEIVE_PAGE = 100  # messages asked for per receive call

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
    # A dead-letter sub-queue: receive past (and keep locked until the end) the messages no span holds,
    # instead of stopping at the first (see the module docstring).
    passing: bool = False

    def __post_init__(self):
        if self.expected < 0 or any(span.backlog_queue != self.queue for span in self.spans):
            raise ValueError(f"invalid purge plan for {self.queue}: expected={self.expected}")

    @property
    def first(self) -> int:
        return min((span.first for span in self.spans), default=1)

    @property
    def last(self) -> int:
        return max((span.last for span in self.spans), default=0)

    def holds(self, identity: Identity) -> bool:
        return any(span.holds(*identity) for span in self.spans)

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
    keep: tuple[int, ...] = ()  # passing mode: not the plan's; keep locked, release when the purge ends


@dataclass(frozen=True)
class PurgeResult:
    completed: int
    dead_lettered: int
    released: int
    remaining: tuple[RecordedSpan, ...]  # spans with messages still there (their counts unknown)
    settled: tuple[RecordedSpan, ...]  # spans whose messages are all gone


class PurgeProgress:
    """The purge of one queue as a state machine: ``credit`` -> receive -> ``on_page`` -> ... -> ``result``."""

    def __init__(self, plan: PurgePlan, page: int = RECEIVE_PAGE):
        self.plan = plan
        self.page = page
        self.seen = 0
        self.completed = 0
        self.dead_lettered = 0
        self.released = 0
        self.stopped = plan.expected == 0

    def credit(self) -> int:
        """How many messages the next receive call may ask for; 0 means the purge is over."""
        if self.stopped:
            return 0
        if self.plan.passing:
            return self.page  # kept messages take some of it: the plan's count is no bound here
        return min(self.page, self.plan.expected - self.seen)

    def on_page(self, received: list[Identity]) -> PageActions:
        """``received``: the identities of the messages one receive call brought, in any order."""
        if not received:
            self.stopped = True  # nothing came within the wait: what is planned is not there (now)
            return PageActions((), (), (), True)
        complete, dead_letter, release, keep = [], [], [], []
        passed_last = False
        for identity in sorted(received, key=lambda item: item[0]):
            seq = identity[0]
            if not self.plan.holds(identity):
                if self.plan.passing:
                    keep.append(seq)
                    passed_last = passed_last or seq > self.plan.last
                else:
                    release.append(seq)
                continue
            self.seen += 1
            reason = self.plan.dead_letters.get(identity)
            if reason is None:
                complete.append(seq)
            else:
                dead_letter.append((seq, reason[0], reason[1]))
        self.released += len(release) + len(keep)
        self.stopped = bool(release) or passed_last or self.seen >= self.plan.expected
        return PageActions(tuple(complete), tuple(dead_letter), tuple(release), self.stopped, tuple(keep))

    def on_settled(self, completed: int, dead_lettered: int) -> None:
        self.completed += completed
        self.dead_lettered += dead_lettered

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
