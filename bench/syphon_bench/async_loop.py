"""The asyncio loop: what a competent engineer writes today with ``azure.servicebus.aio``. One task per
backlog queue; PeekLock with prefetch 300, pages of 100; each page's messages restored (``loops.restored``)
and sent batched per destination and session, in order; then the page's completions gathered, since the
SDK's settlements wait for the service's answer (its 7.15 changelog advises settling many at once)."""
from __future__ import annotations

import asyncio
import time

from syphon_bench import BenchFailure
from syphon_bench.loops import send_runs

PREFETCH, PAGE = 300, 100


async def send_in_batches(sender, messages) -> None:
    """``messages`` in as few sends as the entity's largest message batch allows."""
    from azure.servicebus.exceptions import MessageSizeExceededError

    batch = await sender.create_message_batch()
    for message in messages:
        try:
            batch.add_message(message)
        except MessageSizeExceededError:
            await sender.send_messages(batch)
            batch = await sender.create_message_batch()
            batch.add_message(message)
    await sender.send_messages(batch)


async def move_queue(backlog, primary, queue: str, count: int, deadline: float, *, singles: bool) -> int:
    """One backlog queue, a page at a time: its sends in order, then its completions at once. ``singles``: one
    message per send (a partitioned destination with duplicate detection takes one MessageId per batch)."""
    from azure.servicebus import ServiceBusReceiveMode

    moved, senders = 0, {}
    try:
        async with backlog.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                                              prefetch_count=PREFETCH) as receiver:
            while moved < count and time.perf_counter() < deadline:
                page = await receiver.receive_messages(max_message_count=min(PAGE, count - moved), max_wait_time=5)
                if not page:
                    raise BenchFailure(f"asyncio loop: {queue} gave nothing with {count - moved} messages left")
                for destination, messages in send_runs(page):
                    sender = senders.get(destination) or senders.setdefault(
                        destination, primary.get_queue_sender(destination))
                    if singles:
                        for message in messages:
                            await sender.send_messages(message)
                    else:
                        await send_in_batches(sender, messages)
                await asyncio.gather(*(receiver.complete_message(message) for message in page))
                moved += len(page)
    finally:
        await asyncio.gather(*(sender.close() for sender in senders.values()))
    return moved


async def drain(secondary: str, primary: str, written: dict[str, int], deadline: float, *, singles: bool) -> int:
    """Every backlog queue of ``written`` (queue -> messages it holds) at once; how many messages moved."""
    from azure.servicebus.aio import ServiceBusClient

    async with ServiceBusClient.from_connection_string(secondary) as backlog, \
            ServiceBusClient.from_connection_string(primary) as destinations:
        moved = await asyncio.gather(*(move_queue(backlog, destinations, queue, count, deadline, singles=singles)
                                       for queue, count in written.items()))
    return sum(moved)
