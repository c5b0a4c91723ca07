"""Locks outlive a receive link lost without a clean close, as on the service: a dropped connection (a killed
process), a detach without ``closed`` (the SDK's own live test of settling through ``$management`` after its
receive link broke), a detach by the broker. The messages stay locked until their locks end, then come back
with delivery count + 1, and their lock tokens settle through ``$management`` meanwhile. A clean close (the
SDK's ``close``) frees them at once, and ``release_locks_on_link_loss`` makes every loss do so (the kinder
behaviour a test may ask for)."""
import time
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from servicebus_emulator import Emulator, EmulatorConfig

LOCK = 2.0  # seconds: long enough to see a lock held, short enough to wait out
CONFIG = {"namespaces": [
    {"name": "lost", "port": 0, "allow_short_locks": True},
    {"name": "kind", "port": 0, "allow_short_locks": True, "release_locks_on_link_loss": True},
]}


@pytest.fixture(scope="module")
def emu():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emulator:
        yield emulator


def _queue(emu, namespace: str, messages: int) -> str:
    name = f"q-{uuid.uuid4().hex[:8]}"
    emu.add_queue(namespace, name, lock_duration_seconds=LOCK)
    with ServiceBusClient.from_connection_string(emu.connection_string(namespace)) as client:
        with client.get_queue_sender(name) as sender:
            sender.send_messages([ServiceBusMessage(str(n)) for n in range(messages)])
    return name


def _receive(receiver, count: int, wait: float = 5.0) -> list:
    receiver._open_with_retry()  # the link first: a short receive's wait would bound its attach too
    got: list = []
    deadline = time.monotonic() + wait
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=count - len(got), max_wait_time=0.5)
    return got


def _counts(emu, namespace: str, queue: str) -> tuple[int, int, int]:
    stats = emu.stats(namespace)[queue]
    return stats["active"], stats["locked"], stats["completed"]


def test_a_dropped_connections_locks_outlive_it_settle_through_management_and_end_with_their_lock(emu):
    queue = _queue(emu, "lost", messages=3)
    cs = emu.connection_string("lost")
    with ServiceBusClient.from_connection_string(cs, retry_total=0) as client:
        receiver = client.get_queue_receiver(queue)
        held = _receive(receiver, 3)
        assert [str(m) for m in held] == ["0", "1", "2"]
        taken_at = time.monotonic()
        assert emu.drop_connections("lost") >= 1  # as a killed process's: no detach, no close
        assert _counts(emu, "lost", queue) == (0, 3, 0)
    with ServiceBusClient.from_connection_string(cs, retry_total=0) as client:
        with client.get_queue_receiver(queue) as receiver:
            assert receiver.receive_messages(max_message_count=3, max_wait_time=0.3) == []  # still locked
            # the lost link's token, settled through $management as the SDK's fallback does
            receiver._settle_message_via_mgmt_link("completed", [held[0].lock_token])
            assert _counts(emu, "lost", queue) == (0, 2, 1)
            back = _receive(receiver, 2, wait=LOCK + 5)
            assert time.monotonic() - taken_at >= LOCK - 0.3  # not before their locks ended
            assert [(str(m), m.delivery_count) for m in back] == [("1", 1), ("2", 1)]
            for message in back:
                receiver.complete_message(message)
    assert _counts(emu, "lost", queue) == (0, 0, 3)


def test_a_receive_link_detached_without_closing_leaves_its_locks_and_the_sdk_settles_through_management(emu):
    """The SDK's live test ``test_queue_message_settle_through_mgmt_link_due_to_broken_receiver_link``: its
    receive link detached under it, ``complete_message`` still completes the message."""
    queue = _queue(emu, "lost", messages=2)
    with ServiceBusClient.from_connection_string(emu.connection_string("lost"), retry_total=0) as client:
        with client.get_queue_receiver(queue) as receiver:
            first, second = _receive(receiver, 2)
            receiver._handler._link.detach()  # close=False: the link is lost, not closed
            receiver.complete_message(first)
            assert _counts(emu, "lost", queue) == (0, 1, 1)  # the other stays locked
    assert _counts(emu, "lost", queue)[1] == 1  # a close after the detach frees nothing the lost link held
    time.sleep(LOCK + 0.2)
    assert _counts(emu, "lost", queue) == (1, 0, 1)


def test_a_clean_close_frees_its_locks_at_once(emu):
    queue = _queue(emu, "lost", messages=2)
    with ServiceBusClient.from_connection_string(emu.connection_string("lost"), retry_total=0) as client:
        with client.get_queue_receiver(queue) as receiver:
            assert len(_receive(receiver, 2)) == 2
        assert _counts(emu, "lost", queue) == (2, 0, 0)
        with client.get_queue_receiver(queue) as receiver:
            again = _receive(receiver, 2)
            assert [(str(m), m.delivery_count) for m in again] == [("0", 1), ("1", 1)]


def test_release_locks_on_link_loss_frees_a_dropped_connections_locks_at_once(emu):
    queue = _queue(emu, "kind", messages=2)
    cs = emu.connection_string("kind")
    with ServiceBusClient.from_connection_string(cs, retry_total=0) as client:
        assert len(_receive(client.get_queue_receiver(queue), 2)) == 2
        emu.drop_connections("kind")
        assert _counts(emu, "kind", queue) == (2, 0, 0)
    with ServiceBusClient.from_connection_string(cs, retry_total=0) as client:
        with client.get_queue_receiver(queue) as receiver:
            again = _receive(receiver, 2)
            assert [(str(m), m.delivery_count) for m in again] == [("0", 1), ("1", 1)]
