"""What ``make run``, the tests and the benchmarks share to check a replay: what each destination
should receive, draining destinations, and reading a backlog queue's dead-letters.

Development only (it receives and deletes from destinations): not part of the wheel.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Iterable


def expected_arrivals(originals) -> collections.Counter:
    """Messages each destination entity should receive (topic fan-out by subscription filter), for
    ``tools.backlog_writer.realistic_backlog``'s destinations (those of ``conf/emulator.yaml``)."""
    expected = collections.Counter()
    for message in originals:
        if message.destination == "events":
            expected["events/all"] += 1
            if message.application_properties.get("region") == "eu":
                expected["events/eu"] += 1
        else:
            expected[message.destination] += 1
    return expected


def drain_destinations(client, entities: Iterable[str], *, session_entities: Iterable[str] = (),
                       settle_seconds: float = 0.0, max_wait_seconds: float = 0.5) -> dict[str, list]:
    """Receive and delete everything in each entity: entity -> received messages, in arrival order.

    ``client`` is a ``ServiceBusClient`` of the primary namespace. An entity is a queue or
    ``topic/subscription``; those in ``session_entities`` are drained session after session (each
    session's messages together, in order). ``settle_seconds``: keep receiving at least that long
    (scheduled messages appear a little later).
    """
    from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode
    from azure.servicebus.exceptions import OperationTimeoutError

    mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
    sessions = set(session_entities)
    received: dict[str, list] = {}
    for entity in entities:
        messages = received[entity] = []
        topic, _, subscription = entity.partition("/")
        if entity in sessions:
            while True:
                try:
                    with client.get_queue_receiver(entity, session_id=NEXT_AVAILABLE_SESSION, receive_mode=mode,
                                                   max_wait_time=2) as receiver:
                        while batch := receiver.receive_messages(max_message_count=200,
                                                                 max_wait_time=max_wait_seconds):
                            messages.extend(batch)
                except OperationTimeoutError:  # no session left with messages
                    break
            continue
        receiver = (client.get_subscription_receiver(topic, subscription, receive_mode=mode, prefetch_count=0)
                    if subscription else client.get_queue_receiver(entity, receive_mode=mode, prefetch_count=0))
        with receiver:
            deadline = time.monotonic() + settle_seconds
            for _ in range(10_000):  # bounded: far more rounds than messages / 200
                batch = receiver.receive_messages(max_message_count=200, max_wait_time=max_wait_seconds)
                messages.extend(batch)
                if not batch and time.monotonic() >= deadline:
                    break
    return received


def received_counts(client, entities: Iterable[str], *, session_entities: Iterable[str] = ("sessions-orders",),
                    settle_seconds: float = 1.0) -> collections.Counter:
    """Drain each entity (``drain_destinations``) and count what arrived; ``sessions-orders`` of
    ``conf/emulator.yaml`` is the session-enabled one."""
    drained = drain_destinations(client, entities, session_entities=session_entities, settle_seconds=settle_seconds)
    return collections.Counter({entity: len(messages) for entity, messages in drained.items()})


def backlog_dead_letters(namespace, queue: str, max_count: int = 1000) -> list:
    """Peek a backlog queue's dead-letter sub-queue (``namespace``: the secondary's ``NamespaceConfig``)."""
    from azure.servicebus import ServiceBusSubQueue

    from backlog_syphon.servicebus.clients import open_client

    with open_client(namespace, role="secondary") as client:
        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            return list(receiver.peek_messages(max_message_count=max_count))


def process_tree(pid: int) -> dict[int, int]:
    """Every live descendant of ``pid`` with its parent's pid (Linux /proc; PySpark's daemon moves its
    workers to their own process group, so a group is not enough to find them)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry))  # the name may hold spaces
    found: dict[int, int] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child in children.get(parent, []):
            if child not in found:
                found[child] = parent
                todo.append(child)
    return found
