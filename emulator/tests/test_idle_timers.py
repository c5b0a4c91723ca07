"""Idle timers as a real namespace runs them, shortened to 2 seconds: a link without activity is detached
(``amqp:link:detach-forced``), a connection without links is closed (``amqp:connection:forced``); and what
the real SDK (azure-servicebus 7.15.0) does on its next call after each. A detached receive link's locks
outlive it, as any lost link's (``test_lost_links``): locks here run a few seconds longer than the timer."""
import re
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusConnectionError, ServiceBusError
from proton.utils import BlockingConnection, ConnectionClosed, LinkDetached

from servicebus_emulator import Emulator, EmulatorConfig

TIMER = 2.0
LOCK = 10.0  # a lock that outlives the detach by far
SHORT_LOCK = 4.0  # one that ends soon after it, for a test that waits for the message to come back
CONFIG = {"namespaces": [
    {"name": "idle", "port": 0, "link_idle_timeout_seconds": TIMER, "connection_idle_timeout_seconds": 600,
     "new_connection_idle_timeout_seconds": TIMER, "allow_short_locks": True},
    {"name": "closing", "port": 0, "link_idle_timeout_seconds": TIMER, "connection_idle_timeout_seconds": TIMER,
     "allow_short_locks": True},
]}


@pytest.fixture(scope="module")
def emu():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emulator:
        yield emulator


def wait_for(condition, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


_names = iter(range(1, 1000))


def _queue(emu, namespace, messages=0, lock=LOCK):
    name = f"q{next(_names)}"
    emu.add_queue(namespace, name, lock_duration_seconds=lock)
    if messages:
        with ServiceBusClient.from_connection_string(emu.connection_string(namespace)) as client:
            with client.get_queue_sender(name) as sender:
                sender.send_messages([ServiceBusMessage(str(n)) for n in range(messages)])
    return name


def _ops(emu, namespace, queue):
    return emu.stats(namespace)[queue]["ops"]


def _idle_detaches(emu, namespace, queue):
    return _ops(emu, namespace, queue).get("idle_detach", 0)


def test_an_idle_sender_is_detached_and_its_next_send_fails_once_then_attaches_anew(emu):
    queue = _queue(emu, "idle")
    with ServiceBusClient.from_connection_string(emu.connection_string("idle"), retry_total=0) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("before"))
            wait_for(lambda: _idle_detaches(emu, "idle", queue) == 1)
            with pytest.raises(ServiceBusConnectionError, match="amqp:unknown-error"):
                sender.send_messages(ServiceBusMessage("refused"))     # in flight when the SDK saw the detach
            assert emu.stats("idle")[queue]["total"] == 1           # a detached link takes nothing
            sender.send_messages(ServiceBusMessage("after"))
    assert _ops(emu, "idle", queue)["attach"] == 2
    assert emu.stats("idle")[queue]["total"] == 2


def test_with_retries_the_sdk_sends_on_a_new_link_without_raising_or_duplicating(emu):
    queue = _queue(emu, "idle")
    with ServiceBusClient.from_connection_string(emu.connection_string("idle"), retry_total=3,
                                                 retry_backoff_factor=0.1) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("before"))
            wait_for(lambda: _idle_detaches(emu, "idle", queue) == 1)
            sender.send_messages(ServiceBusMessage("after"))
    with ServiceBusClient.from_connection_string(emu.connection_string("idle")) as client:
        with client.get_queue_receiver(queue) as receiver:
            assert [str(m) for m in receiver.peek_messages(max_message_count=10)] == ["before", "after"]


def test_an_idle_receiver_raises_the_detach_once_then_receives_again_and_its_lock_outlives_the_link(emu):
    """Without retries the next receive raises the detach (the service's text), the one after attaches a
    new link; the lock taken on the detached link outlives it: the message stays locked, and settling it
    completes it (the SDK, its link gone, settles through $management)."""
    queue = _queue(emu, "idle", messages=3)
    with ServiceBusClient.from_connection_string(emu.connection_string("idle"), retry_total=0) as client:
        with client.get_queue_receiver(queue) as receiver:
            (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            wait_for(lambda: _idle_detaches(emu, "idle", queue) == 1)
            assert emu.stats("idle")[queue]["locked"] == 1
            with pytest.raises(ServiceBusConnectionError) as detached:
                receiver.receive_messages(max_message_count=3, max_wait_time=1)
            assert re.match(r"The link '[\w-]+' is force detached\. Code: consumer\(link\d+\)\. Details: "
                            r"AmqpMessageConsumer\.IdleTimerExpired: Idle timeout: 00:00:02\.", str(detached.value))
            got = receiver.receive_messages(max_message_count=3, max_wait_time=1)
            assert [(str(m), m.delivery_count) for m in got] == [("1", 0), ("2", 0)]  # the first is still locked
            receiver.complete_message(held)
            for message in got:
                receiver.complete_message(message)
    assert (emu.stats("idle")[queue]["total"], emu.stats("idle")[queue]["completed"]) == (0, 3)


def test_with_retries_an_idle_receiver_attaches_anew_and_gets_the_message_back_once_its_lock_ends(emu):
    queue = _queue(emu, "idle", messages=1, lock=SHORT_LOCK)
    with ServiceBusClient.from_connection_string(emu.connection_string("idle"), retry_total=3,
                                                 retry_backoff_factor=0.1) as client:
        with client.get_queue_receiver(queue) as receiver:
            (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            wait_for(lambda: _idle_detaches(emu, "idle", queue) == 1)
            # the re-attach counts against max_wait_time: with a second or less the SDK may raise
            # OperationTimeoutError("Timed out waiting for the AMQP link to open") instead
            (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=SHORT_LOCK + 3)
            assert (again.sequence_number, again.delivery_count) == (held.sequence_number, 1)
            receiver.complete_message(again)
    assert emu.stats("idle")[queue]["total"] == 0


def test_a_lock_of_a_detached_link_settled_first_thing_settles_through_management(emu):
    queue = _queue(emu, "idle", messages=1)
    with ServiceBusClient.from_connection_string(emu.connection_string("idle"), retry_total=0) as client:
        with client.get_queue_receiver(queue) as receiver:
            (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            wait_for(lambda: _idle_detaches(emu, "idle", queue) == 1)
            receiver.complete_message(held)
    assert (emu.stats("idle")[queue]["total"], emu.stats("idle")[queue]["completed"]) == (0, 1)


def test_an_idle_peek_caller_fails_once_then_peeks_on(emu):
    queue = _queue(emu, "idle", messages=5)
    with ServiceBusClient.from_connection_string(emu.connection_string("idle"), retry_total=3,
                                                 retry_backoff_factor=0.1) as client:
        with client.get_queue_receiver(queue) as receiver:
            assert [m.sequence_number for m in receiver.peek_messages(max_message_count=2)] == [1, 2]
            wait_for(lambda: _idle_detaches(emu, "idle", queue) == 3)       # its receive link and $management pair
            with pytest.raises(ServiceBusError, match="Management Operation error occurred"):
                receiver.peek_messages(max_message_count=2, sequence_number=3)
            assert [m.sequence_number for m in receiver.peek_messages(max_message_count=2, sequence_number=3)] == [3, 4]


def test_sends_receives_and_peeks_keep_their_links(emu):
    queue = _queue(emu, "idle", messages=1)
    with ServiceBusClient.from_connection_string(emu.connection_string("idle"), retry_total=0) as client:
        with client.get_queue_sender(queue) as sender, client.get_queue_receiver(queue) as receiver:
            deadline = time.monotonic() + 2.5 * TIMER
            while time.monotonic() < deadline:         # each link used at least every half second
                sender.send_messages(ServiceBusMessage("more"))
                receiver.peek_messages(max_message_count=1)
                for message in receiver.receive_messages(max_message_count=5, max_wait_time=0.3):
                    receiver.complete_message(message)
    assert _idle_detaches(emu, "idle", queue) == 0


def test_a_connection_whose_links_are_gone_is_closed_and_the_sdk_opens_a_new_one(emu):
    """The SDK reads the link's detach before the connection's close: its next call raises the detach,
    the one after runs on a new connection."""
    queue = _queue(emu, "closing", messages=2)
    before = emu.idle_stats("closing")["connections"]
    with ServiceBusClient.from_connection_string(emu.connection_string("closing"), retry_total=0) as client:
        with client.get_queue_receiver(queue) as receiver:
            (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            wait_for(lambda: emu.idle_stats("closing")["connections"] == before + 1)
            with pytest.raises(ServiceBusConnectionError, match="IdleTimerExpired"):
                receiver.receive_messages(max_message_count=2, max_wait_time=1)
            got = receiver.receive_messages(max_message_count=2, max_wait_time=1)
            assert [(str(m), m.delivery_count) for m in got] == [("1", 0)]  # the other is still locked
            receiver.complete_message(held)  # through $management, on the new connection
            for message in got:
                receiver.complete_message(message)
    assert emu.stats("closing")[queue]["total"] == 0


def test_the_detach_and_close_carry_the_services_conditions_and_texts(emu):
    """Read with proton's own client (the SDK keeps the texts of detaches to itself)."""
    queue = _queue(emu, "idle")
    connection = BlockingConnection(f"amqp://127.0.0.1:{emu.port('idle')}", allowed_mechs="ANONYMOUS", timeout=10)
    try:
        sender, receiver = connection.create_sender(queue), connection.create_receiver(queue)
        for link, origin in ((sender, r"publisher\(link\d+\)\. Details: AmqpMessagePublisher"),
                             (receiver, r"consumer\(link\d+\)\. Details: AmqpMessageConsumer")):
            with pytest.raises(LinkDetached) as detached:
                connection.wait(lambda: False, timeout=10)
            condition = detached.value.link.remote_condition
            assert detached.value.link.name == link.link.name
            assert condition.name == "amqp:link:detach-forced"
            assert re.fullmatch(rf"The link '{re.escape(link.link.name)}' is force detached\. Code: {origin}"
                                rf"\.IdleTimerExpired: Idle timeout: 00:00:02\. TrackingId:\w+, "
                                rf"SystemTracker:idle:{queue}, Timestamp:\S+", condition.description)
    finally:
        connection.close()


def test_a_connection_that_opens_no_link_is_closed(emu):
    connection = BlockingConnection(f"amqp://127.0.0.1:{emu.port('idle')}", allowed_mechs="ANONYMOUS", timeout=10)
    with pytest.raises(ConnectionClosed) as closed:
        connection.wait(lambda: False, timeout=10)
    condition = closed.value.connection.remote_condition
    assert condition.name == "amqp:connection:forced"
    assert condition.description.startswith(
        "The connection was closed by container 'servicebus-emulator-idle' because it did not have any active "
        "links in the past 2000 milliseconds. TrackingId:")
