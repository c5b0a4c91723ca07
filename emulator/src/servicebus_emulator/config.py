"""Emulator configuration: a mapping shaped like the YAML file or like the official emulator's
``Config.json`` -> validated, frozen objects. No I/O (``loader`` reads the files).

Every validation error is a ``ConfigError`` whose message names the offending key (as a dotted path
in the file's own vocabulary) and, when loaded from a file, the file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

from . import limits
from .aad import ALL_RIGHTS, LISTEN, MANAGE, ROLES, SEND
from .config_error import ConfigError
from .entity_status import EntityKind, EntityStatus, parse_status
from .official_config import native_from_official
from .service_settings import SERVICE_KEYS, ServiceSettings, Tier, service_settings_from_dict

# correlation-filter keys (snake_case, as in the SDK's CorrelationRuleFilter) -> system field name
CORRELATION_FIELDS = (
    "correlation_id", "message_id", "to", "reply_to", "subject", "label",
    "session_id", "reply_to_session_id", "content_type",
)


@dataclass(frozen=True)
class EntitySettings:
    """Settings shared by queues and subscriptions."""
    name: str
    requires_session: bool = False
    lock_duration_seconds: float = 60.0
    max_delivery_count: int = 10
    max_message_size_kb: int = 256
    duplicate_detection_window_seconds: float = 0.0
    default_message_ttl_seconds: float = 0.0          # 0 = never expires
    dead_lettering_on_message_expiration: bool = False
    status: EntityStatus = EntityStatus.ACTIVE


@dataclass(frozen=True)
class QueueConfig(EntitySettings):
    enable_partitioning: bool = False     # 16 partitions (Standard); see ``partitions``


@dataclass(frozen=True)
class SubscriptionRule:
    """One rule of a subscription. ``correlation_filter`` is {"properties": {name: value},
    "correlation_id": ..., "subject": ...} (every key given must match); None matches everything."""
    name: str
    correlation_filter: Optional[Mapping[str, Any]] = None


DEFAULT_RULE = SubscriptionRule("$Default")


@dataclass(frozen=True)
class SubscriptionConfig(EntitySettings):
    # a message is copied to the subscription when any rule matches (as in Service Bus)
    rules: Tuple[SubscriptionRule, ...] = (DEFAULT_RULE,)


@dataclass(frozen=True)
class TopicConfig:
    name: str
    max_message_size_kb: int = 256
    duplicate_detection_window_seconds: float = 0.0
    subscriptions: Tuple[SubscriptionConfig, ...] = ()
    status: EntityStatus = EntityStatus.ACTIVE
    enable_partitioning: bool = False     # 16 partitions (Standard); its subscriptions are partitioned too


@dataclass(frozen=True)
class RoleAssignment:
    """An Azure role a principal holds on the namespace (``scope`` empty) or on one entity (a queue or
    topic path; it covers the entity's subscriptions and sub-queues)."""
    principal: str
    role: str                           # one of aad.ROLES
    scope: str = ""


@dataclass(frozen=True)
class AzureAdConfig:
    """Azure AD for a namespace: tokens signed with ``signing_key`` (see ``aad``) and what their principals
    may do."""
    signing_key: str
    role_assignments: Tuple[RoleAssignment, ...] = ()

    def __repr__(self) -> str:          # the key never shows in a log or an error
        return f"AzureAdConfig(signing_key=<masked>, role_assignments={self.role_assignments!r})"


@dataclass(frozen=True)
class NamespaceConfig:
    name: str
    host: str = "127.0.0.1"
    port: int = 5672
    sas_keys: Mapping[str, str] = field(default_factory=dict)
    queues: Tuple[QueueConfig, ...] = ()
    topics: Tuple[TopicConfig, ...] = ()
    latency_ms: float = 0.0             # added to every frame the emulator sends on this namespace
    local_auth: bool = True             # False: SAS tokens are refused, as with disableLocalAuth
    azure_ad: Optional[AzureAdConfig] = None
    admin_port: int = 0                 # the administration API's HTTPS port (0 = pick a free port)
    tls_port: int = 0                   # AMQP over TLS (5671 on a real namespace; 0 = pick a free port)
    websocket_port: int = 0             # AMQP over WebSockets over TLS (443 on a real namespace; 0 = free)
    # key name -> its rights; a key without an entry has all three (Send, Listen, Manage)
    sas_key_rights: Mapping[str, FrozenSet[str]] = field(default_factory=dict)

    def key_rights(self, key_name: str) -> FrozenSet[str]:
        """The rights a shared access key confers (every right unless ``sas_key_rights`` names fewer)."""
        return self.sas_key_rights.get(key_name, ALL_RIGHTS)
    service: ServiceSettings = ServiceSettings()   # tier, limits, peek paging, idle timers


_ENTITY_KEYS = {
    "requires_session": bool,
    "lock_duration_seconds": (int, float),
    "max_delivery_count": int,
    "max_message_size_kb": int,
    "duplicate_detection_window_seconds": (int, float),
    "default_message_ttl_seconds": (int, float),
    "dead_lettering_on_message_expiration": bool,
    "status": str,
}


def _check_type(value, types, where):
    if isinstance(value, bool) and types in ((int, float), int):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if not isinstance(value, types):
        names = "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise ConfigError(f"{where}: expected {names}, got {type(value).__name__} {value!r}")
    return value


def _mapping(value, where) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value, where) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _unknown(d: Mapping, allowed, where):
    for key in d:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})")


def _name(d: Mapping, where) -> str:
    name = d.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name: required, a non-empty string")
    return name


def _entity_kwargs(d: Mapping, where, kind: EntityKind, allow_short_locks: bool = False) -> Dict[str, Any]:
    """The settings among ``d``'s keys, checked against the ranges Service Bus accepts."""
    out = {}
    for key, types in _ENTITY_KEYS.items():
        if key in d:
            out[key] = _check_type(d[key], types, f"{where}.{key}")
    if "status" in out:
        try:
            out["status"] = parse_status(out["status"], kind)
        except ValueError as exc:
            raise ConfigError(f"{where}.status: {exc}") from None
    lock = out.get("lock_duration_seconds", EntitySettings.lock_duration_seconds)
    error = limits.lock_duration_error(lock, allow_short_locks=allow_short_locks)
    if error:
        hint = "" if allow_short_locks else "; for shorter locks in tests set allow_short_locks: true on the namespace"
        raise ConfigError(f"{where}.lock_duration_seconds: {error}, got {lock!r}{hint}")
    window = out.get("duplicate_detection_window_seconds", 0)
    error = limits.duplicate_detection_window_error(window) if window else None   # 0: detection off
    if error:
        raise ConfigError(f"{where}.duplicate_detection_window_seconds: {error}, or 0 for off, got {window!r}")
    if not 1 <= out.get("max_delivery_count", 1) <= limits.MAX_DELIVERY_COUNT:
        raise ConfigError(f"{where}.max_delivery_count: must be in 1..{limits.MAX_DELIVERY_COUNT}")
    if out.get("max_message_size_kb", 1) <= 0:
        raise ConfigError(f"{where}.max_message_size_kb: must be > 0")
    if out.get("default_message_ttl_seconds", 0) < 0:
        raise ConfigError(f"{where}.default_message_ttl_seconds: must be >= 0")
    return out


def _correlation_filter(value, where) -> Optional[Mapping[str, Any]]:
    if value is None:
        return None
    d = _mapping(value, where)
    _unknown(d, set(CORRELATION_FIELDS) | {"properties"}, where)
    if "properties" in d:
        _mapping(d["properties"], f"{where}.properties")
    return dict(d)


def _partitioning(d: Mapping, where) -> Dict[str, Any]:
    if "enable_partitioning" not in d:
        return {}
    return {"enable_partitioning": _check_type(d["enable_partitioning"], bool, f"{where}.enable_partitioning")}


def queue_from_dict(d, where, *, allow_short_locks: bool = False) -> QueueConfig:
    d = _mapping(d, where)
    _unknown(d, {"name", "enable_partitioning"} | set(_ENTITY_KEYS), where)
    return QueueConfig(name=_name(d, where), **_partitioning(d, where),
                       **_entity_kwargs(d, where, EntityKind.QUEUE, allow_short_locks))


def _rule_from_dict(d, where) -> SubscriptionRule:
    d = _mapping(d, where)
    _unknown(d, {"name", "correlation_filter"}, where)
    return SubscriptionRule(_name(d, where),
                            _correlation_filter(d.get("correlation_filter"), f"{where}.correlation_filter"))


def subscription_from_dict(d, where, *, allow_short_locks: bool = False) -> SubscriptionConfig:
    d = _mapping(d, where)
    _unknown(d, {"name", "correlation_filter", "rules"} | set(_ENTITY_KEYS), where)
    if "rules" in d:
        if "correlation_filter" in d:
            raise ConfigError(f"{where}: give either correlation_filter or rules, not both")
        rules = tuple(_rule_from_dict(r, f"{where}.rules[{i}]")
                      for i, r in enumerate(_list(d["rules"], f"{where}.rules")))
        if not rules:
            raise ConfigError(f"{where}.rules: at least one rule is required (leave rules out to match "
                              f"every message)")
        _no_duplicates([r.name for r in rules], f"{where}.rules")
    else:
        flt = _correlation_filter(d.get("correlation_filter"), f"{where}.correlation_filter")
        rules = (SubscriptionRule(DEFAULT_RULE.name, flt),)
    return SubscriptionConfig(name=_name(d, where), rules=rules,
                              **_entity_kwargs(d, where, EntityKind.SUBSCRIPTION, allow_short_locks))


def _topic_from_dict(d, where, allow_short_locks: bool) -> TopicConfig:
    d = _mapping(d, where)
    own = ("max_message_size_kb", "duplicate_detection_window_seconds", "status")
    _unknown(d, {"name", "subscriptions", "enable_partitioning", *own}, where)
    kwargs = _entity_kwargs({k: d[k] for k in own if k in d}, where, EntityKind.TOPIC)
    kwargs.update(_partitioning(d, where))
    subs = tuple(subscription_from_dict(s, f"{where}.subscriptions[{i}]", allow_short_locks=allow_short_locks)
                 for i, s in enumerate(_list(d.get("subscriptions"), f"{where}.subscriptions")))
    _no_duplicates([s.name for s in subs], f"{where}.subscriptions")
    return TopicConfig(name=_name(d, where), subscriptions=subs, **kwargs)


def _no_duplicates(names, where):
    seen = set()
    for n in names:
        if n.lower() in seen:
            raise ConfigError(f"{where}: duplicate name {n!r}")
        seen.add(n.lower())


def _namespace_from_dict(d, where) -> NamespaceConfig:
    d = _mapping(d, where)
    _unknown(d, {"name", "host", "port", "admin_port", "tls_port", "websocket_port", "sas_keys", "sas_key_rights",
                 "queues", "topics", "latency_ms", "local_auth", "azure_ad", *SERVICE_KEYS}, where)
    service = service_settings_from_dict(d, where)
    host = _check_type(d.get("host", "127.0.0.1"), str, f"{where}.host")
    port = _port(d, "port", 5672, where)
    admin_port = _port(d, "admin_port", 0, where)
    tls_port = _port(d, "tls_port", 0, where)
    websocket_port = _port(d, "websocket_port", 0, where)
    latency_ms = check_latency_ms(d.get("latency_ms", 0), f"{where}.latency_ms")
    keys = _mapping(d.get("sas_keys") or {}, f"{where}.sas_keys")
    for k, v in keys.items():
        if not isinstance(k, str) or not isinstance(v, str) or not v:
            raise ConfigError(f"{where}.sas_keys.{k}: key name and key must be non-empty strings")
    key_rights = _sas_key_rights(d.get("sas_key_rights"), keys, f"{where}.sas_key_rights")
    queues = tuple(queue_from_dict(q, f"{where}.queues[{i}]", allow_short_locks=service.allow_short_locks)
                   for i, q in enumerate(_list(d.get("queues"), f"{where}.queues")))
    topics = tuple(_topic_from_dict(t, f"{where}.topics[{i}]", service.allow_short_locks)
                   for i, t in enumerate(_list(d.get("topics"), f"{where}.topics")))
    _no_duplicates([e.name for e in queues + topics], f"{where}.queues/topics")
    check_partitioning(service, queues + topics, where)
    local_auth = _check_type(d.get("local_auth", True), bool, f"{where}.local_auth")
    azure_ad = _azure_ad(d["azure_ad"], f"{where}.azure_ad") if d.get("azure_ad") is not None else None
    if not local_auth and azure_ad is None:
        raise ConfigError(f"{where}.local_auth: false needs an azure_ad section (else nothing could sign in)")
    return NamespaceConfig(name=_name(d, where), host=host, port=port, sas_keys=dict(keys),
                           queues=queues, topics=topics, latency_ms=float(latency_ms), local_auth=local_auth,
                           azure_ad=azure_ad, admin_port=admin_port, tls_port=tls_port,
                           websocket_port=websocket_port, sas_key_rights=key_rights,
                           service=service)


def check_partitioning(service: ServiceSettings, entities, where: str) -> None:
    """On Premium partitioning is the namespace's (``partitions``), not an entity's: an entity that asks
    for it in a Premium namespace is refused, with what to write instead."""
    if service.tier is not Tier.PREMIUM or service.partitions:
        return
    for e in entities:
        if getattr(e, "enable_partitioning", False):
            raise ConfigError(f"{where}: {e.name}.enable_partitioning: a Premium namespace partitions every entity "
                              f"or none; set partitions: 1, 2 or 4 on the namespace instead")


def _port(d: Mapping, key: str, default: int, where: str) -> int:
    port = _check_type(d.get(key, default), int, f"{where}.{key}")
    if not 0 <= port <= 65535:
        raise ConfigError(f"{where}.{key}: must be in 0..65535")
    return port


def _sas_key_rights(value, keys: Mapping[str, str], where: str) -> Dict[str, FrozenSet[str]]:
    """``{key name: [rights]}``: each name a configured key; Manage only with Send and Listen, as the service
    insists when a rule is created."""
    out = {}
    for name, rights in _mapping(value or {}, where).items():
        if name not in keys:
            raise ConfigError(f"{where}.{name}: not a key of sas_keys (keys: {', '.join(keys) or 'none'})")
        rights = _list(rights, f"{where}.{name}")
        unknown = [r for r in rights if r not in ALL_RIGHTS]
        if unknown or not rights:
            raise ConfigError(f"{where}.{name}: rights must be a non-empty list of {', '.join(sorted(ALL_RIGHTS))}, "
                              f"got {rights!r}")
        if MANAGE in rights and not {SEND, LISTEN} <= set(rights):
            raise ConfigError(f"{where}.{name}: Manage needs Send and Listen too (write [Manage, Send, Listen])")
        out[name] = frozenset(rights)
    return out


def _azure_ad(value, where) -> AzureAdConfig:
    d = _mapping(value, where)
    _unknown(d, {"signing_key", "role_assignments"}, where)
    key = d.get("signing_key")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{where}.signing_key: required, a non-empty string (the test key tokens are signed with)")
    assignments = []
    for i, item in enumerate(_list(d.get("role_assignments"), f"{where}.role_assignments")):
        at = f"{where}.role_assignments[{i}]"
        item = _mapping(item, at)
        _unknown(item, {"principal", "role", "scope"}, at)
        principal = item.get("principal")
        if not isinstance(principal, str) or not principal:
            raise ConfigError(f"{at}.principal: required, a non-empty string (a token's oid)")
        role = item.get("role")
        if role not in ROLES:
            raise ConfigError(f"{at}.role: must be one of {', '.join(ROLES)}, got {role!r}")
        scope = _check_type(item.get("scope", ""), str, f"{at}.scope").strip("/")
        assignments.append(RoleAssignment(principal, role, scope))
    return AzureAdConfig(key, tuple(assignments))


def check_latency_ms(value, where) -> float:
    """A latency in milliseconds: a number >= 0."""
    _check_type(value, (int, float), where)
    if not 0 <= value < float("inf"):
        raise ConfigError(f"{where}: must be a number of milliseconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class EmulatorConfig:
    namespaces: Tuple[NamespaceConfig, ...]
    source: Optional[str] = None        # file it was loaded from, for messages

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: Optional[str] = None) -> "EmulatorConfig":
        try:
            d = _mapping(d, "<root>")
            if "UserConfig" in d:       # the official emulator's Config.json
                d = native_from_official(d)
            _unknown(d, {"namespaces"}, "<root>")
            items = _list(d.get("namespaces"), "namespaces")
            if not items:
                raise ConfigError("namespaces: at least one namespace is required")
            nss = tuple(_namespace_from_dict(n, f"namespaces[{i}]") for i, n in enumerate(items))
            _no_duplicates([n.name for n in nss], "namespaces")
        except ConfigError as exc:
            if source:
                raise ConfigError(f"{source}: {exc}") from None
            raise
        return cls(namespaces=nss, source=source)

    def namespace(self, name: str) -> NamespaceConfig:
        for ns in self.namespaces:
            if ns.name == name:
                return ns
        raise KeyError(f"unknown namespace {name!r}")

