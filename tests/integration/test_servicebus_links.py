"""``servicebus.sdk_internals.prompt``: SDK senders and receivers that open and close without the SDK's
idle waits still do exactly what the SDK's own do, on a fast and on a slow network (the emulator's
simulated latency), with the SDK's own errors; and the keep-alive threads they no longer wait for end
by themselves."""

import threading
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from backlog_syphon.servicebus.sdk_internals import attach, peek_stored_bytes, prompt
from servicebus_emulator import Emulator, EmulatorConfig
from tools.testing import drain_destinations

LATENCY_MS = 40
FAR_MS = 400  # a one-way delay longer than the drain's receive wait below
CONFIG = {"namespaces": [
    {"name": "fast", "port": 0, "queues": [{"name": "q"}]},
    {"name": "slow", "port": 0, "latency_ms": LATENCY_MS, "queues": [{"name": "q"}]},
    {"name": "far", "port": 0, "latency_ms": FAR_MS, "queues": [{"name": "q"}]},
]}


@pytest.fixture(scope="module")
def emulator():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emu:
        yield emu


def _keep_alive_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name != threading.main_thread().name
            and getattr(thread, "_target", None) is not None and thread._target.__name__ == "_keep_alive"}


@pytest.mark.parametrize("namespace", ["fast", "slow"])
def test_prompt_links_send_receive_and_settle_as_the_sdks_own(emulator, namespace):
    before = _keep_alive_threads()
    bodies = [f"{namespace}-{n}" for n in range(5)]
    with ServiceBusClient.from_connection_string(emulator.connection_string(namespace), retry_total=0) as client:
        with prompt(client.get_queue_sender("q")) as sender:
            attach(sender)
            sender.send_messages([ServiceBusMessage(body, message_id=body) for body in bodies])
        with prompt(client.get_queue_receiver("q", max_wait_time=5)) as receiver:
            stored = peek_stored_bytes(receiver, 1, 10)
            received = []
            while len(received) < len(bodies):
                received += receiver.receive_messages(max_message_count=len(bodies), max_wait_time=5)
            for message in received:
                receiver.complete_message(message)
        assert [str(message) for message in received] == bodies  # in order, each once
        assert [message.message_id for message in received] == bodies
        assert len(stored) == len(bodies) and all(body.encode() in raw for body, raw in zip(bodies, stored))
        with prompt(client.get_queue_receiver("q")) as receiver:
            assert receiver.peek_messages(max_message_count=5) == []  # all settled
    assert emulator.stats(namespace)["q"]["completed"] >= len(bodies)
    # Closing did not wait for the keep-alive threads; they end by themselves (they sleep 1 s at a time).
    deadline = time.monotonic() + 10
    while _keep_alive_threads() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _keep_alive_threads() - before


@pytest.mark.parametrize("namespace", ["fast", "slow"])
def test_a_prompt_link_to_a_missing_entity_fails_with_the_sdks_own_error(emulator, namespace):
    with ServiceBusClient.from_connection_string(emulator.connection_string(namespace), retry_total=0) as client:
        for wrap in (prompt, lambda handler: handler):  # the same error, with and without
            with pytest.raises(MessagingEntityNotFoundError), wrap(client.get_queue_sender("no-such-queue")) as sender:
                sender.send_messages(ServiceBusMessage("lost"))


def test_a_drain_takes_everything_though_the_first_message_comes_later_than_a_receives_wait(emulator):
    """The tests' drain stopped at its first empty receive: with the first message slower to arrive than
    the receive's wait (a busy CI machine), it reported a destination full of messages empty. It now stops
    only once a peek finds nothing receivable; a scheduled message does not keep it waiting."""
    import datetime

    bodies = [f"far-{n}" for n in range(5)]
    connection_string = emulator.connection_string("far")
    with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        with prompt(client.get_queue_sender("q")) as sender:
            sender.send_messages([ServiceBusMessage(body, message_id=body) for body in bodies])
            later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
            sender.schedule_messages(ServiceBusMessage("later", message_id="later"), later)

    drained = drain_destinations(connection_string, ["q"], max_wait_seconds=0.2)

    assert [message.message_id for message in drained["q"]] == bodies
    with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        with prompt(client.get_queue_receiver("q")) as receiver:
            assert [m.message_id for m in receiver.peek_messages(max_message_count=5, sequence_number=1)] == ["later"]
