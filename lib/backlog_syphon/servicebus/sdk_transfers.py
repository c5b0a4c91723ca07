"""Several sends in flight on one sender link, with azure-servicebus 7.15.0's AMQP client: the one place the
syphon drives the SDK's transfers itself.

``ServiceBusSender.send_messages`` transfers one message (or batch) and waits for the broker's answer
before it returns: one send per round trip. A partitioned destination with duplicate detection takes
one message per send only (``sink.send_shape``), so at a far primary's round trip that would be a few
dozen messages a second. The SDK's own client can do better, and this module uses it as its
``SendClient._send_message_impl`` does for one message: hand the link a transfer
(``SendClient._transfer_message``, asynchronous), then run the connection (``do_work``) until the
transfer is settled, here for up to ``in_flight`` transfers at once.

Invariants:
- Order: transfers go out on one link in the order given, and a link keeps the order of its transfers;
  answers are taken in that order, and what is reported sent is the prefix the broker accepted.
- After a refusal nothing more is transferred; the transfers already in flight are waited for (their
  answers ignored: the caller sends them again, and the destination's duplicate detection, which is
  why it gets single messages at all, drops a copy it already took).
- Errors are the SDK's: each goes through the sender's own ``_handle_exception`` (the SDK's condition
  map), so ``servicebus.send.classify_send_error`` sees what ``send_messages`` would have raised.
- No SDK retries here: a failure is the caller's to retry (``sink.delivery``'s back-off).
- Only the pinned SDK (``sdk_internals.PINNED_SDK_VERSION``) is driven this way: elsewhere
  (``in_flight_supported`` False) the caller sends one message after the other with the public API.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Sequence

import azure.servicebus
from azure.servicebus import ServiceBusMessageBatch, ServiceBusSender
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError
from azure.servicebus._pyamqp import client as sdk_client
from azure.servicebus._pyamqp import constants as sdk_amqp_constants
from azure.servicebus._pyamqp import message as sdk_message

from backlog_syphon.servicebus.sdk_internals import PINNED_SDK_VERSION

# What ``send_in_flight`` uses of the SDK: (object, attribute).
REQUIRED_ATTRIBUTES = (
    (sdk_client.SendClient, "_transfer_message"),
    (sdk_client.SendClient, "do_work"),
    (sdk_message, "_MessageDelivery"),
    (sdk_message, "BatchMessage"),
    (sdk_amqp_constants, "MessageDeliveryState"),
    (sdk_amqp_constants, "MESSAGE_DELIVERY_DONE_STATES"),
    (ServiceBusSender, "_open"),
    (ServiceBusSender, "_handle_exception"),
)


def in_flight_supported() -> bool:
    """Whether the installed SDK is the one this module drives (else: one send after the other)."""
    return azure.servicebus.__version__ == PINNED_SDK_VERSION and all(
        hasattr(owner, name) for owner, name in REQUIRED_ATTRIBUTES)


class InFlightSendError(Exception):
    """``sent`` of the envelopes were accepted, in order, before ``cause`` (the SDK's exception for the next)."""

    def __init__(self, sent: int, cause: BaseException):
        super().__init__(f"{sent} sent before {type(cause).__name__}")
        self.sent = sent
        self.cause = cause


def send_in_flight(sender: ServiceBusSender, envelopes: Sequence[ServiceBusMessageBatch], *, in_flight: int,
                   timeout: float) -> int:
    """Transfer each envelope (a batch of one message, as ``servicebus.send`` builds it) as its own send, up
    to ``in_flight`` at once, in order; each must be settled within ``timeout`` seconds. Returns how many
    were sent (all); raises ``InFlightSendError`` with the accepted prefix and the first failure."""
    state = sdk_amqp_constants.MessageDeliveryState
    done_states = sdk_amqp_constants.MESSAGE_DELIVERY_DONE_STATES
    sent = 0
    pending: deque = deque()
    try:
        sender._open()
        client = sender._handler
        next_index = 0
        while sent < len(envelopes):
            while next_index < len(envelopes) and len(pending) < in_flight:
                delivery = sdk_message._MessageDelivery(sdk_message.BatchMessage(*envelopes[next_index]._message),
                                                        state.WaitingToBeSent, time.time() + timeout)
                client._transfer_message(delivery, timeout)
                pending.append(delivery)
                next_index += 1
            while pending and pending[0].state in done_states:
                delivery = pending.popleft()
                if delivery.state is not state.Ok:
                    _drain(client, pending, done_states, time.monotonic() + timeout)
                    raise delivery.error if isinstance(delivery.error, BaseException) else ServiceBusError(
                        "the send failed without an error from the service")
                sent += 1
            if sent < len(envelopes) and not client.do_work():
                raise ServiceBusError("the send failed: the connection is no longer running")
    except Exception as exc:  # noqa: BLE001 - turned into the SDK's own exception, as send_messages would
        raise InFlightSendError(sent, _as_servicebus_error(sender, exc)) from exc
    return sent


def _drain(client, pending: deque, done_states, until: float) -> None:
    """Run the connection until the transfers still in flight are answered (or ``until``): nothing of theirs
    is left to arrive on a link the next send uses. Their answers do not matter (see the module's invariants)."""
    try:
        while any(delivery.state not in done_states for delivery in pending) and time.monotonic() < until:
            if not client.do_work():
                return
    except Exception:  # noqa: BLE001 - the first failure is the one reported
        return


def _as_servicebus_error(sender: ServiceBusSender, exc: BaseException) -> BaseException:
    if isinstance(exc, ServiceBusError):
        return exc
    if isinstance(exc, TimeoutError):
        return OperationTimeoutError(message="Send operation timed out")
    try:
        return sender._handle_exception(exc)  # the SDK's condition map; it raises what it would not retry
    except ServiceBusError as error:
        return error
    except Exception:  # noqa: BLE001 - not the SDK's: leave it as it is
        return exc
