"""The syphon's vocabulary: what can happen to a backlog message and why, the TTL policy, and the
typed records of the tables (audit, checkpoint, lease) and of what the driver keeps per backlog queue.

Every module speaks these enums rather than string literals. They are ``StrEnum``s, so they are
written to Delta, Arrow and logs as their plain values (``"delivered"``, ``"missing_path"``), and
the values are part of the audit table's contract. Pure: no I/O, nothing but the standard library.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TypedDict


class Action(StrEnum):
    """What the restore rules decide for a backlog message before anything is sent."""

    DELIVER = "deliver"
    DEAD_LETTER = "dead_letter"
    SKIP = "skip"  # a ping: recorded and settled, never delivered
    # Its destination is in ``restore.skip_destinations``: not sent, not settled, left in the backlog for a
    # later run. Not SKIP: a ping is done with, a held message is not.
    HOLD = "hold"
    # Re-drive only: the message is not sent and stays in the dead-letter sub-queue, untouched (the
    # re-drive's filters did not select it, or an earlier re-drive dead-lettered it again).
    LEAVE = "leave"

    @property
    def stays(self) -> bool:
        """Whether the message is left where it is on purpose (not sent, not settled): ``Outcome.stays``."""
        return self in (Action.HOLD, Action.LEAVE)


class Outcome(StrEnum):
    """What happened to a backlog message: one audit row each."""

    DELIVERED = "delivered"
    DEAD_LETTERED = "dead_lettered"
    SKIPPED_PING = "skipped_ping"
    # Not a final outcome: the message was not sent (its destination stayed unavailable, or the
    # send round ran out of lease). It stays in the backlog, untouched, and the batch's replay sends it.
    UNSENT = "unsent"
    # Not a final outcome either: its destination is in ``restore.skip_destinations`` (``Action.HOLD``), so
    # it was not sent and is not settled. It stays in the backlog, untouched; the next run reads it again (a
    # run re-reads from its head, once, each backlog queue where the audit shows held messages) and, without
    # the skip, sends it.
    HELD = "held"
    # Not a final outcome either (re-drive only): the message was seen and deliberately left in the
    # dead-letter sub-queue (``Action.LEAVE``); the rows tell the audit what the re-drive saw and left.
    NOT_SELECTED = "not_selected"

    @property
    def is_final(self) -> bool:
        return self not in (Outcome.UNSENT, *STAYING_OUTCOMES)

    @property
    def stays(self) -> bool:
        """Left where it is on purpose (HELD, NOT_SELECTED). Like UNSENT rows these cut the recorded spans, so
        no purge settles the message (it passes over it); unlike UNSENT they do not fail the batch: they are
        what the operator asked for."""
        return self in STAYING_OUTCOMES


# The outcomes of messages left where they are on purpose (``Outcome.stays``): never sent, never settled.
STAYING_OUTCOMES = (Outcome.HELD, Outcome.NOT_SELECTED)
FINAL_OUTCOMES = tuple(outcome for outcome in Outcome if outcome.is_final)
# What run summaries count per destination: the final outcomes, and what was left where it is on purpose.
REPORTED_OUTCOMES = FINAL_OUTCOMES + STAYING_OUTCOMES


class ReasonCode(StrEnum):
    """Why a message was not delivered (the audit's ``reason_code`` and the dead-letter reason)."""

    # decided by the restore rules
    PING = "ping"
    MISSING_PATH = "missing_path"
    INVALID_LEGACY_PROPERTY = "invalid_legacy_property"
    INVALID_DESTINATION = "invalid_destination"
    UNDECODABLE_MESSAGE = "undecodable_message"
    EXPIRED_IN_BACKLOG = "expired_in_backlog"
    MESSAGE_TOO_LARGE = "message_too_large"
    # met while building or sending
    RESTORE_FAILED = "restore_failed"
    DESTINATION_NOT_FOUND = "destination_not_found"
    UNAUTHORIZED = "unauthorized"
    # The destination refused this one message for good (amqp:not-allowed, an argument error, an invalid
    # field): no retry changes the answer, so it is that message's outcome, with the service's text.
    DESTINATION_REFUSED = "destination_refused"
    # found before sending: the destination could not take the message as it is (Service Bus would refuse it)
    SESSION_REQUIRED = "session_required"  # the destination requires sessions; the message has no SessionId
    SESSION_ID_NOT_PARTITION_KEY = "session_id_not_partition_key"  # both set, and they differ
    # transient: retried, never a final outcome
    DESTINATION_DISABLED = "destination_disabled"
    AUTHENTICATION_FAILED = "authentication_failed"
    TRANSIENT = "transient"
    # throttling: the primary is over its capacity; the sender slows down (never a final outcome)
    SERVER_BUSY = "server_busy"
    QUOTA_EXCEEDED = "quota_exceeded"
    THROTTLED = "throttled"
    # why a message is UNSENT
    DESTINATION_UNAVAILABLE = "destination_unavailable"  # refused or unreachable for all of sink.outage_wait_seconds
    ROUND_DEADLINE = "round_deadline"  # the send round ended before the lease could expire; the next round sends it
    # why a message is HELD
    DESTINATION_SKIPPED = "destination_skipped"  # restore.skip_destinations names its destination
    # why a re-drive left a dead-lettered message where it is (NOT_SELECTED)
    FILTERED_OUT = "filtered_out"  # the redrive.* filters do not select it
    REDRIVEN_BEFORE = "redriven_before"  # an earlier re-drive dead-lettered it again (redrive.retry_dead_lettered)


# The reason codes a syphon run writes as a message's dead-letter reason (``redrive.reason_codes`` picks among them).
DEAD_LETTER_REASON_CODES = (
    ReasonCode.MISSING_PATH, ReasonCode.INVALID_LEGACY_PROPERTY, ReasonCode.INVALID_DESTINATION,
    ReasonCode.UNDECODABLE_MESSAGE, ReasonCode.EXPIRED_IN_BACKLOG, ReasonCode.MESSAGE_TOO_LARGE,
    ReasonCode.RESTORE_FAILED, ReasonCode.DESTINATION_NOT_FOUND, ReasonCode.UNAUTHORIZED,
    ReasonCode.DESTINATION_REFUSED, ReasonCode.SESSION_REQUIRED, ReasonCode.SESSION_ID_NOT_PARTITION_KEY,
)


class RunSource(StrEnum):
    """What a run reads (``run.source``)."""

    BACKLOG = "backlog"  # the backlog queues themselves
    DEAD_LETTERS = "dead_letters"  # their dead-letter sub-queues: a re-drive of what was dead-lettered


class CredentialKind(StrEnum):
    """Where an Azure AD token for a namespace comes from (``<namespace>.credential.kind``)."""

    DEFAULT = "default"  # azure-identity's DefaultAzureCredential: environment, workload identity, managed identity, ...
    SERVICE_PRINCIPAL = "service_principal"  # a tenant, a client id and a client secret
    MANAGED_IDENTITY = "managed_identity"  # the machine's (system-assigned, or a user-assigned one by client id)
    WORKLOAD_IDENTITY = "workload_identity"  # a federated token file (Kubernetes)
    DATABRICKS_SERVICE_CREDENTIAL = "databricks_service_credential"  # a Unity Catalog service credential, by name
    CUSTOM = "custom"  # a "module:callable" of one's own that returns a token credential


class AccessRight(StrEnum):
    """What Service Bus checks a token or key for, and the narrowest Azure role that grants it."""

    SEND = "Send"
    LISTEN = "Listen"
    MANAGE = "Manage"

    @property
    def role(self) -> str:
        return {AccessRight.SEND: "Azure Service Bus Data Sender", AccessRight.LISTEN: "Azure Service Bus Data Receiver",
                AccessRight.MANAGE: "Azure Service Bus Data Owner"}[self]


class LogFormat(StrEnum):
    """How the command line writes its log lines (``run.log_format``, ``--log-format``)."""

    TEXT = "text"  # for people: a line of text each
    JSON = "json"  # for log pipelines: one JSON object per line, the run's ids on each (``run.logs``)


class BacklogState(StrEnum):
    """The status command's verdict on a backlog (``run.status_report``), most urgent first."""

    LEASE_HELD = "lease_held"  # a run holds the lease now: it is draining (or a continuous run waits for more)
    WAITING = "waiting"  # messages wait in the backlog queues that no run is delivering
    DEAD_LETTERS = "dead_letters"  # the backlog is drained, but its dead-letter sub-queues hold messages
    DRAINED = "drained"  # nothing waits (but what restore.skip_destinations holds on purpose)


class TtlPolicy(StrEnum):
    """How a restored message's time to live treats the time it spent in the backlog (``restore.ttl_policy``)."""

    REMAINING = "remaining"  # only what is left; what expired while waiting is dead-lettered
    RESTART = "restart"  # legacy syphon: the full TTL again from the re-send; expired messages still go

    @classmethod
    def parse(cls, value: str | TtlPolicy) -> TtlPolicy:
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(repr(policy.value) for policy in cls)
            raise ValueError(f"ttl_policy must be one of {valid}; got {value!r}") from None


Int32 = int  # an int stored as a 32-bit column (table schemas are derived from these annotations)


class OutcomeRecord(TypedDict):
    """One backlog message's outcome: a row of the audit table (``restore.rows.OUTCOME_ROW_SCHEMA``,
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
    skipped: int
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


class EntityKind(StrEnum):
    QUEUE = "queue"
    TOPIC = "topic"


@dataclass(frozen=True)
class DestinationShape:
    """What a destination in the primary namespace takes, as its administration API describes it (read once
    per run where the API answers: ``servicebus.entities``). It decides the send's shape before the first
    refusal: a message the destination cannot take as it is, is dead-lettered without being sent."""

    name: str
    kind: EntityKind
    requires_session: bool = False  # a queue's; a topic takes session-less messages whatever its subscriptions
    partitioned: bool = False
    duplicate_detection: bool = False
    max_message_bytes: int | None = None  # what the entity takes per message, where the API says (Premium)
    # A topic's subscriptions that require sessions: the service dead-letters a session-less copy there.
    session_subscriptions: tuple[str, ...] = ()


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
class PacingStats:
    """How a batch's send tasks paced their sends (``sink.pacing``): what the progress line shows.

    Each task reports its own; ``merge`` adds them up (tasks run at once, so the time they spent
    slowed down is the longest of theirs, not the sum).
    """

    sent: int = 0  # messages that went through
    first_send_at: float | None = None  # epoch seconds
    last_send_at: float | None = None
    throttled: int = 0  # throttling answers (ServerBusy, quota exceeded, throttled)
    slowed_seconds: float = 0.0  # how long the sends ran below their cap (or unlimited rate) because of them
    rate_limit: float | None = None  # messages/s the tasks were allowed at their end (None: not limited)
    cap: float | None = None  # the caps' shares, summed (None: no cap)
    tasks: int = 0

    @property
    def send_rate(self) -> float | None:
        """Messages per second from the first send to the last (None: too few sends to tell)."""
        if self.first_send_at is None or self.last_send_at is None or self.last_send_at <= self.first_send_at:
            return None
        return self.sent / (self.last_send_at - self.first_send_at)

    def merge(self, other: PacingStats) -> PacingStats:
        if not other.tasks:
            return self
        if not self.tasks:
            return other
        return PacingStats(
            self.sent + other.sent, _earliest(self.first_send_at, other.first_send_at),
            _latest(self.last_send_at, other.last_send_at), self.throttled + other.throttled,
            max(self.slowed_seconds, other.slowed_seconds),
            None if self.rate_limit is None or other.rate_limit is None else self.rate_limit + other.rate_limit,
            None if self.cap is None or other.cap is None else self.cap + other.cap, self.tasks + other.tasks)


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _latest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass(frozen=True)
class BatchStats:
    """What the sink did with one micro-batch (filled on the driver by the sink, read by the progress reports)."""

    delivered: int
    dead_lettered: int
    skipped: int
    replayed: int  # outcomes recorded by an earlier, interrupted attempt of this batch
    send_seconds: float
    oldest_enqueued: dt.datetime | None  # oldest backlog enqueue time among the batch's messages
    held: int = 0  # left in the backlog for skipped destinations (``Outcome.HELD``)
    # the send tasks' pacing (classic Spark; None over Spark Connect, where the executors' reports do not
    # reach the client)
    pacing: PacingStats | None = None


# --- what the sink's delivery and the Service Bus senders exchange --------------------------------

@dataclass(frozen=True)
class Outgoing:
    """A restored message ready to send: its AMQP bytes and what a batch envelope needs."""

    encoded: bytes
    message_id: str | None
    session_id: str | None
    partition_key: str | None


class SendFailureClass(StrEnum):
    """How the sink handles a send error."""

    # the destination refuses every message sent to it (no such destination, not authorized): the messages
    # concerned are dead-lettered
    FINAL = "final"
    # the destination refused one message of the send for good (too large, amqp:not-allowed, an argument
    # error): which one is found by sending fewer at a time (``sink.delivery``), and only that one is
    # dead-lettered; a refusal of the send's shape ends with every message delivered
    REFUSED = "refused"
    TRANSIENT = "transient"  # retried with back-off; counts against sink.max_send_attempts
    # the primary is over its capacity (ServerBusy, quota exceeded, throttled): the task slows down and
    # the destination waits; it does not count against sink.max_send_attempts
    THROTTLED = "throttled"


THROTTLING_REASONS = frozenset({ReasonCode.SERVER_BUSY, ReasonCode.QUOTA_EXCEEDED, ReasonCode.THROTTLED})
# Final refusals that concern one message of a send, not the destination (``SendFailureClass.REFUSED``).
MESSAGE_REFUSAL_REASONS = frozenset({ReasonCode.MESSAGE_TOO_LARGE, ReasonCode.DESTINATION_REFUSED,
                                     ReasonCode.SESSION_REQUIRED, ReasonCode.SESSION_ID_NOT_PARTITION_KEY})


@dataclass(frozen=True)
class SendFailure:
    """How a send error is handled: retried (transient), or final for the messages concerned."""

    transient: bool
    reason_code: ReasonCode
    reason: str

    @property
    def failure_class(self) -> SendFailureClass:
        if not self.transient:
            return SendFailureClass.REFUSED if self.reason_code in MESSAGE_REFUSAL_REASONS else SendFailureClass.FINAL
        return SendFailureClass.THROTTLED if self.reason_code in THROTTLING_REASONS else SendFailureClass.TRANSIENT


class PartialSendError(Exception):
    """A send that stopped after ``sent`` messages of the group went out, because of ``cause``, which refused
    the next ``attempted`` messages (one batched send; 0: nothing was transferred, the link itself failed)."""

    def __init__(self, sent: int, cause: BaseException, attempted: int = 0):
        super().__init__(f"{sent} sent before {type(cause).__name__}")
        self.sent = sent
        self.cause = cause
        self.attempted = attempted
