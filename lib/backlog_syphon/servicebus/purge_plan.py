"""Planning the purge of one backlog queue: which received message to complete, dead-letter or give
back, and how many to ask for. Pure: the receiving and settling is ``settle.purge_backlog``.

A purge settles the messages of a backlog queue whose outcome is recorded: every message with a
sequence number in ``[first, through]`` (the source reads each queue in contiguous windows, so every
message up to the highest recorded one has a recorded outcome). Recorded dead-letters carry their
reason; every other recorded message is completed.

Invariants:
- Only recorded messages are settled. A message outside ``[first, through]`` that the broker hands
  over anyway (a planned one was locked elsewhere or is gone, so the broker filled the credit with a
  later one) is *released*: its lock is dropped without raising its delivery count. The purge then
  stops, since the head of the queue is no longer what was planned.
- Never ask for more messages than recorded ones are still there, so the broker has no credit to
  fill with messages that are not recorded. After a crash some may be gone already: such a plan is
  verified (the messages still there counted by peeking, which locks nothing) before receiving.
- How far the queue is settled is decided by looking, not by counting: after the purge, the first
  message still at or after ``first`` tells (``settled_through``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

RECEIVE_PAGE = 100  # messages asked for per receive call


@dataclass(frozen=True)
class PurgePlan:
    """What to settle in one backlog queue."""

    queue: str
    first: int  # lowest sequence number that may still need settling (purged-through + 1)
    through: int  # highest sequence number with a recorded outcome
    expected: int  # recorded outcomes in [first, through]: at most this many are still there
    dead_letters: dict[int, tuple[str, str]] = field(default_factory=dict)  # seq -> (reason code, reason)
    # Some recorded messages may be gone already (settled by a run that crashed before it recorded
    # the purge): count what is still there before asking for that many.
    verify: bool = False

    def __post_init__(self):
        if self.first < 1 or self.through < self.first - 1 or self.expected < 0:
            raise ValueError(f"invalid purge plan for {self.queue}: first={self.first} through={self.through} "
                             f"expected={self.expected}")


@dataclass(frozen=True)
class PageActions:
    """What to do with one page of received messages (by sequence number)."""

    complete: tuple[int, ...]
    dead_letter: tuple[tuple[int, str, str], ...]  # (sequence number, reason code, reason)
    release: tuple[int, ...]
    stop: bool  # the head of the queue left the plan: ask for nothing more


@dataclass(frozen=True)
class PurgeResult:
    completed: int
    dead_lettered: int
    released: int
    settled_through: int  # every message up to here is settled (or was gone already)


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
        return min(self.page, self.plan.expected - self.seen)

    def on_page(self, sequence_numbers: list[int]) -> PageActions:
        if not sequence_numbers:
            self.stopped = True  # nothing came within the wait: what is planned is not there (now)
            return PageActions((), (), (), True)
        complete, dead_letter, release = [], [], []
        for seq in sequence_numbers:
            if self.plan.first <= seq <= self.plan.through:
                self.seen += 1
                action = self.plan.dead_letters.get(seq)
                if action is None:
                    complete.append(seq)
                else:
                    dead_letter.append((seq, action[0], action[1]))
            else:
                release.append(seq)
        self.released += len(release)
        self.stopped = bool(release) or self.seen >= self.plan.expected
        return PageActions(tuple(complete), tuple(dead_letter), tuple(release), self.stopped)

    def on_settled(self, completed: int, dead_lettered: int) -> None:
        self.completed += completed
        self.dead_lettered += dead_lettered

    def result(self, first_still_there: int | None) -> PurgeResult:
        """``first_still_there``: sequence number of the first message at or after ``plan.first`` now."""
        if first_still_there is None or first_still_there > self.plan.through:
            through = self.plan.through
        else:
            through = first_still_there - 1
        return PurgeResult(self.completed, self.dead_lettered, self.released, through)
