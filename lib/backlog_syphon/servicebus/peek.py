"""Reading backlog queues without taking anything: raw peeks, window probes, counts, discovery.

Backlog messages are peeked as the bytes the broker stored (the SDK's decoded messages lose AMQP
types: long vs int, described timespans, symbols), through the same management request as
``receiver.peek_messages`` (a private SDK detail pinned by azure-servicebus==7.15.0 and covered by
tests). A peek locks nothing, so nothing here can raise a backlog message's delivery count.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from azure.servicebus._common.constants import (
    MGMT_REQUEST_FROM_SEQUENCE_NUMBER,
    MGMT_REQUEST_MAX_MESSAGE_COUNT,
    REQUEST_RESPONSE_PEEK_OPERATION,
)
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.restore.amqp_codec import sequence_number
from backlog_syphon.restore.queue_names import is_backlog_queue_name
from backlog_syphon.servicebus.clients import pooled_receiver

logger = logging.getLogger(__name__)

PEEK_PAGE_SIZE = 250  # messages per management peek; the service caps a response's size anyway
LAST_SEQUENCE_NUMBER = (1 << 63) - 1


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


def list_backlog_queues(namespace: NamespaceConfig, primary_namespace: str) -> list[str] | None:
    """Every backlog queue of ``primary_namespace``, via the administration API; None if unreachable.

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
            return sorted(q.name for q in admin.list_queues() if is_backlog_queue_name(q.name, primary_namespace))
    except Exception as exc:  # noqa: BLE001 - discovery is best effort by design
        logger.info("backlog queue discovery unavailable (%s); using the configured queue count", type(exc).__name__)
        return None


def peek_counts(namespace: NamespaceConfig, queues: Iterable[str]) -> dict[str, int]:
    """Messages still in each queue, by peeking the queues in parallel (for run summaries)."""
    queues = list(queues)

    def count(queue: str) -> int:
        with pooled_receiver(namespace, queue) as receiver:
            return len(peek_sequence_numbers(receiver, 1, LAST_SEQUENCE_NUMBER))

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(queues))), thread_name_prefix="peek-count") as pool:
        return dict(zip(queues, pool.map(count, queues)))