"""Reading backlog queues without taking anything: raw peeks, window probes, counts, discovery.

Backlog messages are peeked as the bytes the broker stored (the SDK's decoded messages lose AMQP
types: long vs int, described timespans, symbols), through the same management request as
``receiver.peek_messages`` (``sdk_internals.peek_stored_bytes``). A peek locks nothing, so nothing
here can raise a backlog message's delivery count.

Invariants:
- A page that comes back short is read on from after its last message, and an empty one where more may
  follow is looked at twice (``peek_pages.PagedRead``): no read here ends early on a short or empty page.
- Every peek has a timeout of its own and is asked again when it times out (``PeekTimeouts``): the SDK
  bounds a request and its retries by one timeout, so it never retries a peek that timed out.
- Every peek on a pooled link is paced by the namespace's credits (``throttling``): one credit per message
  it answers, and a busy answer is waited out, never a failed read.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterable

from azure.servicebus.exceptions import MessagingEntityNotFoundError, OperationTimeoutError

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.errors import BacklogQueueMissingError, PeekTimedOutError
from backlog_syphon.restore.amqp.sections import broker_identity
from backlog_syphon.restore.queue_names import is_backlog_queue_name
from backlog_syphon.servicebus.access import discovery_refused, discovery_skipped_line
from backlog_syphon.model import CreditKind
from backlog_syphon.servicebus.clients import each_at_once, namespace_of, pooled_receiver
from backlog_syphon.servicebus.credentials import credential_for
from backlog_syphon.partitions import partition_of
from backlog_syphon.peek_pages import LANE_LOOKS, LOOKS, PEEK_PAGE_SIZE, PagedRead
from backlog_syphon.servicebus.sdk_internals import entity_name, peek_stored_bytes
from backlog_syphon.servicebus.throttling import administration, await_credits, list_pages, paced

logger = logging.getLogger(__name__)

LAST_SEQUENCE_NUMBER = (1 << 63) - 1


@dataclass(frozen=True)
class PeekTimeouts:
    """How long each attempt of a peek may take (``first_seconds``, then ``factor`` times longer each time), and
    how many attempts a peek gets. A peek usually answers in a round trip; one the service does not answer in
    time is asked again rather than failing the read, a task or a plan."""

    first_seconds: float = 10.0
    attempts: int = 3
    factor: float = 2.0

    def each(self) -> list[float]:
        return [self.first_seconds * self.factor ** attempt for attempt in range(max(1, self.attempts))]


PEEK_TIMEOUTS = PeekTimeouts()


def peek_raw(receiver, from_sequence_number: int, max_count: int, *,
             timeouts: PeekTimeouts = PEEK_TIMEOUTS, namespace: NamespaceConfig | None = None) -> list[bytes]:
    """The stored bytes of up to ``max_count`` messages with sequence number >= the given one (see
    ``sdk_internals.peek_stored_bytes``): AMQP types survive untouched; [] when the service says there is
    none (the caller decides whether to look again). ``BacklogQueueMissingError`` when the queue does not
    exist; ``PeekTimedOutError`` when every attempt timed out. Paced by the credits of ``namespace`` (by
    default the pooled receiver's), whose busy answers are waited out (``throttling.paced``)."""
    namespace = namespace or namespace_of(receiver)
    limits = timeouts.each()
    for attempt, timeout in enumerate(limits, 1):
        def peek() -> list[bytes]:
            return peek_stored_bytes(receiver, from_sequence_number, max_count, timeout)  # noqa: B023 - called now

        try:
            if namespace is None:  # a receiver of the caller's own (a test's): not paced
                return peek()
            return paced(namespace, CreditKind.PEEK, peek, cost=lambda page: max(1, len(page)), reserve=max_count)
        except MessagingEntityNotFoundError:
            raise BacklogQueueMissingError(f"queue {entity_name(receiver)} does not exist") from None
        except OperationTimeoutError:
            if attempt == len(limits):
                raise PeekTimedOutError(
                    f"queue {entity_name(receiver)}: a peek from sequence number {from_sequence_number} got no answer "
                    f"in {len(limits)} attempts ({', '.join(f'{limit:g} s' for limit in limits)}); the namespace "
                    f"answers no peeks on it: check the queue's status (a SendDisabled or Disabled queue may "
                    f"refuse them) and the network") from None
            logger.info("queue %s: a peek from sequence number %d timed out after %g s (attempt %d of %d); asked "
                        "again", entity_name(receiver), from_sequence_number, timeout, attempt, len(limits))
    raise AssertionError("unreachable")  # the loop returns or raises


def peek_round_trip(receiver, from_sequence_number: int, *, timeouts: PeekTimeouts = PEEK_TIMEOUTS) -> float | None:
    """Seconds one management request takes on ``receiver``'s link there and back: the second of two peeks of one
    message (their answers unused; the first may open the management link, a few round trips of its own), timed
    after the credits' wait, not through it; None when a peek failed (nothing measured)."""
    namespace = namespace_of(receiver)

    def peek() -> list[bytes]:
        return peek_stored_bytes(receiver, max(1, from_sequence_number), 1, timeouts.each()[0])

    seconds = None
    for _ in range(2):
        try:
            if namespace is None:  # a receiver of the caller's own (a test's): not paced
                began = time.monotonic()
                peek()
            else:
                await_credits(namespace, reserve=1)
                began = time.monotonic()
                paced(namespace, CreditKind.PEEK, peek, cost=lambda page: max(1, len(page)), retry=False, wait=False,
                      reserve=1)
        except Exception:  # noqa: BLE001 - a measurement only: the round's own requests say what is wrong
            logger.debug("a timed peek failed", exc_info=True)
            return None
        seconds = time.monotonic() - began
    return seconds


def first_identity_from(receiver, from_sequence_number: int, *, confirm: bool = False, lane: bool = False
                        ) -> tuple[int, int | None] | None:
    """``(sequence number, enqueue time in ms)`` of the first message at or after ``from_sequence_number``,
    or None when there is none (one cheap peek, nothing locked). ``lane``: in the asked number's partition
    only (an answer from another one is none there). ``confirm``: a message is expected there, so an answer
    that misses is looked at again before it counts (``peek_pages``: ``LOOKS``, ``LANE_LOOKS`` in a lane)."""
    looks = (LANE_LOOKS if lane else LOOKS) if confirm else 1
    for _ in range(looks):
        page = peek_raw(receiver, max(1, from_sequence_number), 1)
        identity = broker_identity(page[0]) if page else None
        if identity is not None and not (lane and partition_of(identity[0]) != partition_of(from_sequence_number)):
            return identity
    return None


def probe_at_once(namespace: NamespaceConfig, asks: dict[str, int]) -> dict[str, object]:
    """``first_identity_from`` in each queue of ``asks`` (queue -> sequence number), in parallel on the queues'
    pooled peek links; a queue that does not exist answers its ``BacklogQueueMissingError``. Other failures
    raise. One round trip of time for any number of queues (``probing.ProbeAtOnce``)."""
    def probe(queue: str):
        try:
            with pooled_receiver(namespace, queue) as receiver:
                return first_identity_from(receiver, asks[queue])
        except BacklogQueueMissingError as missing:
            return missing

    return each_at_once(asks, probe, name="probe")


def peek_identities(receiver, first: int, last: int, *, lane: bool = False) -> list[tuple[int, int | None]]:
    """``(sequence number, enqueue time in ms)`` of the messages in ``[first, last]`` still in the entity,
    in order (peeked: nothing is locked); short pages are read on, an empty one looked at twice (``lane``:
    one partition's range, where an answer from another partition misses too)."""
    present: list[tuple[int, int | None]] = []
    read = PagedRead(max(1, first), last, PEEK_PAGE_SIZE, lane=lane)
    while (ask := read.next_ask()) is not None:
        page = [broker_identity(raw) for raw in peek_raw(receiver, *ask)]
        present += page[:read.on_page([seq for seq, _ in page])]
    return present


def peek_sequence_numbers(receiver, first: int, last: int) -> list[int]:
    """Sequence numbers in ``[first, last]`` still in the entity, in order (peeked: nothing is locked)."""
    return [seq for seq, _ in peek_identities(receiver, first, last)]


# An administration call that does not answer within these seconds is given up (azure-core waits 300 s to
# connect by default): discovery, counts and destination shapes are best effort, and nobody should wait.
ADMINISTRATION_TIMEOUT_SECONDS = 10


def administration_client(namespace: NamespaceConfig):
    """A ``ServiceBusAdministrationClient`` for the namespace's administration API (the caller closes it):
    ``administration_endpoint`` (by default the namespace's host, as on Azure), trusting ``ca_file`` when set,
    through the namespace's HTTP proxy when it has one (HTTPS goes through it as WebSockets do); with the
    connection string's key or token, or with Azure AD."""
    from azure.servicebus.management import ServiceBusAdministrationClient

    options = {"connection_timeout": ADMINISTRATION_TIMEOUT_SECONDS, "read_timeout": 3 * ADMINISTRATION_TIMEOUT_SECONDS,
               "retry_total": 1}
    if namespace.ca_file:
        options["connection_verify"] = namespace.ca_file
    if namespace.proxy_host:
        options["proxies"] = {"https": proxy_url(namespace)}
    if namespace.connection_string is None:
        return ServiceBusAdministrationClient(namespace.administration_host, credential_for(namespace.azure_ad),
                                              **options)
    # The SDK's only public way to a client with a connection string's key: the same string, its Endpoint
    # naming the administration API's host (which, on an emulator, is not the AMQP port).
    return ServiceBusAdministrationClient.from_connection_string(
        namespace.connection_string_with_endpoint(namespace.administration_host), **options)


def proxy_url(namespace: NamespaceConfig) -> str:
    """``http://[user:password@]host:port`` of the namespace's HTTP proxy, for azure-core (revealed: for a
    client only, never to print)."""
    from urllib.parse import quote

    credentials = ""
    if namespace.proxy_user is not None:
        credentials = f"{quote(namespace.proxy_user, safe='')}:{quote(namespace.proxy_password.reveal(), safe='')}@"
    return f"http://{credentials}{namespace.proxy_host}:{namespace.proxy_port}"


_DISCOVERY_REFUSAL_TOLD = []  # the warning that discovery is not granted is given once per process


def list_backlog_queues(namespace: NamespaceConfig, primary_namespace: str) -> list[str] | None:
    """Every backlog queue of ``primary_namespace``, via the administration API; None if unavailable.

    Listing queues needs Manage (Azure Service Bus Data Owner), which a least-privilege identity lacks: the
    caller then reads ``0..queue_count-1``. A refusal is said once, as a warning (``access.discovery_skipped_line``).
    """
    def read() -> list:
        with administration_client(namespace) as admin:
            return list(admin.list_queues())

    try:
        return sorted(q.name for q in administration(namespace, read, requests=list_pages)
                      if is_backlog_queue_name(q.name, primary_namespace))
    except Exception as exc:  # noqa: BLE001 - discovery is best effort by design
        if discovery_refused(getattr(exc, "status_code", None)) and not _DISCOVERY_REFUSAL_TOLD:
            _DISCOVERY_REFUSAL_TOLD.append(True)
            logger.warning(discovery_skipped_line(namespace, "secondary"))
        else:
            logger.info("backlog queue discovery unavailable (%s); using the configured queue count",
                        type(exc).__name__)
        return None


def peek_counts(namespace: NamespaceConfig, queues: Iterable[str]) -> dict[str, int]:
    """Messages still in each queue, by peeking the queues in parallel (for run summaries)."""
    queues = list(queues)

    def count(queue: str) -> int:
        try:
            with pooled_receiver(namespace, queue) as receiver:
                return len(peek_sequence_numbers(receiver, 1, LAST_SEQUENCE_NUMBER))
        except BacklogQueueMissingError:
            return 0  # a queue that does not exist holds nothing

    return each_at_once(queues, count, name="peek-count")

