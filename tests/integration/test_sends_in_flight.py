"""``servicebus.send.send_singly`` with the real SDK against the emulator: single-message sends (what a
partitioned destination with duplicate detection takes) go several at once on one link, in order, each
as its own transfer; a refusal in the middle reports exactly the accepted prefix, with the SDK's own
exception; and on a far namespace it is many times faster than one send after the other."""

import time

import pytest
from azure.servicebus import ServiceBusClient
from azure.servicebus.exceptions import ServiceBusError

from backlog_syphon.model import Outgoing, ReasonCode
from backlog_syphon.restore.amqp.message import DecodedMessage, MessageProperties
from backlog_syphon.servicebus.sdk_internals import error_condition, prompt
from backlog_syphon.servicebus.sdk_transfers import InFlightSendError, in_flight_supported
from backlog_syphon.servicebus.send import classify_send_error, send_singly
from backlog_syphon.sink.send_shape import MAX_IN_FLIGHT
from servicebus_emulator import Emulator, EmulatorConfig

LATENCY_MS = 25
CONFIG = {"namespaces": [
    {"name": "far", "port": 0, "latency_ms": LATENCY_MS, "queues": [
        {"name": "dedupe", "duplicate_detection_window_seconds": 600},
        {"name": "sessions", "requires_session": True}]},
]}


@pytest.fixture(scope="module")
def emulator():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emu:
        yield emu


def outgoing(index: int, session: str | None = "s1") -> Outgoing:
    message_id = f"m{index}"
    encoded = DecodedMessage(properties=MessageProperties(message_id=message_id, group_id=session),
                             body=(f"body-{index}".encode(),)).encode()
    return Outgoing(encoded, message_id, session, None)


def received_ids(client, queue: str, count: int, session: str | None = None) -> list[str]:
    ids: list[str] = []
    receiver = client.get_queue_receiver(queue, session_id=session, max_wait_time=5)
    with prompt(receiver):
        while len(ids) < count:
            batch = receiver.receive_messages(max_message_count=count - len(ids), max_wait_time=5)
            if not batch:
                break
            for message in batch:
                ids.append(message.message_id)
                receiver.complete_message(message)
    return ids


def test_the_pinned_sdk_is_driven_in_flight():
    assert in_flight_supported()


def test_single_messages_go_in_flight_in_order_and_much_faster_than_one_after_the_other(emulator):
    messages = [outgoing(i, session=None) for i in range(200)]
    with ServiceBusClient.from_connection_string(emulator.connection_string("far"), retry_total=0) as client:
        with prompt(client.get_queue_sender("dedupe")) as sender:
            send_singly(sender, messages[:1], in_flight=1)  # the link opens
            started = time.monotonic()
            sent = sum(send_singly(sender, messages[start:start + MAX_IN_FLIGHT], in_flight=MAX_IN_FLIGHT)
                       for start in range(1, len(messages), MAX_IN_FLIGHT))
            seconds = time.monotonic() - started
        assert sent == len(messages) - 1
        assert received_ids(client, "dedupe", len(messages)) == [m.message_id for m in messages]
    # One after the other: a round trip (two frames of LATENCY_MS each way at least) per message.
    one_after_the_other = (len(messages) - 1) * 2 * LATENCY_MS / 1000
    assert seconds < one_after_the_other / 4, (seconds, one_after_the_other)
    stats = emulator.stats("far")["dedupe"]
    assert (stats["in"], stats["duplicates"]) == (len(messages), 0)  # each once


def test_a_refusal_in_flight_reports_the_accepted_prefix_with_the_sdks_exception(emulator):
    # A session-less message to a queue that requires sessions is refused for good (amqp:not-allowed).
    messages = [outgoing(i) for i in range(10)]
    messages[6] = outgoing(6, session=None)
    with ServiceBusClient.from_connection_string(emulator.connection_string("far"), retry_total=0) as client:
        with prompt(client.get_queue_sender("sessions")) as sender:
            with pytest.raises(InFlightSendError) as raised:
                send_singly(sender, messages, in_flight=MAX_IN_FLIGHT)
            assert raised.value.sent == 6
            assert isinstance(raised.value.cause, ServiceBusError)
            assert error_condition(raised.value.cause) == "amqp:not-allowed"
            assert classify_send_error(raised.value.cause, "sessions").reason_code == ReasonCode.SESSION_REQUIRED
            # the link is still good: the next send goes on it
            assert send_singly(sender, [outgoing(10)], in_flight=MAX_IN_FLIGHT) == 1
        ids = received_ids(client, "sessions", 20, session="s1")
    # What was in flight behind the refused message was taken too (the caller sends it again, and a destination
    # that gets single messages drops the copy by its duplicate detection); the prefix is exact.
    assert ids == [f"m{i}" for i in (0, 1, 2, 3, 4, 5, 7, 8, 9, 10)]
