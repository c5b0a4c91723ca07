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
    (MessageSizeExceededError(message="big"), SendFailureClass.FINAL, ReasonCode.MESSAGE_TOO_LARGE),
])
def test_each_sdk_error_gets_its_class(error, failure_class, reason_code):
    failure = classify_send_error(error, "orders")
    assert (failure.failure_class, failure.reason_code) == (failure_class, reason_code)
    assert "'orders'" in failure.reason and type(error).__name__ in failure.reason


def test_a_missing_send_right_is_dead_lettered_with_the_role_to_grant():
    failure = classify_send_error(ServiceBusAuthorizationError(message=MISSING_SEND), "orders")
    assert failure.reason.startswith("the primary namespace refused Send on 'orders': grant Azure Service Bus "
                                     "Data Sender on it")
