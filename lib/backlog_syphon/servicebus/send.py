"""Sending restored messages to the primary namespace: encoded batches, the destination senders, the
send-error taxonomy, and the health probe a sender waits on during an outage.

Restored messages are sent as the bytes the syphon's codec built (``add_encoded``), since the SDK's
own encoder cannot express every AMQP body. The decisions (grouping, retries, outcomes) are
``sink.delivery``'s; this is the I/O behind its ``Sender``.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Iterator, Sequence

from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus._common.constants import _BATCH_MESSAGE_OVERHEAD_COST
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.model import ReasonCode
from backlog_syphon.servicebus.clients import discard_sender, open_client, open_in_parallel, pooled_sender
from backlog_syphon.sink.delivery import Outgoing, PartialSendError, SendFailure

logger = logging.getLogger(__name__)


def classify_send_error(exc: BaseException, destination: str) -> SendFailure:
    """Transient (retry, then wait for the primary) or final for these messages (dead-letter)."""
    name = type(exc).__name__
    if isinstance(exc, MessagingEntityNotFoundError):
        return SendFailure(False, ReasonCode.DESTINATION_NOT_FOUND,
                           f"destination '{destination}' does not exist in the primary namespace ({name})")
    if isinstance(exc, MessageSizeExceededError):
        return SendFailure(False, ReasonCode.MESSAGE_TOO_LARGE,
                           f"the restored message is larger than '{destination}' accepts ({name})")
    if isinstance(exc, ServiceBusAuthorizationError):
        return SendFailure(False, ReasonCode.UNAUTHORIZED, f"not authorized to send to '{destination}' ({name})")
    if isinstance(exc, MessagingEntityDisabledError):
        # A disabled entity is an operator's temporary choice: wait rather than dead-letter.
        return SendFailure(True, ReasonCode.DESTINATION_DISABLED, f"destination '{destination}' is disabled ({name})")
    if isinstance(exc, ServiceBusAuthenticationError):
        # The pre-flight checked the credentials: now it is a rotated key or an expired token.
        return SendFailure(True, ReasonCode.AUTHENTICATION_FAILED,
                           f"authentication failed for the primary namespace ({name})")
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
    bytes go in unchanged: the same bookkeeping as ``ServiceBusMessageBatch.add_message`` (pinned
    by azure-servicebus==7.15.0 and covered by the fidelity tests), without the re-encoding.
    """
    size = len(message.encoded)
    size_after = batch._size + size + _BATCH_MESSAGE_OVERHEAD_COST[0 if size < 256 else 1]  # noqa: SLF001
    if size_after + ENVELOPE_RESERVE_BYTES > batch.max_size_in_bytes:
        return False
    batch._message[5].append(message.encoded)  # noqa: SLF001 - the envelope's Data sections
    batch._size = size_after  # noqa: SLF001
    batch._count += 1  # noqa: SLF001
    if batch._count == 1:  # noqa: SLF001 - the envelope names its first message, as add_message does
        batch._amqp_transport.set_batch_envelope_properties(  # noqa: SLF001
            batch._message, message.message_id, message.session_id, message.partition_key)  # noqa: SLF001
    return True


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

    def wait_until_reachable(self, destination: str, max_wait_seconds: float) -> bool:
        return wait_until_reachable(self._namespace, destination, max_wait_seconds=max_wait_seconds)


def wait_until_reachable(namespace: NamespaceConfig, destination: str, *, max_wait_seconds: float,
                         sleep: Callable[[float], None] = time.sleep, interval: float = 2.0) -> bool:
    """Health probe: open a sender link to ``destination`` until it works or the wait is over."""
    deadline = time.monotonic() + max_wait_seconds
    while True:
        try:
            with open_client(namespace, retry_total=0, role="primary") as client:
                with client.get_queue_sender(destination) as sender:
                    sender._open()  # noqa: SLF001 - attaching the link is the probe
            return True
        except MessagingEntityNotFoundError:
            return True  # reachable; the entity problem is reported by the send itself
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            if time.monotonic() >= deadline:
                logger.warning("primary still unreachable after %.0f s (%s)", max_wait_seconds, type(exc).__name__)
                return False
            logger.info("primary unreachable (%s); probing again in %.0f s", type(exc).__name__, interval)
            sleep(interval)
            interval = min(interval * 2, 5.0)  # resume soon after the primary is back
