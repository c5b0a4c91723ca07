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
from backlog_syphon.servicebus.sdk_internals import add_encoded_to_batch
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
    if "throttl" in str(exc).lower():
        # Throttling reported under another condition (the service's text says "... is being throttled").
        return SendFailure(True, ReasonCode.THROTTLED, f"the primary namespace throttled sends to '{destination}' "
                                                       f"({name})")
    return SendFailure(True, ReasonCode.TRANSIENT, f"{name} while sending to '{destination}'")


# The envelope of a batch carries its first message's MessageId, SessionId and partition key, which
# ServiceBusMessageBatch does not count against the size limit: a batch filled to the limit would be
# refused as a whole. Room is kept for them.
ENVELOPE_RESERVE_BYTES = 1024


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


def send_encoded(sender, messages: Sequence[Outgoing]) -> Iterator[int]:
    """Send encoded messages in order, in as few batched sends as fit; yield each send's count once sent."""
    pending = list(messages)
    while pending:
        batch = sender.create_message_batch()
        count = 0
        while count < len(pending) and add_encoded(batch, pending[count]):
            count += 1
        if not count:
            raise MessageSizeExceededError(message=f"a message of {len(pending[0].encoded)} bytes is larger than "
                                                   f"the {batch.max_size_in_bytes} bytes the destination accepts")
        sender.send_messages(batch)
        yield count
        pending = pending[count:]


class DestinationSenders:
    """``sink.delivery.Sender`` on the primary namespace: senders per destination from the process pool."""

    def __init__(self, namespace: NamespaceConfig):
        self._namespace = namespace

    def send(self, destination: str, messages: Sequence[Outgoing]) -> int:
        """Send consecutive messages to one destination in as few batches as fit, in order.

        Returns how many were sent (all of them); raises ``PartialSendError`` saying how many went
        before the first failure, so the caller resumes exactly there.
        """
        sent = 0
        try:
            sender = self._sender(destination)
            for count in send_encoded(sender, messages):
                sent += count
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            raise PartialSendError(sent, exc) from exc
        return sent

    def open(self, destinations: Iterable[str]) -> None:
        """Open the senders of ``destinations`` at once, before sending to them one after the other."""
        open_in_parallel(self._sender(destination) for destination in destinations)

    def _sender(self, destination: str):
        return pooled_sender(self._namespace, destination)

    def reset(self, destination: str) -> None:
        """Drop a sender after an error so the next attempt opens a fresh link."""
        discard_sender(self._namespace, destination)
