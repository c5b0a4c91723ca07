"""A topic's copy that a session-requiring subscription cannot keep (no SessionId) is dead-lettered in that
subscription's $DeadLetterQueue with the service's reason, while other subscriptions take it as usual."""
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from servicebus_emulator import Emulator, EmulatorConfig

CONFIG = {"namespaces": [{"name": "ns", "port": 0, "topics": [{"name": "events", "subscriptions": [
    {"name": "plain"}, {"name": "sessions", "requires_session": True}]}]}]}


@pytest.fixture(scope="module")
def client():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emu:
        with ServiceBusClient.from_connection_string(emu.connection_string("ns"), retry_total=0) as c:
            yield emu, c


def test_a_session_less_copy_is_dead_lettered_in_the_session_subscription_with_the_services_reason(client):
    emu, c = client
    with c.get_topic_sender("events") as sender:         # the topic accepts the send: it is not refused
        sender.send_messages([ServiceBusMessage("no session", message_id="m-1", application_properties={"k": 1}),
                              ServiceBusMessage("in a session", session_id="s1")])
    with c.get_subscription_receiver("events", "sessions", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (dead,) = dlq.receive_messages(max_message_count=5, max_wait_time=5)
        assert (str(dead), dead.message_id, dead.sequence_number) == ("no session", "m-1", 1)
        assert dead.dead_letter_reason == "Session ID is null."
        assert dead.dead_letter_error_description == ("Session enabled entity doesn't allow a message whose session "
                                                      "identifier is null.")
        assert dead.application_properties[b"k"] == 1
        dlq.complete_message(dead)
    with c.get_subscription_receiver("events", "sessions", session_id="s1") as receiver:
        assert [str(m) for m in receiver.peek_messages(max_message_count=5)] == ["in a session"]
    with c.get_subscription_receiver("events", "plain") as receiver:
        assert [str(m) for m in receiver.peek_messages(max_message_count=5)] == ["no session", "in a session"]
    stats = emu.stats("ns")
    assert stats["events/Subscriptions/sessions"]["dead_lettered"] == 1
    assert stats["events/Subscriptions/sessions"]["total"] == 1
