"""Entity status (Active, SendDisabled, ReceiveDisabled, Disabled) through the real SDK, changed while the
emulator runs (``Emulator.set_status``) or set in the configuration (``status``)."""
import re

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessagingEntityDisabledError

from servicebus_emulator import ConfigError, Emulator, EmulatorConfig
from servicebus_emulator.entity_status import EntityStatus

CONFIG = {"namespaces": [{"name": "ns", "port": 0, "queues": [{"name": "paused", "status": "ReceiveDisabled"}],
                          "topics": [{"name": "events", "subscriptions": [{"name": "all"}, {"name": "audit"}]}]}]}
SEND_TEXT = "Messaging entity 'ns:{kind}:{path}' is currently disabled for Send operations. TrackingId:"


@pytest.fixture(scope="module")
def emu():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def client(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string("ns"), retry_total=0) as c:
        yield c


_names = iter(range(1, 1000))


def _queue(emu, client, messages=0):
    name = f"q{next(_names)}"
    emu.add_queue("ns", name)
    if messages:
        with client.get_queue_sender(name) as sender:
            sender.send_messages([ServiceBusMessage(str(n)) for n in range(messages)])
    return name


def _receive_text(emu, path):
    return f"Messaging entity 'sb://127.0.0.1:{emu.port('ns')}/{path}' is currently disabled. For more information"


def test_a_send_disabled_queue_refuses_sends_and_still_receives_and_peeks(emu, client):
    queue = _queue(emu, client, messages=2)
    assert emu.set_status("ns", queue, "SendDisabled") is EntityStatus.SEND_DISABLED
    with client.get_queue_sender(queue) as sender:
        with pytest.raises(MessagingEntityDisabledError) as refused:
            sender.send_messages(ServiceBusMessage("refused"))
        assert str(refused.value).startswith(SEND_TEXT.format(kind="Queue", path=queue))
        with client.get_queue_receiver(queue) as receiver:
            assert [m.sequence_number for m in receiver.peek_messages(max_message_count=5)] == [1, 2]
            received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            for message in received:
                receiver.complete_message(message)
        assert len(received) == 2
        emu.set_status("ns", queue, EntityStatus.ACTIVE)
        sender.send_messages(ServiceBusMessage("taken again"))       # the same sender, after the change
    assert emu.stats("ns")[queue]["total"] == 1


def test_a_receive_disabled_queue_takes_sends_and_refuses_receives_peeks_and_settlements(emu, client):
    queue = _queue(emu, client, messages=2)
    with client.get_queue_receiver(queue) as attached:
        (held,) = attached.receive_messages(max_message_count=1, max_wait_time=5)
        emu.set_status("ns", queue, "ReceiveDisabled")
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("still taken"))
        with pytest.raises(MessagingEntityDisabledError) as settle:
            attached.complete_message(held)
        assert str(settle.value).startswith(_receive_text(emu, queue))
        with pytest.raises(MessagingEntityDisabledError):
            attached.peek_messages(max_message_count=5)
        with pytest.raises(MessagingEntityDisabledError):         # an attached receiver, on its next credit
            attached.receive_messages(max_message_count=5, max_wait_time=1)
    with pytest.raises(MessagingEntityDisabledError):             # a new receiver, at attach
        with client.get_queue_receiver(queue) as receiver:
            receiver.receive_messages(max_wait_time=1)
    with pytest.raises(MessagingEntityDisabledError):             # its dead-letter queue too
        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            receiver.receive_messages(max_wait_time=1)
    emu.set_status("ns", queue, "Active")
    with client.get_queue_receiver(queue) as receiver:
        got = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        for message in got:
            receiver.complete_message(message)
    assert sorted(str(m) for m in got) == ["0", "1", "still taken"]


def test_a_disabled_queue_refuses_both_and_the_config_key_sets_a_status(emu, client):
    queue = _queue(emu, client, messages=1)
    emu.set_status("ns", queue, "Disabled")
    with pytest.raises(MessagingEntityDisabledError, match="disabled for Send operations"):
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("x"))
    with pytest.raises(MessagingEntityDisabledError):
        with client.get_queue_receiver(queue) as receiver:
            receiver.peek_messages(max_message_count=1)
    assert emu.status("ns", "paused") is EntityStatus.RECEIVE_DISABLED       # from the configuration
    with client.get_queue_sender("paused") as sender:
        sender.send_messages(ServiceBusMessage("kept"))
    with pytest.raises(MessagingEntityDisabledError):
        with client.get_queue_receiver("paused") as receiver:
            receiver.receive_messages(max_wait_time=1)


def test_topics_take_only_send_states_and_subscriptions_only_receive_states(emu, client):
    with pytest.raises(ValueError, match="must be one of Active, SendDisabled, Disabled for a topic"):
        emu.set_status("ns", "events", "ReceiveDisabled")
    with pytest.raises(ValueError, match="must be one of Active, ReceiveDisabled, Disabled for a subscription"):
        emu.set_status("ns", "events/Subscriptions/audit", "SendDisabled")
    with pytest.raises(KeyError, match="dead-letter queue"):
        emu.set_status("ns", "events/Subscriptions/audit/$DeadLetterQueue", "Disabled")
    emu.set_status("ns", "events/Subscriptions/audit", "ReceiveDisabled")
    with client.get_topic_sender("events") as sender:
        sender.send_messages(ServiceBusMessage("copied to both"))
    stats = emu.stats("ns")
    assert stats["events/Subscriptions/audit"]["total"] == stats["events/Subscriptions/all"]["total"] == 1
    with pytest.raises(MessagingEntityDisabledError):
        with client.get_subscription_receiver("events", "audit") as receiver:
            receiver.receive_messages(max_wait_time=1)
    emu.set_status("ns", "events/Subscriptions/audit", "Active")
    emu.set_status("ns", "events", "Disabled")      # a disabled topic: no sends, no receives from its subscriptions
    with pytest.raises(MessagingEntityDisabledError) as refused:
        with client.get_topic_sender("events") as sender:
            sender.send_messages(ServiceBusMessage("x"))
    assert str(refused.value).startswith(SEND_TEXT.format(kind="Topic", path="events"))
    with pytest.raises(MessagingEntityDisabledError):
        with client.get_subscription_receiver("events", "all") as receiver:
            receiver.peek_messages(max_message_count=1)
    emu.set_status("ns", "events", "Active")
    with client.get_subscription_receiver("events", "all") as receiver:
        assert [str(m) for m in receiver.peek_messages(max_message_count=5)] == ["copied to both"]


def test_set_unavailable_disabled_is_send_disabled_and_set_available_lifts_only_that(emu, client):
    queue = _queue(emu, client)
    emu.set_status("ns", queue, "ReceiveDisabled")
    emu.set_unavailable("ns", queue, mode="disabled")
    assert emu.status("ns", queue) is EntityStatus.DISABLED
    emu.set_available("ns", queue)
    assert emu.status("ns", queue) is EntityStatus.RECEIVE_DISABLED
    emu.set_status("ns", queue, "Active")
    emu.set_unavailable("ns", mode="disabled")                  # every queue and topic of the namespace
    assert {emu.status("ns", name) for name in (queue, "events")} == {EntityStatus.SEND_DISABLED}
    emu.set_available("ns")
    assert {emu.status("ns", name) for name in (queue, "events")} == {EntityStatus.ACTIVE}
    assert emu.status("ns", "paused") is EntityStatus.RECEIVE_DISABLED
    with pytest.raises(KeyError, match="no queue or topic"):
        emu.set_unavailable("ns", "nothing-here", mode="disabled")


@pytest.mark.parametrize("entity, where", [
    ({"queues": [{"name": "q", "status": "Paused"}]}, "namespaces[0].queues[0].status"),
    ({"topics": [{"name": "t", "status": "ReceiveDisabled"}]}, "namespaces[0].topics[0].status"),
    ({"topics": [{"name": "t", "subscriptions": [{"name": "s", "status": "SendDisabled"}]}]},
     "namespaces[0].topics[0].subscriptions[0].status"),
])
def test_a_status_the_entity_cannot_have_is_a_config_error(entity, where):
    with pytest.raises(ConfigError, match="^" + re.escape(where) + ": must be one of"):
        EmulatorConfig.from_dict({"namespaces": [{"name": "ns", **entity}]})
