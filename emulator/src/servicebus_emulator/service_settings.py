"""A namespace's service settings: the tier, the limits a test may change, peek paging, idle timers.

Defaults are what a real Standard namespace does (``limits``); each key is a namespace key of the YAML
configuration (``Config.json`` has no such keys: its namespaces take the defaults). No I/O.

Invariants:
- a setting left out takes the service's value; ``tier: premium`` only raises the default message
  count per batch (an explicit ``max_messages_per_batch`` wins over the tier);
- every error is a ``ConfigError`` naming the key's path and what is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Mapping

from . import limits
from .config_error import ConfigError


class Tier(str, Enum):
    STANDARD = "standard"
    PREMIUM = "premium"


MAX_MESSAGES_PER_BATCH = {Tier.STANDARD: limits.STANDARD_MAX_MESSAGES_PER_BATCH,
                          Tier.PREMIUM: limits.PREMIUM_MAX_MESSAGES_PER_BATCH}


@dataclass(frozen=True)
class ServiceSettings:
    tier: Tier = Tier.STANDARD
    max_messages_per_batch: int = limits.STANDARD_MAX_MESSAGES_PER_BATCH
    peek_page_bytes: int = limits.DEFAULT_PEEK_PAGE_BYTES     # encoded messages per peek answer, at most
    peek_empty_page_probability: float = 0.0                   # a peek that finds messages answers none
    peek_seed: int = 0                                         # seeds the empty pages' draws
    link_idle_timeout_seconds: float = limits.LINK_IDLE_TIMEOUT_SECONDS
    connection_idle_timeout_seconds: float = limits.CONNECTION_IDLE_TIMEOUT_SECONDS
    new_connection_idle_timeout_seconds: float = limits.NEW_CONNECTION_IDLE_TIMEOUT_SECONDS
    allow_short_locks: bool = False                            # tests only: locks under 5 seconds
    partitions: int = 0               # Premium only: 1, 2 or 4 partitions in every entity (0 = per entity)
    peek_one_per_call: bool = False   # a peek on a partitioned entity answers one message, as once reported
    receive_empty_probability: float = 0.0   # a receive on a partitioned entity gets nothing though messages wait
    receive_seed: int = 0                    # seeds those draws
    release_locks_on_link_loss: bool = False  # tests only: a lost receive link's locks end at once, not at expiry


SERVICE_KEYS = frozenset(f.name for f in fields(ServiceSettings))
_DURATIONS = ("link_idle_timeout_seconds", "connection_idle_timeout_seconds", "new_connection_idle_timeout_seconds")


def service_settings_from_dict(d: Mapping[str, Any], where: str) -> ServiceSettings:
    """The service settings among a namespace's keys (other keys are ignored: the caller checks them)."""
    values: dict = {}
    tier = d.get("tier", Tier.STANDARD.value)
    try:
        values["tier"] = Tier(tier)
    except ValueError:
        raise ConfigError(f"{where}.tier: must be one of {', '.join(t.value for t in Tier)}, got {tier!r}") from None
    values["max_messages_per_batch"] = _integer(d, "max_messages_per_batch", where,
                                                MAX_MESSAGES_PER_BATCH[values["tier"]], minimum=1)
    values["peek_page_bytes"] = _integer(d, "peek_page_bytes", where, limits.DEFAULT_PEEK_PAGE_BYTES, minimum=1)
    values["peek_seed"] = _integer(d, "peek_seed", where, 0)
    probability = _number(d, "peek_empty_page_probability", where, 0.0)
    if not 0 <= probability <= 1:
        raise ConfigError(f"{where}.peek_empty_page_probability: must be from 0 to 1, got {probability!r}")
    values["peek_empty_page_probability"] = float(probability)
    for key in _DURATIONS:
        seconds = _number(d, key, where, getattr(ServiceSettings, key))
        if not 0 < seconds < float("inf"):
            raise ConfigError(f"{where}.{key}: must be a number of seconds above 0, got {seconds!r}")
        values[key] = float(seconds)
    allow = d.get("allow_short_locks", False)
    if not isinstance(allow, bool):
        raise ConfigError(f"{where}.allow_short_locks: expected true or false, got {allow!r}")
    values["allow_short_locks"] = allow
    partitions = _integer(d, "partitions", where, 0)
    if partitions and (partitions not in limits.PREMIUM_PARTITION_COUNTS or values["tier"] is not Tier.PREMIUM):
        raise ConfigError(f"{where}.partitions: a partitioned namespace is Premium (tier: premium) with 1, 2 or 4 "
                          f"partitions, got {partitions!r}{'' if values['tier'] is Tier.PREMIUM else ' on ' + values['tier'].value}; "
                          f"on Standard set enable_partitioning on each queue or topic instead")
    values["partitions"] = partitions
    one = d.get("peek_one_per_call", False)
    if not isinstance(one, bool):
        raise ConfigError(f"{where}.peek_one_per_call: expected true or false, got {one!r}")
    values["peek_one_per_call"] = one
    values["receive_seed"] = _integer(d, "receive_seed", where, 0)
    probability = _number(d, "receive_empty_probability", where, 0.0)
    if not 0 <= probability <= 1:
        raise ConfigError(f"{where}.receive_empty_probability: must be from 0 to 1, got {probability!r}")
    values["receive_empty_probability"] = float(probability)
    release = d.get("release_locks_on_link_loss", False)
    if not isinstance(release, bool):
        raise ConfigError(f"{where}.release_locks_on_link_loss: expected true or false, got {release!r}")
    values["release_locks_on_link_loss"] = release
    return ServiceSettings(**values)


def _integer(d, key, where, default, *, minimum=None) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}.{key}: must be at least {minimum}, got {value}")
    return value


def _number(d, key, where, default) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    return value
