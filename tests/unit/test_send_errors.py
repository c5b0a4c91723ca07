"""The send-error taxonomy (``servicebus.send.classify_send_error``) on the SDK's own exception types:
which errors dead-letter, which are retried, and which are throttling (slow down, no attempt spent)."""

import pytest
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
)

from backlog_syphon.model import ReasonCode, SendFailureClass
from backlog_syphon.servicebus.send import classify_send_error

# Service Bus's answer to a send without the Send right (a role, or a key's claim).
MISSING_SEND = ("Unauthorized access. 'Send' claim(s) are required to perform this operation. Resource: "
                "'sb://contoso.servicebus.windows.net/orders'. TrackingId:1, SystemTracker:contoso:orders")


@pytest.mark.parametrize("error, failure_class, reason_code", [
    (ServiceBusServerBusyError(), SendFailureClass.THROTTLED, ReasonCode.SERVER_BUSY),
    (ServiceBusQuotaExceededError(), SendFailureClass.THROTTLED, ReasonCode.QUOTA_EXCEEDED),
    (ServiceBusError("The request was terminated because the namespace is being throttled. Error code : 50009."),
     SendFailureClass.THROTTLED, ReasonCode.THROTTLED),
    (ServiceBusConnectionError(message="connection dropped"), SendFailureClass.TRANSIENT, ReasonCode.TRANSIENT),
    (MessagingEntityDisabledError(message="disabled"), SendFailureClass.TRANSIENT, ReasonCode.DESTINATION_DISABLED),
    (MessagingEntityNotFoundError(message="gone"), SendFailureClass.FINAL, ReasonCode.DESTINATION_NOT_FOUND),
    (ServiceBusAuthorizationError(message=MISSING_SEND), SendFailureClass.FINAL, ReasonCode.UNAUTHORIZED),
    (ServiceBusAuthorizationError(message="Unauthorized access. The token has expired."), SendFailureClass.TRANSIENT,
     ReasonCode.AUTHENTICATION_FAILED),
    (MessageSizeExceededError(message="big"), SendFailureClass.REFUSED, ReasonCode.MESSAGE_TOO_LARGE),
    # an unmapped condition the SDK retries: transient for the syphon too
    (ServiceBusError("The service was unable to process the request.", condition=b"amqp:internal-error"),
     SendFailureClass.TRANSIENT, ReasonCode.TRANSIENT),
])
def test_each_sdk_error_gets_its_class(error, failure_class, reason_code):
    failure = classify_send_error(error, "orders")
    assert (failure.failure_class, failure.reason_code) == (failure_class, reason_code)
    assert "'orders'" in failure.reason and type(error).__name__ in failure.reason


def test_a_missing_send_right_is_dead_lettered_with_the_role_to_grant():
    failure = classify_send_error(ServiceBusAuthorizationError(message=MISSING_SEND), "orders")
    assert failure.reason.startswith("the primary namespace refused Send on 'orders': grant Azure Service Bus "
                                     "Data Sender on it")


SESSION_NOT_SET = ("The SessionId was not set on a message, and it cannot be sent to the entity. Entities that have "
                   "session support enabled can only receive messages that have the SessionId set to a valid value.")


@pytest.mark.parametrize("condition, text, reason_code", [
    (b"amqp:not-allowed", SESSION_NOT_SET, ReasonCode.SESSION_REQUIRED),
    (b"amqp:not-allowed", "The SessionId 'a' and the PartitionKey 'b' of the message must be equal.",
     ReasonCode.SESSION_ID_NOT_PARTITION_KEY),
    (b"com.microsoft:argument-error", "The value supplied for Label is too long.", ReasonCode.DESTINATION_REFUSED),
    (b"com.microsoft:argument-out-of-range", "The value is out of range.", ReasonCode.DESTINATION_REFUSED),
    (b"amqp:invalid-field", "The field is invalid.", ReasonCode.DESTINATION_REFUSED),
])
def test_a_final_refusal_concerns_one_message_and_quotes_the_service(condition, text, reason_code):
    # as the SDK raises them: a plain ServiceBusError that it does not retry, the condition kept aside
    error = ServiceBusError(text, condition=condition, status_code=400)
    failure = classify_send_error(error, "sessions-orders")
    assert (failure.failure_class, failure.reason_code, failure.transient) == (SendFailureClass.REFUSED, reason_code,
                                                                               False)
    assert failure.reason.startswith(f"destination 'sessions-orders' refused the message ({condition.decode()}): "
                                     f"{text} (")
    assert "Error condition" not in failure.reason and "Status Code" not in failure.reason


@pytest.mark.parametrize("text", [
    "Batching brokered messages with distinct SessionId, PartitionKey, or MessageId is not supported for an entity "
    "with partitioning and duplicate detection enabled. LogicalPartitionId:3",
    "Batching messages with distinct SessionId or PartitionKey isn't supported on partitioned namespaces.",
])
def test_a_refusal_of_a_batchs_shape_is_told_apart_from_a_refusal_of_a_message(text):
    # sink.delivery sends the batch again one message at a time: nothing is dead-lettered for it
    error = ServiceBusError(text, condition=b"amqp:not-allowed", status_code=400)
    failure = classify_send_error(error, "orders")
    assert (failure.failure_class, failure.reason_code, failure.transient) == (
        SendFailureClass.REFUSED, ReasonCode.BATCH_SHAPE_REFUSED, False)
    assert failure.reason.startswith("destination 'orders' refused a batch for its shape (amqp:not-allowed): Batching")
