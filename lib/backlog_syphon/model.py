"""The syphon's vocabulary: what can happen to a backlog message and why, the TTL policy, and the
typed records of the tables (audit, checkpoint, lease) and of what the driver keeps per backlog queue.

Every module speaks these enums rather than string literals. They are ``StrEnum``s, so they are
written to Delta, Arrow and logs as their plain values (``"delivered"``, ``"missing_path"``), and
the values are part of the audit table's contract. Pure: no I/O, nothing but the standard library.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TypedDict


class Action(StrEnum):
    """What the restore rules decide for a backlog message before anything is sent."""

    DELIVER = "deliver"
    DEAD_LETTER = "dead_letter"
    SKIP = "skip"


class Outcome(StrEnum):
    """What happened to a backlog message: one audit row each."""

    DELIVERED = "delivered"
    DEAD_LETTERED = "dead_lettered"
    SKIPPED_PING = "skipped_ping"


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
    # transient: retried, never a final outcome
    DESTINATION_DISABLED = "destination_disabled"
    AUTHENTICATION_FAILED = "authentication_failed"
    TRANSIENT = "transient"


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
    body_size: int | None
    enqueued_time: datetime | None  # when it entered the backlog
    scheduled_enqueue_time: datetime | None
    time_to_live_ms: int | None  # TTL given to the re-sent message
    outcome_time: datetime  # delivered (or dead-letter decided) at
    attempts: int


@dataclass(frozen=True)
class CheckpointRow:
    """One backlog queue's progress: a row of the checkpoint table."""

    backlog_queue: str
    delivered_through: int  # every message up to here has a recorded outcome
    purged_through: int  # ... and has been removed from the backlog
    last_batch_id: int
    last_run_id: str
    updated_at: datetime
    delivered_count: int
    dead_lettered_count: int
    skipped_count: int


@dataclass(frozen=True)
class QueueOutcomes:
    """What one micro-batch recorded for one backlog queue: the aggregate the driver works from."""

    backlog_queue: str
    first: int  # lowest and highest sequence number with an outcome in the batch
    through: int
    delivered: int
    dead_lettered: int
    skipped: int
    oldest_enqueued: datetime | None  # oldest backlog enqueue time among them

    @property
    def count(self) -> int:
        return self.delivered + self.dead_lettered + self.skipped


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

    @property
    def holder(self) -> str:
        return f"run {self.run_id} on {self.host} (pid {self.pid})"

    def is_free_for(self, run_id: str, now: dt.datetime, *, holder_gone: bool = False) -> bool:
        """Whether ``run_id`` may take (or keep) this lease at ``now``; ``holder_gone``: its process is known dead."""
        return self.run_id == run_id or self.expires_at <= now or holder_gone
