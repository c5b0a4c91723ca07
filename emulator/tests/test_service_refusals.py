"""Sends a real namespace refuses, with its conditions and texts, through the real SDK: a session-less
message to a session queue, a SessionId that differs from its PartitionKey, a batch of too many messages,
a batch above 1 MB; and the batch limit the SDK takes from the link (the service advertises none)."""
import re
import struct

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus._pyamqp.error import ErrorCondition
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusConnectionError, ServiceBusError
from proton import Message
from proton.utils import BlockingConnection, LinkDetached

from servicebus_emulator import Emulator, EmulatorConfig
from servicebus_emulator.refusals import SESSION_ID_MISSING, UNABLE_TO_PROCESS

CONFIG = {"namespaces": [
    {"name": "standard", "port": 0, "queues": [
        {"name": "plain"}, {"name": "sessions", "requires_session": True},
        {"name": "small", "max_message_size_kb": 64}]},
    {"name": "premium", "port": 0, "tier": "premium", "queues": [
        {"name": "one-mb", "max_message_size_kb": 1024}, {"name": "large", "max_message_size_kb": 4096}]},
    {"name": "tuned", "port": 0, "max_messages_per_batch": 10, "queues": [{"name": "plain"}]},
]}


@pytest.fixture(scope="module")
def emu():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emulator:
        yield emulator


def _client(emu, namespace, retry_total=0):
    return ServiceBusClient.from_connection_string(emu.connection_string(namespace), retry_total=retry_total,
                                                   retry_backoff_factor=0.1)


def _tiny(count):
    """Messages of a few bytes each, so that thousands fit the SDK's batch size."""
    return [AmqpAnnotatedMessage(data_body=b"") for _ in range(count)]


def _stored(emu, namespace, queue):
    return emu.stats(namespace)[queue]["total"]


def test_a_message_without_session_id_to_a_session_queue_is_refused_alone_or_in_a_batch(emu):
    before = _stored(emu, "standard", "sessions")
    with _client(emu, "standard", retry_total=3) as client, client.get_queue_sender("sessions") as sender:
        sends = emu.stats("standard")["sessions"]["ops"].get("send", 0)
        for payload in (ServiceBusMessage("no session"),
                        [ServiceBusMessage("a", session_id="s1"), ServiceBusMessage("no session"),
                         ServiceBusMessage("b", session_id="s1")]):
            with pytest.raises(ServiceBusError) as refused:
                sender.send_messages(payload)
            assert type(refused.value) is ServiceBusError          # the SDK's plain class, not a subclass
            assert refused.value.inner_exception.condition == ErrorCondition.NotAllowed
            assert str(refused.value).startswith(SESSION_ID_MISSING + " TrackingId:")
            assert "SystemTracker:standard:sessions" in str(refused.value)
        # not retried (not-allowed is final for the SDK), and nothing of the batch was stored
        assert emu.stats("standard")["sessions"]["ops"]["send"] - sends == 2
        assert _stored(emu, "standard", "sessions") == before
        sender.send_messages([ServiceBusMessage("a", session_id="s1"), ServiceBusMessage("b", session_id="s2")])
    assert _stored(emu, "standard", "sessions") == before + 2


def test_a_session_id_that_differs_from_the_partition_key_is_refused_on_any_entity(emu):
    # the SDK checks this for the messages it builds; pre-encoded (here: raw AMQP) messages bypass its check
    def message(session_id, partition_key):
        return AmqpAnnotatedMessage(data_body=b"x", properties={"group_id": session_id},
                                    annotations={b"x-opt-partition-key": partition_key})

    with _client(emu, "standard") as client:
        for queue in ("plain", "sessions"):
            before = _stored(emu, "standard", queue)
            with client.get_queue_sender(queue) as sender:
                with pytest.raises(ServiceBusError) as refused:
                    sender.send_messages([message("s1", "s1"), message("s2", "other")])
                assert refused.value.inner_exception.condition == ErrorCondition.NotAllowed
                assert str(refused.value).startswith(
                    "PartitionKey:other cannot be set to a different value than SessionId:s2. TrackingId:")
                assert _stored(emu, "standard", queue) == before
                sender.send_messages([message("s1", "s1"), message("s2", "s2")])     # equal: accepted
            assert _stored(emu, "standard", queue) == before + 2
        with client.get_queue_sender("plain") as sender:           # a partition key alone is fine
            sender.send_messages(ServiceBusMessage("pk only", partition_key="p"))


def test_a_batch_of_more_than_4500_messages_gets_the_generic_refusal_and_4500_go_through(emu):
    before = _stored(emu, "standard", "plain")
    with _client(emu, "standard") as client, client.get_queue_sender("plain") as sender:
        batch = sender.create_message_batch()
        for message in _tiny(4501):
            batch.add_message(message)
        with pytest.raises(ServiceBusError) as refused:
            sender.send_messages(batch)
        assert type(refused.value) is ServiceBusError
        # internal-error: a condition the SDK retries, which says nothing about any one message
        assert refused.value.inner_exception.condition == ErrorCondition.InternalError
        assert refused.value._retryable
        assert str(refused.value).startswith(UNABLE_TO_PROCESS + " Reference:")
        assert "SystemTracker:standard:Queue:plain" in str(refused.value)
        assert _stored(emu, "standard", "plain") == before
        sender.send_messages(_tiny(4500))                          # the same link takes the next batch
    assert _stored(emu, "standard", "plain") == before + 4500


def test_premium_takes_15000_messages_per_batch_and_the_setting_overrides_the_tier(emu):
    with _client(emu, "premium") as client, client.get_queue_sender("one-mb") as sender:
        sender.send_messages(_tiny(15000))
        with pytest.raises(ServiceBusError, match="unable to process the request"):
            sender.send_messages(_tiny(15001))
    assert _stored(emu, "premium", "one-mb") == 15000
    with _client(emu, "tuned") as client, client.get_queue_sender("plain") as sender:
        sender.send_messages(_tiny(10))
        with pytest.raises(ServiceBusError, match="unable to process the request"):
            sender.send_messages(_tiny(11))
    assert _stored(emu, "tuned", "plain") == 10


def test_the_sdk_takes_its_fallback_batch_limit_as_the_service_advertises_none(emu):
    """With no com.microsoft:max-message-batch-size on the link the SDK takes 256 KB, or 1 MB where the
    entity takes messages of 1 MB or more; for an entity below 256 KB that is more than it accepts."""
    limits = {}
    for namespace, queue in (("standard", "plain"), ("standard", "small"), ("premium", "one-mb"),
                             ("premium", "large")):
        with _client(emu, namespace) as client, client.get_queue_sender(queue) as sender:
            limits[queue] = sender.create_message_batch().max_size_in_bytes
            if queue == "small":           # the SDK builds a batch of 100 KB that the 64 KB entity refuses
                batch = sender.create_message_batch()
                for _ in range(10):
                    batch.add_message(ServiceBusMessage(b"x" * 10_000))
                with pytest.raises(MessageSizeExceededError):
                    sender.send_messages(batch)
    assert limits == {"plain": 256 * 1024, "small": 256 * 1024, "one-mb": 1024 * 1024, "large": 1024 * 1024}


def test_a_batch_above_1_mb_is_refused_where_single_messages_may_be_larger(emu):
    """The service force-detaches the link (amqp:not-allowed); the SDK learns of the detach while its
    transfer is in flight and raises a retryable connection error, then attaches anew."""
    before = _stored(emu, "premium", "large")
    with _client(emu, "premium") as client, client.get_queue_sender("large") as sender:
        sender.send_messages(ServiceBusMessage(b"x" * 2_000_000))              # one 2 MB message: fine
        sender._max_batch_size_on_link = 4 * 1024 * 1024     # as an SDK that took the entity's size would
        batch = sender.create_message_batch()
        for _ in range(3):
            batch.add_message(ServiceBusMessage(b"x" * 400_000))
        attaches = emu.stats("premium")["large"]["ops"]["attach"]
        with pytest.raises(ServiceBusConnectionError) as refused:
            sender.send_messages(batch)
        assert refused.value._retryable
        assert _stored(emu, "premium", "large") == before + 1
        fits = sender.create_message_batch(max_size_in_bytes=1024 * 1024)
        for _ in range(2):
            fits.add_message(ServiceBusMessage(b"x" * 400_000))
        sender.send_messages(fits)                                            # on a new link
        assert emu.stats("premium")["large"]["ops"]["attach"] == attaches + 1
    assert _stored(emu, "premium", "large") == before + 3


def test_the_1_mb_refusal_is_a_detach_with_the_services_condition_and_text(emu):
    """What the SDK does not show: the detach's condition and text (read with proton's own client)."""
    inner = Message(body=b"x" * 400_000, inferred=True).encode()     # a message with a Data body
    envelope = b"".join(b"\x00\x53\x75\xb0" + struct.pack(">I", len(inner)) + inner for _ in range(3))
    connection = BlockingConnection(f"amqp://127.0.0.1:{emu.port('premium')}", allowed_mechs="ANONYMOUS", timeout=10)
    try:
        sender = connection.create_sender("large")
        sender.link.delivery(b"1")
        sender.link.send(envelope)
        sender.link.advance()
        with pytest.raises(LinkDetached) as detached:
            connection.wait(lambda: False, timeout=10)
        condition = detached.value.link.remote_condition
        assert condition.name == "amqp:not-allowed"
        assert re.fullmatch(rf"The link '{re.escape(sender.link.name)}' is force detached by the broker because "
                            rf"publisher\(link\d+\) received a batch message with no data in it\. Detach origin: "
                            rf"Publisher\.", condition.description)
    finally:
        connection.close()
