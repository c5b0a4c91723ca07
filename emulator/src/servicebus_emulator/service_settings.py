"""A namespace's service settings: the tier, the limits a test may change, peek paging, idle timers, the
credit budget, and how a namespace under load answers receives, peeks and settlements.

Defaults are what a real Standard namespace does (``limits``); each key is a namespace key of the YAML
configuration (``Config.json`` has no such keys: its namespaces take the defaults). No I/O.

Invariants:
- a setting left out takes the service's value; ``tier: premium`` raises the default message count per
  batch (an explicit ``max_messages_per_batch`` wins over the tier) and has no credit budget (Premium's
  limit is its messaging units, not credits), which is why an explicit ``credits_per_second`` on Premium
  is an error;
- every error is a ``ConfigError`` naming the key's path and what is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Mapping

from . import limits
from .config_error import ConfigError


class Tier(str, Enum):
    BASIC = "basic"
    STANDARD = "standard"
    PREMIUM = "premium"


MAX_MESSAGES_PER_BATCH = {Tier.BASIC: limits.STANDARD_MAX_MESSAGES_PER_BATCH,
                          Tier.STANDARD: limits.STANDARD_MAX_MESSAGES_PER_BATCH,
                          Tier.PREMIUM: limits.PREMIUM_MAX_MESSAGES_PER_BATCH}
CREDITS_PER_SECOND = {Tier.BASIC: limits.STANDARD_CREDITS_PER_SECOND,
                      Tier.STANDARD: limits.STANDARD_CREDITS_PER_SECOND, Tier.PREMIUM: 0.0}


class DispositionMode(str, Enum):
    """What a settlement of several lock tokens does with the live ones when some are dead (the service
    answers one status, 410, and does not document it)."""
    PARTIAL = "partial"     # the live tokens are settled, then the request is refused
    ATOMIC = "atomic"       # nothing is settled


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
    receive_seed: int = 0                    # seeds those draws (and the short receives')
    release_locks_on_link_loss: bool = False  # tests only: a lost receive link's locks end at once, not at expiry
    credits_per_second: float = limits.STANDARD_CREDITS_PER_SECOND   # 0: no credit budget (Premium's)
    multi_token_disposition: DispositionMode = DispositionMode.PARTIAL
    short_receive_probability: float = 0.5   # a receive of several messages gets a part of them
    peek_other_partition_probability: float = 0.0   # a partitioned peek answers from a later partition
    expiry_sweep_seconds: float = limits.EXPIRY_SWEEP_SECONDS   # expired messages collected this often
    max_connections: int = limits.MAX_CONNECTIONS


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
    for key in ("receive_empty_probability", "short_receive_probability", "peek_other_partition_probability"):
        values[key] = _probability(d, key, where, getattr(ServiceSettings, key))
    release = d.get("release_locks_on_link_loss", False)
    if not isinstance(release, bool):
        raise ConfigError(f"{where}.release_locks_on_link_loss: expected true or false, got {release!r}")
    values["release_locks_on_link_loss"] = release
    values["credits_per_second"] = _credits(d, where, values["tier"])
    mode = d.get("multi_token_disposition", DispositionMode.PARTIAL.value)
    try:
        values["multi_token_disposition"] = DispositionMode(mode)
    except ValueError:
        raise ConfigError(f"{where}.multi_token_disposition: must be one of "
                          f"{', '.join(m.value for m in DispositionMode)}, got {mode!r}") from None
    sweep = _number(d, "expiry_sweep_seconds", where, limits.EXPIRY_SWEEP_SECONDS)
    if not 0 < sweep < float("inf"):
        raise ConfigError(f"{where}.expiry_sweep_seconds: must be a number of seconds above 0, got {sweep!r}")
    values["expiry_sweep_seconds"] = float(sweep)
    values["max_connections"] = _integer(d, "max_connections", where, limits.MAX_CONNECTIONS, minimum=1)
    return ServiceSettings(**values)


def _probability(d, key, where, default) -> float:
    probability = _number(d, key, where, default)
    if not 0 <= probability <= 1:
        raise ConfigError(f"{where}.{key}: must be from 0 to 1, got {probability!r}")
    return float(probability)


def _credits(d, where, tier: Tier) -> float:
    """The namespace's credits a second: the tier's (1,000 on Basic and Standard, none on Premium) unless set."""
    if "credits_per_second" not in d:
        return CREDITS_PER_SECOND[tier]
    credits = _number(d, "credits_per_second", where, 0)
    if not 0 <= credits < float("inf"):
        raise ConfigError(f"{where}.credits_per_second: must be 0 (no budget) or a number of credits above 0, "
                          f"got {credits!r}")
    if credits and tier is Tier.PREMIUM:
        raise ConfigError(f"{where}.credits_per_second: a Premium namespace has no credit budget (its limit is its "
                          f"messaging units); leave it out, or use tier: standard")
    return float(credits)


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
