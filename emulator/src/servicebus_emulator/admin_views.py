"""What the administration API reports about queues, topics and subscriptions, read from the live broker
state into frozen records.

Every function here reads broker objects, so it must run on the broker's loop thread
(``Server.call``); the records it returns may then go anywhere. No I/O.

Invariants:
- the counts are the messages present now: active counts locked and deferred messages too (the service
  counts a deferred message as active), scheduled ones are counted apart, and the total adds the
  dead-letter queue's; a topic's scheduled messages are the topic's (the SDK reads a scheduled count
  for topics and none for subscriptions), so its subscriptions report none;
- a topic's size and scheduled count count each message once, however many subscriptions hold a copy;
- lists are ordered by lower-case name, so that ``$skip``/``$top`` pages neither repeat nor skip an entity
  while the set of entities stays the same;
- ``status`` is the entity's own ``status`` attribute when it has one (an enum's value or a string), else
  ``Active``; ``enable_partitioning`` is whether the entity is partitioned (its own setting, or its namespace's).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any, List, Mapping, Optional

from .broker import Entity, Topic
from .message import ACTIVE, DEFERRED, LOCKED, SCHEDULED

ACTIVE_STATUS = "Active"


class EntityKind(Enum):
    QUEUE = "queue"
    TOPIC = "topic"
    SUBSCRIPTION = "subscription"


@dataclass(frozen=True)
class MessageCounts:
    active: int = 0
    dead_letter: int = 0
    scheduled: int = 0
    transfer: int = 0                 # auto-forwarding is not modelled: always 0
    transfer_dead_letter: int = 0

    @property
    def total(self) -> int:
        return self.active + self.dead_letter + self.scheduled + self.transfer + self.transfer_dead_letter


@dataclass(frozen=True)
class EntityView:
    """One entity as the administration API describes it. ``settings`` is its configuration record
    (``QueueConfig``, ``TopicConfig`` or ``SubscriptionConfig``)."""
    kind: EntityKind
    name: str                         # the queue's or topic's path, or the subscription's own name
    settings: Any
    status: str
    created_ms: int
    accessed_ms: int
    counts: MessageCounts
    size_in_bytes: int
    enable_partitioning: bool
    topic: Optional[str] = None       # a subscription's topic
    subscription_count: int = 0       # a topic's

    @property
    def path(self) -> str:
        """The entity's path in URLs: ``topic/subscriptions/name`` for a subscription."""
        return f"{self.topic}/subscriptions/{self.name}" if self.kind is EntityKind.SUBSCRIPTION else self.name


def find_entity(ns, name: str) -> Optional[EntityView]:
    """The queue or topic named ``name`` (any case) in namespace ``ns``, or None."""
    target = ns.senders.get(name.lower())
    if isinstance(target, Topic):
        return topic_view(target)
    return queue_view(target) if isinstance(target, Entity) else None


def list_entities(ns, kind: EntityKind) -> List[EntityView]:
    """Every queue (or every topic) of ``ns``, by lower-case name."""
    if kind is EntityKind.QUEUE:
        return [queue_view(t) for _, t in sorted(ns.senders.items()) if isinstance(t, Entity)]
    return [topic_view(t) for _, t in sorted(ns.senders.items()) if isinstance(t, Topic)]


def find_subscription(ns, topic_name: str, name: str) -> Optional[EntityView]:
    topic = ns.senders.get(topic_name.lower())
    if not isinstance(topic, Topic):
        return None
    for sub in topic.subscriptions:
        if sub.settings.name.lower() == name.lower():
            return subscription_view(topic, sub)
    return None


def list_subscriptions(ns, topic_name: str) -> List[EntityView]:
    """The subscriptions of a topic by lower-case name; none for a topic that does not exist."""
    topic = ns.senders.get(topic_name.lower())
    if not isinstance(topic, Topic):
        return []
    subs = sorted(topic.subscriptions, key=lambda s: s.settings.name.lower())
    return [subscription_view(topic, s) for s in subs]


@dataclass(frozen=True)
class RuleView:
    """One subscription rule as the administration API lists it: its name and correlation filter (None: a true
    filter, which takes every message)."""

    name: str
    correlation_filter: Optional[Mapping[str, Any]]
    created_ms: int


def list_rules(ns, topic_name: str, name: str) -> Optional[List[RuleView]]:
    """A subscription's rules, in their configured order; None when there is no such subscription."""
    topic = ns.senders.get(topic_name.lower())
    if not isinstance(topic, Topic):
        return None
    sub = next((s for s in topic.subscriptions if s.settings.name.lower() == name.lower()), None)
    if sub is None:
        return None
    return [RuleView(rule.name, rule.correlation_filter, sub.created_ms) for rule in sub.settings.rules]


def queue_view(queue: Entity) -> EntityView:
    return EntityView(EntityKind.QUEUE, queue.path, queue.settings, _status(queue), queue.created_ms,
                      queue.accessed_ms, _counts(queue), _size(queue), _partitioned(queue))


def subscription_view(topic: Topic, sub: Entity) -> EntityView:
    counts = dataclasses.replace(_counts(sub), scheduled=0)      # the topic reports them
    return EntityView(EntityKind.SUBSCRIPTION, sub.settings.name, sub.settings, _status(sub), sub.created_ms,
                      sub.accessed_ms, counts, _size(sub), _partitioned(topic), topic=topic.path)


def topic_view(topic: Topic) -> EntityView:
    # the subscriptions' copies share the message's Content: count each message once
    stored, scheduled = {}, set()
    for entity in [e for sub in topic.subscriptions for e in (sub, sub.dlq)] + [e for e in (topic.held,) if e]:
        for m in entity.msgs.values():
            stored[id(m.content)] = m.content.size
            if m.state == SCHEDULED:
                scheduled.add(id(m.content))
    accessed = max([topic.created_ms] + [sub.accessed_ms for sub in topic.subscriptions])
    return EntityView(EntityKind.TOPIC, topic.path, topic.settings, _status(topic), topic.created_ms, accessed,
                      MessageCounts(scheduled=len(scheduled)), sum(stored.values()), _partitioned(topic),
                      subscription_count=len(topic.subscriptions))


def _counts(entity: Entity) -> MessageCounts:
    states = Counter(m.state for m in entity.msgs.values())
    return MessageCounts(active=states[ACTIVE] + states[LOCKED] + states[DEFERRED],
                         dead_letter=len(entity.dlq.msgs), scheduled=states[SCHEDULED])


def _size(entity: Entity) -> int:
    return sum(m.content.size for e in (entity, entity.dlq) for m in e.msgs.values())


def _status(entity) -> str:
    status = getattr(entity, "status", ACTIVE_STATUS)
    return str(getattr(status, "value", status))


def _partitioned(entity) -> bool:
    """Partitioned by its own setting or by its namespace's (Premium): what the entity is, not what it asked."""
    return bool(getattr(entity, "partitions", 0))
