"""All Service Bus I/O of the syphon: clients, raw peeks, sends, settlement, probes, discovery.

Everything that touches the ``azure-servicebus`` SDK lives here, so the rest of the library is
pure logic or Delta I/O. Invariants kept by the callers of this module, and made possible here:
- send before settle: nothing in this module completes a backlog message it has not been told
  was delivered (``purge_backlog``);
- raw bytes in, typed values out: backlog messages are peeked as the raw AMQP bytes the broker
  stored (the SDK's decoded messages lose AMQP types), and re-sent with explicit AMQP types;
- connection strings never appear in an exception or log line raised from here.

Two private SDK details are used, both pinned by azure-servicebus==7.15.0 and covered by tests:
the management request behind ``peek_messages`` (to get the stored bytes), and the typed-value
form ``{TYPE: AMQPTypes.x, VALUE: v}`` of its AMQP encoder.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import proton
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus._common.constants import (
    MGMT_REQUEST_FROM_SEQUENCE_NUMBER,
    MGMT_REQUEST_MAX_MESSAGE_COUNT,
    REQUEST_RESPONSE_PEEK_OPERATION,
)
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageHeader, AmqpMessageProperties
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
)

from backlog_syphon.config import NamespaceConfig

logger = logging.getLogger(__name__)

PEEK_PAGE_SIZE = 250  # messages per management peek; the service caps a response's size anyway


class ServiceBusAccessError(RuntimeError):
    """A namespace cannot be used as configured (auth, bad endpoint, missing entity): operator action needed."""


# --- clients ----------------------------------------------------------------------------------

def open_client(namespace: NamespaceConfig, *, retry_total: int = 3, role: str = "namespace") -> ServiceBusClient:
    """A ServiceBusClient for a namespace config; the caller closes it (``with``)."""
    if namespace.connection_string is not None:
        try:
            return ServiceBusClient.from_connection_string(
                namespace.connection_string.reveal(), retry_total=retry_total, retry_backoff_factor=0.5,
                retry_backoff_max=10)
        except (ValueError, TypeError) as exc:
            # The SDK's message can quote the string it failed to parse: never pass it on.
            raise ServiceBusAccessError(
                f"the {role} connection string (from {namespace.connection_string.source}) is not valid: "
                f"{type(exc).__name__}; check Endpoint, SharedAccessKeyName and SharedAccessKey") from None
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ServiceBusAccessError(
            f"the {role} namespace uses Azure AD (fully_qualified_namespace) but azure-identity is not "
            f"installed: pip install 'backlog-syphon[azure-ad]'") from None
    return ServiceBusClient(namespace.fully_qualified_namespace, DefaultAzureCredential(),
                            retry_total=retry_total)


class _HandlerPool:
    """Senders and receivers kept open per process (executor Python worker or driver) and reused.

    Each SDK sender or receiver opens its own AMQP connection; opening and closing one costs about
    a second, which dominated small batches. Like Spark's Kafka connector, the syphon pools them:
    a handler that fails is discarded and reopened on next use.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._clients: dict[tuple, ServiceBusClient] = {}
        self._handlers: dict[tuple, Any] = {}

    @staticmethod
    def _namespace_key(namespace: NamespaceConfig, role: str) -> tuple:
        secret = namespace.connection_string.reveal() if namespace.connection_string else ""
        return role, namespace.fully_qualified_namespace, hashlib.sha256(secret.encode()).hexdigest()

    def get(self, namespace: NamespaceConfig, role: str, key: tuple, make: Callable[[ServiceBusClient], Any]):
        client_key = self._namespace_key(namespace, role)
        with self._lock:
            handler = self._handlers.get((client_key, key))
            if handler is None:
                client = self._clients.get(client_key)
                if client is None:
                    client = self._clients[client_key] = open_client(
                        namespace, role=role, retry_total=2 if role == "primary" else 3)
                handler = self._handlers[(client_key, key)] = make(client)
            return handler

    def discard(self, namespace: NamespaceConfig, role: str, key: tuple) -> None:
        with self._lock:
            handler = self._handlers.pop((self._namespace_key(namespace, role), key), None)
        if handler is not None:
            try:
                handler.close()
            except Exception:  # noqa: BLE001 - closing a broken link may fail; nothing to keep
                pass


_POOL = _HandlerPool()


@contextmanager
def pooled_receiver(namespace: NamespaceConfig, queue: str, *, purpose: str = "peek"):
    """A receiver on ``queue`` from the process pool (peek: default mode; settle: PEEK_LOCK, no prefetch)."""
    key = ("receiver", purpose, queue)
    receiver = _POOL.get(namespace, "secondary", key, lambda client: client.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0))
    try:
        yield receiver
    except BaseException:
        _POOL.discard(namespace, "secondary", key)
        raise


# --- peeking backlog queues -------------------------------------------------------------------

def peek_raw(receiver, from_sequence_number: int, max_count: int, timeout: float | None = None) -> list[bytes]:
    """The stored bytes of up to ``max_count`` messages with sequence number >= the given one.

    Uses the same management request as ``receiver.peek_messages`` but keeps each message's raw
    encoding, so AMQP types (long vs int, described timespans, symbols) survive untouched.
    """
    request = {
        MGMT_REQUEST_FROM_SEQUENCE_NUMBER: {TYPE: AMQPTypes.long, VALUE: int(from_sequence_number)},
        MGMT_REQUEST_MAX_MESSAGE_COUNT: int(max_count),
    }

    def keep_raw(status_code, message, description, **_):
        if status_code == 200:
            return [bytes(m[b"message"]) for m in (message.value or {}).get(b"messages", [])]
        if status_code in (202, 204):
            return []
        condition = message.application_properties.get(b"errorCondition")
        receiver._amqp_transport.handle_amqp_mgmt_error(  # raises the SDK's mapped exception
            logger, "Message peek failed.", condition, description, status_code)
        return []

    receiver._check_live()  # noqa: SLF001 - see module docstring
    return receiver._mgmt_request_response_with_retry(  # noqa: SLF001
        REQUEST_RESPONSE_PEEK_OPERATION, request, keep_raw, timeout=timeout)


def first_sequence_number_from(receiver, sequence_number: int) -> int | None:
    """Sequence number of the first message at or after ``sequence_number``, or None (one cheap peek)."""
    peeked = receiver.peek_messages(max_message_count=1, sequence_number=max(1, sequence_number))
    return peeked[0].sequence_number if peeked else None


def list_backlog_queues(namespace: NamespaceConfig, prefix: str) -> list[str] | None:
    """Every queue whose name starts with ``prefix``, via the administration API; None if unreachable.

    The local emulator (and a connection string without Manage rights) has no administration
    endpoint; the caller then falls back to ``0..queue_count-1``.
    """
    try:
        from azure.servicebus.management import ServiceBusAdministrationClient
        if namespace.connection_string is not None:
            if "UseDevelopmentEmulator=true" in namespace.connection_string.reveal():
                return None  # the administration client always uses https; the emulator has none
            admin = ServiceBusAdministrationClient.from_connection_string(namespace.connection_string.reveal())
        else:
            from azure.identity import DefaultAzureCredential
            admin = ServiceBusAdministrationClient(namespace.fully_qualified_namespace, DefaultAzureCredential())
        with admin:
            return sorted(q.name for q in admin.list_queues() if q.name.lower().startswith(prefix.lower()))
    except Exception as exc:  # noqa: BLE001 - discovery is best effort by design
        logger.info("backlog queue discovery unavailable (%s); using the configured queue count", type(exc).__name__)
        return None


# --- sending restored messages ----------------------------------------------------------------

# proton's decoded AMQP types -> (the SDK encoder's type name, how to turn the value into what it wants).
# AMQP char and decimal have no SDK encoder; they do not occur in Service Bus properties.
_PROTON_TYPES: dict[type, tuple[str, Callable[[Any], Any]]] = {
    proton.int32: (AMQPTypes.int, int), proton.short: (AMQPTypes.short, int), proton.byte: (AMQPTypes.byte, int),
    proton.ulong: (AMQPTypes.ulong, int), proton.uint: (AMQPTypes.uint, int), proton.ushort: (AMQPTypes.ushort, int),
    proton.ubyte: (AMQPTypes.ubyte, int), proton.float32: (AMQPTypes.float, float),
    proton.symbol: (AMQPTypes.symbol, lambda v: str(v).encode()), proton.timestamp: (AMQPTypes.timestamp, int),
    bool: (AMQPTypes.boolean, bool), int: (AMQPTypes.long, int),  # proton decodes AMQP long as plain int
    float: (AMQPTypes.double, float), str: (AMQPTypes.string, str), bytes: (AMQPTypes.binary, bytes),
    uuid.UUID: (AMQPTypes.uuid, lambda v: v),
}


def typed_value(value: Any) -> Any:
    """A proton-decoded AMQP value in the SDK encoder's explicit form, so its AMQP type is kept."""
    if value is None:
        return None
    if isinstance(value, proton.Described):
        return (typed_value(value.descriptor), typed_value(value.value))
    if isinstance(value, list):
        return {TYPE: AMQPTypes.list, VALUE: [typed_value(v) for v in value]}
    if isinstance(value, dict):
        return {TYPE: AMQPTypes.map, VALUE: {typed_value(k): typed_value(v) for k, v in value.items()}}
    if isinstance(value, dt.datetime):
        return {TYPE: AMQPTypes.timestamp, VALUE: value}
    amqp_type, convert = _PROTON_TYPES.get(type(value), (None, None))
    if amqp_type is None:
        raise TypeError(f"cannot forward an AMQP value of type {type(value).__name__}")
    return {TYPE: amqp_type, VALUE: convert(value)}


def _plain(value: Any) -> Any:
    """Message ids and the like: the SDK wants plain str/bytes/uuid/int there."""
    if value is None or isinstance(value, (str, bytes, uuid.UUID)):
        return str(value) if isinstance(value, proton.symbol) else value
    return int(value) if isinstance(value, int) else value


def to_sdk_message(message) -> AmqpAnnotatedMessage:
    """An outgoing SDK message from a restored ``amqp_message.DecodedMessage``, types preserved."""
    body_kwargs: dict[str, Any]
    if message.body_kind == "data":
        body_kwargs = {"data_body": list(message.body)}
    elif message.body_kind == "sequence":
        body_kwargs = {"sequence_body": [typed_value(section) for section in message.body]}
    else:
        body_kwargs = {"value_body": typed_value(message.body)}
    header = message.header
    props = message.properties
    return AmqpAnnotatedMessage(
        header=AmqpMessageHeader(durable=header.durable, priority=header.priority,
                                 time_to_live=header.ttl_ms, first_acquirer=header.first_acquirer),
        properties=AmqpMessageProperties(
            message_id=_plain(props.message_id), user_id=props.user_id, to=props.to, subject=props.subject,
            reply_to=props.reply_to, correlation_id=_plain(props.correlation_id), content_type=props.content_type,
            content_encoding=props.content_encoding, group_id=props.group_id, group_sequence=props.group_sequence,
            reply_to_group_id=props.reply_to_group_id,
            absolute_expiry_time=None, creation_time=props.creation_time),
        application_properties={k: typed_value(v) for k, v in message.application_properties.items()},
        annotations={k: typed_value(v) for k, v in message.message_annotations.items()},
        **body_kwargs,
    )


@dataclass(frozen=True)
class SendFailure:
    transient: bool
    reason_code: str
    reason: str


def classify_send_error(exc: BaseException, destination: str) -> SendFailure:
    """Transient (retry, then wait for the primary) or final for these messages (dead-letter)."""
    name = type(exc).__name__
    if isinstance(exc, MessagingEntityNotFoundError):
        return SendFailure(False, "destination_not_found", f"destination '{destination}' does not exist in the primary namespace ({name})")
    if isinstance(exc, MessageSizeExceededError):
        return SendFailure(False, "message_too_large", f"the restored message is larger than '{destination}' accepts ({name})")
    if isinstance(exc, ServiceBusAuthorizationError):
        return SendFailure(False, "unauthorized", f"not authorized to send to '{destination}' ({name})")
    if isinstance(exc, MessagingEntityDisabledError):
        # A disabled entity is an operator's temporary choice: wait rather than dead-letter.
        return SendFailure(True, "destination_disabled", f"destination '{destination}' is disabled ({name})")
    if isinstance(exc, (ServiceBusServerBusyError, ServiceBusQuotaExceededError, OperationTimeoutError,
                        ServiceBusConnectionError)):
        return SendFailure(True, "transient", f"{name} while sending to '{destination}'")
    if isinstance(exc, ServiceBusAuthenticationError):
        return SendFailure(True, "authentication_failed", f"authentication failed for the primary namespace ({name})")
    if isinstance(exc, ServiceBusError):
        return SendFailure(True, "transient", f"{name} while sending to '{destination}'")
    return SendFailure(True, "transient", f"{name} while sending to '{destination}'")


def send_in_batches(sender, messages: Iterable) -> Iterator[int]:
    """Send messages in order, as few ``ServiceBusMessageBatch`` sends as fit; yield each one's size once sent."""
    batch = sender.create_message_batch()
    for message in messages:
        try:
            batch.add_message(message)
        except MessageSizeExceededError:
            if not len(batch):
                raise  # too large on its own
            sender.send_messages(batch)  # batch full: ship it and start the next one
            yield len(batch)
            batch = sender.create_message_batch()
            batch.add_message(message)
    if len(batch):
        sender.send_messages(batch)
        yield len(batch)


class PartialSendError(Exception):
    def __init__(self, sent: int, cause: BaseException):
        super().__init__(f"{sent} sent before {type(cause).__name__}")
        self.sent = sent
        self.cause = cause


class DestinationSenders:
    """Senders per destination for one task, taken from the process pool (kept open between tasks)."""

    def __init__(self, namespace: NamespaceConfig):
        self._namespace = namespace

    def send(self, destination: str, messages: Sequence[AmqpAnnotatedMessage]) -> int:
        """Send consecutive messages to one destination in as few batches as fit, in order.

        Returns how many were sent (all of them); raises ``PartialSendError`` saying how many went
        before the first failure, so the caller resumes exactly there.
        """
        sent = 0
        try:
            sender = _POOL.get(self._namespace, "primary", ("sender", destination),
                               lambda client: client.get_queue_sender(destination))
            for count in send_in_batches(sender, messages):
                sent += count
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            raise PartialSendError(sent, exc) from exc
        return sent

    def reset(self, destination: str) -> None:
        """Drop a sender after an error so the next attempt opens a fresh link."""
        _POOL.discard(self._namespace, "primary", ("sender", destination))


@dataclass(frozen=True)
class DestinationCheck:
    max_message_size: int | None  # what the destination's link accepts; None when it cannot be used
    failure: SendFailure | None


def check_destinations(namespace: NamespaceConfig, destinations: Iterable[str]) -> dict[str, DestinationCheck]:
    """Attach a sender to each destination without sending anything (for the dry run).

    Attaching is what fails for a missing entity or a missing Send right, and the attached link
    tells the largest message the destination takes.
    """
    checks = {}
    with open_client(namespace, role="primary", retry_total=0) as client:
        for destination in sorted(set(destinations)):
            try:
                with client.get_queue_sender(destination) as sender:
                    checks[destination] = DestinationCheck(sender.create_message_batch().max_size_in_bytes, None)
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the dry run changes nothing
                checks[destination] = DestinationCheck(None, classify_send_error(exc, destination))
    return checks


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


# --- settling backlog messages ----------------------------------------------------------------

@dataclass(frozen=True)
class PurgeResult:
    completed: int
    dead_lettered: int
    released: int
    settled_through: int | None  # every planned message up to this sequence number is settled


def purge_backlog(namespace: NamespaceConfig, queue: str, plan: dict[int, tuple[str, str, str] | None],
                  *, max_wait_seconds: float = 5.0) -> PurgeResult:
    """Settle the planned messages of one backlog queue: complete (plan value None) or dead-letter.

    ``plan`` maps sequence number -> None (delivered or skipped: complete it) or
    (reason_code, reason, _) (dead-letter it with that reason). Messages not in the plan are
    released untouched (abandoned). Stops once every planned message was seen, a message past the
    plan shows up, or the queue runs dry.
    """
    if not plan:
        return PurgeResult(0, 0, 0, None)
    remaining = set(plan)
    highest = max(plan)
    completed = dead_lettered = 0
    unsettled: set[int] = set()  # seen but could not be settled (lock lost): found again by a later purge
    held: list = []
    with pooled_receiver(namespace, queue, purpose="settle") as receiver:
        while remaining:
            # Exactly as many as still planned: the queue's head is this plan (FIFO), so asking
            # for more would only lock, and then release, messages of a later batch.
            batch = receiver.receive_messages(max_message_count=min(len(remaining), 100),
                                              max_wait_time=max_wait_seconds)
            if not batch:
                break
            past_plan = False
            to_complete = []
            for message in batch:
                seq = message.sequence_number
                if seq in remaining:
                    action = plan[seq]
                    if action is None:
                        to_complete.append(message)
                    else:
                        receiver.dead_letter_message(message, reason=action[0], error_description=action[1][:1024])
                        dead_lettered += 1
                    remaining.discard(seq)
                else:
                    # Not ours to settle. Keep it locked until the end, so the next receive
                    # moves past it instead of getting it straight back.
                    held.append(message)
                    past_plan = past_plan or seq > highest
            failed = complete_all(receiver, to_complete)
            completed += len(to_complete) - len(failed)
            unsettled.update(failed)
            if past_plan:
                break
        for message in held:
            receiver.abandon_message(message)
        released = len(held)
        # Planned messages that never showed up may be gone already (settled by a run that
        # crashed before recording it, or expired): a peek tells, so they do not block the mark.
        if remaining:
            remaining &= present_sequence_numbers(receiver, min(remaining), max(remaining))
    left = remaining | unsettled
    settled_through = (min(left) - 1) if left else highest
    return PurgeResult(completed, dead_lettered, released, settled_through)


def present_sequence_numbers(receiver, first: int, last: int) -> set[int]:
    """Sequence numbers in ``[first, last]`` still in the entity (peeked, so nothing is locked)."""
    present: set[int] = set()
    position = first
    while position <= last:
        page = receiver.peek_messages(max_message_count=PEEK_PAGE_SIZE, sequence_number=position)
        if not page:
            break
        present.update(m.sequence_number for m in page if m.sequence_number <= last)
        position = page[-1].sequence_number + 1
    return present


def complete_all(receiver, messages: list) -> set[int]:
    """Complete received messages with one management request instead of one round trip each.

    ``update-disposition`` with a list of lock tokens is the management form of settlement (the
    SDK itself falls back to it); if it fails, each message is completed on its own. Returns the
    sequence numbers that could not be completed (their locks were lost).
    """
    if not messages:
        return set()
    try:
        receiver._settle_message_via_mgmt_link("completed", [m.lock_token for m in messages])  # noqa: SLF001
        return set()
    except ServiceBusError as exc:
        logger.info("bulk completion failed (%s); completing one by one", type(exc).__name__)
    failed = set()
    for message in messages:
        try:
            receiver.complete_message(message)
        except ServiceBusError as exc:
            logger.warning("sequence_number=%s not completed (%s)", message.sequence_number, type(exc).__name__)
            failed.add(message.sequence_number)
    return failed


def backlog_dead_letters(namespace: NamespaceConfig, queue: str, max_count: int = 1000) -> list:
    """Peek a backlog queue's dead-letter sub-queue (for reports and tests)."""
    with open_client(namespace, role="secondary") as client:
        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            return list(receiver.peek_messages(max_message_count=max_count))


def peek_counts(namespace: NamespaceConfig, queues: Iterable[str], max_count: int = 100_000) -> dict[str, int]:
    """Messages still in each queue, by peeking (cheap enough for summaries of local runs)."""
    counts = {}
    with open_client(namespace, role="secondary") as client:
        for queue in queues:
            with client.get_queue_receiver(queue) as receiver:
                total, seq = 0, 1
                while total < max_count:
                    page = receiver.peek_messages(max_message_count=250, sequence_number=seq)
                    if not page:
                        break
                    total += len(page)
                    seq = page[-1].sequence_number + 1
                counts[queue] = total
    return counts


# --- writing legacy backlogs (rehearsals, tests, benchmarks) ------------------------------------

TIMESPAN_DESCRIPTOR = b"com.microsoft:timespan"
_TICKS_PER_MS = 10_000


def legacy_backlog_message(original) -> AmqpAnnotatedMessage:
    """The backlog copy the legacy .NET client made of ``backlog_writer.OriginalMessage``.

    Session id, TTL and schedule move into ``x-ms-*`` properties with the .NET wire encodings
    (string, ``com.microsoft:timespan``-described ticks, AMQP timestamp); the destination goes
    into ``x-ms-path``; the originals are cleared so the copy is visible at once and never expires.
    """
    properties = {key: (value if isinstance(value, (dict, tuple)) else typed_value(value))
                  for key, value in original.application_properties.items()}
    if original.destination is not None:
        properties["x-ms-path"] = original.destination
    if original.session_id is not None:
        properties["x-ms-sessionid"] = original.session_id
    if original.time_to_live is not None:
        ticks = int(original.time_to_live / dt.timedelta(milliseconds=1)) * _TICKS_PER_MS
        properties["x-ms-timetolive"] = ({TYPE: AMQPTypes.symbol, VALUE: TIMESPAN_DESCRIPTOR},
                                         {TYPE: AMQPTypes.long, VALUE: ticks})
    if original.scheduled_enqueue_time is not None:
        properties["x-ms-scheduledenqueuetimeutc"] = {TYPE: AMQPTypes.timestamp,
                                                      VALUE: original.scheduled_enqueue_time}
    properties.update(original.legacy_overrides)
    annotations = {"x-opt-partition-key": original.partition_key} if original.partition_key else None
    return AmqpAnnotatedMessage(
        data_body=original.body,
        properties=AmqpMessageProperties(
            message_id=original.message_id, correlation_id=original.correlation_id, subject=original.subject,
            content_type=original.content_type, reply_to=original.reply_to,
            reply_to_group_id=original.reply_to_session_id, to=original.to),
        application_properties=properties,
        annotations=annotations,
    )


def send_legacy_backlog(secondary: NamespaceConfig, per_queue: dict[str, list]) -> None:
    """Send each queue's originals, in order, as legacy backlog copies (batched)."""
    with open_client(secondary, role="secondary") as client:
        for queue, originals in per_queue.items():
            with client.get_queue_sender(queue) as sender:
                for _ in send_in_batches(sender, (legacy_backlog_message(o) for o in originals)):
                    pass
