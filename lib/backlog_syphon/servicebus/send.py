"""Sending restored messages to the primary namespace: encoded batches, the destination senders and
the send-error taxonomy.

Restored messages are sent as the bytes the syphon's codec built (``add_encoded``), since the SDK's
own encoder cannot express every AMQP body. The decisions (grouping, retries, outcomes) are
``sink.delivery``'s; this is the I/O behind its ``Sender``.
"""

from __future__ import annotations

import logging
from typing import Iterable, Iterator, Sequence

from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
)

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.servicebus.access import is_missing_claim
from backlog_syphon.servicebus.clients import discard_sender, open_in_parallel, pooled_sender
from backlog_syphon.servicebus.sdk_transfers import InFlightSendError, in_flight_supported, send_in_flight
from backlog_syphon.servicebus.sdk_internals import (
    add_encoded_to_batch,
    error_condition,
    link_max_message_size,
    service_text,
)
from backlog_syphon.model import AccessRight, Outgoing, PartialSendError, ReasonCode, SendFailure

logger = logging.getLogger(__name__)


def classify_send_error(exc: BaseException, destination: str) -> SendFailure:
    """Transient (retried, and waited for up to ``sink.outage_wait_seconds``) or final for these messages
    (dead-letter). Throttling (``SendFailure.failure_class`` THROTTLED: server busy, quota exceeded,
    throttled) is transient too, and makes the sender slow down (``sink.pacing``)."""
    name = type(exc).__name__
    if isinstance(exc, ServiceBusServerBusyError):
        # com.microsoft:server-busy: how a namespace out of its throughput credits answers.
        return SendFailure(True, ReasonCode.SERVER_BUSY, f"the primary namespace is busy sending to "
                                                         f"'{destination}' ({name})")
    if isinstance(exc, MessagingEntityNotFoundError):
        return SendFailure(False, ReasonCode.DESTINATION_NOT_FOUND,
                           f"destination '{destination}' does not exist in the primary namespace ({name})")
    if isinstance(exc, MessageSizeExceededError):
        return SendFailure(False, ReasonCode.MESSAGE_TOO_LARGE,
                           f"the restored message is larger than '{destination}' accepts ({name})")
    if isinstance(exc, ServiceBusAuthorizationError):
        if is_missing_claim(str(exc)):  # the service's answer for a missing role (or a key without Send)
            return SendFailure(False, ReasonCode.UNAUTHORIZED,
                               f"the primary namespace refused {AccessRight.SEND} on '{destination}': grant "
                               f"{AccessRight.SEND.role} on it, or use a key with the {AccessRight.SEND} right ({name})")
        # Anything else (a token that expired on the link): a new link gets a new token.
        return SendFailure(True, ReasonCode.AUTHENTICATION_FAILED,
                           f"the primary namespace refused the link's token for '{destination}' ({name})")
    if isinstance(exc, MessagingEntityDisabledError):
        # A disabled entity is an operator's temporary choice: wait rather than dead-letter.
        return SendFailure(True, ReasonCode.DESTINATION_DISABLED, f"destination '{destination}' is disabled ({name})")
    if isinstance(exc, ServiceBusQuotaExceededError):
        # A full destination (or a namespace at its connection quota) drains as its consumers catch up:
        # slow down and wait rather than dead-letter.
        return SendFailure(True, ReasonCode.QUOTA_EXCEEDED,
                           f"destination '{destination}' is full or the namespace's quota is exceeded ({name})")
    if isinstance(exc, ServiceBusAuthenticationError):
        # The pre-flight checked the credentials: now it is a rotated key or an expired token.
        return SendFailure(True, ReasonCode.AUTHENTICATION_FAILED,
                           f"authentication failed for the primary namespace ({name})")
    condition = error_condition(exc)
    if condition in FINAL_REFUSAL_CONDITIONS:
        return refusal_of_message(condition, service_text(exc), destination)
    if "throttl" in str(exc).lower():
        # Throttling reported under another condition (the service's text says "... is being throttled").
        return SendFailure(True, ReasonCode.THROTTLED, f"the primary namespace throttled sends to '{destination}' "
                                                       f"({name})")
    return SendFailure(True, ReasonCode.TRANSIENT, f"{name} while sending to '{destination}'")


# Conditions under which the service refuses a message for good: nothing about the message will change, so
# the SDK does not retry them either (its no-retry list). What they concern is one message of the send (or
# the send's shape), never the destination as a whole: ``sink.delivery`` finds which one by sending fewer.
FINAL_REFUSAL_CONDITIONS = frozenset({"amqp:not-allowed", "com.microsoft:argument-error",
                                      "com.microsoft:argument-out-of-range", "amqp:invalid-field"})
# How the service words the refusals whose cause the syphon can name (and check before sending).
_SESSION_NOT_SET = "sessionid was not set"
# A partitioned entity refusing a batch for its shape: "Batching brokered messages with distinct SessionId,
# PartitionKey, or MessageId is not supported for an entity with partitioning and duplicate detection
# enabled." (and, without duplicate detection, of distinct SessionId or PartitionKey).
_BATCH_SHAPE = ("batching", "distinct")
_SESSION_VS_PARTITION_KEY = ("partitionkey", "sessionid")


def refusal_of_message(condition: str, text: str, destination: str) -> SendFailure:
    """A final refusal of a message: its reason code, and a reason that quotes the service and says what to do."""
    lowered = text.lower()
    if all(word in lowered for word in _BATCH_SHAPE):
        # The send's shape, not a message: ``sink.delivery`` sends the batch again one message at a time.
        return SendFailure(False, ReasonCode.BATCH_SHAPE_REFUSED, f"destination '{destination}' refused a batch "
                                                                  f"for its shape ({condition}): {text}"[:1024])
    if _SESSION_NOT_SET in lowered:
        code, advice = ReasonCode.SESSION_REQUIRED, ("the destination requires sessions and the message has none: "
                                                     "give it a SessionId, or route it to an entity without sessions "
                                                     "(restore.destination_map), then re-drive it")
    elif all(word in lowered for word in _SESSION_VS_PARTITION_KEY):
        code, advice = ReasonCode.SESSION_ID_NOT_PARTITION_KEY, ("its SessionId and PartitionKey differ; Service "
                                                                 "Bus takes a message only when they are equal")
    else:
        code, advice = ReasonCode.DESTINATION_REFUSED, "no retry changes this answer"
    return SendFailure(False, code, f"destination '{destination}' refused the message ({condition}): {text} "
                                    f"({advice})"[:1024])


# At most this many messages in one batched send, whatever the link advertises: Standard namespaces refuse a
# batch of more (with a generic error the SDK would retry), and neither the SDK nor the link says so.
MAX_BATCH_MESSAGES = 4500
# At most this many bytes in one batched send, on every tier: a Premium entity that takes messages of up to
# 100 MB still takes batches of 1 MB only, and the service does not advertise it on the link.
MAX_BATCH_BYTES = 1024 * 1024

# The envelope of a batch carries its first message's MessageId, SessionId and partition key, which
# ServiceBusMessageBatch does not count against the size limit: a batch filled to the limit would be
# refused as a whole. Room is kept for them.
ENVELOPE_RESERVE_BYTES = 1024


# How long one single-message send in flight may wait for the broker's answer (the SDK's sends wait as long).
SINGLE_SEND_TIMEOUT_SECONDS = 60.0


def add_encoded(batch: ServiceBusMessageBatch, message: Outgoing) -> bool:
    """Add an encoded AMQP message to a batch exactly as it is; False when it does not fit.

    The SDK re-encodes what it is given from its own message model, which cannot express every
    AMQP body (a typed value or sequence body comes out as a map, or nested one level deeper). The
    batch envelope carries each message as one Data section of its encoded bytes, so the restored
    bytes go in unchanged (``sdk_internals.add_encoded_to_batch``).
    """
    return add_encoded_to_batch(batch, message.encoded, message_id=message.message_id,
                                session_id=message.session_id, partition_key=message.partition_key,
                                reserve_bytes=ENVELOPE_RESERVE_BYTES)


def send_encoded(sender, messages: Sequence[Outgoing], *, on_batch=lambda count: None) -> Iterator[int]:
    """Send encoded messages in order, in as few batched sends as fit (at most ``MAX_BATCH_MESSAGES`` and
    ``MAX_BATCH_BYTES`` each); ``on_batch(n)`` before each send of ``n``; yield each send's count once sent."""
    pending = list(messages)
    while pending:
        batch = _new_batch(sender)
        count = 0
        while count < min(len(pending), MAX_BATCH_MESSAGES) and add_encoded(batch, pending[count]):
            count += 1
        if not count:
            on_batch(1)  # the refusal is the first message's: it alone is too large
            raise MessageSizeExceededError(message=f"a message of {len(pending[0].encoded)} bytes is larger than "
                                                   f"the {batch.max_size_in_bytes} bytes the destination accepts")
        on_batch(count)
        sender.send_messages(batch)
        yield count
        pending = pending[count:]


def _new_batch(sender) -> ServiceBusMessageBatch:
    batch = sender.create_message_batch()
    # The service takes a batch no larger than one message of the entity, and 1 MB at most: the SDK's
    # own limit can be larger (256 KB when the link advertises none, whatever the entity's message size).
    limit = min(batch.max_size_in_bytes, MAX_BATCH_BYTES, link_max_message_size(sender) or MAX_BATCH_BYTES)
    if limit < batch.max_size_in_bytes:
        batch = sender.create_message_batch(max_size_in_bytes=limit)
    return batch


def single_envelope(sender, message: Outgoing) -> ServiceBusMessageBatch:
    """A batch of ``message`` alone, as a single-message send carries it (the bytes unchanged, the envelope
    naming its MessageId, SessionId and partition key); ``MessageSizeExceededError`` when it does not fit."""
    batch = _new_batch(sender)
    if not add_encoded(batch, message):
        raise MessageSizeExceededError(message=f"a message of {len(message.encoded)} bytes is larger than "
                                               f"the {batch.max_size_in_bytes} bytes the destination accepts")
    return batch


def send_singly(sender, messages: Sequence[Outgoing], *, in_flight: int) -> int:
    """Send each message as its own send, up to ``in_flight`` at once on the link, in order (one after the
    other where the SDK is not the pinned one); returns how many went, or raises ``InFlightSendError``."""
    envelopes, too_large = [], None
    for message in messages:  # a message too large to send alone is refused after those before it went
        try:
            envelopes.append(single_envelope(sender, message))
        except MessageSizeExceededError as exc:
            too_large = exc
            break
    if in_flight_supported():
        sent = send_in_flight(sender, envelopes, in_flight=in_flight, timeout=SINGLE_SEND_TIMEOUT_SECONDS)
    else:
        sent = 0
        for envelope in envelopes:
            try:
                sender.send_messages(envelope)
            except Exception as exc:  # noqa: BLE001 - the caller classifies it
                raise InFlightSendError(sent, exc) from exc
            sent += 1
    if too_large is not None:
        raise InFlightSendError(sent, too_large)
    return sent


class DestinationSenders:
    """``sink.delivery.Sender`` on the primary namespace: senders per destination from the process pool."""

    def __init__(self, namespace: NamespaceConfig):
        self._namespace = namespace

    def send(self, destination: str, messages: Sequence[Outgoing]) -> int:
        """Send consecutive messages to one destination in as few batches as fit, in order.

        Returns how many were sent (all of them); raises ``PartialSendError`` saying how many went
        before the first failure, so the caller resumes exactly there.
        """
        sent, attempted = 0, [0]  # the batch being sent: 0 while none is (the link's opening comes first)
        try:
            sender = self._sender(destination)
            for count in send_encoded(sender, messages, on_batch=lambda count: attempted.__setitem__(0, count)):
                sent, attempted[0] = sent + count, 0
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            raise PartialSendError(sent, exc, attempted[0]) from exc
        return sent

    def send_singly(self, destination: str, messages: Sequence[Outgoing]) -> int:
        """Send each message on its own, several in flight on the destination's link, in order (a partitioned
        destination with duplicate detection takes no batch of distinct MessageIds). Raises ``PartialSendError``
        (``attempted`` 1: the message refused; 0: the link itself failed)."""
        try:
            sender = self._sender(destination)
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            raise PartialSendError(0, exc, 0) from exc
        try:
            return send_singly(sender, messages, in_flight=len(messages))
        except InFlightSendError as error:
            raise PartialSendError(error.sent, error.cause, 1) from error.cause

    def open(self, destinations: Iterable[str]) -> None:
        """Open the senders of ``destinations`` at once, before sending to them one after the other."""
        open_in_parallel(self._sender(destination) for destination in destinations)

    def _sender(self, destination: str):
        return pooled_sender(self._namespace, destination)

    def reset(self, destination: str) -> None:
        """Drop a sender after an error so the next attempt opens a fresh link."""
        discard_sender(self._namespace, destination)
