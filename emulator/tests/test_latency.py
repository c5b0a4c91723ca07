"""Simulated network latency: every frame the emulator sends leaves ``latency_ms`` after it was produced."""
import socket
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue

from servicebus_emulator import Emulator, EmulatorConfig

LATENCY_MS = 40
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
CONFIG = {"namespaces": [
    {"name": "slow", "port": 0, "latency_ms": LATENCY_MS, "queues": [{"name": "q"}, {"name": "settle"}, {"name": "ordered"}]},
    {"name": "fast", "port": 0, "queues": [{"name": "q"}]},
]}


@pytest.fixture(scope="module")
def emulator():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emu:
        yield emu


def _first_answer(emulator, namespace: str):
    """Seconds from connecting to the first bytes the emulator sends, and those bytes."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", emulator.port(namespace)), timeout=10) as sock:
        sock.sendall(SASL_HEADER)
        data = sock.recv(8)
        return time.monotonic() - started, data


def test_first_frame_leaves_after_the_latency(emulator):
    elapsed, data = _first_answer(emulator, "slow")
    assert data == SASL_HEADER                     # a real answer, only later
    assert elapsed >= LATENCY_MS / 1000


def test_each_sdk_peek_round_trip_takes_at_least_the_latency(emulator):
    with ServiceBusClient.from_connection_string(emulator.connection_string("slow"), retry_total=0) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("peek me"))
        with client.get_queue_receiver("q") as receiver:
            receiver.peek_messages(max_message_count=1, sequence_number=1)   # opens the management link
            durations = []
            for _ in range(5):
                started = time.monotonic()
                (peeked,) = receiver.peek_messages(max_message_count=1, sequence_number=1)
                durations.append(time.monotonic() - started)
                assert str(peeked) == "peek me"
    # one delay per round trip (requests are not delayed): each peek waits one latency for its answer
    assert min(durations) >= LATENCY_MS / 1000, durations
    assert sum(durations) < 5.0, durations                  # sanity only: nowhere near 25 latencies each


def test_send_receive_and_settle_work_with_latency(emulator):
    # A queue of its own: the tests of this module can run on different workers, each with its emulator.
    with ServiceBusClient.from_connection_string(emulator.connection_string("slow"), retry_total=0) as client:
        with client.get_queue_sender("settle") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(4)])
        with client.get_queue_receiver("settle", max_wait_time=5) as receiver:
            received = []
            while len(received) < 4:
                received += receiver.receive_messages(max_message_count=4 - len(received), max_wait_time=5)
            assert [str(m) for m in received] == ["m0", "m1", "m2", "m3"]
            first, second, third, fourth = received
            receiver.complete_message(first)
            receiver.complete_message(second)
            receiver.dead_letter_message(third, reason="test", error_description="latency")
            receiver.abandon_message(fourth)
            (again,) = receiver.receive_messages(max_wait_time=5)
            assert str(again) == "m3" and again.delivery_count == 1
            receiver.complete_message(again)
        with client.get_queue_receiver("settle", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = dlq.peek_messages(max_message_count=5)
            assert str(dead) == "m2" and dead.dead_letter_reason == "test"
    stats = emulator.stats("slow")["settle"]
    assert (stats["total"], stats["completed"], stats["dead_lettered"]) == (0, 3, 1)


def test_many_messages_keep_their_order_with_latency(emulator):
    count = 400
    with ServiceBusClient.from_connection_string(emulator.connection_string("slow"), retry_total=0) as client:
        with client.get_queue_sender("ordered") as sender:
            for start in range(0, count, 100):
                batch = sender.create_message_batch()
                for i in range(start, start + 99):
                    batch.add_message(ServiceBusMessage(f"{i:04d}" + "x" * 2000))
                sender.send_messages(batch)
                # one delivery of many frames back to the client in each hundred
                sender.send_messages(ServiceBusMessage(f"{start + 99:04d}" + "y" * 200_000))
        with client.get_queue_receiver("ordered", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                                       prefetch_count=50) as receiver:
            bodies = []
            deadline = time.monotonic() + 60
            while len(bodies) < count and time.monotonic() < deadline:
                bodies += [str(m)[:4] for m in receiver.receive_messages(max_message_count=100, max_wait_time=2)]
    assert bodies == [f"{i:04d}" for i in range(count)]
    assert emulator.stats("slow")["ordered"]["total"] == 0


def test_zero_latency_writes_at_once(emulator):
    assert (emulator.latency_ms("slow"), emulator.latency_ms("fast")) == (LATENCY_MS, 0)
    _, data = _first_answer(emulator, "fast")
    assert data == SASL_HEADER
    with ServiceBusClient.from_connection_string(emulator.connection_string("fast"), retry_total=0) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("fast"))
        with client.get_queue_receiver("q") as receiver:
            (m,) = receiver.receive_messages(max_wait_time=5)
            receiver.complete_message(m)
            # white box: with latency 0 the direct write path runs and nothing is ever queued
            assert emulator._server.call(lambda: [c for c in emulator._server._delayed if c.ns.name == "fast"]) == []
    assert str(m) == "fast"
