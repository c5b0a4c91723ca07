"""The official Azure Service Bus emulator's ``Config.json`` -> this emulator's own config mapping.

``native_from_official(doc)`` returns the mapping a YAML file would hold, so one validator
(``EmulatorConfig.from_dict``) builds both. No I/O.

Invariants:
- every key of the official schema is either mapped or refused with a ``ConfigError`` that names its
  JSON path (``UserConfig.Namespaces[0].Queues[1].Properties.ForwardTo``); unknown keys are refused
  the same way. Only ``Logging`` is read and dropped: it steers the official emulator's own log files.
- a property the file leaves out takes the official emulator's default (``OFFICIAL_DEFAULTS``), so a
  file means the same thing here as there.
- the first namespace listens on 5672 (the official emulator's port), the next ones on 5673, ...; their
  administration APIs on 5300, 5301, ...; each takes the key name and key of the official emulator's
  documented connection string.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

from . import limits
from .config_error import ConfigError

OFFICIAL_PORT = 5672
OFFICIAL_ADMIN_PORT = 5300          # its administration API (HTTP there, HTTPS here); EMULATOR_HTTP_PORT
OFFICIAL_KEY_NAME = "RootManageSharedAccessKey"
OFFICIAL_KEY = "SAS_KEY_VALUE"
OFFICIAL_DEFAULTS = {
    "LockDuration": "PT1M",
    "MaxDeliveryCount": 3,
    "DefaultMessageTimeToLive": "PT1H",
    "DuplicateDetectionHistoryTimeWindow": "PT20S",
}
# a SQL filter that is a true filter: the one SQL rule kept (it matches every message)
MATCH_ALL_SQL = re.compile(r"^\s*\(?\s*1\s*=\s*1\s*\)?\s*$")

# Config.json correlation-filter key -> the emulator's correlation-filter key
_CORRELATION_KEYS = {
    "ContentType": "content_type", "CorrelationId": "correlation_id", "Label": "label",
    "MessageId": "message_id", "ReplyTo": "reply_to", "ReplyToSessionId": "reply_to_session_id",
    "SessionId": "session_id", "To": "to",
}
_QUEUE_KEYS = {"LockDuration", "MaxDeliveryCount", "RequiresSession", "RequiresDuplicateDetection",
               "DuplicateDetectionHistoryTimeWindow", "DefaultMessageTimeToLive",
               "DeadLetteringOnMessageExpiration", "ForwardTo", "ForwardDeadLetteredMessagesTo"}
_TOPIC_KEYS = {"DefaultMessageTimeToLive", "DuplicateDetectionHistoryTimeWindow", "RequiresDuplicateDetection"}
_SUBSCRIPTION_KEYS = {"LockDuration", "MaxDeliveryCount", "RequiresSession", "DefaultMessageTimeToLive",
                      "DeadLetteringOnMessageExpiration", "ForwardTo", "ForwardDeadLetteredMessagesTo"}

_DURATION = re.compile(r"^P(?!$)(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)D)?"
                       r"(?:T(?=\d)(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_duration(text, where: str) -> float:
    """An ISO-8601 duration (``PT1M``, ``PT20S``, ``PT1H``, ``P1D``, ``P1DT2H30M``) in seconds.
    A year counts 365 days and a month 30, as .NET's ``XmlConvert.ToTimeSpan`` does."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(f"{where}: {text!r} is not an ISO-8601 duration; write e.g. \"PT30S\", \"PT5M\", "
                          f"\"PT1H\" or \"P1D\"")
    years, months, days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return (((years * 365 + months * 30 + days) * 24 + hours) * 60 + minutes) * 60 + seconds


def native_from_official(doc: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"UserConfig": {"Namespaces": [...], "Logging": ...}, "Logging": ...}`` -> ``{"namespaces": [...]}``."""
    _only(doc, {"UserConfig", "Logging"}, "")
    user = _mapping(doc["UserConfig"], "UserConfig")
    _only(user, {"Namespaces", "Logging"}, "UserConfig")
    for where, holder in (("Logging", doc), ("UserConfig.Logging", user)):
        if "Logging" in holder:
            _only(_mapping(holder["Logging"], where), {"Type"}, where)
    namespaces = _list(user.get("Namespaces"), "UserConfig.Namespaces")
    if not namespaces:
        raise ConfigError("UserConfig.Namespaces: at least one namespace is required")
    return {"namespaces": [_namespace(ns, f"UserConfig.Namespaces[{i}]", i) for i, ns in enumerate(namespaces)]}


def _namespace(ns, where: str, index: int) -> Dict[str, Any]:
    ns = _mapping(ns, where)
    _only(ns, {"Name", "Queues", "Topics"}, where)
    queues = [_queue(q, f"{where}.Queues[{i}]") for i, q in enumerate(_list(ns.get("Queues"), f"{where}.Queues"))]
    topics = [_topic(t, f"{where}.Topics[{i}]") for i, t in enumerate(_list(ns.get("Topics"), f"{where}.Topics"))]
    _unique([e["name"] for e in queues + topics], f"{where}: queue and topic names")
    return {"name": _name(ns, where), "host": "127.0.0.1", "port": OFFICIAL_PORT + index,
            "admin_port": OFFICIAL_ADMIN_PORT + index, "sas_keys": {OFFICIAL_KEY_NAME: OFFICIAL_KEY}, "queues": queues, "topics": topics}


def _queue(q, where: str) -> Dict[str, Any]:
    q = _mapping(q, where)
    _only(q, {"Name", "Properties"}, where)
    props = _properties(q, _QUEUE_KEYS, where)
    return {"name": _name(q, where), **_receiver_settings(props, f"{where}.Properties"),
            **_duplicate_detection(props, f"{where}.Properties")}


def _topic(t, where: str) -> Dict[str, Any]:
    t = _mapping(t, where)
    _only(t, {"Name", "Properties", "Subscriptions"}, where)
    props = _properties(t, _TOPIC_KEYS, where)
    # Service Bus applies the smaller of the topic's and the subscription's default TTL
    topic_ttl = _duration(props, "DefaultMessageTimeToLive", f"{where}.Properties", positive=True)
    subs = [_subscription(s, f"{where}.Subscriptions[{i}]", topic_ttl)
            for i, s in enumerate(_list(t.get("Subscriptions"), f"{where}.Subscriptions"))]
    _unique([s["name"] for s in subs], f"{where}.Subscriptions: subscription names")
    return {"name": _name(t, where), "subscriptions": subs,
            **_duplicate_detection(props, f"{where}.Properties")}


def _subscription(s, where: str, topic_ttl: float) -> Dict[str, Any]:
    s = _mapping(s, where)
    _only(s, {"Name", "Properties", "Rules"}, where)
    props = _properties(s, _SUBSCRIPTION_KEYS, where)
    out = {"name": _name(s, where), **_receiver_settings(props, f"{where}.Properties")}
    out["default_message_ttl_seconds"] = min(out["default_message_ttl_seconds"], topic_ttl)
    rules = [_rule(r, f"{where}.Rules[{i}]") for i, r in enumerate(_list(s.get("Rules"), f"{where}.Rules"))]
    if rules:        # none: the subscription keeps its $Default rule, which matches every message
        _unique([r["name"] for r in rules], f"{where}.Rules: rule names")
        out["rules"] = rules
    return out


def _receiver_settings(props: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """Settings shared by queues and subscriptions."""
    for key in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
        target = _typed(props, key, str, where, "")
        if target:
            raise ConfigError(f"{where}.{key}: auto-forwarding (to {target!r}) is not supported by this "
                              f"emulator; set it to \"\" and have your code move the messages")
    max_delivery = _typed(props, "MaxDeliveryCount", int, where, OFFICIAL_DEFAULTS["MaxDeliveryCount"])
    if not 1 <= max_delivery <= limits.MAX_DELIVERY_COUNT:
        raise ConfigError(f"{where}.MaxDeliveryCount: must be in 1..{limits.MAX_DELIVERY_COUNT}, "
                          f"got {max_delivery}")
    lock = _duration(props, "LockDuration", where, positive=True)
    error = limits.lock_duration_error(lock)
    if error:
        raise ConfigError(f"{where}.LockDuration: {error}, got {props.get('LockDuration')!r}")
    return {
        "lock_duration_seconds": lock,
        "max_delivery_count": max_delivery,
        "requires_session": _typed(props, "RequiresSession", bool, where, False),
        "default_message_ttl_seconds": _duration(props, "DefaultMessageTimeToLive", where, positive=True),
        "dead_lettering_on_message_expiration": _typed(props, "DeadLetteringOnMessageExpiration", bool, where,
                                                       False),
    }


def _duplicate_detection(props: Mapping[str, Any], where: str) -> Dict[str, Any]:
    window = _duration(props, "DuplicateDetectionHistoryTimeWindow", where)
    on = _typed(props, "RequiresDuplicateDetection", bool, where, False)
    error = limits.duplicate_detection_window_error(window) if on else None
    if error:
        raise ConfigError(f"{where}.DuplicateDetectionHistoryTimeWindow: {error}, got "
                          f"{props.get('DuplicateDetectionHistoryTimeWindow')!r}")
    return {"duplicate_detection_window_seconds": window if on else 0.0}


def _rule(r, where: str) -> Dict[str, Any]:
    r = _mapping(r, where)
    _only(r, {"Name", "Properties"}, where)
    name = _name(r, where)
    if "Properties" not in r:
        raise ConfigError(f"{where}.Properties: required (FilterType and its filter)")
    props = _mapping(r["Properties"], f"{where}.Properties")
    where = f"{where}.Properties"
    filter_type = props.get("FilterType")
    if filter_type == "Correlation":
        _only(props, {"FilterType", "CorrelationFilter", "Action"}, where)
        flt = _correlation_filter(props.get("CorrelationFilter"), f"{where}.CorrelationFilter", name)
    elif filter_type == "Sql":
        _only(props, {"FilterType", "SqlFilter", "Action"}, where)
        sql = _mapping(props.get("SqlFilter"), f"{where}.SqlFilter")
        _only(sql, {"SqlExpression"}, f"{where}.SqlFilter")
        expression = sql.get("SqlExpression")
        if not isinstance(expression, str) or not MATCH_ALL_SQL.match(expression):
            raise ConfigError(f"{where}.SqlFilter: rule {name!r} has a SQL filter ({expression!r}), which this "
                              f"emulator does not evaluate; use \"FilterType\": \"Correlation\" with a "
                              f"CorrelationFilter (a SqlExpression of \"1=1\" is accepted and matches every "
                              f"message)")
        flt = None
    else:
        raise ConfigError(f"{where}.FilterType: rule {name!r} needs \"Correlation\" or \"Sql\", "
                          f"got {filter_type!r}")
    if "Action" in props:
        action = _mapping(props["Action"], f"{where}.Action")
        _only(action, {"SqlExpression"}, f"{where}.Action")
        if (action.get("SqlExpression") or "").strip():
            raise ConfigError(f"{where}.Action: rule {name!r} has a SQL action, which this emulator does not "
                              f"support (it would change the messages); remove the Action")
    return {"name": name, "correlation_filter": flt}


def _correlation_filter(value, where: str, rule: str) -> Dict[str, Any]:
    flt = _mapping(value, where)
    _only(flt, set(_CORRELATION_KEYS) | {"Properties"}, where)
    out: Dict[str, Any] = {}
    for key, native in _CORRELATION_KEYS.items():
        text = _typed(flt, key, str, where, "")
        if text:                         # empty: not part of the filter
            out[native] = text
    properties = _mapping(flt.get("Properties") or {}, f"{where}.Properties")
    for key, prop in properties.items():
        if isinstance(prop, (dict, list)) or prop is None:
            raise ConfigError(f"{where}.Properties.{key}: expected a string, number or boolean, got {prop!r}")
    if properties:
        out["properties"] = dict(properties)
    if not out:
        raise ConfigError(f"{where}: rule {rule!r} has an empty correlation filter; set at least one field or "
                          f"property (to match every message, leave the subscription's Rules out)")
    return out


# ---- shape checks (JSON paths in messages) -------------------------------------------------------

def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _mapping(value, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _list(value, where: str) -> List[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a JSON array, got {type(value).__name__}")
    return value


def _only(d: Mapping[str, Any], allowed, where: str) -> None:
    for key in d:
        if key not in allowed:
            raise ConfigError(f"{_path(where, key)}: unknown key (allowed here: {', '.join(sorted(allowed))})")


def _name(d: Mapping[str, Any], where: str) -> str:
    name = d.get("Name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.Name: required, a non-empty string")
    return name


def _properties(d: Mapping[str, Any], allowed, where: str) -> Mapping[str, Any]:
    props = _mapping(d.get("Properties") or {}, f"{where}.Properties")
    if "EnablePartitioning" in props:
        raise ConfigError(f"{where}.Properties.EnablePartitioning: the official emulator has no partitioning (its "
                          f"Config.json schema has no such key); write the configuration in this emulator's YAML, "
                          f"with enable_partitioning: true on the queue or topic")
    _only(props, allowed, f"{where}.Properties")
    return props


def _typed(props: Mapping[str, Any], key: str, kind: type, where: str, default):
    value = props.get(key, default)
    # bool is an int in Python: a JSON true must not pass for a count
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}.{key}: expected a JSON {_JSON_NAMES[kind]}, got {value!r}")
    return value


_JSON_NAMES = {str: "string", int: "integer", bool: "boolean (true/false)"}


def _duration(props: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> float:
    seconds = parse_duration(props.get(key, OFFICIAL_DEFAULTS[key]), f"{where}.{key}")
    if positive and seconds <= 0:
        raise ConfigError(f"{where}.{key}: must be longer than zero, got {props.get(key)!r}")
    return seconds


def _unique(names, where: str) -> None:
    seen = set()
    for name in names:
        if name.lower() in seen:
            raise ConfigError(f"{where}: {name!r} appears twice")
        seen.add(name.lower())
