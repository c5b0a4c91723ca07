"""What a Standard namespace holds when its migration to Premium is committed, written into the emulator's
``contoso-old`` (conf/emulator-migration.yaml), and what the Premium namespace ``contoso`` must hold once the
migration mode drained it: ``make run SCENARIO=migration`` and the migration tests share both.

Written with the unmodified SDK, as an application would have left it:
- ``orders``: messages with application properties of several types and a time to live, three scheduled an hour
  ahead, three deferred by a receiver, four dead-lettered by one (their dead-letter sub-queue), one whose time
  to live runs out before the drain, and one of ``LARGE_BODY`` bytes (a run with a lower
  ``sink.max_message_size_bytes`` dead-letters it: what a re-drive then moves);
- ``sessions-orders`` (sessions): three sessions in order, two with a session state, one message deferred in its
  session, and a session with a state only;
- ``partitioned-orders`` (16 partitions on Standard, none on Premium): messages over partition keys and without;
- the topic ``events``: its subscription ``all`` takes everything, ``eu`` what has region=eu (one of its messages
  dead-lettered by a consumer: its dead-letter sub-queue goes along its route, to the topic by property);
- the topic ``alerts``: its only subscription ``ops``, and two messages scheduled an hour ahead (in the topic
  until their time);
- the topic ``news``: its subscriptions ``mobile`` and ``web`` take everything, so they hold the same messages
  (drained through ``mobile``, sent to the topic once for both).

Development only: not part of the wheel.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

ORDERS, SESSIONS, PARTITIONED = "orders", "sessions-orders", "partitioned-orders"
EVENTS, ALERTS, EVENTS_ALL_QUEUE, NEWS = "events", "alerts", "events-all", "news"
NEWS_SUBSCRIPTIONS = ("mobile", "web")  # mobile, the first by name, sends for both
SESSION_COUNTS = {"s-a": 4, "s-b": 3, "s-c": 2}
SESSION_STATES = {"s-a": b"state of s-a", "s-b": b"state of s-b", "s-d": b"a session with a state only"}
DEFERRED_IN_SESSION = "s-b"
LARGE_ID, LARGE_BODY = "o-large", 70 * 1024


@dataclass
class MigrationBacklog:
    """What was written, by message id: where each message must arrive, and what stays behind."""

    queues: dict[str, list[str]] = field(default_factory=dict)  # target queue -> message ids, in order
    sessions: dict[str, list[str]] = field(default_factory=dict)  # session -> message ids, in order
    subscriptions: dict[str, list[str]] = field(default_factory=dict)  # "topic/Subscriptions/name" -> ids
    scheduled: dict[str, list[str]] = field(default_factory=dict)  # target entity -> scheduled message ids
    dead_lettered: list[str] = field(default_factory=list)  # ids in orders/$DeadLetterQueue (poison)
    subscription_dead_lettered: list[str] = field(default_factory=list)  # in events/Subscriptions/eu/$DeadLetterQueue
    deferred: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)  # expires before the drain: never arrives
    partition_keys: dict[str, str | None] = field(default_factory=dict)  # partitioned-orders' ids -> key
    properties: dict[str, dict] = field(default_factory=dict)  # id -> the application properties sent


def _client(namespace):
    from tools.testing import client_for

    return client_for(namespace, retry_total=1)


def write_migration_backlog(namespace, *, count: int = 30, scale: int = 1) -> MigrationBacklog:
    """Fill the Standard namespace (a connection string or ``NamespaceConfig``); ``count`` messages in ``orders``
    (the other entities scale with ``scale``)."""
    from azure.servicebus import ServiceBusMessage

    written = MigrationBacklog()
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    with _client(namespace) as client:
        with client.get_queue_sender(ORDERS) as sender:
            ids = [f"o-{n}" for n in range(count)]
            messages = []
            for n, message_id in enumerate(ids):
                properties = {"n": n, "weight": n * 0.5, "urgent": n % 2 == 0, "tenant": f"t-{n % 3}",
                              "at": dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=n)}
                written.properties[message_id] = properties
                messages.append(ServiceBusMessage(f"order {n}".encode(), message_id=message_id,
                                                  application_properties=properties, subject="order",
                                                  content_type="application/json", correlation_id=f"c-{n}",
                                                  time_to_live=dt.timedelta(hours=6) if n % 4 == 0 else None))
            sender.send_messages(messages)
            sender.schedule_messages([ServiceBusMessage(f"later {n}".encode(), message_id=f"o-later-{n}")
                                      for n in range(3)], later)
            written.scheduled[ORDERS] = [f"o-later-{n}" for n in range(3)]
            sender.send_messages(ServiceBusMessage(b"short-lived", message_id="o-expired",
                                                   time_to_live=dt.timedelta(seconds=1)))
            written.expired.append("o-expired")
            sender.send_messages(ServiceBusMessage(b"L" * LARGE_BODY, message_id=LARGE_ID))
        with client.get_queue_receiver(ORDERS, max_wait_time=5) as receiver:
            taken = []
            while len(taken) < 7:
                taken += receiver.receive_messages(max_message_count=7 - len(taken), max_wait_time=5)
            for message in taken[:3]:
                receiver.defer_message(message)
                written.deferred.append(str(message.message_id))
            for message in taken[3:]:
                receiver.dead_letter_message(message, reason="Poison", error_description="the consumer gave up")
                written.dead_lettered.append(str(message.message_id))
        written.queues[ORDERS] = [i for i in ids if i not in written.dead_lettered] + [LARGE_ID]

        with client.get_queue_sender(SESSIONS) as sender:
            for session, n in SESSION_COUNTS.items():
                session_ids = [f"{session}-{k}" for k in range(n * scale)]
                written.sessions[session] = session_ids
                sender.send_messages([ServiceBusMessage(f"{session} step {k}".encode(), message_id=message_id,
                                                        session_id=session)
                                      for k, message_id in enumerate(session_ids)])
        for session, state in SESSION_STATES.items():
            with client.get_queue_receiver(SESSIONS, session_id=session) as receiver:
                receiver.session.set_state(state)
                if session == DEFERRED_IN_SESSION:
                    (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                    receiver.defer_message(first)
                    written.deferred.append(str(first.message_id))

        with client.get_queue_sender(PARTITIONED) as sender:
            for n in range(24 * scale):
                key = f"k-{n % 6}" if n % 4 else None
                written.partition_keys[f"p-{n}"] = key
                sender.send_messages(ServiceBusMessage(f"part {n}".encode(), message_id=f"p-{n}", partition_key=key))
        written.queues[PARTITIONED] = list(written.partition_keys)

        with client.get_topic_sender(EVENTS) as sender:
            events = [(f"e-{n}", "eu" if n % 2 else "us") for n in range(10 * scale)]
            sender.send_messages([ServiceBusMessage(f"event {n}".encode(), message_id=message_id,
                                                    application_properties={"region": region})
                                  for n, (message_id, region) in enumerate(events)])
        written.queues[EVENTS_ALL_QUEUE] = [message_id for message_id, _ in events]
        written.subscriptions[f"{EVENTS}/Subscriptions/eu"] = [m for m, region in events if region == "eu"]
        with client.get_subscription_receiver(EVENTS, "eu", max_wait_time=5) as receiver:
            (poison,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.dead_letter_message(poison, reason="Poison", error_description="the consumer gave up")
            written.subscription_dead_lettered.append(str(poison.message_id))

        with client.get_topic_sender(ALERTS) as sender:
            alerts = [f"a-{n}" for n in range(4)]
            sender.send_messages([ServiceBusMessage(b"alert", message_id=message_id) for message_id in alerts])
            sender.schedule_messages([ServiceBusMessage(b"alert later", message_id=f"a-later-{n}") for n in range(2)],
                                     later)
        written.subscriptions[f"{ALERTS}/Subscriptions/ops"] = alerts
        written.scheduled[ALERTS] = [f"a-later-{n}" for n in range(2)]

        with client.get_topic_sender(NEWS) as sender:
            news = [f"n-{n}" for n in range(5 * scale)]
            sender.send_messages([ServiceBusMessage(f"news {n}".encode(), message_id=message_id)
                                  for n, message_id in enumerate(news)])
        for name in NEWS_SUBSCRIPTIONS:
            written.subscriptions[f"{NEWS}/Subscriptions/{name}"] = news
    time.sleep(1.2)  # o-expired's time to live runs out
    return written


TARGET, SOURCE = "contoso", "contoso-old"  # conf/emulator-migration.yaml's namespaces
PROVENANCE_REASON = "x-syphon-dead-letter-reason"
SUBSCRIPTION_PROPERTY = "x-syphon-subscription"


def check_migration(emulator, written: MigrationBacklog) -> list[str]:
    """What the Premium namespace received and what the Standard one still holds, against what was written:
    one line per problem (none: the drain moved every message once, exact, in order per session and per source (per
    partition key for a partitioned one), and left in the source only what stays by its outcome: the expired
    message, in its dead-letter sub-queue)."""
    from tools.testing import drain_destinations

    problems: list[str] = []
    target = emulator.connection_string(TARGET)
    news = [f"{NEWS}/{name}" for name in NEWS_SUBSCRIPTIONS]
    drained = drain_destinations(target, [ORDERS, PARTITIONED, EVENTS_ALL_QUEUE, f"{EVENTS}/eu", f"{EVENTS}/all",
                                          f"{ALERTS}/ops", *news], settle_seconds=1.0)

    def once(entity: str, got: list, want: list[str], *, ordered: bool = False) -> None:
        ids = [str(message.message_id) for message in got]
        if sorted(ids) != sorted(want) or (ordered and ids != want):
            problems.append(f"{entity}: expected {len(want)} message(s) once{' in order' if ordered else ''}, got "
                            f"{len(ids)} ({sorted(set(want) - set(ids))[:5]} missing, "
                            f"{sorted(i for i in set(ids) if ids.count(i) > 1)[:5]} twice)")

    def in_order(entity: str, got: list[str], want: list[str]) -> None:
        if got != want:
            problems.append(f"{entity}: arrived as {got}, not in the order written {want}")

    orders = drained[ORDERS]
    once(ORDERS, orders, written.queues[ORDERS] + written.dead_lettered)
    # In order per source: what came from orders itself (not its dead-letter sub-queue, nor the re-drive of o-large)
    in_place = [i for i in written.queues[ORDERS] if i != LARGE_ID]
    in_order(ORDERS, [str(m.message_id) for m in orders if str(m.message_id) in set(in_place)], in_place)
    for message in orders:
        message_id = str(message.message_id)
        sent = written.properties.get(message_id, {})
        got = {str(k, "utf-8") if isinstance(k, bytes) else k: v for k, v in (message.application_properties or {}).items()}
        own = {k: v for k, v in got.items() if not str(k).startswith("x-syphon-")}
        if own != {k: _as_received(v) for k, v in sent.items()}:
            problems.append(f"{ORDERS} {message_id}: application properties {own} are not the ones sent {sent}")
        reason = got.get(PROVENANCE_REASON)
        reason = reason.decode() if isinstance(reason, bytes) else reason
        if (message_id in written.dead_lettered) != (reason == "Poison"):
            problems.append(f"{ORDERS} {message_id}: provenance {PROVENANCE_REASON}={reason!r}")
        if sent and sent["n"] % 4 == 0 and not dt.timedelta(hours=5) < message.time_to_live < dt.timedelta(hours=6):
            problems.append(f"{ORDERS} {message_id}: time to live {message.time_to_live} is not what was left of 6 h")
    once(PARTITIONED, drained[PARTITIONED], list(written.partition_keys))
    for key in set(written.partition_keys.values()) - {None}:  # in order per partition key (read lane by lane)
        want = [i for i, k in written.partition_keys.items() if k == key]
        in_order(f"{PARTITIONED} key {key}", [str(m.message_id) for m in drained[PARTITIONED]
                                              if str(m.message_id) in set(want)], want)
    wrong_keys = [str(m.message_id) for m in drained[PARTITIONED]
                  if m.partition_key != written.partition_keys.get(str(m.message_id))]
    if wrong_keys:
        problems.append(f"{PARTITIONED}: partition keys changed for {wrong_keys[:5]}")
    once(EVENTS_ALL_QUEUE, drained[EVENTS_ALL_QUEUE], written.queues[EVENTS_ALL_QUEUE], ordered=True)
    eu = written.subscriptions[f"{EVENTS}/Subscriptions/eu"]
    once(f"{EVENTS}/eu", drained[f"{EVENTS}/eu"], eu)
    kept = [i for i in eu if i not in written.subscription_dead_lettered]  # the rest came from its sub-queue
    in_order(f"{EVENTS}/eu", [str(m.message_id) for m in drained[f"{EVENTS}/eu"] if str(m.message_id) in set(kept)],
             kept)
    once(f"{EVENTS}/all", drained[f"{EVENTS}/all"], [])
    once(f"{ALERTS}/ops", drained[f"{ALERTS}/ops"], written.subscriptions[f"{ALERTS}/Subscriptions/ops"],
         ordered=True)
    for name in NEWS_SUBSCRIPTIONS:  # each subscription's copy once: the topic's of the one message sent for both
        once(f"{NEWS}/{name}", drained[f"{NEWS}/{name}"], written.subscriptions[f"{NEWS}/Subscriptions/{name}"],
             ordered=True)
    problems += _check_sessions(emulator, written)
    problems += _check_scheduled(emulator, written)
    problems += _check_source_left(emulator, written)
    return problems


def _as_received(value):
    """A property as the SDK's receive decodes it: text as UTF-8 bytes, a time as milliseconds since the epoch
    (the AMQP types themselves are compared end to end by the fidelity tests' raw receivers)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    return value


def _check_sessions(emulator, written: MigrationBacklog) -> list[str]:
    from azure.servicebus import ServiceBusReceiveMode

    problems = []
    with _client(emulator.connection_string(TARGET)) as client:
        for session, ids in written.sessions.items():
            with client.get_queue_receiver(SESSIONS, session_id=session,
                                           receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
                got = []
                while batch := receiver.receive_messages(max_message_count=50, max_wait_time=1):
                    got += [str(message.message_id) for message in batch]
                state = receiver.session.get_state()
            # the deferred message was deferred at the head of its session: it arrives where it was, first
            if got != ids:
                problems.append(f"{SESSIONS} session {session}: got {got}, expected {ids} in order")
            if state != SESSION_STATES.get(session):
                problems.append(f"{SESSIONS} session {session}: state {state!r} on the target")
        with client.get_queue_receiver(SESSIONS, session_id="s-d") as receiver:
            if receiver.session.get_state() != SESSION_STATES["s-d"]:
                problems.append(f"{SESSIONS} session s-d: its state did not move")
    with _client(emulator.connection_string(SOURCE)) as client:
        left = list(client.list_queue_sessions(SESSIONS))
        if left:
            problems.append(f"{SESSIONS}: the source still lists sessions {left} (messages or states)")
    return problems


def _check_scheduled(emulator, written: MigrationBacklog) -> list[str]:
    from azure.servicebus import ServiceBusMessageState

    problems = []
    with _client(emulator.connection_string(TARGET)) as client, client.get_queue_receiver(ORDERS) as receiver:
        scheduled = [str(m.message_id) for m in receiver.peek_messages(max_message_count=100)
                     if m.state == ServiceBusMessageState.SCHEDULED]
    if sorted(scheduled) != sorted(written.scheduled[ORDERS]):
        problems.append(f"{ORDERS}: scheduled on the target {scheduled}, expected {written.scheduled[ORDERS]}")
    for namespace, want in ((TARGET, len(written.scheduled[ALERTS])), (SOURCE, 0)):
        held = emulator.stats(namespace)[ALERTS].get("scheduled", 0)
        if held != want:
            problems.append(f"{ALERTS} on {namespace}: {held} scheduled message(s) in the topic, expected {want}")
    return problems


def _check_source_left(emulator, written: MigrationBacklog) -> list[str]:
    """The source holds nothing but the expired message (in orders' dead-letter sub-queue, where it stays)."""
    stats = emulator.stats(SOURCE)
    left = {entity: counts["total"] for entity, counts in stats.items() if counts.get("total")}
    want = {f"{ORDERS}/$DeadLetterQueue": len(written.expired)} if written.expired else {}
    return [] if left == want else [f"the source holds {left}, expected {want}"]
