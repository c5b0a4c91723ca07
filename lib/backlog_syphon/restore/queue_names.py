"""Backlog queue names: ``<primary namespace>/x-servicebus-transfer/<index>``, as the legacy
paired-namespace client names them in the secondary namespace. Pure."""

from __future__ import annotations

import re

BACKLOG_QUEUE_SEGMENT = "x-servicebus-transfer"
_BACKLOG_QUEUE_NAME = re.compile(
    r"(?P<namespace>[^/]+)/" + re.escape(BACKLOG_QUEUE_SEGMENT) + r"/(?P<index>0|[1-9][0-9]*)",
    re.IGNORECASE,
)


def backlog_queue_name(primary_namespace: str, index: int) -> str:
    """The backlog queue ``<primary>/x-servicebus-transfer/<index>`` the legacy client uses."""
    if not primary_namespace or "/" in primary_namespace:
        raise ValueError("primary_namespace must be a namespace name such as 'contoso' (no '/')")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be an int >= 0, got {index!r}")
    return f"{primary_namespace}/{BACKLOG_QUEUE_SEGMENT}/{index}"


def backlog_queue_names(primary_namespace: str, queue_count: int) -> list[str]:
    """The backlog queues ``0..queue_count-1`` of a primary namespace (the senders' BacklogQueueCount)."""
    return [backlog_queue_name(primary_namespace, index) for index in range(queue_count)]


def is_backlog_queue_name(name: str, primary_namespace: str | None = None) -> bool:
    """Whether ``name`` is a backlog queue, optionally of the given primary namespace.

    Entity names are case-insensitive in Service Bus, so the comparison is too.
    """
    match = _BACKLOG_QUEUE_NAME.fullmatch(name)
    if match is None:
        return False
    return primary_namespace is None or match["namespace"].lower() == primary_namespace.lower()


# A queue's dead-letter sub-queue is addressed as the path "<queue>/$DeadLetterQueue": the SDK's
# ``sub_queue=ServiceBusSubQueue.DEAD_LETTER`` builds the same entity path, and so does the emulator.
# A re-drive reads it under that name, so its offsets, checkpoint rows and audit rows never mix with
# those of the backlog queue itself.
DEAD_LETTER_SUBQUEUE = "$DeadLetterQueue"


def dead_letter_queue_name(queue: str) -> str:
    """The entity path of ``queue``'s dead-letter sub-queue: ``<queue>/$DeadLetterQueue``."""
    return f"{queue}/{DEAD_LETTER_SUBQUEUE}"


def is_dead_letter_queue_name(name: str) -> bool:
    """Whether ``name`` is a dead-letter sub-queue's path (compared case-insensitively, as Service Bus does)."""
    return name.lower().endswith("/" + DEAD_LETTER_SUBQUEUE.lower())


def owning_queue(name: str) -> str:
    """The queue an entity path belongs to: a dead-letter sub-queue's queue (partitioned as it is), else ``name``."""
    return name.rsplit("/", 1)[0] if is_dead_letter_queue_name(name) else name
