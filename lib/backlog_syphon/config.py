"""Load and validate the syphon's configuration, once, into frozen objects.

Sources, later ones winning: a YAML file (``conf/*.yaml``), environment variables
``SYPHON__<SECTION>__<KEY>``, then ``--set section.key=value`` flags. Unknown keys and wrong types
are errors that name the key and where it came from.

Secrets: connection strings (and an Azure AD credential's client secret) are given as ``{env: VAR}``,
``{secret: scope/key}`` (Databricks secret scope) or, for a one-off run, literally; either way they end
up in a ``Secret`` whose repr and str are masked (also once pickled to executors), and no error message
ever includes a value that could be one. Secret scopes are
read by the ``secret_reader`` the caller passes (``run.host.load_config`` passes Databricks' own), so
this module stays pure: it reads the file and the variables it is given, nothing else.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from backlog_syphon.errors import SettingsError
from backlog_syphon.model import DEAD_LETTER_REASON_CODES, CredentialKind, LogFormat, RunSource, TtlPolicy
from backlog_syphon.restore.legacy_properties import entity_path_problem

ENV_PREFIX = "SYPHON__"
AVAILABLE_NOW = "available_now"  # run.trigger: drain what is there when the run starts, then stop
SECRET_SCOPES_NEED_DATABRICKS = "{secret: scope/key} references need Databricks (dbutils.secrets); use {env: VAR} elsewhere"
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(second|seconds|minute|minutes|hour|hours)\s*$")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # module.path:callable


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
    # A PEM file of certificates to trust for the administration API instead of the system's (an emulator's).
    administration_ca_file: str | None = None
    # A pooled link (a sender, a peek or purge receiver) idle this long is closed and opened again before
    # its next use: Service Bus detaches links idle for 10 minutes, and a link met detached fails its next
    # request first. Lower it behind a firewall or NAT that drops idle connections sooner.
    idle_link_seconds: float = 480.0

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
    # What the run reads: the backlog queues, or their dead-letter sub-queues (a re-drive, filtered by
    # the ``redrive`` section; ``jobs/syphon.py --redrive-dead-letters`` sets it).
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


@dataclass(frozen=True)
class SyphonConfig:
    primary: PrimaryConfig
    secondary: NamespaceConfig
    backlog: BacklogConfig = field(default_factory=BacklogConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    run: RunConfig = field(default_factory=RunConfig)
    restore: RestoreConfig = field(default_factory=RestoreConfig)
    sink: SinkConfig = field(default_factory=SinkConfig)
    redrive: RedriveConfig = field(default_factory=RedriveConfig)

    @property
    def redriving(self) -> bool:
        """Whether this run re-drives the backlog queues' dead-letter sub-queues (``run.source: dead_letters``)."""
        return self.run.source == RunSource.DEAD_LETTERS

    def with_overrides(self, overrides: Mapping[str, str], origin: str = "--set") -> "SyphonConfig":
        """A copy with dotted ``section.key`` overrides applied and validated."""
        raw = _to_raw(self)
        for dotted, text in overrides.items():
            _apply_override(raw, dotted, text, origin)
        return _build(raw, origin, resolve_secret=_SecretResolver(os.environ, None))


_SECTIONS: dict[str, type] = {
    "primary": PrimaryConfig,
    "secondary": NamespaceConfig,
    "backlog": BacklogConfig,
    "storage": StorageConfig,
    "run": RunConfig,
    "restore": RestoreConfig,
    "sink": SinkConfig,
    "redrive": RedriveConfig,
}
_REQUIRED = ("primary.namespace", "storage.audit_table", "storage.checkpoint_table",
             "storage.checkpoint_location")


def load_config(path: str | os.PathLike | None = None, *, overrides: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None,
                secret_reader: Callable[[str, str], str] | None = None) -> SyphonConfig:
    """Load YAML (optional), then ``SYPHON__*`` variables, then ``overrides``; validate; resolve secrets.

    ``secret_reader(scope, key)`` reads ``{secret: scope/key}`` references; without one they are an
    error (``run.host.load_config`` passes Databricks' secret scopes where they exist).
    """
    environ = os.environ if environ is None else environ
    origin = str(path) if path else "configuration"
    raw: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections {sorted(_SECTIONS)}")
        for section, values in loaded.items():
            if section not in _SECTIONS:
                raise ConfigError(f"{path}: unknown section '{section}'; known sections: {', '.join(_SECTIONS)}")
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: section '{section}' must be a mapping of keys")
            raw[section].update(values)
    for name, text in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            parts = name[len(ENV_PREFIX):].lower().split("__")
            if len(parts) != 2:
                raise ConfigError(f"environment variable {name}: expected {ENV_PREFIX}<SECTION>__<KEY>")
            _apply_override(raw, ".".join(parts), text, f"environment variable {name}")
    for dotted, text in (overrides or {}).items():
        _apply_override(raw, dotted, text, "--set")
    resolver = _SecretResolver(environ, secret_reader)
    return _build(raw, origin, resolver)


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["run.trigger=10 seconds", ...]`` -> ``{"run.trigger": "10 seconds"}``."""
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects section.key=value, got '{pair.split('=')[0]}...'")
        result[key.strip()] = value
    return result


def trigger_options(trigger: str) -> dict[str, Any]:
    """Keyword arguments for ``DataStreamWriter.trigger``."""
    if trigger == AVAILABLE_NOW:
        return {"availableNow": True}
    return {"processingTime": trigger}


# --- internals ---------------------------------------------------------------------------------

def _apply_override(raw: dict, dotted: str, text: str, origin: str) -> None:
    section, _, key = dotted.partition(".")
    if section not in _SECTIONS or not key:
        raise ConfigError(f"{origin}: unknown key '{dotted}'; keys look like section.key with section one of "
                          f"{', '.join(_SECTIONS)}")
    known = [f.name for f in dataclasses.fields(_SECTIONS[section])]
    if key not in known:
        raise ConfigError(f"{origin}: unknown key '{dotted}'; known keys in '{section}': {', '.join(known)}")
    # Values arrive as text: read them as YAML scalars so "20" is an int and "true" a bool, but
    # keep secrets verbatim (a connection string is not YAML). "env:VAR" and "secret:scope/key"
    # are references (a connection string starts with "Endpoint=", so they cannot be one).
    value: Any = text
    if key == "credential" and text.strip() in set(CredentialKind):
        value = {"kind": text.strip()}  # --set primary.credential=managed_identity
    elif "connection_string" in key:
        kind, sep, name = text.strip().partition(":")
        if sep and kind in ("env", "secret") and name and "=" not in name:
            value = {kind: name}
    else:
        try:
            value = yaml.safe_load(text) if text.strip() else text
        except yaml.YAMLError:
            value = text
    raw[section][key] = value


def _to_raw(config: SyphonConfig) -> dict:
    return {name: {f.name: getattr(getattr(config, name), f.name)
                   for f in dataclasses.fields(getattr(config, name))} for name in _SECTIONS}


class _SecretResolver:
    def __init__(self, environ: Mapping[str, str], secret_reader: Callable[[str, str], str] | None):
        self.environ = environ
        self.secret_reader = secret_reader

    def __call__(self, ref: Any, where: str) -> Secret:
        if isinstance(ref, Secret):
            return ref
        if isinstance(ref, str):
            return Secret(ref, f"literal value of {where}")
        if isinstance(ref, dict) and set(ref) == {"env"} and isinstance(ref["env"], str):
            name = ref["env"]
            if not self.environ.get(name):
                raise ConfigError(f"{where}: environment variable {name} is not set (or empty); export it, or "
                                  f"point {where} at another source")
            return Secret(self.environ[name], f"env {name}")
        if isinstance(ref, dict) and set(ref) == {"secret"} and isinstance(ref["secret"], str):
            scope, sep, key = ref["secret"].partition("/")
            if not sep or not scope or not key:
                raise ConfigError(f"{where}: secret references look like {{secret: <scope>/<key>}}")
            reader = self.secret_reader
            if reader is None:
                raise ConfigError(SECRET_SCOPES_NEED_DATABRICKS)
            try:
                return Secret(reader(scope, key), f"secret {scope}/{key}")
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - the reader's own errors may carry anything
                raise ConfigError(f"{where}: cannot read secret {scope}/{key} ({type(exc).__name__})") from None
        raise ConfigError(f"{where}: expected a secret reference {{env: VAR}} or {{secret: scope/key}}, got a "
                          f"{type(ref).__name__}")


def _build(raw: dict, origin: str, resolve_secret: Callable[[Any, str], Any]) -> SyphonConfig:
    sections = {}
    for name, cls in _SECTIONS.items():
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for key, value in raw[name].items():
            where = f"{name}.{key} in {origin}"
            if key not in known:
                raise ConfigError(f"{origin}: unknown key '{name}.{key}'; known keys in '{name}': "
                                  f"{', '.join(known)}")
            if key == "connection_string":
                values[key] = None if value is None else resolve_secret(value, where)
            elif key == "credential":
                values[key] = None if value is None else _credential(value, f"{name}.credential", origin,
                                                                     resolve_secret)
            else:
                values[key] = _check_type(value, known[key].type, where)
        sections[name] = cls(**values)
    config = SyphonConfig(**sections)
    _validate(config, origin)
    return config


def _credential(value: Any, key: str, origin: str, resolve_secret: Callable[[Any, str], Any]) -> CredentialConfig:
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


def _check_type(value: Any, annotation: str, where: str) -> Any:
    if value is None and "None" in annotation:
        return None
    if annotation.startswith("dict[str, str]"):
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


def _validate(config: SyphonConfig, origin: str) -> None:
    for dotted in _REQUIRED:
        section, key = dotted.split(".")
        if not getattr(getattr(config, section), key):
            raise ConfigError(f"{origin}: '{dotted}' is required")
    for name in ("primary", "secondary"):
        ns = getattr(config, name)
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
        if ns.administration_ca_file is not None and not os.path.isfile(ns.administration_ca_file):
            raise ConfigError(f"{origin}: '{name}.administration_ca_file' names {ns.administration_ca_file!r}, "
                              f"which is not a readable file: give the PEM file of the certificates to trust")
    if config.backlog.queue_count < 1:
        raise ConfigError(f"{origin}: backlog.queue_count must be at least 1")
    if config.storage.checkpoint_interval_seconds < 0:
        raise ConfigError(f"{origin}: storage.checkpoint_interval_seconds must be 0 (after every batch) or more, "
                          f"got {config.storage.checkpoint_interval_seconds:g}")
    if config.run.lease_seconds < 1:
        raise ConfigError(f"{origin}: run.lease_seconds must be at least 1")
    if config.run.max_single_batch_messages < 1:
        raise ConfigError(f"{origin}: run.max_single_batch_messages must be at least 1")
    if config.run.max_messages_per_trigger < 1:
        raise ConfigError(f"{origin}: run.max_messages_per_trigger must be at least 1")
    if config.run.trigger != AVAILABLE_NOW and not _INTERVAL.match(config.run.trigger):
        raise ConfigError(f"{origin}: run.trigger must be 'available_now' or an interval such as '10 seconds', "
                          f"got '{config.run.trigger}'")
    if config.restore.ttl_policy not in set(TtlPolicy):
        raise ConfigError(f"{origin}: restore.ttl_policy must be one of {', '.join(TtlPolicy)}, "
                          f"got '{config.restore.ttl_policy}'")
    if config.run.log_format not in set(LogFormat):
        raise ConfigError(f"{origin}: run.log_format must be one of {', '.join(LogFormat)}, "
                          f"got '{config.run.log_format}'")
    if config.sink.max_send_attempts < 1:
        raise ConfigError(f"{origin}: sink.max_send_attempts must be at least 1")
    if config.sink.max_messages_per_second < 0:
        raise ConfigError(f"{origin}: sink.max_messages_per_second must be 0 (no cap) or more, "
                          f"got {config.sink.max_messages_per_second:g}")
    if config.sink.throttle_recovery_seconds <= 0:
        raise ConfigError(f"{origin}: sink.throttle_recovery_seconds must be more than 0, "
                          f"got {config.sink.throttle_recovery_seconds:g}")
    _validate_routing(config.restore, origin)
    _validate_redrive(config, origin)


def _validate_redrive(config: SyphonConfig, origin: str) -> None:
    if config.run.source not in set(RunSource):
        raise ConfigError(f"{origin}: run.source must be one of {', '.join(RunSource)}, got '{config.run.source}'")
    redrive = config.redrive
    if not config.redriving:
        if redrive != RedriveConfig():
            raise ConfigError(f"{origin}: redrive.* settings apply to a re-drive only: set run.source: dead_letters "
                              f"(jobs/syphon.py --redrive-dead-letters) or remove them")
        return
    if config.run.trigger != AVAILABLE_NOW:
        raise ConfigError(f"{origin}: a re-drive (run.source: dead_letters) reads what the dead-letter queues hold when "
                          f"it starts: run.trigger must be 'available_now', got '{config.run.trigger}'")
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
