"""What the backlog queues and their dead-letter sub-queues hold now, for the status command: in a few
round trips per queue, whatever its size.

Paging through a queue with peeks costs a round trip per page of at most a few hundred messages, 30 to
80 ms each when the backlog is a region away: minutes for a large backlog. So:
- where the administration API answers (a connection string with Manage, or Azure AD with a role
  that reads entities), its runtime counts are exact, for every queue in one listing;
- elsewhere (a Listen-only key, the local emulator) one peek page from the head counts a queue
  exactly when it holds at most ``EXACT_COUNT_LIMIT`` messages (one single-message peek past the page
  makes sure: the service may cut a page short), and a larger one gets an upper bound, the span of
  sequence numbers from its first message to its last, found with single-message peeks (the gallop and
  halving of ``probing.search_tail``: about log8(span) + log2(span) of them, 30 for a million; removed
  messages inside the span are counted too).
A partitioned queue's numbers are 16 runs far apart (``partitions``), so its bound is summed over its
partitions, each searched within its own lane (an answer from another partition is "nothing" there).
Either way the first message's enqueue time gives the oldest message's age (no broker metric has it),
and a dead-letter sub-queue's first page gives its dead-letter reasons. Peeks lock nothing, so
nothing here can raise a message's delivery count.

Invariants:
- A short page is read on (up to ``EXACT_COUNT_LIMIT`` messages), never counted as the queue's end.
- An empty answer that would end a count (an empty queue, nothing past the page, the last sequence number)
  is looked at once more before it counts (``peek_pages``): a peek can come back empty while messages
  exist, and a count that says "drained" when it is not would give the status a wrong verdict. It costs
  one single-message peek per queue and status call, all queues at once.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter
from typing import Callable

from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.model import BrokerCount
from backlog_syphon.partitions import LANES, is_partitioned_number, lane_start, partition_of
from backlog_syphon.probing import Identity, run_search, search_tail
from backlog_syphon.restore.amqp.annotations import DEAD_LETTER_REASON_PROPERTY
from backlog_syphon.restore.amqp.message_decoding import decode_envelope
from backlog_syphon.restore.amqp.sections import broker_identity
from backlog_syphon.restore.queue_names import dead_letter_queue_name, is_backlog_queue_name, is_dead_letter_queue_name
from backlog_syphon.servicebus.clients import each_at_once, open_client
from backlog_syphon.servicebus.peek import LAST_SEQUENCE_NUMBER, administration_client, peek_raw
from backlog_syphon.peek_pages import PagedRead
from backlog_syphon.servicebus.sdk_internals import management_handle, prompt
from backlog_syphon.servicebus.throttling import administration, list_pages

logger = logging.getLogger(__name__)

EXACT_COUNT_LIMIT = 100  # messages one peek page counts exactly; beyond, an upper bound
NO_REASON = "(none)"  # a dead-lettered message without a DeadLetterReason
UNREADABLE = "(unreadable)"

Peek = Callable[[int, int], list]  # (from sequence number, max count) -> stored messages, in order


def count_backlog(namespace: NamespaceConfig, primary_namespace: str, queues: list[str]
                  ) -> tuple[dict[str, BrokerCount], dict[str, BrokerCount], str]:
    """(backlog queue -> what it holds, its dead-letter sub-queue -> what that holds, how they were
    counted). The queues are ``queues`` and any other backlog queue of ``primary_namespace`` the
    administration API lists."""
    runtime = runtime_counts(namespace, primary_namespace)
    known = {name.lower(): counts for name, counts in (runtime or {}).items()}
    names = {name.lower(): name for name in [*(runtime or {}), *queues]}  # the configured spelling wins
    backlog = sorted(names.values(), key=_queue_order)
    entities = [(queue, False, known[queue.lower()][0] if queue.lower() in known else None) for queue in backlog]
    entities += [(dead_letter_queue_name(queue), True, known[queue.lower()][1] if queue.lower() in known else None)
                 for queue in backlog]

    def count(entity: tuple[str, bool, int | None]) -> BrokerCount:
        name, dead_letters, runtime_count = entity
        return _count_entity(namespace, name, dead_letters=dead_letters, known=runtime_count)

    counts = {entity[0]: count for entity, count in each_at_once(entities, count, name="status-count").items()}
    how = ("the administration API's runtime counts (exact)" if runtime is not None else
           f"peeks: exact up to {EXACT_COUNT_LIMIT} messages a queue; '<=N' is an upper bound, the span of "
           f"sequence numbers from the first message to the last")
    return ({queue: counts[queue] for queue in backlog},
            {dead_letter_queue_name(queue): counts[dead_letter_queue_name(queue)] for queue in backlog}, how)


def runtime_counts(namespace: NamespaceConfig, primary_namespace: str) -> dict[str, tuple[int, int]] | None:
    """Backlog queue -> (active messages, dead-lettered messages) from the administration API; None where
    it cannot be used (a key without Manage, no network path to it)."""
    def read() -> list:
        with administration_client(namespace) as admin:
            return list(admin.list_queues_runtime_properties())

    try:
        return {queue.name: (queue.active_message_count, queue.dead_letter_message_count)
                for queue in administration(namespace, read, requests=list_pages)
                if is_backlog_queue_name(queue.name, primary_namespace)}
    except Exception as exc:  # noqa: BLE001 - the peeks count instead
        logger.info("runtime counts unavailable (%s); counting with peeks", type(exc).__name__)
        return None


def count_entities(namespace: NamespaceConfig, entities: list[str], *, browse_only: frozenset[str] = frozenset()
                   ) -> dict[str, BrokerCount]:
    """What each of a migration's entities holds (peeked, as above; a dead-letter sub-queue with its reasons);
    ``browse_only``: the lower-case paths peeked through a management-only link (session-enabled, topics)."""
    def count(name: str) -> BrokerCount:
        return _count_entity(namespace, name, dead_letters=is_dead_letter_queue_name(name), known=None,
                             browse=name.lower() in browse_only)

    return each_at_once(entities, count, name="status-count")


def _count_entity(namespace: NamespaceConfig, name: str, *, dead_letters: bool, known: int | None,
                  browse: bool = False) -> BrokerCount:
    # A client of its own per entity (each link is a connection of its own anyway): nothing shared with
    # the process's pooled links, which a run in this process may be using.
    try:
        with open_client(namespace, role="secondary") as client:
            handler = management_handle(client, name) if browse else prompt(client.get_queue_receiver(
                name, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0))
            try:
                return survey(lambda first, count: peek_raw(handler, first, count, namespace=namespace), known=known,
                              reasons=dead_letters)
            finally:
                handler.close()
    except (BacklogQueueMissingError, MessagingEntityNotFoundError):  # refused at the peek, or at the link's attach
        return BrokerCount(0, True, None, {}, exists=False)


def survey(peek: Peek, *, known: int | None, reasons: bool) -> BrokerCount:
    """What one queue holds, from its first page of peeks (see the module docstring). ``known``: its count
    from the administration API, when there is one; ``reasons``: tally the page's dead-letter reasons."""
    limit = EXACT_COUNT_LIMIT if reasons or known is None else 1
    page, ended = first_messages(peek, limit)
    if not page:
        return BrokerCount(known or 0, True, None, {})
    identities = [broker_identity(raw) for raw in page]
    first, first_ms = identities[0]
    oldest = None if first_ms is None else dt.datetime.fromtimestamp(first_ms / 1000, dt.timezone.utc)
    tally = dict(Counter(dead_letter_reason(raw) for raw in page)) if reasons else {}
    if known is not None:
        return BrokerCount(known, True, oldest, tally, reasons_complete=not reasons or len(page) >= known)
    if ended:
        return BrokerCount(len(page), True, oldest, tally)

    def probe(sequence_number: int) -> Identity | None:
        found = peek(sequence_number, 1)
        return broker_identity(found[0]) if found else None

    more = probe(identities[-1][0] + 1)
    if more is None:
        more = probe(identities[-1][0] + 1)  # the end of an exact count: a second look
    if more is None:
        return BrokerCount(len(page), True, oldest, tally)
    if is_partitioned_number(more[0]) or any(is_partitioned_number(seq) for seq, _ in identities):
        return BrokerCount(lanes_bound(probe), False, oldest, tally, reasons_complete=not reasons)
    end = run_search(search_tail(more, confirm=True), probe)  # the end it finds is looked at twice too
    if is_partitioned_number(end - 1):  # the search ran on into other partitions: count them one by one
        return BrokerCount(lanes_bound(probe), False, oldest, tally, reasons_complete=not reasons)
    return BrokerCount(end - first, False, oldest, tally, reasons_complete=not reasons)


def lanes_bound(probe: Callable[[int], Identity | None]) -> int:
    """A partitioned queue's upper bound: per partition, the span from its first message to its last, found
    within its lane (a probe answered from a higher partition is "nothing in this lane"), summed. A lane's
    empty head and its end are looked at twice, as above."""
    total = 0
    for partition in range(LANES):
        def in_lane(sequence_number: int, partition=partition) -> Identity | None:
            found = probe(sequence_number)
            return found if found is not None and partition_of(found[0]) == partition else None

        head = in_lane(lane_start(partition)) or in_lane(lane_start(partition))
        if head is not None:
            total += run_search(search_tail(head, confirm=True), in_lane) - head[0]
    return total


def first_messages(peek: Peek, count: int) -> tuple[list, bool]:
    """Up to ``count`` stored messages from the head of a queue, and whether they are all it holds (its end
    was seen): short pages are read on, an empty answer looked at twice (``peek_pages.PagedRead``)."""
    found: list = []
    read = PagedRead(1, LAST_SEQUENCE_NUMBER, count)
    while len(found) < count:
        read.page_size = count - len(found)
        if (ask := read.next_ask()) is None:
            break
        page = peek(*ask)
        found += page[:read.on_page([broker_identity(raw)[0] for raw in page])]
    return found, read.done


def dead_letter_reason(raw: bytes) -> str:
    """The DeadLetterReason a stored message carries."""
    try:
        reason = decode_envelope(raw).application_properties.get(DEAD_LETTER_REASON_PROPERTY)
    except ValueError:
        return UNREADABLE
    return NO_REASON if reason is None else str(reason)


def _queue_order(queue: str) -> tuple[int, str]:
    index = queue.rsplit("/", 1)[-1]
    return (int(index), queue) if index.isdigit() else (1 << 62, queue)
