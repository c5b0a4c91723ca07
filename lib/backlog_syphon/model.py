"""The syphon's vocabulary: what can happen to a backlog message and why, and the records the driver
keeps per backlog queue.

Every module speaks these enums rather than string literals. They are ``StrEnum``s, so they are
written to Delta, Arrow and logs as their plain values (``"delivered"``, ``"missing_path"``), and
the values are part of the audit table's contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


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
