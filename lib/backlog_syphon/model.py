"""The syphon's vocabulary: what can happen to a backlog message, and why.

Every module speaks these enums rather than string literals. They are ``StrEnum``s, so they are
written to Delta, Arrow and logs as their plain values (``"delivered"``, ``"missing_path"``), and
the values are part of the audit table's contract.
"""

from __future__ import annotations

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
