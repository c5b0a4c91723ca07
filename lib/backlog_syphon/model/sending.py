"""What the sink's delivery and the Service Bus senders exchange: a destination's shape, a message ready to
send, how a send failed, and what the sends report (their pacing, a batch's stats).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from backlog_syphon.model.vocabulary import EntityKind, ReasonCode


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


class SendShape(StrEnum):
    """How a destination's messages are cut into sends (``sink.send_shape``)."""

    # batched sends, each of one session and partition key: what any destination takes, partitioned or not
    KEYED_BATCHES = "keyed_batches"
    # one message per send (several in flight on the link, in order): a partitioned destination with duplicate
    # detection refuses a batch of distinct MessageIds
    SINGLE_MESSAGES = "single_messages"


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
    # Destinations a refusal of a batch's shape taught to take single messages only (lower-case names), and
    # how many batches were refused for their shape: the driver hands the first to the next rounds' tasks.
    single_message_destinations: tuple[str, ...] = ()
    shape_refusals: int = 0

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
            None if self.cap is None or other.cap is None else self.cap + other.cap, self.tasks + other.tasks,
            tuple(sorted(set(self.single_message_destinations) | set(other.single_message_destinations))),
            self.shape_refusals + other.shape_refusals)


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


@dataclass(frozen=True)
class EarlierBatches:
    """What a long run's progress history let go of (``run.progress.RETAINED_POINTS``), folded into the
    figures its runs-table row needs: the batches with messages, and the pacing of those that report one."""

    batches: int = 0
    paced: int = 0
    slowed_seconds: float = 0.0

    def plus(self, stats: list[BatchStats]) -> EarlierBatches:
        paced = [batch.pacing for batch in stats if batch.pacing is not None]
        return EarlierBatches(self.batches + len(stats), self.paced + len(paced),
                              self.slowed_seconds + sum(pacing.slowed_seconds for pacing in paced))


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
# (``BATCH_SHAPE_REFUSED`` concerns the send's shape: the batch goes again, one message at a time.)
MESSAGE_REFUSAL_REASONS = frozenset({ReasonCode.MESSAGE_TOO_LARGE, ReasonCode.DESTINATION_REFUSED,
                                     ReasonCode.SESSION_REQUIRED, ReasonCode.SESSION_ID_NOT_PARTITION_KEY,
                                     ReasonCode.BATCH_SHAPE_REFUSED})


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


class ExpiredBeforeSendError(ValueError):
    """A migrated message's absolute expiry passed before its copy was built: it is not sent
    (``Outcome.EXPIRED``), as if the rules had found it expired."""


class RefusedBeforeSending(ValueError):
    """A restored message its destination would refuse for good, found before it is sent (its properties are too
    large): that message's dead-letter outcome, with its reason code and reason."""

    def __init__(self, reason_code: ReasonCode, reason: str):
        super().__init__(reason)
        self.reason_code, self.reason = reason_code, reason


class PartialSendError(Exception):
    """A send that stopped after ``sent`` messages of the group went out, because of ``cause``, which refused
    the next ``attempted`` messages (one batched send; 0: nothing was transferred, the link itself failed)."""

    def __init__(self, sent: int, cause: BaseException, attempted: int = 0):
        super().__init__(f"{sent} sent before {type(cause).__name__}")
        self.sent = sent
        self.cause = cause
        self.attempted = attempted
