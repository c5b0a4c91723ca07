"""Restored messages go into the SDK's batch envelope as they are, and a full batch stays under the limit."""

from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus._pyamqp.message import BatchMessage
from azure.servicebus._pyamqp.utils import get_message_encoded_size

from backlog_syphon.restore.amqp_message import DecodedMessage, MessageProperties, decode_message
from backlog_syphon.sink.delivery import Outgoing
from backlog_syphon.servicebus.send import add_encoded


def outgoing(index: int, body_size: int = 40) -> Outgoing:
    # Small messages fill a batch to within a few bytes of its limit; a long session id and message
    # id make the envelope (which names the first message) big.
    session = "customer-" + "s" * 100
    message_id = "m" * 120 + str(index)
    encoded = DecodedMessage(properties=MessageProperties(message_id=message_id, group_id=session),
                             body=(bytes([index % 256]) * body_size,)).encode()
    return Outgoing(encoded, message_id, session, session)


def test_a_full_batch_with_its_envelope_stays_within_the_limit_and_keeps_the_bytes():
    limit = 64 * 1024
    batch = ServiceBusMessageBatch(max_size_in_bytes=limit)
    added = []
    while add_encoded(batch, message := outgoing(len(added))):
        added.append(message)
    assert len(added) > 10 and len(batch) == len(added)
    envelope = BatchMessage(*batch._message)  # what the sender encodes and sends
    assert get_message_encoded_size(envelope) <= limit
    assert [bytes(data) for data in batch._message[5]] == [message.encoded for message in added]
    assert decode_message(bytes(batch._message[5][3])).body == ((bytes([3]) * 40),)
    assert envelope.properties.message_id == added[0].message_id and envelope.properties.group_id == added[0].session_id


def test_a_message_larger_than_the_limit_does_not_fit_an_empty_batch():
    batch = ServiceBusMessageBatch(max_size_in_bytes=4096)
    assert not add_encoded(batch, outgoing(0, body_size=8000))
    assert len(batch) == 0
