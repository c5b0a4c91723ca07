"""``servicebus.sdk_transfers``: single-message sends in flight on one link, with a fake SDK client that
answers transfers in order: at most ``in_flight`` at once, the accepted prefix on a refusal, what was in
flight behind a refusal waited for, and the SDK's own exceptions."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus.exceptions import ServiceBusError
from azure.servicebus._pyamqp.constants import MessageDeliveryState
from azure.servicebus._pyamqp.error import ErrorCondition, MessageSendFailed

from backlog_syphon.servicebus.sdk_transfers import InFlightSendError, in_flight_supported, send_in_flight


class FakeClient:
    """Answers the oldest unanswered transfer on each ``do_work``; ``refuse``: indexes refused."""

    def __init__(self, refuse=()):
        self.refuse = set(refuse)
        self.transfers: list = []
        self.answered = 0
        self.most_in_flight = 0

    def _transfer_message(self, delivery, timeout):
        delivery.state = MessageDeliveryState.WaitingForSendAck
        self.transfers.append(delivery)
        self.most_in_flight = max(self.most_in_flight, len(self.transfers) - self.answered)

    def do_work(self):
        if self.answered < len(self.transfers):
            delivery = self.transfers[self.answered]
            if self.answered in self.refuse:
                delivery.state = MessageDeliveryState.Error
                delivery.error = MessageSendFailed(ErrorCondition.NotAllowed, description="refused")
            else:
                delivery.state = MessageDeliveryState.Ok
            self.answered += 1
        return True


class FakeSender:
    def __init__(self, client):
        self._handler = client
        self.opened = 0

    def _open(self):
        self.opened += 1

    def _handle_exception(self, exc):  # the SDK's map: its own error, raised when it would not retry
        raise ServiceBusError(str(exc), condition=b"amqp:not-allowed")


def envelopes(count):
    return [ServiceBusMessageBatch(max_size_in_bytes=1024) for _ in range(count)]


def test_the_pinned_sdk_has_what_is_driven():
    assert in_flight_supported()


def test_all_go_at_most_in_flight_at_once_in_order():
    client = FakeClient()
    assert send_in_flight(FakeSender(client), envelopes(150), in_flight=64, timeout=5) == 150
    assert client.most_in_flight == 64
    assert client.answered == 150


def test_a_refusal_reports_the_prefix_waits_for_what_was_in_flight_and_transfers_nothing_more():
    client = FakeClient(refuse={10})
    with pytest.raises(InFlightSendError) as raised:
        send_in_flight(FakeSender(client), envelopes(150), in_flight=64, timeout=5)
    assert raised.value.sent == 10
    assert isinstance(raised.value.cause, ServiceBusError)
    # the window was full when the refusal came back (0..63 transferred, then one more per answer); nothing after
    assert len(client.transfers) == 64 + 10
    assert client.answered == len(client.transfers)  # the ones in flight behind it were answered, not left on the link


class PublicApiSender:
    """A sender as ``servicebus.send.send_singly`` uses it on an SDK it does not drive: batches and sends."""

    def __init__(self, refuse_at=None):
        self.sent: list[ServiceBusMessageBatch] = []
        self.refuse_at = refuse_at

    def create_message_batch(self, max_size_in_bytes=None):
        return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or 4096)

    def send_messages(self, batch):
        if len(self.sent) == self.refuse_at:
            raise ServiceBusError("refused", condition=b"amqp:not-allowed")
        self.sent.append(batch)


def _outgoing(count, large_at=None):
    from backlog_syphon.model import Outgoing
    from backlog_syphon.restore.amqp.message import DecodedMessage, MessageProperties

    return [Outgoing(DecodedMessage(properties=MessageProperties(message_id=f"m{i}"),
                                    body=(b"x" * (8000 if i == large_at else 10),)).encode(), f"m{i}", None, None)
            for i in range(count)]


def test_on_another_sdk_single_messages_go_one_after_the_other_with_the_public_api(monkeypatch):
    from backlog_syphon.servicebus import send

    monkeypatch.setattr(send, "in_flight_supported", lambda: False)
    sender = PublicApiSender()
    assert send.send_singly(sender, _outgoing(5), in_flight=64) == 5
    assert [len(batch) for batch in sender.sent] == [1] * 5  # each message its own send
    assert [batch._message[5][0] for batch in sender.sent] == [m.encoded for m in _outgoing(5)]
    refusing = PublicApiSender(refuse_at=2)
    with pytest.raises(InFlightSendError) as raised:
        send.send_singly(refusing, _outgoing(5), in_flight=64)
    assert raised.value.sent == 2 and isinstance(raised.value.cause, ServiceBusError)


def test_a_message_too_large_to_go_alone_is_refused_after_those_before_it_went(monkeypatch):
    from azure.servicebus.exceptions import MessageSizeExceededError

    from backlog_syphon.servicebus import send

    monkeypatch.setattr(send, "in_flight_supported", lambda: False)
    sender = PublicApiSender()
    with pytest.raises(InFlightSendError) as raised:
        send.send_singly(sender, _outgoing(5, large_at=3), in_flight=64)
    assert raised.value.sent == 3 and len(sender.sent) == 3
    assert isinstance(raised.value.cause, MessageSizeExceededError)
