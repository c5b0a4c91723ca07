"""All Service Bus I/O of the syphon: clients, raw peeks, sends, settlement, probes, discovery.

Everything that touches the ``azure-servicebus`` SDK lives here, so the rest of the library is
pure logic or Delta I/O. Invariants kept by the callers of this module, and made possible here:
- send before settle: nothing in this module completes a backlog message it has not been told
  was delivered (``purge_backlog``);
- raw bytes in, raw bytes out: backlog messages are peeked as the bytes the broker stored (the
  SDK's decoded messages lose AMQP types) and restored messages are sent as bytes, so every AMQP
  type and every body kind arrives as it was sent; nothing here decodes a backlog message with the
  SDK's decoder except the purge's receive, which only needs sequence numbers and lock tokens;
- connection strings never appear in an exception or log line raised from here.

Private SDK details used, all pinned by azure-servicebus==7.15.0 and covered by tests: the
management request behind ``peek_messages`` (to get the stored bytes), the batch envelope
(``add_encoded``: restored messages are sent as the bytes the codec built, since the SDK's own
encoder cannot express every AMQP body), the receive link's credit and buffer (``revoke_credit``),
and the decoder's constructor table (``sdk_decoder_patch``: the purge receives through the SDK,
which otherwise cannot decode a message holding an AMQP char or decimal32/64).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import queue as queue_module
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from azure.servicebus import ServiceBusClient, ServiceBusMessageBatch, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus._common.constants import (
    _BATCH_MESSAGE_OVERHEAD_COST,
    MGMT_REQUEST_FROM_SEQUENCE_NUMBER,
    MGMT_REQUEST_MAX_MESSAGE_COUNT,
    REQUEST_RESPONSE_PEEK_OPERATION,
)
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
)

from backlog_syphon import sdk_decoder_patch
from backlog_syphon.amqp_codec import sequence_number
from backlog_syphon.config import NamespaceConfig
from backlog_syphon.delivery import Outgoing, PartialSendError, SendFailure
from backlog_syphon.model import ReasonCode
from backlog_syphon.purge_plan import PurgePlan, PurgeProgress, PurgeResult

logger = logging.getLogger(__name__)

sdk_decoder_patch.install()

PEEK_PAGE_SIZE = 250  # messages per management peek; the service caps a response's size anyway
LAST_SEQUENCE_NUMBER = (1 << 63) - 1


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
    """A PEEK_LOCK receiver without prefetch on ``queue`` from the process pool, one per purpose.

    ``peek`` receivers only peek (the management link; their receive link never gets credit, so
    they lock nothing); ``settle`` receivers receive and settle for the purge.
    """
    key = ("receiver", purpose, queue)
    receiver = _receiver(namespace, queue, purpose)
    try:
        yield receiver
    except BaseException:
        _POOL.discard(namespace, "secondary", key)
        raise


def _receiver(namespace: NamespaceConfig, queue: str, purpose: str):
    return _POOL.get(namespace, "secondary", ("receiver", purpose, queue), lambda client: client.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0))


def open_peek_receivers(namespace: NamespaceConfig, queues: Iterable[str]) -> None:
    """Open the pooled peek receivers of ``queues`` at once (see ``open_in_parallel``)."""
    open_in_parallel(_receiver(namespace, queue, "peek") for queue in queues)


def open_in_parallel(handlers: Iterable) -> None:
    """Open SDK senders or receivers concurrently instead of one after the other.

    Each opens its own connection: a few round trips plus the SDK's polling (50 ms a step), about
    half a second each. A failure is left for the first real operation on the handler to report.
    """
    from concurrent.futures import ThreadPoolExecutor

    def open_one(handler) -> None:
        try:
            handler._open_with_retry()  # noqa: SLF001 - opening is what the first operation would do
        except Exception:  # noqa: BLE001 - reported by the operation that needs the handler
            logger.debug("opening a Service Bus link in advance failed", exc_info=True)

    handlers = list(handlers)
    if len(handlers) > 1:
        with ThreadPoolExecutor(max_workers=min(8, len(handlers)), thread_name_prefix="open-link") as pool:
            list(pool.map(open_one, handlers))


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


def first_sequence_number_from(receiver, from_sequence_number: int) -> int | None:
    """Sequence number of the first message at or after ``from_sequence_number``, or None (one cheap peek)."""
    page = peek_raw(receiver, max(1, from_sequence_number), 1)
    return sequence_number(page[0]) if page else None


def peek_sequence_numbers(receiver, first: int, last: int) -> list[int]:
    """Sequence numbers in ``[first, last]`` still in the entity, in order (peeked: nothing is locked)."""
    present: list[int] = []
    position = first
    while position <= last:
        page = [sequence_number(raw) for raw in peek_raw(receiver, position, min(PEEK_PAGE_SIZE, last - position + 1))]
        if not page:
            break
        present += [seq for seq in page if seq <= last]
        position = page[-1] + 1
    return present


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
    """``delivery.Sender`` on the primary namespace: senders per destination from the process pool."""

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
        return _POOL.get(self._namespace, "primary", ("sender", destination),
                         lambda client: client.get_queue_sender(destination))

    def reset(self, destination: str) -> None:
        """Drop a sender after an error so the next attempt opens a fresh link."""
        _POOL.discard(self._namespace, "primary", ("sender", destination))

    def wait_until_reachable(self, destination: str, max_wait_seconds: float) -> bool:
        return wait_until_reachable(self._namespace, destination, max_wait_seconds=max_wait_seconds)


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


# --- pre-flight -------------------------------------------------------------------------------

PREFLIGHT_TIMEOUT_SECONDS = 20.0
PREFLIGHT_PROBE_ENTITY = "backlog-syphon-preflight"  # a sender attach to it proves auth even when absent


class PreflightError(RuntimeError):
    """A namespace cannot be used as configured; the message is one line naming the setting to fix."""


def preflight(config, *, timeout_seconds: float = PREFLIGHT_TIMEOUT_SECONDS) -> None:
    """Check both namespaces before the stream starts; raise ``PreflightError`` with what to fix.

    Authenticates to the secondary namespace and peeks one message of a backlog queue (a peek locks
    nothing), then authenticates to the primary namespace and attaches a sender link to a destination
    (the first backlog message's, when there is one), without sending. Nothing is sent, locked or
    settled. Bounded in time: a namespace that does not answer is reported, not waited for.
    """
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    from backlog_syphon.legacy_properties import backlog_queue_name

    queue_name = backlog_queue_name(config.primary.namespace, 0)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
    stage = ["secondary"]

    def check() -> None:
        destination = _preflight_secondary(config.secondary, queue_name)
        stage[0] = "primary"
        _preflight_primary(config.primary, destination or PREFLIGHT_PROBE_ENTITY)

    try:
        pool.submit(check).result(timeout=timeout_seconds)
    except FutureTimeout:
        namespace = getattr(config, stage[0])
        raise PreflightError(
            f"the {stage[0]} namespace ({namespace.endpoint}) did not answer within {timeout_seconds:.0f} s: check the "
            f"Endpoint in {_setting(namespace, stage[0])} and that this machine can reach it (AMQP, TCP port "
            f"5671)") from None
    finally:
        pool.shutdown(wait=False)


def _setting(namespace: NamespaceConfig, role: str) -> str:
    return f"{role}.connection_string" if namespace.connection_string is not None else \
        f"{role}.fully_qualified_namespace"


def _preflight_failure(exc: BaseException, namespace: NamespaceConfig, role: str, entity: str, right: str
                       ) -> PreflightError:
    setting = _setting(namespace, role)
    where = f"the {role} namespace ({namespace.endpoint})"
    name = type(exc).__name__
    if isinstance(exc, ServiceBusAuthenticationError):
        return PreflightError(f"{where} refused the credentials ({name}): check SharedAccessKeyName and "
                              f"SharedAccessKey in {setting}")
    if isinstance(exc, ServiceBusAuthorizationError):
        return PreflightError(f"{where} does not allow '{right}' on '{entity}' ({name}): give the key in "
                              f"{setting} the {right} right")
    if isinstance(exc, MessagingEntityNotFoundError):
        return PreflightError(f"{where} has no queue '{entity}' ({name}): check primary.namespace (the backlog "
                              f"queues are <primary.namespace>/x-servicebus-transfer/<N>) and {setting}")
    if isinstance(exc, ServiceBusAccessError):
        return PreflightError(str(exc))
    return PreflightError(f"cannot reach {where} ({name}): check the Endpoint in {setting} and that this "
                          f"machine can reach it")


def _preflight_secondary(namespace: NamespaceConfig, queue_name: str) -> str | None:
    """Authenticate and peek one message; return its destination (x-ms-path) if it has a readable one."""
    from backlog_syphon.amqp_message import decode_message
    from backlog_syphon.legacy_properties import decode_legacy_properties

    try:
        with open_client(namespace, role="secondary", retry_total=0) as client:
            with client.get_queue_receiver(queue_name) as receiver:
                page = peek_raw(receiver, 1, 1)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one plain line
        logger.debug("pre-flight of the secondary namespace failed", exc_info=True)
        raise _preflight_failure(exc, namespace, "secondary", queue_name, "Listen") from None
    if not page:
        return None
    try:
        return decode_legacy_properties(decode_message(page[0]).application_properties).destination
    except ValueError:
        return None  # a message the run will dead-letter; it says nothing about access


def _preflight_primary(namespace: NamespaceConfig, destination: str) -> None:
    try:
        with open_client(namespace, role="primary", retry_total=0) as client:
            with client.get_queue_sender(destination) as sender:
                sender._open()  # noqa: SLF001 - attaching the link is the check; nothing is sent
    except MessagingEntityNotFoundError:
        return  # authenticated; a missing destination is that destination's messages' problem
    except Exception as exc:  # noqa: BLE001 - every failure becomes one plain line
        logger.debug("pre-flight of the primary namespace failed", exc_info=True)
        raise _preflight_failure(exc, namespace, "primary", destination, "Send") from None


# --- settling backlog messages ----------------------------------------------------------------

def purge_backlog(namespace: NamespaceConfig, plan: PurgePlan, *, max_wait_seconds: float = 5.0) -> PurgeResult:
    """Settle what ``plan`` says in one backlog queue: complete or dead-letter recorded messages only.

    The decisions are ``purge_plan.PurgeProgress``'s; this receives (PeekLock, exactly as many as are
    planned), settles, and makes sure no receive credit stays open, so nothing that is not recorded is
    locked between calls (see ``revoke_credit``). Anything received outside the plan is released,
    which does not raise its delivery count.
    """
    with pooled_receiver(namespace, plan.queue, purpose="settle") as receiver:
        if plan.verify and plan.expected:
            present = len(peek_sequence_numbers(receiver, plan.first, plan.through))
            plan = dataclasses.replace(plan, expected=min(plan.expected, present))
        progress = PurgeProgress(plan)
        revoke_credit(receiver)  # the link's attach gave the broker one credit of its own
        while credit := progress.credit():
            page = receiver.receive_messages(max_message_count=credit, max_wait_time=max_wait_seconds)
            revoke_credit(receiver)  # a call that returns early leaves the rest of its credit open
            by_seq = {message.sequence_number: message for message in page}
            actions = progress.on_page(sorted(by_seq))
            for seq in actions.release:
                release_message(receiver, by_seq[seq])
            for seq, reason_code, reason in actions.dead_letter:
                receiver.dead_letter_message(by_seq[seq], reason=reason_code, error_description=reason[:1024])
            failed = complete_all(receiver, [by_seq[seq] for seq in actions.complete])
            progress.on_settled(len(actions.complete) - len(failed), len(actions.dead_letter))
            if actions.release:
                logger.warning("backlog=%s purge received sequence numbers %s outside its plan [%d, %d]; released "
                               "them untouched", plan.queue, list(actions.release), plan.first, plan.through)
        # Whatever could not be settled (lock lost, not there yet) is still there: look, don't count.
        # The peek is also the barrier behind any transfer still on its way (see revoke_credit).
        first_still_there = first_sequence_number_from(receiver, plan.first)
        release_buffered(receiver)
        return progress.result(first_still_there)


def revoke_credit(receiver) -> None:
    """Take back the receive credit the SDK leaves open, and release what it brought in.

    azure-servicebus 7.15.0 leaves the unused credit of a receive call that returns early open, and
    grants one credit more whenever a call uses up its credit before its batch is full; messages
    that arrive on such credit are locked. This sets the credit to 0 (a drain) and releases what is
    buffered (no delivery count). Transfers the broker sent before it saw the drain can still be on
    their way: a later call on the same connection reads them first (the next receive call counts
    them against its credit; the purge's closing peek is answered only after them, and the SDK
    releases what arrives outside a receive call).
    """
    handler = getattr(receiver, "_handler", None)
    link = getattr(handler, "_link", None)
    if link is None or getattr(link, "_is_closed", True):
        return
    if link.current_link_credit > 0:
        link.flow(link_credit=0, drain=True)
    release_buffered(receiver)


def release_buffered(receiver) -> None:
    """Release every message the SDK holds in its buffer (received outside, or beyond, a receive call)."""
    handler = receiver._handler  # noqa: SLF001
    while True:
        try:
            frame, _ = handler._received_messages.get_nowait()  # noqa: SLF001
        except queue_module.Empty:
            return
        handler.settle_messages(frame[1], frame[2], "released")
        handler._received_messages.task_done()  # noqa: SLF001


def release_message(receiver, message) -> None:
    """Give a received message back without settling it: unlike abandon, its delivery count stays."""
    receiver._handler.settle_messages(message._delivery_id, message._delivery_tag, "released")  # noqa: SLF001


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


def peek_counts(namespace: NamespaceConfig, queues: Iterable[str]) -> dict[str, int]:
    """Messages still in each queue, by peeking the queues in parallel (for run summaries)."""
    from concurrent.futures import ThreadPoolExecutor

    queues = list(queues)

    def count(queue: str) -> int:
        with pooled_receiver(namespace, queue) as receiver:
            return len(peek_sequence_numbers(receiver, 1, LAST_SEQUENCE_NUMBER))

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(queues))), thread_name_prefix="peek-count") as pool:
        return dict(zip(queues, pool.map(count, queues)))
