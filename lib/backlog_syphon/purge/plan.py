"""What the purge of one backlog queue settles (``PurgePlan``) and what it left (``PurgeResult``). Pure: the
state machine that walks a plan is ``purge.progress``, the receiving and settling ``servicebus.purge``.

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
- A recorded message that no receive brings (the migration mode's scheduled and deferred messages) is a
  ``special`` of the plan: settled by its own means (a scheduled one cancelled by its sequence number, a deferred
  one received by it), by identity, and never counted in what the receives expect.
- A session-enabled source (``sessions``) is received session by session, each session asked for its own
  recorded count: only a session receiver can settle its messages.
- Settling never outlives the locks (``settle_timing``): a page holds no more messages than the requests
  that fit inside its locks at the measured round trip can settle (one bulk completion, one bulk
  dead-lettering per distinct reason: ``dead_letter_groups``); a bulk request that fails is split and
  tried again within the locks (``BulkSettlement``), never walked one message at a time past them; what
  a page could not settle in time is released (no delivery count) and received again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from backlog_syphon.model import HeldSpan, RecordedSpan, SettleOrder
from backlog_syphon.partitions import is_partitioned_number, partition_of

RECEIVE_PAGE = 100  # messages asked for per receive call, at most
# A partitioned queue's round ends after this many receives in a row that brought nothing recorded (empty, or
# only other partitions' messages): each waits up to the purge's receive wait, and the next round goes on.
PARTITIONED_IDLE_RECEIVES = 4

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
    # The recorded messages a receive does not bring, by identity (scheduled, deferred): settled by their own means.
    special: dict[Identity, SettleOrder] = field(default_factory=dict)
    # A session-enabled source: its recorded messages per session (upper bounds after a crash); None elsewhere.
    sessions: dict[str, int] | None = None
    # The queue's lock duration where the administration API said (seconds): how long recorded messages
    # locked by an earlier receiver may take to come back (``purge.lock_wait``).
    lock_seconds: float | None = None

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
        """The plan once the messages present in its range are known (peeked): expect only those it holds (and a
        receive brings), and only the special ones still there."""
        there = [identity for identity in present if self.holds(identity)]
        special = {identity: order for identity, order in self.special.items() if identity in set(there)}
        return dataclasses.replace(self, expected=sum(1 for identity in there if identity not in special),
                                   special=special, verify=False)

    def in_session(self, session_id: str, expected: int) -> PurgePlan:
        """This plan as one session's: its receives ask that session for ``expected`` messages at most (its special
        messages are settled before, by their own means, ``servicebus.purge``; a look leaves them out)."""
        return dataclasses.replace(self, expected=expected, sessions=None, verify=False)

@dataclass(frozen=True)
class PurgeResult:
    completed: int
    dead_lettered: int
    released: int
    remaining: tuple[RecordedSpan, ...]  # spans with messages still there (their counts unknown)
    settled: tuple[RecordedSpan, ...]  # spans whose messages are all gone
    # A session-enabled source: per session of the plan, how much of its count this round took off: what it settled,
    # or all of it where the session's receive came back empty (nothing of it is left there).
    sessions_settled: dict[str, int] | None = None
    throttled: bool = False  # the round ended because the namespace throttled it (server-busy): not an answer

def span_after_peek(span: RecordedSpan, head: Identity | None) -> RecordedSpan | None:
    """What is left of ``span`` when ``head`` is the first message at or after its first sequence number.

    None (settled) when there is no such message, when it lies past the span, or when it is not one
    of the span's messages (its queue was recreated: the span's messages went with the old queue).
    """
    if head is None or not span.holds(*head):
        return None
    return dataclasses.replace(span, first=head[0])
