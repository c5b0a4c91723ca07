"""Check the settings once they are read: each value's type as it is read, then the sections together.

Every error is a :class:`~backlog_syphon.config.types.ConfigError` that names the key, where it came
from and what to give instead, and never a value that could be a secret.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from backlog_syphon.config.types import (
    AVAILABLE_NOW,
    CREDENTIAL_FIELDS,
    BacklogConfig,
    ConfigError,
    CredentialConfig,
    MigrationConfig,
    NamespaceConfig,
    PrimaryConfig,
    RedriveConfig,
    RestoreConfig,
    RunConfig,
    Secret,
    SinkConfig,
    StorageConfig,
)
from backlog_syphon.model import (
    DEAD_LETTER_REASON_CODES,
    CredentialKind,
    LogFormat,
    MessageRules,
    RunSource,
    SubscriptionDelivery,
    Transport,
    TtlPolicy,
)
from backlog_syphon.restore.legacy_properties import entity_path_problem
from backlog_syphon.restore.queue_names import is_backlog_queue_name

_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(second|seconds|minute|minutes|hour|hours)\s*$")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # module.path:callable


def credential_config(value: Any, key: str, origin: str, resolve_secret: Callable[[Any, str], Any]) -> CredentialConfig:
    """``<namespace>.credential``: a mapping with ``kind`` and that kind's fields (``CREDENTIAL_FIELDS``)."""
    if isinstance(value, CredentialConfig):
        return value
    kinds = ", ".join(CredentialKind)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} in {origin}: expected a mapping such as {{kind: managed_identity}} (kinds: {kinds})")
    kind = value.get("kind")
    if kind not in set(CredentialKind):
        raise ConfigError(f"{key}.kind in {origin}: must be one of {kinds}, got {kind!r}")
    required, optional = CREDENTIAL_FIELDS[kind]
    for name in value:
        if name != "kind" and name not in required + optional:
            takes = ", ".join(required + optional) or "no other setting"
            raise ConfigError(f"{key}.{name} in {origin}: not a setting of a {kind} credential; it takes {takes}")
    for name in required:
        if value.get(name) in (None, ""):
            raise ConfigError(f"{key}.{name} in {origin}: a {kind} credential needs it")
    fields: dict[str, Any] = {"kind": kind}
    for name, given in value.items():
        where = f"{key}.{name} in {origin}"
        if name == "kind" or given is None:
            continue
        if name in ("client_secret", "secret"):
            fields[name] = resolve_secret(given, where)
        elif name == "options":
            if not (isinstance(given, Mapping) and all(isinstance(k, str) and isinstance(v, (str, int, float, bool))
                                                       for k, v in given.items())):
                raise ConfigError(f"{where}: expected a mapping of keyword arguments to plain values (text, "
                                  f"numbers, true/false); give secrets as 'secret'")
            fields[name] = dict(given)
        elif not isinstance(given, str) or not given.strip():
            raise ConfigError(f"{where}: expected text, got {type(given).__name__}")
        else:
            fields[name] = given.strip()
    if kind == CredentialKind.CUSTOM and not _FACTORY.match(fields["factory"]):
        raise ConfigError(f"{key}.factory in {origin}: expected 'module.path:callable', got {fields['factory']!r}")
    return CredentialConfig(**fields)


def check_type(value: Any, annotation: str, where: str) -> Any:
    if value is None and "None" in annotation:
        return None
    annotation = annotation.removesuffix(" | None")
    if annotation.startswith("dict[str, int]"):
        if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                              and v >= 0 for k, v in value.items()):
            return dict(value)
        expected = "a mapping of names to whole numbers of 0 or more, such as {name: 2}"
    elif annotation.startswith("dict[str, str]"):
        if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
        expected = "a mapping of names to names, such as {old-name: new-name}"
    elif annotation.startswith("tuple[str"):
        # A YAML list, or one text (from --set or a variable) with the items separated by commas.
        items = [item.strip() for item in value.split(",")] if isinstance(value, str) else value
        if isinstance(items, (list, tuple)) and all(isinstance(item, str) for item in items):
            return tuple(item for item in items if item)
        expected = "a list of texts (in YAML [a, b], or a,b)"
    elif annotation.startswith("str"):
        if isinstance(value, str):
            return value
        if isinstance(value, dt.datetime):  # YAML reads an ISO 8601 time as one
            if value.tzinfo is None:
                raise ConfigError(f"{where}: a time needs its time zone, e.g. 2026-11-26T10:00:00Z")
            return value.isoformat()
        expected = "text"
    elif annotation == "bool":
        if isinstance(value, bool):
            return value
        expected = "true or false"
    elif annotation == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        expected = "a whole number"
    elif annotation == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        expected = "a number"
    else:  # pragma: no cover - every field type is handled above
        raise AssertionError(annotation)
    shown = type(value).__name__
    raise ConfigError(f"{where}: expected {expected}, got {shown}")


def validate_sections(origin: str, *, primary: PrimaryConfig, secondary: NamespaceConfig, backlog: BacklogConfig,
              storage: StorageConfig, run: RunConfig, restore: RestoreConfig, sink: SinkConfig,
              redrive: RedriveConfig, migration: MigrationConfig = MigrationConfig()) -> None:
    """The sections of one configuration, checked together before they make a ``SyphonConfig`` (which lives
    with the loader, since its ``with_overrides`` loads; this module stays below it)."""
    required = {"primary.namespace": primary.namespace, "storage.audit_table": storage.audit_table,
                "storage.checkpoint_table": storage.checkpoint_table,
                "storage.checkpoint_location": storage.checkpoint_location}
    for dotted, value in required.items():
        if not value:
            raise ConfigError(f"{origin}: '{dotted}' is required")
    for name, ns in (("primary", primary), ("secondary", secondary)):
        if ns.connection_string is not None and (ns.fully_qualified_namespace or ns.credential is not None):
            raise ConfigError(f"{origin}: '{name}' has connection_string and Azure AD settings (fully_qualified_namespace, "
                              f"credential): keep one way in")
        if ns.credential is not None and not ns.fully_qualified_namespace:
            raise ConfigError(f"{origin}: '{name}.credential' goes with '{name}.fully_qualified_namespace', the "
                              f"namespace's host name (such as contoso.servicebus.windows.net)")
        if ns.connection_string is None and not ns.fully_qualified_namespace:
            raise ConfigError(f"{origin}: '{name}' needs connection_string ({{env: VAR}} or {{secret: scope/key}}) "
                              f"or fully_qualified_namespace and credential (Azure AD)")
        if ns.use_development_emulator and not ns.fully_qualified_namespace:
            raise ConfigError(f"{origin}: '{name}.use_development_emulator' applies to Azure AD "
                              f"(fully_qualified_namespace); a connection string says UseDevelopmentEmulator=true itself")
        if ns.fully_qualified_namespace and "://" in ns.fully_qualified_namespace:
            raise ConfigError(f"{origin}: '{name}.fully_qualified_namespace' is a host name (and port), such as "
                              f"contoso.servicebus.windows.net, without a scheme")
        if ns.connection_string is not None:
            _check_connection_string(ns.connection_string, f"{name}.connection_string")
        if ns.administration_endpoint is not None and ("://" in ns.administration_endpoint
                                                       or "/" in ns.administration_endpoint.strip("/")):
            raise ConfigError(f"{origin}: '{name}.administration_endpoint' is a host name and port, such as "
                              f"127.0.0.1:5300, without a scheme or path")
        if not 0 < ns.idle_link_seconds < 600:
            raise ConfigError(f"{origin}: '{name}.idle_link_seconds' must be above 0 and below 600 (Service Bus "
                              f"detaches a link idle for 10 minutes), got {ns.idle_link_seconds:g}")
        if not 0 <= ns.max_credits_per_second < float("inf"):
            raise ConfigError(f"{origin}: '{name}.max_credits_per_second' must be 0 (no budget) or the credits a "
                              f"second the syphon may spend there, got {ns.max_credits_per_second:g}")
        _validate_network(ns, name, origin)
    if backlog.queue_count < 1:
        raise ConfigError(f"{origin}: backlog.queue_count must be at least 1")
    for name in backlog.exported_dead_letters:
        if not is_backlog_queue_name(name, primary.namespace):
            raise ConfigError(f"{origin}: backlog.exported_dead_letters names {name!r}, which is not a backlog queue of "
                              f"{primary.namespace!r}: name the queue (such as {primary.namespace}/x-servicebus-transfer/0), "
                              f"not its dead-letter sub-queue")
    if storage.checkpoint_interval_seconds < 0:
        raise ConfigError(f"{origin}: storage.checkpoint_interval_seconds must be 0 (after every batch) or more, "
                          f"got {storage.checkpoint_interval_seconds:g}")
    if storage.table_retention_days < 1:
        raise ConfigError(f"{origin}: storage.table_retention_days must be at least 1 (Delta drops log entries a day "
                          f"at a time), got {storage.table_retention_days}")
    if run.lease_seconds < 1:
        raise ConfigError(f"{origin}: run.lease_seconds must be at least 1")
    if run.max_single_batch_messages < 1:
        raise ConfigError(f"{origin}: run.max_single_batch_messages must be at least 1")
    if run.max_messages_per_trigger < 1:
        raise ConfigError(f"{origin}: run.max_messages_per_trigger must be at least 1")
    if run.trigger != AVAILABLE_NOW and not _INTERVAL.match(run.trigger):
        raise ConfigError(f"{origin}: run.trigger must be 'available_now' or an interval such as '10 seconds', "
                          f"got '{run.trigger}'")
    if restore.ttl_policy not in set(TtlPolicy):
        raise ConfigError(f"{origin}: restore.ttl_policy must be one of {', '.join(TtlPolicy)}, "
                          f"got '{restore.ttl_policy}'")
    if run.log_format not in set(LogFormat):
        raise ConfigError(f"{origin}: run.log_format must be one of {', '.join(LogFormat)}, "
                          f"got '{run.log_format}'")
    if sink.max_send_attempts < 1:
        raise ConfigError(f"{origin}: sink.max_send_attempts must be at least 1")
    if sink.max_messages_per_second < 0:
        raise ConfigError(f"{origin}: sink.max_messages_per_second must be 0 (no cap) or more, "
                          f"got {sink.max_messages_per_second:g}")
    if sink.throttle_recovery_seconds <= 0:
        raise ConfigError(f"{origin}: sink.throttle_recovery_seconds must be more than 0, "
                          f"got {sink.throttle_recovery_seconds:g}")
    _validate_routing(restore, origin)
    _validate_redrive(run, redrive, origin)
    _validate_migration(run, migration, origin)


def _validate_migration(run: RunConfig, migration: MigrationConfig, origin: str) -> None:
    """The ``migration`` section: only with ``run.source: migration`` (or a re-drive of what it dead-lettered),
    and then an ``available_now`` run with something to read. What the names match, and the routes, are checked
    against the namespaces' listings when the run starts (``migration.selection``, ``migration.routes``)."""
    if not migration.configured:
        if run.source == RunSource.MIGRATION:
            raise ConfigError(f"{origin}: run.source: migration needs migration.entities: the source's entities to "
                              f"drain, by name or pattern (such as [orders, 'events/Subscriptions/*'])")
        if migration != MigrationConfig():
            raise ConfigError(f"{origin}: migration.* settings need migration.entities (the entities they apply to)")
        return
    if run.source == RunSource.BACKLOG:
        raise ConfigError(f"{origin}: the migration section applies to run.source: migration (jobs/syphon.py "
                          f"--migrate) or to a re-drive of what it dead-lettered (--redrive-dead-letters): set "
                          f"run.source, or remove the section")
    if run.trigger != AVAILABLE_NOW:
        raise ConfigError(f"{origin}: a migration run reads what its sources hold when it starts: run.trigger must be "
                          f"'available_now', got '{run.trigger}'")
    if migration.message_rules not in set(MessageRules):
        raise ConfigError(f"{origin}: migration.message_rules must be one of {', '.join(MessageRules)}, "
                          f"got '{migration.message_rules}'")
    for pattern, choice in migration.subscriptions.items():
        if choice not in set(SubscriptionDelivery):
            raise ConfigError(f"{origin}: migration.subscriptions.{pattern} must be one of "
                              f"{', '.join(SubscriptionDelivery)}, got '{choice}'")
    for source, destination in migration.destination_map.items():
        why = entity_path_problem(destination)
        if why is not None:
            raise ConfigError(f"{origin}: migration.destination_map: {destination!r} (for {source!r}) {why}; name a "
                              f"queue or topic of the target namespace")
    if not migration.subscription_property.strip():
        raise ConfigError(f"{origin}: migration.subscription_property must name an application property")
    if migration.scheduled_margin_seconds < 0:
        raise ConfigError(f"{origin}: migration.scheduled_margin_seconds must be 0 or more, "
                          f"got {migration.scheduled_margin_seconds:g}")


def _validate_network(ns: NamespaceConfig, name: str, origin: str) -> None:
    """``transport``, ``custom_endpoint_address``, ``proxy_*`` and ``ca_file`` of one namespace."""
    if ns.transport not in set(Transport):
        raise ConfigError(f"{origin}: '{name}.transport' must be one of {', '.join(Transport)}, got '{ns.transport}'")
    websockets = ns.transport_kind is Transport.AMQP_WEBSOCKETS
    if websockets and ns.plain_amqp:
        raise ConfigError(f"{origin}: '{name}.transport' amqp-websockets needs TLS, which a local emulator's "
                          f"UseDevelopmentEmulator=true (or use_development_emulator) turns off: remove it and point "
                          f"{name}.custom_endpoint_address at the emulator's WebSocket port")
    address = ns.custom_endpoint_address
    if address is not None:
        parts = urlsplit(address if "://" in address else f"sb://{address}")
        try:
            parts.port
        except ValueError:
            parts = None
        if parts is None or parts.scheme != "sb" or not parts.hostname or parts.path.strip("/") or parts.query:
            raise ConfigError(f"{origin}: '{name}.custom_endpoint_address' is sb://host[:port] (such as "
                              f"sb://gateway.contoso.com:443), got '{address}'")
    proxy = {key: getattr(ns, key) for key in ("proxy_host", "proxy_port", "proxy_user", "proxy_password")}
    if any(value is not None for value in proxy.values()):
        if not websockets:
            raise ConfigError(f"{origin}: '{name}.proxy_host' and the other proxy settings need "
                              f"'{name}.transport: amqp-websockets' (an HTTP proxy carries WebSockets, not AMQP on "
                              f"5671)")
        if not ns.proxy_host or ns.proxy_port is None:
            raise ConfigError(f"{origin}: a proxy needs both '{name}.proxy_host' and '{name}.proxy_port'")
        if "://" in ns.proxy_host or "/" in ns.proxy_host or ":" in ns.proxy_host.strip("[]"):
            raise ConfigError(f"{origin}: '{name}.proxy_host' is a host name or address without a scheme or port "
                              f"(the port goes in '{name}.proxy_port'), got '{ns.proxy_host}'")
        if not 0 < ns.proxy_port < 65536:
            raise ConfigError(f"{origin}: '{name}.proxy_port' must be a port number (1-65535), got {ns.proxy_port}")
        if (ns.proxy_user is None) != (ns.proxy_password is None):
            raise ConfigError(f"{origin}: a proxy's credentials are '{name}.proxy_user' and '{name}.proxy_password' "
                              f"together (or neither, for a proxy that asks for none)")
    if ns.ca_file is not None and not os.path.isfile(ns.ca_file):
        raise ConfigError(f"{origin}: '{name}.ca_file' names {ns.ca_file!r}, which is not a readable file: give "
                          f"the PEM file of the certificate authorities to trust")


def _validate_redrive(run: RunConfig, redrive: RedriveConfig, origin: str) -> None:
    if run.source not in set(RunSource):
        raise ConfigError(f"{origin}: run.source must be one of {', '.join(RunSource)}, got '{run.source}'")
    if run.source != RunSource.DEAD_LETTERS:  # not a re-drive
        if redrive != RedriveConfig():
            raise ConfigError(f"{origin}: redrive.* settings apply to a re-drive only: set run.source: dead_letters "
                              f"(jobs/syphon.py --redrive-dead-letters) or remove them")
        return
    if run.trigger != AVAILABLE_NOW:
        raise ConfigError(f"{origin}: a re-drive (run.source: dead_letters) reads what the dead-letter queues hold when "
                          f"it starts: run.trigger must be 'available_now', got '{run.trigger}'")
    unknown = [code for code in redrive.reason_codes if code not in DEAD_LETTER_REASON_CODES]
    if unknown:
        raise ConfigError(f"{origin}: redrive.reason_codes: unknown reason code '{unknown[0]}'; the syphon dead-letters "
                          f"with {', '.join(DEAD_LETTER_REASON_CODES)} (the broker's own reasons, such as "
                          f"MaxDeliveryCountExceeded, go in redrive.dead_letter_reasons)")
    for key in ("enqueued_after", "enqueued_before"):
        text = getattr(redrive, key)
        if text is None:
            continue
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ConfigError(f"{origin}: redrive.{key} must be an ISO 8601 time such as 2026-11-26T10:00:00Z, "
                              f"got '{text}'") from None
        if parsed.tzinfo is None:
            raise ConfigError(f"{origin}: redrive.{key} needs its time zone, e.g. 2026-11-26T10:00:00Z")
    after, before = redrive.enqueued_window
    if after is not None and before is not None and after >= before:
        raise ConfigError(f"{origin}: redrive.enqueued_after ({redrive.enqueued_after}) must lie before "
                          f"redrive.enqueued_before ({redrive.enqueued_before})")


def _validate_routing(restore: RestoreConfig, origin: str) -> None:
    """``restore.destination_map`` and ``restore.skip_destinations``: entity names, applied once, unambiguous.

    Service Bus entity names are case-insensitive, so names are compared lower-cased. A chain (a -> b and
    b -> c) is refused rather than followed or ignored: the map is applied once, so a message for 'a' would
    go to 'b' while the map reads as if it went on to 'c'; saying 'a: c' is what is meant either way.
    A skip names the destination as sent (after the map): an old name that the map renames has no
    messages left to skip, so naming it is refused instead of silently doing nothing.
    """
    old_names: dict[str, str] = {}
    for old, new in restore.destination_map.items():
        for name in (old, new):
            why = entity_path_problem(name)
            if why is not None:
                raise ConfigError(f"{origin}: restore.destination_map: {name!r} {why}; use the queue or topic "
                                  f"path as x-ms-path names it (old) and as the primary namespace has it (new)")
        if old.lower() == new.lower():
            raise ConfigError(f"{origin}: restore.destination_map maps {old!r} to itself; remove that entry")
        if old.lower() in old_names:
            raise ConfigError(f"{origin}: restore.destination_map names {old_names[old.lower()]!r} and {old!r}, "
                              f"the same entity (names are case-insensitive); keep one entry")
        old_names[old.lower()] = old
    for old, new in restore.destination_map.items():
        if new.lower() in old_names:
            after = restore.destination_map[old_names[new.lower()]]
            raise ConfigError(f"{origin}: restore.destination_map maps {old!r} to {new!r} and {new!r} on to "
                              f"{after!r}; the map is applied once, not in a chain: map {old!r} straight to the "
                              f"name it has now")
    for name in restore.skip_destinations:
        why = entity_path_problem(name)
        if why is not None:
            raise ConfigError(f"{origin}: restore.skip_destinations: {name!r} {why}; list queue or topic paths")
        if name.lower() in old_names:
            new = restore.destination_map[old_names[name.lower()]]
            raise ConfigError(f"{origin}: restore.skip_destinations names {name!r}, which restore.destination_map "
                              f"renames to {new!r}; skips name the destination as sent: list {new!r}")


def _check_connection_string(secret: Secret, where: str) -> None:
    """Shape check only: names the missing part, never echoes the value."""
    parts = {}
    for piece in secret.reveal().strip().strip(";").split(";"):
        key, sep, value = piece.partition("=")
        if not sep:
            raise ConfigError(f"{where} (from {secret.source}) is not a Service Bus connection string: "
                              f"expected key=value pairs separated by ';'")
        parts[key.strip().lower()] = value
    if not parts.get("endpoint", "").startswith("sb://"):
        raise ConfigError(f"{where} (from {secret.source}) has no 'Endpoint=sb://<host>' part")
    has_key = parts.get("sharedaccesskeyname") and parts.get("sharedaccesskey")
    if not has_key and not parts.get("sharedaccesssignature"):
        raise ConfigError(f"{where} (from {secret.source}) needs SharedAccessKeyName and SharedAccessKey "
                          f"(or SharedAccessSignature)")
