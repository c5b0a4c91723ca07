"""The syphon's words: what can happen to a backlog message and why (actions, outcomes, reason codes),
and the kinds its settings and reports choose among (run source, credentials, rights, log format, the
status's verdict, TTL policy, entity kind).

They are ``StrEnum``s, so they are written to Delta, Arrow and logs as their plain values
(``"delivered"``, ``"missing_path"``), and the values are part of the audit table's contract.
"""

from __future__ import annotations

from enum import StrEnum


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
    # The message had expired where it was read: a backlog copy whose own time to live ran out in its backlog
    # queue, or (the migration mode) a message whose enqueue time plus its time to live had passed. Service Bus
    # still shows it to a peek, but collects it at the next receive (removes it, or dead-letters it with
    # TTLExpiredException where the entity dead-letters on expiry); no receiver would ever get it, so it is not
    # sent either.
    EXPIRE = "expire"
    # The migration mode's ``topic`` route of a topic whose every subscription holds the same messages: one of
    # them (its lead) sends each message to the target topic, which gives every subscription its copy again; the
    # others' copies of it are recorded and settled (completed), never sent.
    COVER = "cover"

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
    # Final: the message had expired where it was read (``Action.EXPIRE``): never sent, and the broker, not the
    # purge, takes it out (in a dead-letter sub-queue, which expires nothing, it stays).
    EXPIRED = "expired"
    # Final: a subscription's copy of a message its lead subscription's send to the topic gives it again
    # (``Action.COVER``): never sent, settled (completed) once recorded.
    COVERED = "covered"

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
    # the original message's time to live ran out while it waited in the backlog (restore.ttl_policy remaining)
    EXPIRED_IN_BACKLOG = "expired_in_backlog"
    # the backlog copy's own time to live ran out in its backlog queue (``Outcome.EXPIRED``)
    BACKLOG_COPY_EXPIRED = "backlog_copy_expired"
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
    # a property above 32 KB, all of them above 64 KB, or a MessageId or SessionId above 128 characters: the
    # service refuses it with a generic text that looks transient
    PROPERTY_TOO_LARGE = "property_too_large"
    # The destination refused a batch for its shape (distinct partition keys, sessions or, with duplicate
    # detection on a partitioned entity, MessageIds): the sender learns to send it one message at a time and
    # sends the batch again. Only ever a log line and a count, never a message's outcome.
    BATCH_SHAPE_REFUSED = "batch_shape_refused"
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
    # migration only
    EXPIRED_IN_SOURCE = "expired_in_source"  # EXPIRED: its absolute expiry had passed when it was read (migration)
    # HELD: a scheduled message due within migration.scheduled_margin_seconds, left to become active (and read
    # again then) rather than moved and cancelled at the moment it activates
    SCHEDULED_SOON = "scheduled_soon"
    # HELD: an active message a topic's own log shows is on its way to the topic's subscriptions, where it is read
    IN_TRANSIT = "in_transit"
    # COVERED: the lead subscription's copy of the message goes to the topic, which fans it out to this one again
    FANNED_OUT = "fanned_out"


# The reason codes a syphon run writes as a message's dead-letter reason (``redrive.reason_codes`` picks among them).
DEAD_LETTER_REASON_CODES = (
    ReasonCode.MISSING_PATH, ReasonCode.INVALID_LEGACY_PROPERTY, ReasonCode.INVALID_DESTINATION,
    ReasonCode.UNDECODABLE_MESSAGE, ReasonCode.EXPIRED_IN_BACKLOG, ReasonCode.MESSAGE_TOO_LARGE,
    ReasonCode.RESTORE_FAILED, ReasonCode.DESTINATION_NOT_FOUND, ReasonCode.UNAUTHORIZED,
    ReasonCode.DESTINATION_REFUSED, ReasonCode.SESSION_REQUIRED, ReasonCode.SESSION_ID_NOT_PARTITION_KEY,
    ReasonCode.PROPERTY_TOO_LARGE,
)


class RunSource(StrEnum):
    """What a run reads (``run.source``)."""

    BACKLOG = "backlog"  # the backlog queues themselves
    DEAD_LETTERS = "dead_letters"  # their dead-letter sub-queues: a re-drive of what was dead-lettered
    # any entities of a source namespace (the ``migration`` section): what a migration or failover left behind
    MIGRATION = "migration"


class CredentialKind(StrEnum):
    """Where an Azure AD token for a namespace comes from (``<namespace>.credential.kind``)."""

    DEFAULT = "default"  # azure-identity's DefaultAzureCredential: environment, workload identity, managed identity, ...
    SERVICE_PRINCIPAL = "service_principal"  # a tenant, a client id and a client secret
    MANAGED_IDENTITY = "managed_identity"  # the machine's (system-assigned, or a user-assigned one by client id)
    WORKLOAD_IDENTITY = "workload_identity"  # a federated token file (Kubernetes)
    DATABRICKS_SERVICE_CREDENTIAL = "databricks_service_credential"  # a Unity Catalog service credential, by name
    CUSTOM = "custom"  # a "module:callable" of one's own that returns a token credential


class Transport(StrEnum):
    """How the syphon reaches a namespace (``<namespace>.transport``)."""

    AMQP = "amqp"  # AMQP over TLS on TCP 5671 (plain AMQP to a local emulator's UseDevelopmentEmulator port)
    AMQP_WEBSOCKETS = "amqp-websockets"  # AMQP over WebSockets over TLS on 443, optionally through an HTTP proxy

    @property
    def default_port(self) -> int:
        return 443 if self is Transport.AMQP_WEBSOCKETS else 5671


class NetworkFailure(StrEnum):
    """Why a namespace could not be reached, as far as the network goes (before any credential is looked at)."""

    CERTIFICATE_UNTRUSTED = "certificate_untrusted"  # signed by an authority the syphon does not trust
    CERTIFICATE_NAME_MISMATCH = "certificate_name_mismatch"  # it does not name the host connected to
    TLS_FAILED = "tls_failed"  # no TLS handshake (not a TLS port, or cut off on the way)
    REFUSED = "refused"  # nothing takes connections there, or a firewall rejects them: the port is blocked
    UNANSWERED = "unanswered"  # no answer at all: a firewall that drops what it blocks
    PROXY_UNREACHABLE = "proxy_unreachable"  # the HTTP proxy itself refused the connection
    PROXY_AUTHENTICATION = "proxy_authentication"  # the proxy asks for credentials (407)
    PROXY_REFUSED = "proxy_refused"  # the proxy refused the tunnel (403 and other answers)
    UNKNOWN_HOST = "unknown_host"  # the host name does not resolve
    WEBSOCKET_REFUSED = "websocket_refused"  # something answered the WebSocket upgrade that is not Service Bus


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
    DECOMMISSIONED = "decommissioned"  # drained, and its backlog queues were removed (``--decommission``)


class DrainHold(StrEnum):
    """What keeps a backlog queue from being removed (``run.decommission_plan``): it is drained and safe to
    remove only with none of these."""

    MESSAGES = "messages"  # the broker holds messages in it: still to deliver (or held on purpose)
    UNSETTLED = "recorded_unsettled"  # outcomes are recorded whose messages are not known settled yet
    DEAD_LETTERS = "dead_letters"  # its dead-letter sub-queue holds messages not exported and acknowledged


class RunMode(StrEnum):
    """What a row of the runs table records (its ``mode``; None in rows older versions wrote: a syphon run)."""

    SYPHON = "syphon"  # a run that drained (or re-drove) backlog queues' messages
    DECOMMISSION = "decommission"  # ``--decommission --confirm``: drained backlog queues removed
    MIGRATION = "migration"  # a run of the migration mode (or a re-drive of what it dead-lettered)


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


class CreditKind(StrEnum):
    """What a namespace's credits are spent on (Basic and Standard: 1,000 a second per namespace, ``credits``):
    a peek, a receive and a send one per message, a settlement one per lock token (an assumption: the service
    names no cost for it, but throttles it), an administration read ten."""

    PEEK = "peek"
    RECEIVE = "receive"
    SETTLE = "settle"
    SEND = "send"
    ADMINISTRATION = "administration"


class NamespaceRole(StrEnum):
    """Which of the two namespaces: the backlog's, or the destinations'."""

    SECONDARY = "secondary"
    PRIMARY = "primary"


class EntityKind(StrEnum):
    QUEUE = "queue"
    TOPIC = "topic"


class MessageState(StrEnum):
    """A stored message's state, as a peek shows it (the broker's ``x-opt-message-state`` annotation: 0, 1, 2)."""

    ACTIVE = "active"
    DEFERRED = "deferred"  # received only by its sequence number
    SCHEDULED = "scheduled"  # not active before its scheduled enqueue time; cancelled by its sequence number

    @classmethod
    def from_annotation(cls, value: int | None) -> MessageState:
        """The state of an ``x-opt-message-state`` value (absent, or a value the service does not document:
        active, which a receive would take)."""
        return {1: cls.DEFERRED, 2: cls.SCHEDULED}.get(value, cls.ACTIVE)


class SourceKind(StrEnum):
    """What a migration source is (``migration.selection``)."""

    QUEUE = "queue"
    SUBSCRIPTION = "subscription"  # "<topic>/Subscriptions/<name>"
    TOPIC = "topic"  # a topic itself: what it holds are its scheduled messages, in no subscription before their time
    DEAD_LETTERS = "dead_letters"  # "<queue or subscription>/$DeadLetterQueue"


class SubscriptionDelivery(StrEnum):
    """How a subscription's messages reach the target (``migration.subscriptions``): the operator's choice,
    since re-sending to the topic gives every other subscription a copy too."""

    TOPIC = "topic"  # to the topic: only when the subscription is its topic's only one
    QUEUE = "queue"  # to the queue migration.destination_map names for it
    PROPERTY = "property"  # to the topic, with migration.subscription_property set to the subscription's name


class MessageRules(StrEnum):
    """What a migrated message becomes (``migration.message_rules``)."""

    COPY = "copy"  # the message as it was, its absolute expiry kept
    RESTORE = "restore"  # the backlog mode's restore rules (x-ms-* legacy properties, x-ms-path)


class SettleKind(StrEnum):
    """How the purge settles a recorded message that a receive does not bring (``model.SettleOrder``)."""

    CANCEL_SCHEDULED = "cancel_scheduled"  # cancelled by its sequence number (once a peek finds its identity there)
    RECEIVE_DEFERRED = "receive_deferred"  # received by its sequence number, then completed or dead-lettered
