"""The typed records of the tables (audit, checkpoint, lease, runs) and of what the driver keeps per backlog
queue: the status's broker counts, the spans of recorded and held messages the purge settles or passes
over by identity, and the dead-letter orders it carries out.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypedDict

from backlog_syphon.model.vocabulary import NamespaceRole


Int32 = int  # an int stored as a 32-bit column (table schemas are derived from these annotations)


class OutcomeRecord(TypedDict):
    """One backlog message's outcome: a row of the audit table (``rows.OUTCOME_ROW_SCHEMA``,
    which the table extends with its partition column ``outcome_date``).

    A ``TypedDict``, not a dataclass: the sink builds one per message and hands them to Arrow as
    mappings, so the type costs nothing at run time.
    """

    run_id: str
    batch_id: int
    backlog_queue: str
    sequence_number: int
    message_id: str | None
    destination: str | None
    session_id: str | None
    outcome: str  # an Outcome's value
    reason_code: str | None  # a ReasonCode's value
    reason: str | None
    body_size: Int32 | None
    enqueued_time: datetime | None  # when it entered the backlog
    scheduled_enqueue_time: datetime | None
    time_to_live_ms: int | None  # TTL given to the re-sent message
    outcome_time: datetime  # delivered (or dead-letter decided) at
    attempts: Int32
    # A re-drive's rows: why the broker (or the syphon) had dead-lettered the message it read from a
    # dead-letter sub-queue (its DeadLetterReason and DeadLetterErrorDescription); null for backlog rows.
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    # The destination x-ms-path named when ``restore.destination_map`` renamed it (``destination`` is then
    # the new name); null when the map did not apply. Columns are only ever appended to the table.
    original_destination: str | None
    # The migration mode's rows: the message's state when it was read (a MessageState: a scheduled or deferred
    # message is settled by its own means, ``SettleOrder``); null for backlog rows.
    message_state: str | None


@dataclass(frozen=True)
class CheckpointRow:
    """One backlog queue's progress: a row of the checkpoint table.

    Sequence numbers mean something only within one incarnation of a queue (a queue deleted and
    created again numbers from 1 again), so the marks come with the enqueue times that identify
    the messages they name.
    """

    backlog_queue: str
    incarnation: int  # 1, then one more each time the queue was found numbering from the start again
    delivered_through: int  # highest sequence number with a recorded outcome, in this incarnation
    delivered_enqueued_ms: int | None  # ... and when that message entered the backlog (ms since the epoch)
    purged_through: int  # highest sequence number whose recorded message is settled, in this incarnation
    # Every recorded message of the queue that entered the backlog at or before this time is settled
    # (whatever its incarnation): where a restart starts looking for what may still need settling.
    purged_enqueued_ms: int | None
    last_batch_id: int
    last_run_id: str
    updated_at: datetime
    delivered_count: int
    dead_lettered_count: int
    skipped_count: int
    # Set in every row by the last write of a run that ended cleanly (after its last send and settlement):
    # that run's lease is free from then on, without a commit of its own (``run.fence``). None while a
    # run goes on, and in tables older versions wrote.
    ended_run_id: str | None = None


def new_run_id(now: dt.datetime) -> str:
    """A run's id: when it started (so ids sort by time), and a random part."""
    return f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class JobIds:
    """The Databricks job and job run a run belongs to (the task parameters ``{{job.id}}`` and
    ``{{job.run_id}}``); None outside a job. Not secrets: they name where to look in the jobs UI."""

    job_id: str | None = None
    job_run_id: str | None = None


@dataclass(frozen=True)
class RunRow:
    """One run of the syphon as a whole: a row of the runs table, appended once the run has ended (after
    it gave the lease back), whether it drained, left messages or failed (``run.runs``)."""

    run_id: str
    source: str  # a RunSource's value: the backlog queues, or their dead-letter sub-queues (a re-drive)
    trigger: str  # run.trigger: available_now, or an interval such as "30 seconds"
    job_id: str | None
    job_run_id: str | None
    started_at: datetime
    ended_at: datetime
    exit_code: Int32  # what the command line exits with (errors.EXIT_*)
    closing_line: str  # the run's last line: why it ended, and what to do
    # What the run recorded, per outcome (Outcome values), over every destination.
    delivered: int
    dead_lettered: int
    skipped: int  # pings; a migration run's covered copies too (``Outcome.COVERED``: settled, never sent)
    held: int
    not_selected: int
    # Per backlog queue (a re-drive: per dead-letter sub-queue), the messages left when the run ended,
    # peeked then; null when the run did not count them (it failed, or never started its query).
    remaining: dict[str, int] | None
    remaining_total: int | None
    batches: int  # micro-batches that handled messages
    # How long the send tasks ran below their cap because the primary throttled, summed over the
    # batches; null where their reports do not reach the driver (Spark Connect).
    throttled_seconds: float | None
    # The credits (operations) the run spent on each namespace (``CreditUsage``), and per kind
    # ("secondary.peek", ...); null for a run from before they were counted.
    secondary_credits: int | None = None
    primary_credits: int | None = None
    credits_by_kind: dict[str, int] | None = None
    # What the row records (a RunMode's value); null in rows older versions wrote, which are all syphon runs.
    mode: str | None = None
    # A decommission's row: the backlog queues it removed (``remaining`` then names those it refused, with the
    # messages they hold); null for syphon runs.
    removed_queues: list[str] | None = None
    # A migration run's: the messages it found expired in their sources (``Outcome.EXPIRED``); null elsewhere.
    expired: int | None = None


@dataclass(frozen=True)
class CreditUsage:
    """What a run spent of each namespace's credits (its operations), per kind (``CreditKind`` values), as the
    syphon counts them: what the driver paced (the purge's receives, settlements and peeks, the pre-flight,
    the counts, the administration reads), the planner's probes, one peek per message the windows read, one
    send per message sent. A Basic or Standard namespace has 1,000 a second for every client."""

    secondary: dict[str, int]
    primary: dict[str, int]
    moved: int  # messages that left the backlog: delivered, dead-lettered, skipped

    def total(self, role: NamespaceRole) -> int:
        return sum((self.secondary if role is NamespaceRole.SECONDARY else self.primary).values())

    def per_moved(self, role: NamespaceRole) -> float | None:
        return self.total(role) / self.moved if self.moved else None

    @property
    def by_kind(self) -> dict[str, int]:
        return {f"{role}.{kind}": credits for role, spent in ((NamespaceRole.SECONDARY, self.secondary),
                                                            (NamespaceRole.PRIMARY, self.primary))
                for kind, credits in sorted(spent.items()) if credits}

    def line(self) -> str:
        """``credits: secondary 9,120 (3.0 a moved message: peek 3,050, ...), primary 3,040 (1.0 ...)``."""
        def one(role: NamespaceRole, spent: dict[str, int]) -> str:
            per = self.per_moved(role)
            parts = ([f"{per:.2f} a moved message"] if per is not None else []) + [
                ", ".join(f"{kind} {credits:,}" for kind, credits in sorted(spent.items()) if credits)]
            parts = [part for part in parts if part]
            return f"{role} {self.total(role):,}" + (f" ({'; '.join(parts)})" if parts else "")

        return (f"credits spent: {one(NamespaceRole.SECONDARY, self.secondary)}; "
                f"{one(NamespaceRole.PRIMARY, self.primary)}")


@dataclass(frozen=True)
class BrokerCount:
    """What one backlog queue (or dead-letter sub-queue) holds now, as the status command reads it
    from the broker (``servicebus.counts``)."""

    messages: int
    exact: bool  # False: an upper bound (the span of sequence numbers from the first message to the last)
    oldest_enqueued: datetime | None  # when the first message entered it
    # Dead-letter sub-queues: DeadLetterReason -> messages, among the first ones (all when ``reasons_complete``).
    reasons: dict[str, int]
    reasons_complete: bool = True
    exists: bool = True


@dataclass(frozen=True)
class RecordedSpan:
    """Messages of one backlog queue whose outcomes one batch recorded, by identity.

    Every message the source read with a sequence number in ``[first, last]`` and an enqueue time
    in ``[enqueued_from_ms, enqueued_to_ms]`` has a recorded final outcome: a window is read whole,
    a span is cut wherever a message was left unsent, and a queue recreated since numbers its new
    messages from 1 again but enqueues them later, so none of them matches. ``holds`` is the test
    the purge applies before it settles a message.
    """

    backlog_queue: str
    first: int
    last: int
    enqueued_from_ms: int
    enqueued_to_ms: int
    count: int  # recorded outcomes in the span
    delivered: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    batch_id: int | None = None  # the batch that recorded it

    def holds(self, sequence_number: int, enqueued_ms: int | None) -> bool:
        return (self.first <= sequence_number <= self.last and enqueued_ms is not None
                and self.enqueued_from_ms <= enqueued_ms <= self.enqueued_to_ms)


@dataclass(frozen=True)
class HeldSpan:
    """Where messages a batch left in a backlog queue for skipped destinations (``Outcome.HELD``) lie.

    It only tells the purge that such a message at the head of the queue is expected, so the purge
    passes over it (keeps it locked while it settles what lies behind, then releases it) instead of
    stopping there. It never makes anything be settled: the range may also cover recorded messages
    of other destinations, which the recorded spans settle, and merging held spans only widens it.
    """

    backlog_queue: str
    first: int
    last: int
    enqueued_from_ms: int
    enqueued_to_ms: int
    count: int  # held outcomes in it (an upper bound of the messages: a replayed batch counts them again)

    def holds(self, sequence_number: int, enqueued_ms: int | None) -> bool:
        return (self.first <= sequence_number <= self.last and enqueued_ms is not None
                and self.enqueued_from_ms <= enqueued_ms <= self.enqueued_to_ms)

    def merged(self, other: HeldSpan | None) -> HeldSpan:
        """One span covering both (the purge needs no more than the range)."""
        if other is None:
            return self
        return HeldSpan(self.backlog_queue, min(self.first, other.first), max(self.last, other.last),
                        min(self.enqueued_from_ms, other.enqueued_from_ms),
                        max(self.enqueued_to_ms, other.enqueued_to_ms), self.count + other.count)


@dataclass(frozen=True)
class DeadLetterOrder:
    """A recorded dead-letter outcome the purge carries out in the backlog queue, by identity."""

    backlog_queue: str
    sequence_number: int
    enqueued_ms: int
    reason_code: str
    reason: str


@dataclass(frozen=True)
class Lease:
    """The lease row of one backlog (the lease table's only row), as read or as written.

    The decisions about it (taking, extending, may this run send) are ``run.lease``'s.
    """

    lease_key: str  # which backlog: "<secondary host>/<primary namespace>"
    epoch: int  # 1 for the first write, one more for every write after it
    run_id: str  # the holding run
    host: str  # where the holder runs, and its process: to tell people, and to see a crashed holder
    pid: int
    acquired_at: dt.datetime
    renewed_at: dt.datetime
    expires_at: dt.datetime
    # The holding process beyond doubt ("<boot id>/<pid namespace>/<pid>/<start time>"): only a run that
    # shares the machine and pid namespace can prove from it that the holder is gone (a host name and
    # a pid are not proof: containers share host names, and pids are reused).
    process_identity: str | None = None

    @property
    def holder(self) -> str:
        return f"run {self.run_id} on {self.host} (pid {self.pid})"

    def is_free_for(self, run_id: str, now: dt.datetime, *, holder_gone: bool = False) -> bool:
        """Whether ``run_id`` may take (or keep) this lease at ``now``; ``holder_gone``: its process is known dead."""
        return self.run_id == run_id or self.expires_at <= now or holder_gone


@dataclass(frozen=True)
class QueueSettings:
    """What the administration API says of a namespace's queues, by lower-case name: which are partitioned
    (``enable_partitioning``) and each one's lock duration in seconds; empty where it does not answer."""

    partitioned: frozenset[str] = frozenset()
    lock_seconds: dict[str, float] = field(default_factory=dict)
