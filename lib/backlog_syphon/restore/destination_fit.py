"""Whether a restored message fits its destination as it is, before it is sent: pure, on plain values.

Service Bus refuses some messages for good (``amqp:not-allowed``): one without a SessionId sent to a
session-enabled queue, and one whose SessionId and PartitionKey are both set and differ (on any entity).
No retry changes that, so such a message is dead-lettered before it is sent, with a reason that says
what to change; the dry run shows it. Where the destination's shape is unknown (the administration API
did not answer), the first refusal teaches the sender (``sink.delivery``), with the same reason code.

The service also refuses a message whose properties are too large (``property_size_refusal``: a property
above 32 KB, all of them above 64 KB, a MessageId or SessionId above 128 characters), and with a generic
text that looks transient ("The service was unable to process the request; please retry the operation"):
a retry would send the same message for ever, so it is measured on the restored bytes before it is sent.

Invariants:
- A message is judged on what will be sent: the restored SessionId (from ``x-ms-sessionid``) and the
  PartitionKey the backlog copy carries; its sizes on the restored message's bytes.
- A topic never refuses a session-less message, whatever its subscriptions: the service dead-letters the
  copy in each subscription that requires sessions, so the syphon warns (``session_subscription_warning``)
  rather than dead-letter what the other subscriptions would take.
"""

from __future__ import annotations

from typing import Mapping

from backlog_syphon.model import DestinationShape, EntityKind, ReasonCode
from backlog_syphon.restore.amqp.sections import SectionCode, map_entries, split_sections

# Service Bus's limits on a message's properties (its quotas): each property, all of them (the system ones
# included), and the MessageId and SessionId.
MAX_PROPERTY_BYTES = 32 * 1024
MAX_PROPERTIES_BYTES = 64 * 1024
MAX_ID_CHARACTERS = 128
_HEADER_SECTIONS = (SectionCode.MESSAGE_ANNOTATIONS, SectionCode.PROPERTIES, SectionCode.APPLICATION_PROPERTIES)

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


def property_size_refusal(encoded: bytes, message_id: str | None, session_id: str | None) -> str | None:
    """Why Service Bus would refuse this restored message for the size of its properties, or None."""
    for name, value in (("MessageId", message_id), ("SessionId", session_id)):
        if value is not None and len(value) > MAX_ID_CHARACTERS:
            return f"its {name} has {len(value)} characters, more than the {MAX_ID_CHARACTERS} Service Bus takes"
    header = 0
    for section in split_sections(encoded):
        if section.code not in _HEADER_SECTIONS:
            continue
        header += section.end - section.value_start
        if section.code is SectionCode.APPLICATION_PROPERTIES:
            for entry in map_entries(encoded, section.value_start):
                if entry.end - entry.start > MAX_PROPERTY_BYTES:
                    return (f"its property '{entry.key}' is {entry.end - entry.start:,} bytes, more than the "
                            f"{MAX_PROPERTY_BYTES:,} Service Bus takes per property")
    if header > MAX_PROPERTIES_BYTES:
        return (f"its properties are {header:,} bytes in all, more than the {MAX_PROPERTIES_BYTES:,} Service Bus takes "
                f"(system properties included)")
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
