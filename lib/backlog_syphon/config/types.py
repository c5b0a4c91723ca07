"""The syphon's settings as frozen, typed records, one per section, and ``Secret``.

Invariants:
- Secrets (connection strings, an Azure AD credential's client secret, a proxy's password) are ``Secret``s
  whose repr and str are masked, also once pickled to executors.
- The defaults here are the documented defaults; :mod:`backlog_syphon.config.loading` fills the records
  and :mod:`backlog_syphon.config.validation` checks them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from backlog_syphon.errors import SettingsError
from backlog_syphon.model import CredentialKind, LogFormat, MessageRules, RunSource, Transport, TtlPolicy

AVAILABLE_NOW = "available_now"  # run.trigger: drain what is there when the run starts, then stop


class ConfigError(SettingsError, ValueError):
    """A configuration problem, described so that the operator knows what to change."""


class Secret:
    """A secret value that never shows itself in repr, str, logs or tracebacks."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str):
        self._value = value
        self.source = source  # where it came from, e.g. "env SYPHON_PRIMARY_CONNECTION_STRING"

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(<masked>, from {self.source})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self):  # picklable for executors; still masked everywhere it is printed
        return (Secret, (self._value, self.source))


@dataclass(frozen=True)
class CredentialConfig:
    """Where a namespace's Azure AD tokens come from (``<namespace>.credential``). Which fields a kind
    takes is ``CREDENTIAL_FIELDS``; the only secrets (``client_secret``, ``secret``) are ``Secret``s."""

    kind: str = CredentialKind.DEFAULT.value
    tenant_id: str | None = None
    client_id: str | None = None  # an app registration's, or a user-assigned managed identity's
    client_secret: Secret | None = None  # service_principal
    name: str | None = None  # databricks_service_credential: the Unity Catalog service credential's name
    token_file: str | None = None  # workload_identity: the federated token file (default AZURE_FEDERATED_TOKEN_FILE)
    factory: str | None = None  # custom: "module:callable", called once per process with options (and secret)
    options: dict[str, Any] = field(default_factory=dict)  # custom: keyword arguments, not secret
    secret: Secret | None = None  # custom: passed as the keyword argument ``secret``

    @property
    def the_secret(self) -> Secret | None:
        return self.client_secret or self.secret

    @property
    def public(self) -> dict[str, Any]:
        """The settings that are not secret (those set), e.g. for the source's options."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("client_secret", "secret") and getattr(self, f.name) not in (None, {})}

    @property
    def cache_key(self) -> tuple[str, str]:
        """Identifies the credential in a process's cache without holding its secret: the public settings,
        and a hash of the secret."""
        secret = self.the_secret.reveal() if self.the_secret is not None else ""
        return json.dumps(self.public, sort_keys=True, default=str), hashlib.sha256(secret.encode()).hexdigest()

    def describe(self) -> str:
        """For operators' lines: the kind and what tells it apart, never a secret."""
        detail = {CredentialKind.SERVICE_PRINCIPAL: self.client_id, CredentialKind.MANAGED_IDENTITY: self.client_id,
                  CredentialKind.WORKLOAD_IDENTITY: self.client_id,
                  CredentialKind.DATABRICKS_SERVICE_CREDENTIAL: self.name, CredentialKind.CUSTOM: self.factory}
        shown = detail.get(self.kind)
        return f"{self.kind} '{shown}'" if shown else self.kind


# Per kind: (required fields, optional fields). Secrets are fields too: client_secret, secret.
CREDENTIAL_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    CredentialKind.DEFAULT: ((), ()),
    CredentialKind.SERVICE_PRINCIPAL: (("tenant_id", "client_id", "client_secret"), ()),
    CredentialKind.MANAGED_IDENTITY: ((), ("client_id",)),
    CredentialKind.WORKLOAD_IDENTITY: ((), ("tenant_id", "client_id", "token_file")),
    CredentialKind.DATABRICKS_SERVICE_CREDENTIAL: (("name",), ()),
    CredentialKind.CUSTOM: (("factory",), ("options", "secret")),
}


@dataclass(frozen=True)
class NamespaceConfig:
    """How to reach one namespace: a SAS connection string, or Azure AD with a host name and a credential."""

    connection_string: Secret | None = None
    fully_qualified_namespace: str | None = None  # e.g. contoso.servicebus.windows.net (Azure AD)
    credential: CredentialConfig | None = None  # Azure AD: where tokens come from (none: kind default)
    # Azure AD against a local emulator: plain AMQP to the port in fully_qualified_namespace ("127.0.0.1:5672"),
    # no TLS (what UseDevelopmentEmulator=true means in a connection string).
    use_development_emulator: bool = False
    # The administration API (HTTPS): ``host[:port]``; by default the namespace's host, as on Azure. A local
    # emulator serves it on a port of its own (Microsoft's on 5300).
    administration_endpoint: str | None = None
    # How the namespace is reached (``Transport``): AMQP over TLS on 5671, or AMQP over WebSockets on 443 where
    # only 443 is open (a firewalled VNet, corporate egress), optionally through an HTTP proxy.
    transport: str = Transport.AMQP.value
    # Where to connect instead of the namespace's host: ``sb://host[:port]`` (an application gateway, a
    # private endpoint's address). Service Bus still knows the namespace by its own host; TLS checks that the
    # certificate names this host.
    custom_endpoint_address: str | None = None
    # An HTTP proxy on the way (amqp-websockets only): the tunnel is asked for with CONNECT, with basic
    # credentials when a user is given; the password only from {env: VAR} or {secret: scope/key}.
    proxy_host: str | None = None
    proxy_port: int | None = None
    proxy_user: str | None = None
    proxy_password: Secret | None = None
    # A PEM file of the certificate authorities to trust instead of the system's, for AMQP (TLS, WebSockets)
    # and the administration API alike: a private authority (a TLS-inspecting proxy's), an emulator's own.
    ca_file: str | None = None
    # A pooled link (a sender, a peek or purge receiver) idle this long is closed and opened again before
    # its next use: Service Bus detaches links idle for 10 minutes, and a link met detached fails its next
    # request first. Lower it behind a firewall or NAT that drops idle connections sooner.
    idle_link_seconds: float = 480.0
    # At most this many of the namespace's credits a second over all the syphon's processes (0: no budget).
    # A Basic or Standard namespace has 1,000 a second for every client, and throttles every kind of operation
    # once they are spent: leave the namespace's other clients what they need
    # (docs/running/routing-and-pacing.md, "A budget of credits").
    max_credits_per_second: float = 0.0

    @property
    def azure_ad(self) -> CredentialConfig | None:
        """The Azure AD credential (kind ``default`` when none is configured); None with a connection string."""
        if self.connection_string is not None:
            return None
        return self.credential or CredentialConfig()

    @property
    def endpoint(self) -> str:
        """``host[:port]`` of the namespace (not a secret: it names where, not how to get in)."""
        if self.connection_string is None:
            return self.fully_qualified_namespace or ""
        for piece in self.connection_string.reveal().split(";"):
            key, _, value = piece.partition("=")
            if key.strip().lower() == "endpoint":
                return value.strip().split("://", 1)[-1].strip("/")
        return ""

    @property
    def transport_kind(self) -> Transport:
        return Transport(self.transport)

    @property
    def plain_amqp(self) -> bool:
        """A local emulator's plain AMQP (``UseDevelopmentEmulator=true``, ``use_development_emulator``): no TLS."""
        if self.connection_string is None:
            return self.use_development_emulator
        for piece in self.connection_string.reveal().split(";"):
            key, _, value = piece.partition("=")
            if key.strip().lower() == "usedevelopmentemulator":
                return value == "true"  # as the SDK reads it: lower case only
        return False

    @property
    def connect_endpoint(self) -> str:
        """``host:port`` the syphon connects to (not a secret): the custom endpoint's, else the namespace's
        host on its transport's port (plain AMQP to an emulator: the port its endpoint names)."""
        if self.plain_amqp:
            return self.endpoint
        port = self.transport_kind.default_port
        if self.custom_endpoint_address:
            parts = urlsplit(self.custom_endpoint_address if "://" in self.custom_endpoint_address
                             else f"sb://{self.custom_endpoint_address}")
            return f"{parts.hostname}:{parts.port or port}"
        return f"{self.endpoint.split(':', 1)[0].split('/', 1)[0]}:{port}"

    @property
    def proxy_address(self) -> str | None:
        """``host:port`` of the HTTP proxy, or None (not a secret: no user or password)."""
        return f"{self.proxy_host}:{self.proxy_port}" if self.proxy_host else None

    @property
    def network_key(self) -> tuple:
        """Identifies how the namespace is reached, for a process's cache of clients (the proxy's password
        only as a hash)."""
        password = self.proxy_password.reveal() if self.proxy_password is not None else ""
        return (self.transport, self.custom_endpoint_address, self.proxy_host, self.proxy_port, self.proxy_user,
                hashlib.sha256(password.encode()).hexdigest(), self.ca_file)

    @property
    def administration_host(self) -> str:
        """``host[:port]`` of the namespace's administration API."""
        return self.administration_endpoint or self.endpoint.split(":", 1)[0]

    def connection_string_with_endpoint(self, host: str) -> str:
        """The connection string (revealed: for a client only, never to print) with its Endpoint at ``host``."""
        pieces = [f"Endpoint=sb://{host}/" if piece.partition("=")[0].strip().lower() == "endpoint" else piece
                  for piece in self.connection_string.reveal().split(";")]
        return ";".join(pieces)


@dataclass(frozen=True)
class PrimaryConfig(NamespaceConfig):
    namespace: str = ""  # primary namespace name, as used in backlog queue paths


@dataclass(frozen=True)
class BacklogConfig:
    queue_count: int = 10  # legacy BacklogQueueCount: queues 0..count-1 are always read
    discover: bool = True  # also list <ns>/x-servicebus-transfer/* when a management API is reachable
    # {backlog queue: dead-lettered messages exported}: the operator's acknowledgement that what its dead-letter
    # sub-queue holds was exported (docs/running/finishing.md), so ``--decommission`` may remove the queue with
    # them. Only an exact match counts: a queue whose dead-letter count differs is held (export again).
    exported_dead_letters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StorageConfig:
    audit_table: str = ""  # Delta path (contains '/' or a scheme) or a catalog table name
    checkpoint_table: str = ""
    checkpoint_location: str = ""  # Spark streaming checkpoint folder
    lease_table: str = ""  # which run may deliver; default: the checkpoint table's name + "_lease"
    # How often a run rewrites the checkpoint table while it goes on (0: after every batch). Each batch
    # commits its audit rows; the checkpoint rows are a shortcut over them (where a restart starts
    # reading), so rewriting them less often saves a commit per batch (about a second on cloud storage)
    # and costs a run that crashed only a longer read of the audit. A run's clean end always writes them.
    checkpoint_interval_seconds: float = 60.0
    runs_table: str = ""  # one row per run; default: the checkpoint table's name + "_runs"
    # The state tables' time-travel window, in days: how long their log entries and the files a compaction or
    # rewrite replaced stay (``storage.upkeep``). Every commit lists the whole log folder on most file systems,
    # so a longer window is a slower batch at a batch every few seconds (docs/running/table-upkeep.md).
    table_retention_days: int = 1

    @property
    def resolved_lease_table(self) -> str:
        return self.lease_table or self.checkpoint_table.rstrip("/") + "_lease"

    @property
    def resolved_runs_table(self) -> str:
        return self.runs_table or self.checkpoint_table.rstrip("/") + "_runs"


@dataclass(frozen=True)
class RunConfig:
    trigger: str = AVAILABLE_NOW  # or a processing-time interval such as "10 seconds"
    # Bigger batches spread each batch's fixed cost (a Delta commit, a few Spark jobs) over more
    # messages; the driver holds aggregates only, so its memory does not grow with them.
    max_messages_per_trigger: int = 10000
    query_name: str = "backlog-syphon"
    # Longest pause between probes (one peek each) of an empty backlog queue: 900 s costs 4 operations
    # per idle queue per hour, like the legacy syphon's 15-minute long poll; a message written into a
    # long-idle queue is seen within that long.
    idle_probe_max_seconds: float = 900.0
    wait_for_lease: bool = False  # another run holds the backlog: wait for it (true) or exit at once
    lease_seconds: float = 120.0  # how long a crashed run's lease blocks the next run
    # Where nothing can bound an available-now batch (Spark Connect against a Spark 4.0/4.1 server, such
    # as serverless on those versions), a run whose backlog spans more sequence numbers than this refuses
    # to start: one batch of everything makes the duplicate window the whole backlog.
    max_single_batch_messages: int = 100000
    # What the run reads: the backlog queues, their dead-letter sub-queues (a re-drive, filtered by the
    # ``redrive`` section; ``jobs/syphon.py --redrive-dead-letters`` sets it), or the entities the ``migration``
    # section selects (``--migrate``).
    source: str = RunSource.BACKLOG.value
    # How the command line writes its log lines: text, or one JSON object per line (``--log-format``).
    log_format: str = LogFormat.TEXT.value


@dataclass(frozen=True)
class RedriveConfig:
    """Which dead-lettered messages a re-drive (``run.source: dead_letters``) sends again. Every filter
    given must match (an empty one matches everything); what does not match stays where it is."""

    reason_codes: tuple[str, ...] = ()  # the syphon's reason codes (model.DEAD_LETTER_REASON_CODES)
    dead_letter_reasons: tuple[str, ...] = ()  # the broker's (or anyone's) DeadLetterReason, e.g. MaxDeliveryCountExceeded
    destinations: tuple[str, ...] = ()  # the destination restored from x-ms-path
    enqueued_after: str | None = None  # ISO 8601 with a time zone; entered the backlog at or after it
    enqueued_before: str | None = None  # ... and before it
    # An earlier re-drive dead-lettered a message again (it is still undeliverable): send it again only
    # when asked, so repeated re-drives do not keep re-sending what keeps failing.
    retry_dead_lettered: bool = False

    @property
    def enqueued_window(self) -> tuple[dt.datetime | None, dt.datetime | None]:
        return (None if self.enqueued_after is None else dt.datetime.fromisoformat(self.enqueued_after),
                None if self.enqueued_before is None else dt.datetime.fromisoformat(self.enqueued_before))

    @property
    def filters(self) -> bool:
        """Whether any filter is set (a re-drive without one selects every dead-lettered message)."""
        return bool(self.reason_codes or self.dead_letter_reasons or self.destinations or self.enqueued_after
                    or self.enqueued_before)


@dataclass(frozen=True)
class MigrationConfig:
    """The migration mode (``run.source: migration``): which entities of the source namespace (``secondary``)
    are drained into the target (``primary``), where each one's messages go, and what a moved message becomes.
    With ``run.source: dead_letters`` it names whose dead-letter sub-queues a re-drive reads."""

    # Entity paths and shell patterns over what the source's administration API lists: queues ("orders"),
    # subscriptions ("events/Subscriptions/audit"), topics (their scheduled messages: "events") and dead-letter
    # sub-queues, which only a name or pattern saying $DeadLetterQueue selects ("*/$DeadLetterQueue").
    entities: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()  # names and patterns taken out again
    # {source entity path: target queue or topic}: by default a source's messages go to the entity of the same
    # name (a dead-letter sub-queue's: its entity's route; a subscription: see ``subscriptions``).
    destination_map: dict[str, str] = field(default_factory=dict)
    # {subscription path or pattern: topic | queue | property}: how a subscription's messages reach the target
    # (``model.SubscriptionDelivery``); every selected subscription needs one.
    subscriptions: dict[str, str] = field(default_factory=dict)
    subscription_property: str = "x-syphon-subscription"  # the application property ``property`` delivery sets
    message_rules: str = MessageRules.COPY.value  # or the backlog mode's restore rules
    # The broker's fields (source entity, sequence number, enqueue time, delivery count, dead-letter reason)
    # as x-syphon-* application properties of the copy; None: on for dead-letter sources only.
    provenance: bool | None = None
    # A scheduled message due sooner than this is left to become active and read again then: moving it and
    # cancelling it would race its activation (a new sequence number, so a second copy).
    scheduled_margin_seconds: float = 60.0

    @property
    def configured(self) -> bool:
        return bool(self.entities)


@dataclass(frozen=True)
class RestoreConfig:
    ttl_policy: str = TtlPolicy.REMAINING.value  # TtlPolicy.RESTART is the legacy syphon's behaviour
    # {old name: new name}: messages whose x-ms-path names a queue or topic renamed since go to its new
    # name. Applied once, never transitively; names match case-insensitively, as Service Bus's do.
    destination_map: dict[str, str] = field(default_factory=dict)
    # Destinations (as sent, so after destination_map) whose messages stay in the backlog, untouched,
    # for a later run: a destination that must stay closed for now.
    skip_destinations: tuple[str, ...] = ()


@dataclass(frozen=True)
class SinkConfig:
    max_send_attempts: int = 5  # per batch of sends, for transient errors
    retry_backoff_seconds: float = 1.0
    max_retry_backoff_seconds: float = 30.0
    outage_wait_seconds: float = 600.0  # how long a batch waits for an unreachable primary before failing the run
    max_message_size_bytes: int = 256 * 1024  # Standard tier; 100 MB for Premium entities
    # Sends to the primary per second, over all send tasks (0: no cap). A Standard namespace has about
    # 1,000 credits a second for everyone, live producers included
    # (docs/running/routing-and-pacing.md, "Draining politely").
    max_messages_per_second: float = 0.0
    # After ServerBusy (or quota exceeded, or throttled) a task's rate is halved; it climbs back from
    # the floor to its cap (or, with no cap, to where it was) over this many seconds of sending.
    throttle_recovery_seconds: float = 30.0


def trigger_options(trigger: str) -> dict[str, Any]:
    """Keyword arguments for ``DataStreamWriter.trigger``."""
    if trigger == AVAILABLE_NOW:
        return {"availableNow": True}
    return {"processingTime": trigger}
