"""The source's options, typed: one dataclass that becomes Spark's string options and is read back
from them. Pure.

Spark hands a data source its options as strings, in the process that plans batches and in every
executor that reads them. ``SourceOptions.from_config`` is the only way the syphon fills them, so
every value has a setting behind it; where an option is absent anyway (a user's own
``spark.readStream.format("servicebus-backlog")``), the default is the configuration's own
(``config``), never a second copy of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from backlog_syphon.config import (
    AVAILABLE_NOW,
    BacklogConfig,
    CredentialConfig,
    NamespaceConfig,
    RunConfig,
    Secret,
    SinkConfig,
    SyphonConfig,
)
from backlog_syphon.credits import CreditTerms
from backlog_syphon.model import NO_MIGRATION, CredentialKind, MigrationPlan
from backlog_syphon.restore.queue_names import backlog_queue_names, dead_letter_queue_name

# Option names containing "secret" are redacted by Spark's default spark.redaction.regex, so the
# connection string (or the Azure AD credential's secret) never shows in plans, the Spark UI or event logs.
SECRET_OPTION = "connection_string_secret"
CREDENTIAL_SECRET_OPTION = "credential_secret"
PROXY_SECRET_OPTION = "proxy_password_secret"

_BACKLOG, _RUN, _SINK = BacklogConfig(), RunConfig(), SinkConfig()


@dataclass(frozen=True)
class SourceOptions:
    """What the source needs: where the backlog is, how much a batch reads, when to stop."""

    primary_namespace: str
    secondary: NamespaceConfig  # the namespace holding the backlog queues
    queue_count: int = _BACKLOG.queue_count
    discover: bool = _BACKLOG.discover
    max_messages_per_trigger: int = _RUN.max_messages_per_trigger
    idle_probe_max_seconds: float = _RUN.idle_probe_max_seconds
    available_now: bool = False  # run.trigger is available_now; without the option, a trigger that keeps going
    stop_file: str | None = None  # once this file exists, no new batch is planned (a polite stop)
    # Spark 4.0/4.1 have no read limits for Python sources: an available-now run is played with a
    # processing-time trigger, bounded windows, and a polite stop once the target is reached.
    emulate_available_now: bool = False
    # Backlog queues where earlier runs left messages for skipped destinations (restore.skip_destinations):
    # the run's first window of each starts at the queue's first message (see ``planning``).
    look_back: tuple[str, ...] = ()
    # A re-drive: read each backlog queue's dead-letter sub-queue ("<queue>/$DeadLetterQueue") instead.
    dead_letters: bool = False
    # The migration mode: the source entities to read (their paths), instead of backlog queues (nothing is
    # discovered); their rows are the messages as they were (``copy``, unless its restore rules apply); which of
    # them are peeked through a management-only link (lower-case paths), and which are partitioned.
    sources: tuple[str, ...] = ()
    copy: bool = False
    browse_only: tuple[str, ...] = ()
    partitioned: tuple[str, ...] = ()
    # How the secondary's credits are paced (``credits``): its budget is the secondary's setting.
    outage_seconds: float = _SINK.outage_wait_seconds
    recovery_seconds: float = _SINK.throttle_recovery_seconds
    # The cluster's task slots (0: unknown): at most this many windows are read at once, so the reads' share
    # of the budget is divided among no more (as the send cap is, ``sink.spark_ports.concurrent_send_tasks``).
    read_slots: int = 0

    def credit_terms(self, share: float, parts: int = 1) -> CreditTerms:
        """How one of this source's processes paces the secondary: its ``share`` of the budget among ``parts``."""
        from backlog_syphon.credits import SHARES

        return CreditTerms(SHARES.of(self.secondary.max_credits_per_second, share, parts), self.outage_seconds,
                           self.recovery_seconds)

    def windows_at_once(self, windows: int) -> int:
        """How many of a batch's ``windows`` are read at once: all of them, at most the task slots (if known)."""
        return max(1, min(windows, self.read_slots) if self.read_slots > 0 else windows)

    @classmethod
    def from_config(cls, config: SyphonConfig, *, stop_file: str | None = None,
                    emulate_available_now: bool = False, look_back: tuple[str, ...] = (),
                    migration: MigrationPlan = NO_MIGRATION, read_slots: int = 0) -> SourceOptions:
        return cls(primary_namespace=config.primary.namespace, secondary=config.secondary,
                   queue_count=config.backlog.queue_count, discover=config.backlog.discover and not migration.sources,
                   max_messages_per_trigger=config.run.max_messages_per_trigger,
                   idle_probe_max_seconds=config.run.idle_probe_max_seconds,
                   available_now=config.run.trigger == AVAILABLE_NOW, stop_file=stop_file,
                   emulate_available_now=emulate_available_now, look_back=tuple(sorted(look_back)),
                   dead_letters=config.redriving and not migration.sources, sources=migration.paths,
                   copy=bool(migration.sources) and migration.copy, browse_only=tuple(sorted(migration.browse_only)),
                   partitioned=tuple(source.path for source in migration.sources if source.partitioned),
                   outage_seconds=config.sink.outage_wait_seconds,
                   recovery_seconds=config.sink.throttle_recovery_seconds, read_slots=read_slots)

    @property
    def configured_queues(self) -> list[str]:
        """The backlog queues ``0..queue_count-1`` (or their dead-letter sub-queues), always read (discovery
        may add more); a migration run's sources."""
        if self.sources:
            return list(self.sources)
        return self.entities(backlog_queue_names(self.primary_namespace, self.queue_count))

    def entities(self, backlog_queues: list[str]) -> list[str]:
        """What the source reads of these backlog queues: themselves, or their dead-letter sub-queues."""
        return [dead_letter_queue_name(queue) for queue in backlog_queues] if self.dead_letters else list(backlog_queues)

    def to_spark(self) -> dict[str, str]:
        """The reader options (all strings, as Spark wants them)."""
        options = {
            "primaryNamespace": self.primary_namespace,
            "queueCount": str(self.queue_count),
            "discover": str(self.discover).lower(),
            "maxMessagesPerTrigger": str(self.max_messages_per_trigger),
            "idleProbeMaxSeconds": str(self.idle_probe_max_seconds),
            "availableNow": str(self.available_now).lower(),
        }
        if self.secondary.connection_string is not None:
            options[SECRET_OPTION] = self.secondary.connection_string.reveal()
        if self.secondary.fully_qualified_namespace:
            options["fullyQualifiedNamespace"] = self.secondary.fully_qualified_namespace
        credential = self.secondary.credential
        if credential is not None:
            options["credential"] = json.dumps(credential.public, sort_keys=True)  # not secret: kind, ids, names
            if credential.the_secret is not None:
                options[CREDENTIAL_SECRET_OPTION] = credential.the_secret.reveal()
        if self.secondary.use_development_emulator:
            options["useDevelopmentEmulator"] = "true"
        if self.secondary.administration_endpoint:
            options["administrationEndpoint"] = self.secondary.administration_endpoint
        options["transport"] = self.secondary.transport
        for name, value in (("customEndpointAddress", self.secondary.custom_endpoint_address),
                            ("proxyHost", self.secondary.proxy_host), ("proxyUser", self.secondary.proxy_user),
                            ("caFile", self.secondary.ca_file)):
            if value:
                options[name] = value
        if self.secondary.proxy_port is not None:
            options["proxyPort"] = str(self.secondary.proxy_port)
        if self.secondary.proxy_password is not None:
            options[PROXY_SECRET_OPTION] = self.secondary.proxy_password.reveal()
        options["idleLinkSeconds"] = str(self.secondary.idle_link_seconds)
        options["maxCreditsPerSecond"] = str(self.secondary.max_credits_per_second)
        options["outageSeconds"] = str(self.outage_seconds)
        options["recoverySeconds"] = str(self.recovery_seconds)
        if self.read_slots:
            options["readSlots"] = str(self.read_slots)
        if self.stop_file:
            options["stopFile"] = self.stop_file
        if self.emulate_available_now:
            options["emulateAvailableNow"] = "true"
        if self.look_back:
            options["lookBack"] = "\n".join(self.look_back)  # queue names hold no newline
        if self.dead_letters:
            options["deadLetters"] = "true"
        for name, values in (("sources", self.sources), ("browseOnly", self.browse_only),
                             ("partitioned", self.partitioned)):
            if values:
                options[name] = "\n".join(values)  # entity paths hold no newline
        if self.copy:
            options["copy"] = "true"
        return options

    @classmethod
    def from_spark(cls, options: Mapping[str, str]) -> SourceOptions:
        """Read the options back (Spark's option map: look-ups only, its keys' case may differ)."""
        secret = options.get(SECRET_OPTION)
        proxy_password = options.get(PROXY_SECRET_OPTION)
        secondary = NamespaceConfig(connection_string=Secret(secret, "source option") if secret else None,
                                    fully_qualified_namespace=options.get("fullyQualifiedNamespace") or None,
                                    credential=_credential(options),
                                    use_development_emulator=_boolean(options.get("useDevelopmentEmulator") or ""),
                                    administration_endpoint=options.get("administrationEndpoint") or None,
                                    transport=options.get("transport") or NamespaceConfig.transport,
                                    custom_endpoint_address=options.get("customEndpointAddress") or None,
                                    proxy_host=options.get("proxyHost") or None,
                                    proxy_port=int(options["proxyPort"]) if options.get("proxyPort") else None,
                                    proxy_user=options.get("proxyUser") or None,
                                    proxy_password=Secret(proxy_password, "source option") if proxy_password else None,
                                    ca_file=options.get("caFile") or None,
                                    idle_link_seconds=float(options.get("idleLinkSeconds")
                                                            or NamespaceConfig.idle_link_seconds),
                                    max_credits_per_second=float(options.get("maxCreditsPerSecond")
                                                                 or NamespaceConfig.max_credits_per_second))

        def get(name: str, default, parse):
            text = options.get(name)
            return default if text is None else parse(text)

        return cls(primary_namespace=options["primaryNamespace"], secondary=secondary,
                   queue_count=get("queueCount", cls.queue_count, int),
                   discover=get("discover", cls.discover, _boolean),
                   max_messages_per_trigger=get("maxMessagesPerTrigger", cls.max_messages_per_trigger, int),
                   idle_probe_max_seconds=get("idleProbeMaxSeconds", cls.idle_probe_max_seconds, float),
                   available_now=get("availableNow", cls.available_now, _boolean),
                   stop_file=options.get("stopFile") or None,
                   emulate_available_now=get("emulateAvailableNow", cls.emulate_available_now, _boolean),
                   look_back=tuple(filter(None, (options.get("lookBack") or "").split("\n"))),
                   dead_letters=get("deadLetters", cls.dead_letters, _boolean),
                   sources=_lines(options.get("sources")), copy=get("copy", cls.copy, _boolean),
                   browse_only=_lines(options.get("browseOnly")), partitioned=_lines(options.get("partitioned")),
                   outage_seconds=get("outageSeconds", cls.outage_seconds, float),
                   recovery_seconds=get("recoverySeconds", cls.recovery_seconds, float),
                   read_slots=get("readSlots", cls.read_slots, int))


def _credential(options: Mapping[str, str]) -> CredentialConfig | None:
    public = options.get("credential")
    if not public:
        return None
    fields = json.loads(public)
    secret = options.get(CREDENTIAL_SECRET_OPTION)
    if secret:  # the kind's one secret field: a service principal's client secret, a custom factory's secret
        fields["secret" if fields["kind"] == CredentialKind.CUSTOM else "client_secret"] = Secret(secret, "source option")
    return CredentialConfig(**fields)


def _lines(text: str | None) -> tuple[str, ...]:
    return tuple(filter(None, (text or "").split("\n")))


def _boolean(text: str) -> bool:
    return text == "true"
