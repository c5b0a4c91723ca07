"""Whether a restored message fits its destination as it is, before it is sent: pure, on plain values.

Service Bus refuses some messages for good (``amqp:not-allowed``): one without a SessionId sent to a
session-enabled queue, and one whose SessionId and PartitionKey are both set and differ (on any entity).
No retry changes that, so such a message is dead-lettered before it is sent, with a reason that says
what to change; the dry run shows it. Where the destination's shape is unknown (the administration API
did not answer), the first refusal teaches the sender (``sink.delivery``), with the same reason code.

Invariants:
- A message is judged on what will be sent: the restored SessionId (from ``x-ms-sessionid``) and the
  PartitionKey the backlog copy carries.
- A topic never refuses a session-less message, whatever its subscriptions: the service dead-letters the
  copy in each subscription that requires sessions, so the syphon warns (``session_subscription_warning``)
  rather than dead-letter what the other subscriptions would take.
"""

from __future__ import annotations

from typing import Mapping

from backlog_syphon.model import DestinationShape, EntityKind, ReasonCode

WHAT_TO_DO = "then re-drive it (--redrive-dead-letters)"
SESSION_REQUIRED_REASON = ("destination '{destination}' requires sessions and the message has no SessionId (its "
                           "backlog copy carries no x-ms-sessionid), so Service Bus would refuse it: give it a "
                           "SessionId, or send it to an entity without sessions (restore.destination_map), "
                           + WHAT_TO_DO)
KEY_MISMATCH_REASON = ("its SessionId '{session_id}' and PartitionKey '{partition_key}' differ, so Service Bus "
                       "would refuse it on any entity: make them equal, or clear the PartitionKey, " + WHAT_TO_DO)


def requires_session(shapes: Mapping[str, DestinationShape], destination: str | None) -> bool:
    """Whether ``destination`` (any case) is a queue that requires sessions, as far as ``shapes`` know."""
    shape = shapes.get((destination or "").lower())
    return shape is not None and shape.kind is EntityKind.QUEUE and shape.requires_session


def misfit(shapes: Mapping[str, DestinationShape], destination: str | None, session_id: str | None,
           partition_key: str | None) -> tuple[ReasonCode, str] | None:
    """Why the destination would refuse this message for good, or None when it may be sent."""
    if session_id is not None and partition_key is not None and session_id != partition_key:
        return ReasonCode.SESSION_ID_NOT_PARTITION_KEY, KEY_MISMATCH_REASON.format(session_id=session_id,
                                                                                     partition_key=partition_key)
    if session_id is None and requires_session(shapes, destination):
        return ReasonCode.SESSION_REQUIRED, SESSION_REQUIRED_REASON.format(destination=destination)
    return None


def by_name(shapes) -> dict[str, DestinationShape]:
    """Shapes keyed by lower-case name: entity names are case-insensitive in Service Bus."""
    return {shape.name.lower(): shape for shape in shapes}


def session_subscription_warning(shape: DestinationShape) -> str | None:
    """What to tell an operator about a topic with subscriptions that require sessions (None: nothing)."""
    if shape.kind is not EntityKind.TOPIC or not shape.session_subscriptions:
        return None
    return (f"topic '{shape.name}' has subscriptions that require sessions ({', '.join(shape.session_subscriptions)}): "
            f"Service Bus dead-letters a copy of every session-less message sent to it there (reason 'Session ID "
            f"is null.'), while its other subscriptions take the message")
