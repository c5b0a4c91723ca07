"""What the subscriptions of a ``topic`` route with a lead hold: their sequence numbers, every one, peeked
(``migration.fan_out`` compares them). Peeks lock nothing: nothing here touches a message.

Each subscription is paged through from its first message (lane by lane where partitioned: a page answered from
another lane ends the lane), pages of ``PAGE``; an empty answer is looked at once more before it ends a lane, as
the counts do (a peek can come back empty while messages exist). A session-enabled subscription is peeked
through a management-only link (``sdk_internals.management_handle``).
"""

from __future__ import annotations

from typing import Iterable

from azure.servicebus import ServiceBusReceiveMode

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.partitions import LANES, lane_end, lane_start
from backlog_syphon.restore.amqp.sections import broker_identity
from backlog_syphon.servicebus.clients import each_at_once, open_client
from backlog_syphon.servicebus.peek import peek_raw
from backlog_syphon.servicebus.sdk_internals import management_handle, prompt

PAGE = 250


def live_sequence_numbers(namespace: NamespaceConfig, entities: Iterable[str], *,
                          browse_only: frozenset[str] = frozenset(), partitioned: frozenset[str] = frozenset()
                          ) -> dict[str, frozenset[int]]:
    """{entity: the sequence numbers it holds now}; ``browse_only`` and ``partitioned``: lower-case paths."""
    def read(name: str) -> frozenset[int]:
        with open_client(namespace, role="secondary") as client:
            handler = management_handle(client, name) if name.lower() in browse_only else prompt(
                client.get_queue_receiver(name, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0))
            try:
                lanes = range(LANES) if name.lower() in partitioned else (None,)
                return frozenset(number for lane in lanes for number in lane_numbers(handler, lane))
            finally:
                handler.close()

    return each_at_once(list(entities), read, name="fan-out-peek")


def lane_numbers(handler, lane: int | None) -> list[int]:
    """The sequence numbers of one lane (``None``: a non-partitioned entity's whole range), in order."""
    low, high = (0, None) if lane is None else (lane_start(lane), lane_end(lane))
    numbers: list[int] = []
    start, looked_again = low, False
    while True:
        page = [broker_identity(raw)[0] for raw in peek_raw(handler, start, PAGE)]
        inside = [number for number in page if number >= low and (high is None or number < high)]
        if inside:
            numbers += inside
            start, looked_again = max(inside) + 1, False
            if len(inside) < len(page):  # the rest of the page is another lane's: this one has ended
                return numbers
            continue
        if looked_again or page:  # nothing more here: twice empty, or answered from another lane
            return numbers
        looked_again = True
