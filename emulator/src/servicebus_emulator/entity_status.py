"""Entity status as Service Bus has it: Active, SendDisabled, ReceiveDisabled, Disabled.

Queues take every status; topics only those about sending, subscriptions only those about receiving
(a topic is never received from, a subscription never sent to). The configuration reader parses it
here; the server finds an entity's status and changes it here (``status_holder``, ``disable_sends``).
No I/O and no imports of the emulator's other modules (entities are used by their attributes).

Invariants:
- on a queue ``Disabled`` is ``SendDisabled`` and ``ReceiveDisabled`` at once: ``send_disabled``
  changes the send half only (a topic has no receive half: lifting its send refusal makes it Active);
- what an entity may do is decided by its own status and, for a dead-letter queue, its parent's; a
  subscription cannot be received from while its topic is Disabled (the service's rule).
"""
from __future__ import annotations

from enum import Enum
from typing import Tuple


class EntityStatus(str, Enum):
    """The service's spellings (the administration API's ``status``)."""
    ACTIVE = "Active"
    SEND_DISABLED = "SendDisabled"
    RECEIVE_DISABLED = "ReceiveDisabled"
    DISABLED = "Disabled"

    @property
    def sends(self) -> bool:
        return self in (EntityStatus.ACTIVE, EntityStatus.RECEIVE_DISABLED)

    @property
    def receives(self) -> bool:
        return self in (EntityStatus.ACTIVE, EntityStatus.SEND_DISABLED)

    def __str__(self) -> str:
        return self.value


class EntityKind(str, Enum):
    QUEUE = "queue"
    TOPIC = "topic"
    SUBSCRIPTION = "subscription"


ALLOWED_STATUSES = {
    EntityKind.QUEUE: tuple(EntityStatus),
    EntityKind.TOPIC: (EntityStatus.ACTIVE, EntityStatus.SEND_DISABLED, EntityStatus.DISABLED),
    EntityKind.SUBSCRIPTION: (EntityStatus.ACTIVE, EntityStatus.RECEIVE_DISABLED, EntityStatus.DISABLED),
}


def parse_status(value, kind: EntityKind) -> EntityStatus:
    """``value`` (a status or its spelling) as a status a ``kind`` may have; ValueError naming the
    allowed ones otherwise."""
    allowed: Tuple[EntityStatus, ...] = ALLOWED_STATUSES[kind]
    try:
        status = EntityStatus(value)
    except ValueError:
        status = None
    if status not in allowed:
        raise ValueError(f"must be one of {', '.join(s.value for s in allowed)} for a {kind.value}, got {value!r}")
    return status


def send_disabled(status: EntityStatus, kind: EntityKind, disabled: bool = True) -> EntityStatus:
    """The status of a queue or topic once sending is disabled (or enabled again), receiving as it was."""
    if disabled:
        if not status.sends:
            return status
        return EntityStatus.SEND_DISABLED if status.receives else EntityStatus.DISABLED
    if status.sends:
        return status
    return EntityStatus.ACTIVE if status.receives or kind is EntityKind.TOPIC else EntityStatus.RECEIVE_DISABLED


def kind_of(target) -> EntityKind:
    """What a namespace's queue, topic or subscription is (a topic has subscriptions, a subscription a topic)."""
    if hasattr(target, "subscriptions"):
        return EntityKind.TOPIC
    return EntityKind.SUBSCRIPTION if target.topic is not None else EntityKind.QUEUE


def status_holder(ns, path: str):
    """The queue, topic or subscription of namespace ``ns`` at ``path`` (KeyError when there is none)."""
    lower = path.lower()
    target = ns.senders.get(lower) or ns.entities.get(lower)
    if target is None or getattr(target, "is_dlq", False):
        raise KeyError(f"no queue, topic or subscription {path!r} in namespace {ns.name!r} (a dead-letter queue "
                       f"has the status of its entity)")
    return target


def disable_sends(ns, entity, disabled: bool) -> None:
    """SendDisabled on (or off) for one queue or topic of namespace ``ns``, or (``entity`` None) all of them."""
    if entity is not None and entity.lower() not in ns.senders:
        raise KeyError(f"no queue or topic {entity!r} in namespace {ns.name!r}")
    for target in [ns.senders[entity.lower()]] if entity is not None else ns.senders.values():
        target.status = send_disabled(target.status, kind_of(target), disabled)


def receive_status(entity) -> EntityStatus:
    """What decides whether ``entity`` (a queue, subscription or dead-letter queue) may be received from."""
    owner = entity.parent or entity
    topic = owner.topic
    if topic is not None and topic.status is EntityStatus.DISABLED:
        return EntityStatus.DISABLED
    return owner.status
