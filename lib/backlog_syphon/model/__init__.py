"""The syphon's vocabulary: what can happen to a backlog message and why, the TTL policy, and the
typed records of the tables (audit, checkpoint, lease, runs) and of what the driver keeps per backlog
queue. Every module speaks these enums rather than string literals. Pure: no I/O, nothing but the
standard library.

Four modules, re-exported here under the names every caller uses (``from backlog_syphon.model import
Outcome``): ``vocabulary`` (the enums), ``records`` (the tables' rows, spans and counts), ``sending``
(what the delivery and the senders exchange and report) and ``migration`` (the migration mode's sources,
routes and settle orders).
"""

from backlog_syphon.model.vocabulary import (
    AccessRight, Action, BacklogState, CredentialKind, CreditKind, DEAD_LETTER_REASON_CODES, DrainHold, EntityKind,
    FINAL_OUTCOMES, LogFormat, MessageRules, MessageState, NamespaceRole, NetworkFailure, Outcome, REPORTED_OUTCOMES,
    ReasonCode, RunMode, RunSource, STAYING_OUTCOMES, SettleKind, SourceKind, SubscriptionDelivery, Transport, TtlPolicy
)
from backlog_syphon.model.records import (
    BrokerCount, CheckpointRow, CreditUsage, DeadLetterOrder, HeldSpan, Int32, JobIds, Lease, OutcomeRecord,
    QueueSettings, RecordedSpan, RunRow, new_run_id
)
from backlog_syphon.model.sending import (
    BatchStats, DestinationShape, EarlierBatches, ExpiredBeforeSendError, MESSAGE_REFUSAL_REASONS, Outgoing,
    PacingStats, PartialSendError, RefusedBeforeSending, SendFailure, SendFailureClass, SendShape, THROTTLING_REASONS
)
from backlog_syphon.model.migration import (
    NO_MIGRATION, ListedEntity, ListedSubscription, MigrationPlan, NamespaceListing, Route, RuleFilter, SessionStates,
    SettleOrder, SourceEntity, settle_kind
)

__all__ = [
    "AccessRight", "Action", "BacklogState", "CredentialKind", "CreditKind", "DEAD_LETTER_REASON_CODES", "DrainHold",
    "EntityKind", "FINAL_OUTCOMES", "LogFormat", "NamespaceRole", "NetworkFailure", "Outcome", "REPORTED_OUTCOMES",
    "ReasonCode", "RunMode", "RunSource", "STAYING_OUTCOMES", "Transport", "TtlPolicy", "BrokerCount",
    "CheckpointRow", "CreditUsage", "DeadLetterOrder", "HeldSpan", "Int32", "JobIds", "Lease", "OutcomeRecord",
    "QueueSettings", "RecordedSpan", "RunRow", "new_run_id", "BatchStats", "DestinationShape", "EarlierBatches",
    "ExpiredBeforeSendError", "MESSAGE_REFUSAL_REASONS", "Outgoing", "PacingStats", "PartialSendError",
    "RefusedBeforeSending", "SendFailure", "SendFailureClass", "SendShape", "THROTTLING_REASONS", "MessageRules",
    "MessageState", "SettleKind", "SourceKind", "SubscriptionDelivery", "ListedEntity", "ListedSubscription",
    "NamespaceListing", "Route", "RuleFilter", "SessionStates", "SettleOrder", "SourceEntity", "settle_kind",
    "NO_MIGRATION", "MigrationPlan",
]
