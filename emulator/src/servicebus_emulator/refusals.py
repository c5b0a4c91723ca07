"""What a real namespace refuses, with its conditions and texts: sends it will not store, entities whose
status forbids the operation, and the dead-letter reason of a copy a session subscription cannot keep.

Each function returns the ``BrokerError`` to answer with, or None; the server decides where it goes
(a rejected delivery, a refused attach, a detach, a management status). docs/emulator.md cites the
source of each text. No I/O.

Invariants:
- a refusal of a message in a batch refuses the whole batch: the service stores all of a batch or
  none of it;
- descriptions end as the service's do (``TrackingId``, ``SystemTracker``, ``Timestamp``), through
  the namespace's ``described``.
"""
from __future__ import annotations

import uuid
import zlib
from typing import Iterable, List, Optional

from . import codec
from .broker import BrokerError, Topic
from .entity_status import receive_status
from .limits import MAX_BATCH_BYTES, MAX_HEADER_BYTES, MAX_ID_CHARACTERS, MAX_PROPERTY_BYTES
from .message import Content
from .partitions import partition_key, routing_key

NOT_ALLOWED = "amqp:not-allowed"
INTERNAL_ERROR = "amqp:internal-error"
ENTITY_DISABLED = "com.microsoft:entity-disabled"
SERVER_BUSY = "com.microsoft:server-busy"
RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"

# A namespace out of its credits (the text of azure-sdk-for-python#19376 and azure-sdk-for-java#37594), and an
# entity the service throttles (the throttling article's text)
NAMESPACE_THROTTLED = ("The request was terminated because the namespace {namespace} is being throttled. Error code : "
                       "50009. Please wait 2 seconds and try again. To know more visit "
                       "https://aka.ms/sbResourceMgrExceptions and https://aka.ms/ServiceBusThrottling")
ENTITY_THROTTLED = ("The request was terminated because the entity is being throttled. Error code: 50009. Please "
                    "wait 2 seconds and try again.")
# Lock tokens of several partitions in one settlement or renewal (azure-service-bus-dotnet#386, google/go-cloud#2362)
LOCK_TOKENS_ACROSS_PARTITIONS = ("Batching lock tokens for different partitions is not supported for an entity with "
                                 "partitioning enabled.")
CONNECTIONS_QUOTA_EXCEEDED = "ConnectionsQuotaExceeded for namespace {namespace}."

SESSION_ID_MISSING = ("The SessionId was not set on a message, and it cannot be sent to the entity. Entities "
                      "that have session support enabled can only receive messages that have the SessionId set "
                      "to a valid value.")
# the service's generic answer to a batch of too many messages (it names no limit)
UNABLE_TO_PROCESS = ("The service was unable to process the request; please retry the operation. For more "
                     "information on exception types and proper exception handling, please refer to "
                     "http://go.microsoft.com/fwlink/?LinkId=761101")
# DeadLetterReason and DeadLetterErrorDescription of a session-less copy in a session subscription
SESSIONLESS_COPY = ("Session ID is null.",
                    "Session enabled entity doesn't allow a message whose session identifier is null.")
# a batch whose messages a partitioned entity would put in different partitions (the service's texts)
DISTINCT_KEYS_BATCH = ("Batching brokered messages with distinct SessionId or PartitionKey is not supported for "
                       "an entity with partitioning enabled.")
DISTINCT_KEYS_DEDUPE_BATCH = ("Batching brokered messages with distinct SessionId, PartitionKey, or MessageId  is not "
                              "supported for an entity with partitioning and duplicate detection enabled.")

# set_unavailable modes that let senders attach and then refuse every message, as a namespace does for
# a full entity or a namespace that throttles (a Standard namespace out of its credits answers sends
# with server-busy on links that stay attached; the SDK maps the condition to ServiceBusServerBusyError):
# mode -> (condition, description, status code)
SEND_REFUSALS = {
    "quota-exceeded": ("amqp:resource-limit-exceeded",
                       "The maximum entity size has been reached or exceeded for '{path}'.", 403),
    "throttled": (SERVER_BUSY, ENTITY_THROTTLED, 503),
}


class LinkRefusal(BrokerError):
    """A refusal the service answers by detaching the sender's link, not by rejecting the transfer."""


def throttled(ns, path: str, *, entity: bool = False) -> BrokerError:
    """The service's answer to an operation it throttles: the namespace is out of its credits (or, ``entity``,
    a test throttles one entity)."""
    text = ENTITY_THROTTLED if entity else NAMESPACE_THROTTLED.format(namespace=ns.name)
    return BrokerError(SERVER_BUSY, ns.described(text, path), 503)


def busy_refusal(ns, path: str) -> Optional[BrokerError]:
    """Why the namespace refuses an operation on ``path`` for being busy, or None: a test's ``server-busy``
    switch on the namespace or on the entity."""
    if not ns.is_busy(path):
        return None
    return throttled(ns, path, entity=not ns.busy_all)


def _kind(target) -> str:
    return "Topic" if isinstance(target, Topic) else "Queue"


def oversized(content: Content) -> Optional[str]:
    """What of a message's properties is larger than the service takes, or None: a property above 32 KB,
    all properties (system ones included) above 64 KB, a MessageId or SessionId above 128 characters."""
    for name, value in (("MessageId", content.message_id), ("SessionId", content.session_id)):
        if isinstance(value, (str, bytes)) and len(value) > MAX_ID_CHARACTERS:
            return f"{name} of {len(value)} characters"
    entries = codec.section_map_entries(content.app_raw) if content.app_raw else []
    for key, value in entries:
        if len(key) + len(value) > MAX_PROPERTY_BYTES:
            return f"property {codec.key_name(key)!r} of {len(key) + len(value)} bytes"
    header = len(content.props_raw) + len(content.app_raw) + sum(len(k) + len(v) for k, v in content.ann_entries)
    if header > MAX_HEADER_BYTES:
        return f"properties of {header} bytes in all"
    return None


def message_refusal(ns, target, contents: Iterable[Content]) -> Optional[BrokerError]:
    """Why the service refuses these messages (one transfer: a message or a batch), or None."""
    for content in contents:
        if oversized(content) is not None:
            # the service's generic answer, which names no limit (azure-sdk-for-net#15325)
            return BrokerError(INTERNAL_ERROR, ns.described(f"{UNABLE_TO_PROCESS} {_reference()}",
                                                            f"{_kind(target)}:{target.path}"), 500)
        if getattr(target, "requires_session", False) and content.session_id is None:
            return BrokerError(NOT_ALLOWED, ns.described(SESSION_ID_MISSING, target.path))
        key = partition_key(content)
        if content.session_id is not None and key is not None and key != content.session_id:
            return BrokerError(NOT_ALLOWED, ns.described(
                f"PartitionKey:{key} cannot be set to a different value than SessionId:{content.session_id}.",
                target.path))
        if (getattr(target, "partitions", 0) and _deduplicating(target) and content.message_id is None
                and routing_key(content) is None):
            return _dedupe_refusal(ns, target, content)   # nothing to place it by: the same answer
    return None


def _deduplicating(target) -> bool:
    return getattr(target.settings, "duplicate_detection_window_seconds", 0) > 0


def _reference() -> str:
    return f"Reference:{uuid.uuid4()},"


def _dedupe_refusal(ns, target, content: Content) -> BrokerError:
    """The refusal of a partitioned, deduplicating entity: it names the message's keys as the service does
    (the logical partition is the emulator's own number for the key)."""
    key, sid, mid = partition_key(content), content.session_id, content.message_id
    logical = zlib.crc32(str(routing_key(content) or mid or "").encode()) % 256
    return BrokerError(NOT_ALLOWED, ns.described(
        f"{DISTINCT_KEYS_DEDUPE_BATCH}LogicalPartitionId:{logical}::PartitionKey:{key or ''}::SessionId:{sid or ''}"
        f"::MessageId:{'' if mid is None else mid}::ViaPartitionKey::: {_reference()}",
        f"{_kind(target).lower()}:{target.path}"))


def partitioned_batch_refusal(ns, target, contents: List[Content]) -> Optional[BrokerError]:
    """Why a partitioned entity refuses a batch: messages of distinct SessionIds or PartitionKeys (they
    would go to different partitions), or, with duplicate detection, of distinct MessageIds; else None."""
    if not getattr(target, "partitions", 0) or len(contents) < 2:
        return None
    if _deduplicating(target):
        if len({(routing_key(c), c.message_id) for c in contents}) > 1:
            return _dedupe_refusal(ns, target, contents[0])
        return None
    if len({routing_key(c) for c in contents}) > 1:
        return BrokerError(NOT_ALLOWED, ns.described(f"{DISTINCT_KEYS_BATCH} {_reference()}",
                                                     f"{_kind(target).lower()}:{target.path}"))
    return None


def batch_refusal(ns, target, *, count: int, size: int, link_name: str, link_number: int) -> Optional[BrokerError]:
    """Why the service refuses a batch envelope of ``count`` messages and ``size`` bytes (already within
    the entity's message size), or None."""
    if count > ns.settings.max_messages_per_batch:
        return BrokerError(INTERNAL_ERROR, ns.described(f"{UNABLE_TO_PROCESS} Reference:{uuid.uuid4()},",
                                                        f"{_kind(target)}:{target.path}"), 500)
    if size > MAX_BATCH_BYTES:
        return LinkRefusal(NOT_ALLOWED, f"The link '{link_name}' is force detached by the broker because "
                                        f"publisher(link{link_number}) received a batch message with no data in it. "
                                        f"Detach origin: Publisher.")
    return None


def status_refusal(ns, target, *, send: bool) -> Optional[BrokerError]:
    """Why ``target``'s status refuses a send (``send``) or a receive, peek or settlement, or None."""
    if send:
        if target.status.sends:
            return None
        return BrokerError(ENTITY_DISABLED, ns.described(
            f"Messaging entity '{ns.name}:{_kind(target)}:{target.path}' is currently disabled for Send operations.",
            target.path))
    if isinstance(target, Topic) or receive_status(target).receives:
        return None
    return BrokerError(ENTITY_DISABLED, ns.described(
        f"Messaging entity 'sb://{ns.host}:{ns.port}/{target.path}' is currently disabled. For more information "
        f"please see https://aka.ms/ServiceBusExceptions .", target.path))
