"""Reading backlog queues without taking anything: raw peeks, window probes, counts, discovery.

Backlog messages are peeked as the bytes the broker stored (the SDK's decoded messages lose AMQP
types: long vs int, described timespans, symbols), through the same management request as
``receiver.peek_messages`` (``sdk_internals.peek_stored_bytes``). A peek locks nothing, so nothing
here can raise a backlog message's delivery count.
"""

from __future__ import annotations

import logging
from typing import Iterable

from azure.servicebus.exceptions import MessagingEntityNotFoundError

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.restore.amqp_codec import broker_identity
from backlog_syphon.restore.queue_names import is_backlog_queue_name
from backlog_syphon.servicebus.access import discovery_refused, discovery_skipped_line
from backlog_syphon.servicebus.clients import each_at_once, pooled_receiver
from backlog_syphon.servicebus.credentials import credential_for
from backlog_syphon.servicebus.sdk_internals import entity_name, peek_stored_bytes

logger = logging.getLogger(__name__)

PEEK_PAGE_SIZE = 250  # messages per management peek; the service caps a response's size anyway
LAST_SEQUENCE_NUMBER = (1 << 63) - 1


def peek_raw(receiver, from_sequence_number: int, max_count: int, timeout: float | None = None) -> list[bytes]:
    """The stored bytes of up to ``max_count`` messages with sequence number >= the given one (see
    ``sdk_internals.peek_stored_bytes``): AMQP types survive untouched. ``BacklogQueueMissingError``
    when the queue does not exist."""
    try:
        return peek_stored_bytes(receiver, from_sequence_number, max_count, timeout)
    except MessagingEntityNotFoundError:
        raise BacklogQueueMissingError(f"queue {entity_name(receiver)} does not exist") from None


def first_identity_from(receiver, from_sequence_number: int) -> tuple[int, int | None] | None:
    """``(sequence number, enqueue time in ms)`` of the first message at or after ``from_sequence_number``,
    or None when there is none (one cheap peek, nothing locked)."""
    page = peek_raw(receiver, max(1, from_sequence_number), 1)
    return broker_identity(page[0]) if page else None


def probe_at_once(namespace: NamespaceConfig, asks: dict[str, int]) -> dict[str, object]:
    """``first_identity_from`` in each queue of ``asks`` (queue -> sequence number), in parallel on the queues'
    pooled peek links; a queue that does not exist answers its ``BacklogQueueMissingError``. Other failures
    raise. One round trip of time for any number of queues (``source.planning.ProbeAtOnce``)."""
    def probe(queue: str):
        try:
            with pooled_receiver(namespace, queue) as receiver:
                return first_identity_from(receiver, asks[queue])
        except BacklogQueueMissingError as missing:
            return missing

    return each_at_once(asks, probe, name="probe")


def peek_identities(receiver, first: int, last: int) -> list[tuple[int, int | None]]:
    """``(sequence number, enqueue time in ms)`` of the messages in ``[first, last]`` still in the entity,
    in order (peeked: nothing is locked)."""
    present: list[tuple[int, int | None]] = []
    position = first
    while position <= last:
        page = [broker_identity(raw) for raw in peek_raw(receiver, position, min(PEEK_PAGE_SIZE, last - position + 1))]
        if not page:
            break
        present += [identity for identity in page if identity[0] <= last]
        position = page[-1][0] + 1
    return present


def peek_sequence_numbers(receiver, first: int, last: int) -> list[int]:
    """Sequence numbers in ``[first, last]`` still in the entity, in order (peeked: nothing is locked)."""
    return [seq for seq, _ in peek_identities(receiver, first, last)]


def administration_client(namespace: NamespaceConfig):
    """A ``ServiceBusAdministrationClient`` for the namespace (the caller closes it), or None for the local
    emulator, which has no administration endpoint (the client always uses https)."""
    from azure.servicebus.management import ServiceBusAdministrationClient
    if namespace.connection_string is not None:
        if "UseDevelopmentEmulator=true" in namespace.connection_string.reveal():
            return None
        return ServiceBusAdministrationClient.from_connection_string(namespace.connection_string.reveal())
    if namespace.use_development_emulator:
        return None
    return ServiceBusAdministrationClient(namespace.fully_qualified_namespace, credential_for(namespace.azure_ad))


_DISCOVERY_REFUSAL_TOLD = []  # the warning that discovery is not granted is given once per process


def list_backlog_queues(namespace: NamespaceConfig, primary_namespace: str) -> list[str] | None:
    """Every backlog queue of ``primary_namespace``, via the administration API; None if unavailable.

    The local emulator has no administration endpoint, and listing queues needs Manage (Azure Service
    Bus Data Owner), which a least-privilege identity lacks: the caller then reads
    ``0..queue_count-1``. A refusal is said once, as a warning (``access.discovery_skipped_line``).
    """
    try:
        admin = administration_client(namespace)
        if admin is None:
            return None
        with admin:
            return sorted(q.name for q in admin.list_queues() if is_backlog_queue_name(q.name, primary_namespace))
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

