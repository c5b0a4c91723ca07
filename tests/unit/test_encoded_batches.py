"""Restored messages go into the SDK's batch envelope as they are, and a full batch stays under the limit."""

from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus.exceptions import MessageSizeExceededError
from azure.servicebus._pyamqp.message import BatchMessage
from azure.servicebus._pyamqp.utils import get_message_encoded_size

from backlog_syphon.restore.amqp.message import DecodedMessage, MessageProperties
from backlog_syphon.restore.amqp.message_decoding import decode_message
from backlog_syphon.sink.delivery import Outgoing
from backlog_syphon.servicebus.send import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, add_encoded, send_encoded


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


class BatchesOnALink:
    """A sender as send_encoded uses it: the batches it creates (as large as the link says) and sends."""

    def __init__(self, link_batch_bytes: int, link_message_bytes: int | None = None):
        self.link_batch_bytes = link_batch_bytes
        self._max_message_size_on_link = link_message_bytes  # as the SDK's sender keeps it
        self.sent: list[ServiceBusMessageBatch] = []

    def create_message_batch(self, max_size_in_bytes=None):
        return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or self.link_batch_bytes)

    def send_messages(self, batch):
        self.sent.append(batch)


def test_batches_hold_at_most_4500_messages_and_1_mb_whatever_the_link_says():
    tiny = [Outgoing(DecodedMessage(body=(b"x",)).encode(), f"m{i}", None, None) for i in range(10_000)]
    link = BatchesOnALink(link_batch_bytes=4 * 1024 * 1024)  # a Premium large-message entity's link
    assert list(send_encoded(link, tiny)) == [MAX_BATCH_MESSAGES, MAX_BATCH_MESSAGES, 1000]
    assert [batch.max_size_in_bytes for batch in link.sent] == [MAX_BATCH_BYTES] * 3 and MAX_BATCH_MESSAGES == 4500

    large = [outgoing(i, body_size=100_000) for i in range(25)]  # 2.5 MB in all
    link = BatchesOnALink(link_batch_bytes=4 * 1024 * 1024)
    counts = list(send_encoded(link, large))
    assert sum(counts) == 25 and len(counts) == 3 and max(counts) == 10
    assert all(get_message_encoded_size(BatchMessage(*batch._message)) <= MAX_BATCH_BYTES for batch in link.sent)

    standard = BatchesOnALink(link_batch_bytes=256 * 1024)  # smaller than the cap: the link's limit holds
    assert list(send_encoded(standard, large[:5])) == [2, 2, 1]

    # An entity that takes 64 KB messages, on a link that advertises no batch size: the SDK allows 256 KB
    # batches, which the entity would refuse whole; a batch holds no more than one message may.
    small = BatchesOnALink(link_batch_bytes=256 * 1024, link_message_bytes=64 * 1024)
    thirty = [outgoing(i, body_size=30_000) for i in range(3)]
    assert list(send_encoded(small, thirty)) == [2, 1]
    assert {batch.max_size_in_bytes for batch in small.sent} == {64 * 1024}


def test_a_message_too_large_for_an_empty_batch_is_refused_as_the_first_of_its_send():
    attempted = []
    link = BatchesOnALink(link_batch_bytes=4096)
    try:
        list(send_encoded(link, [outgoing(0, body_size=8000), outgoing(1)], on_batch=attempted.append))
    except MessageSizeExceededError as error:
        assert "8" in str(error) and "4096" in str(error)
    else:
        raise AssertionError("a message larger than any batch was not refused")
    assert attempted == [1] and link.sent == []
