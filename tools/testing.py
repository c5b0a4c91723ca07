"""What ``make run``, the tests and the benchmarks share to check a replay: what each destination
should receive, draining destinations, and reading a backlog queue's dead-letters.

Development only (it receives and deletes from destinations): not part of the wheel.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable, Hashable, Iterable, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


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


def emulator_environment(emulator, primary: str = "contoso", secondary: str = "contoso-secondary", *,
                         transport: str = "amqp", proxy=None) -> dict[str, str]:
    """What a syphon's configuration (conf/local.yaml) reads from the environment to use a running emulator:
    the two connection strings, and where each namespace's administration API listens with the certificate
    to trust for it (as ``SYPHON__<NAMESPACE>__...`` settings).

    ``transport``: ``amqp`` (the emulator's plain port, ``UseDevelopmentEmulator=true``), ``amqps`` (AMQP over
    TLS, as on 5671) or ``amqp-websockets`` (over WebSockets, as on 443): the connection strings then name the
    host only, as a real namespace's do, and ``custom_endpoint_address`` the emulator's port for it.
    ``proxy``: a running ``tools.http_proxy.HttpProxy`` the WebSockets go through (its user and password
    as the settings, the password from the environment)."""
    transport_setting = "amqp-websockets" if transport == "amqp-websockets" else "amqp"
    environ = {"SYPHON_PRIMARY_CONNECTION_STRING": emulator.connection_string(primary, transport=transport),
               "SYPHON_SECONDARY_CONNECTION_STRING": emulator.connection_string(secondary, transport=transport)}
    for role, namespace in (("PRIMARY", primary), ("SECONDARY", secondary)):
        environ[f"SYPHON__{role}__ADMINISTRATION_ENDPOINT"] = emulator.admin_endpoint(namespace)
        environ[f"SYPHON__{role}__CA_FILE"] = emulator.ca_file
        if transport != "amqp":
            environ[f"SYPHON__{role}__TRANSPORT"] = transport_setting
            environ[f"SYPHON__{role}__CUSTOM_ENDPOINT_ADDRESS"] = emulator.endpoint(namespace, transport)
        if proxy is not None:
            environ[f"SYPHON__{role}__PROXY_HOST"] = proxy.host
            environ[f"SYPHON__{role}__PROXY_PORT"] = str(proxy.port)
            if proxy.user is not None:
                environ[f"SYPHON__{role}__PROXY_USER"] = proxy.user
                environ[f"SYPHON__{role}__PROXY_PASSWORD"] = proxy.password
    return environ


def each_at_once(items: Iterable[K], work: Callable[[K], T], *, name: str) -> dict[K, T]:
    """``work(item)`` for each distinct item, all at once, one thread each: item -> what it returned
    (the first error is raised again).

    The tools below give each entity a client of its own (a client is not shared between threads),
    and its links open and close without the SDK's idle waits (``sdk_internals.prompt``): what is left
    per entity is mostly waiting on the emulator (a last empty receive), which overlaps."""
    from concurrent.futures import ThreadPoolExecutor

    items = list(dict.fromkeys(items))
    with ThreadPoolExecutor(max_workers=max(1, len(items)), thread_name_prefix=name) as pool:
        return dict(zip(items, pool.map(work, items)))


def client_for(namespace, *, retry_total: int = 1):
    """A ServiceBusClient for a connection string or a ``NamespaceConfig`` (Azure AD too)."""
    from azure.servicebus import ServiceBusClient

    from backlog_syphon.servicebus.clients import open_client

    if isinstance(namespace, str):
        return ServiceBusClient.from_connection_string(namespace, retry_total=retry_total)
    return open_client(namespace, retry_total=retry_total)


def drain_destinations(connection_string, entities: Iterable[str], *, session_entities: Iterable[str] = (),
                       settle_seconds: float = 0.0, max_wait_seconds: float = 0.5) -> dict[str, list]:
    """Take everything out of each entity: entity -> received messages, in arrival order.

    ``connection_string`` is the primary namespace's (or its ``NamespaceConfig``). An entity is a queue or ``topic/subscription``;
    those in ``session_entities`` are drained session by session (each session's messages together,
    in order; see ``_drain_sessions``). ``settle_seconds``: keep receiving at least that long
    (scheduled messages appear a little later). The entities are drained at once (``each_at_once``).
    """
    sessions = set(session_entities)

    def drain(entity: str) -> list:
        if entity in sessions:
            return _drain_sessions(connection_string, entity)
        return _drain_entity(connection_string, entity, settle_seconds, max_wait_seconds)

    return each_at_once(entities, drain, name="drain")


def _drain_entity(connection_string, entity: str, settle_seconds: float, max_wait_seconds: float) -> list:
    from azure.servicebus import ServiceBusReceiveMode
    from azure.servicebus.exceptions import ServiceBusServerBusyError

    from backlog_syphon.servicebus.sdk_internals import prompt

    # Locked and completed, not received and deleted: a receive the namespace throttles part way (its credits
    # ran out) would lose what reached the link of a receive-and-delete receiver before the SDK raised.
    mode = ServiceBusReceiveMode.PEEK_LOCK
    messages: list = []
    topic, _, subscription = entity.partition("/")
    deadline = time.monotonic() + settle_seconds
    with client_for(connection_string) as client:
        for _ in range(60):  # bounded: a namespace out of credits answers busy for a second or two at a time
            receiver = prompt(client.get_subscription_receiver(topic, subscription, receive_mode=mode,
                                                               prefetch_count=0)
                              if subscription else client.get_queue_receiver(entity, receive_mode=mode,
                                                                             prefetch_count=0))
            try:
                with receiver:
                    if _drain_receiver(receiver, messages, deadline, max_wait_seconds):
                        return messages
            except ServiceBusServerBusyError:
                # The emulator throttles as a Standard namespace does: a receive refused for want of credits
                # on a link that holds no lock took nothing (the link is detached: a new receiver goes on).
                time.sleep(1.0)
    raise AssertionError(f"{entity}: still throttled after 60 tries; drained {len(messages)} so far")


def _drain_receiver(receiver, messages: list, deadline: float, max_wait_seconds: float) -> bool:
    """Receive and complete into ``messages`` until the entity is empty: True once it is."""
    for _ in range(10_000):  # bounded: far more rounds than messages / 200
        batch = receiver.receive_messages(max_message_count=200, max_wait_time=max_wait_seconds)
        if not batch and time.monotonic() >= deadline and not _holds_active(receiver):
            # What the broker sent after the last receive's wait reached the
            # link before the peek's answer on the same connection: take it before closing.
            batch = receiver.receive_messages(max_message_count=200, max_wait_time=max_wait_seconds)
            if not batch:
                return True
        for message in batch:
            _complete(receiver, message)
            messages.append(message)
    return True


def _complete(receiver, message) -> None:
    """Complete ``message``; a settlement the namespace throttles leaves it locked, so it is asked again."""
    from azure.servicebus.exceptions import ServiceBusServerBusyError

    for _ in range(60):
        try:
            receiver.complete_message(message)
            return
        except ServiceBusServerBusyError:
            time.sleep(0.5)
    raise AssertionError(f"message {message.message_id}: its completion still throttled after 60 tries")


def _holds_active(receiver, pages: int = 100) -> bool:
    """Whether the entity still holds a message a receive can take (peeked, so nothing is locked or taken).

    An empty receive alone does not say the entity is empty: on a busy machine the first message can
    take longer than the receive's wait to arrive, and a drain that stopped there lost what was on its way
    (received and deleted) and reported a full destination empty. Scheduled and deferred messages are not receivable, so they do not count; a page
    of them only moves the peek on (bounded), past them to what follows."""
    from azure.servicebus import ServiceBusMessageState

    sequence_number = 1
    for _ in range(pages):
        page = receiver.peek_messages(max_message_count=100, sequence_number=sequence_number)
        if not page:
            return False
        if any(message.state == ServiceBusMessageState.ACTIVE for message in page):
            return True
        sequence_number = page[-1].sequence_number + 1
    return False


# As many as the sessions tools.backlog_writer.realistic_backlog spreads over: each takes one session and
# then waits up to a second for another (100 messages in 20 sessions: 3.6 s with 6 drainers, 1.9 s with 20).
SESSION_DRAINERS = 20


def _drain_sessions(connection_string, queue: str) -> list:
    """Every message of a session-enabled queue, each session's together and in order.

    Several receivers take the next available session at once, each with a client of its own (a
    client is not shared between threads) that does not retry: a receiver ends when no session is
    left to accept within a second. They lock and complete (not receive-and-delete): a message the
    emulator sends after a receiver's last empty receive, just as it closes, goes back to the queue
    for the next receiver instead of being lost with the link.
    """
    from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode
    from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusServerBusyError

    from backlog_syphon.servicebus.sdk_internals import prompt

    def drain(_: int) -> list:
        messages: list = []
        with client_for(connection_string, retry_total=0) as client:
            for _ in range(10_000):  # bounded: far more sessions and throttled answers than a test makes
                try:
                    with prompt(client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1,
                                                          receive_mode=ServiceBusReceiveMode.PEEK_LOCK)) as receiver:
                        while batch := receiver.receive_messages(max_message_count=200, max_wait_time=0.3):
                            for message in batch:
                                _complete(receiver, message)
                                messages.append(message)
                except OperationTimeoutError:  # no session left with messages
                    return messages
                except ServiceBusServerBusyError:
                    # Out of credits (the emulator throttles as Standard does): what this session's receiver
                    # left uncompleted goes back with the session's lock; a new receiver takes it again.
                    time.sleep(1.0)
        raise AssertionError(f"{queue}: sessions still offered after 10,000 receivers; drained {len(messages)}")

    drained = each_at_once(range(SESSION_DRAINERS), drain, name="drain-sessions")
    return [message for messages in drained.values() for message in messages]


def received_counts(connection_string, entities: Iterable[str], *,
                    session_entities: Iterable[str] = ("sessions-orders",),
                    settle_seconds: float = 1.0) -> collections.Counter:
    """Drain each entity (``drain_destinations``) and count what arrived; ``sessions-orders`` of
    ``conf/emulator.yaml`` is the session-enabled one."""
    drained = drain_destinations(connection_string, entities, session_entities=session_entities,
                                 settle_seconds=settle_seconds)
    return collections.Counter({entity: len(messages) for entity, messages in drained.items()})


def read_queues(namespace, queues: Iterable[str], read: Callable[[Any], T], *,
                dead_letters: bool = False) -> dict[str, T]:
    """``read(receiver)`` on each queue (or its dead-letter sub-queue): queue -> what it returned.

    ``namespace``: a connection string or a ``NamespaceConfig``. The queues are read at once
    (``each_at_once``)."""
    from azure.servicebus import ServiceBusSubQueue

    from backlog_syphon.servicebus.sdk_internals import prompt

    sub_queue = ServiceBusSubQueue.DEAD_LETTER if dead_letters else None

    def one(queue: str) -> T:
        with client_for(namespace) as client, prompt(client.get_queue_receiver(queue, sub_queue=sub_queue)) as receiver:
            return read(receiver)

    return each_at_once(queues, one, name="read-queues")


def backlog_dead_letters(namespace, queues: Iterable[str], max_count: int = 1000) -> list:
    """Peek backlog queues' dead-letter sub-queues (at once): their messages, queue after queue
    (``namespace``: the secondary's connection string or ``NamespaceConfig``)."""
    found = read_queues(namespace, queues, lambda receiver: list(receiver.peek_messages(max_message_count=max_count)),
                        dead_letters=True)
    return [message for messages in found.values() for message in messages]


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
