"""The asyncio loop: what a competent engineer writes today with ``azure.servicebus.aio``. One task per
backlog queue; PeekLock with prefetch 300, pages of 100; each page's messages restored (``loops.restored``)
and sent batched per destination and session, in order; then the page's completions gathered, since the
SDK's settlements wait for the service's answer (its 7.15 changelog advises settling many at once)."""
from __future__ import annotations

import asyncio
import time

from syphon_bench import BenchFailure
from syphon_bench.loops import BUSY_PAUSE_SECONDS, EMPTY_RECEIVES, send_runs

PREFETCH, PAGE = 300, 100
LOCK_SECONDS = 60  # the backlog queues' lock duration (conf/emulator.yaml)


async def while_busy(operation):
    """``await operation()``, asked again after the service's pause while the namespace answers it server-busy
    (the SDK's own retries gave up), as ``loops.while_busy``."""
    from azure.servicebus.exceptions import ServiceBusServerBusyError

    while True:
        try:
            return await operation()
        except ServiceBusServerBusyError:
            await asyncio.sleep(BUSY_PAUSE_SECONDS)


async def send_in_batches(sender, messages) -> None:
    """``messages`` in as few sends as the entity's largest message batch allows, each waited out while busy."""
    from azure.servicebus.exceptions import MessageSizeExceededError

    batch = await sender.create_message_batch()
    for message in messages:
        try:
            batch.add_message(message)
        except MessageSizeExceededError:
            await while_busy(lambda: sender.send_messages(batch))  # noqa: B023
            batch = await sender.create_message_batch()
            batch.add_message(message)
    await while_busy(lambda: sender.send_messages(batch))


async def move_queue(backlog, primary, queue: str, count: int, deadline: float, *, singles: bool) -> int:
    """One backlog queue, a page at a time: its sends in order, then its completions at once. ``singles``: one
    message per send (a partitioned destination with duplicate detection takes one MessageId per batch). A busy
    answer is waited out; a receive throttled on a detached link, or a page whose completions failed, gets a new
    receiver (as ``loops.move_queue``). Returns the messages it completed, and those it sent but could not complete
    (each maybe sent again, out of order)."""
    from azure.servicebus import ServiceBusReceiveMode
    from azure.servicebus.exceptions import ServiceBusError

    moved, unsure, senders, empty = 0, 0, {}, 0
    released_at = 0.0  # when the locks of messages whose completion failed have expired
    receiver = None
    try:
        while moved < count and time.perf_counter() < deadline:
            if receiver is None:
                receiver = backlog.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                                                      prefetch_count=PREFETCH)
            try:
                page = await receiver.receive_messages(max_message_count=min(PAGE, count - moved), max_wait_time=5)
            except ServiceBusError:  # busy: the link is detached, the SDK's receiver keeps raising it; or its
                # link did not open in time under throttling: a new receiver goes on
                await receiver.close()
                receiver = None
                await asyncio.sleep(BUSY_PAUSE_SECONDS)
                continue
            if not page:  # a namespace out of credits holds a receive on a link with locks: asked again
                empty += 1
                if empty > EMPTY_RECEIVES and time.perf_counter() > released_at:
                    raise BenchFailure(f"asyncio loop: {queue} gave nothing {empty} times in a row with "
                                       f"{count - moved} messages left")
                continue
            empty = 0
            for destination, messages in send_runs(page):
                sender = senders.get(destination) or senders.setdefault(
                    destination, primary.get_queue_sender(destination))
                if singles:
                    for message in messages:
                        await while_busy(lambda: sender.send_messages(message))  # noqa: B023
                else:
                    await send_in_batches(sender, messages)
            completions = await asyncio.gather(*(while_busy(lambda m=message: receiver.complete_message(m))
                                                 for message in page), return_exceptions=True)
            failed = [outcome for outcome in completions if isinstance(outcome, BaseException)]
            moved += len(page) - len(failed)
            unsure += len(failed)
            if failed:
                # Under throttling the SDK can close the receiver under settlements still in flight (they end in
                # "'NoneType' object has no attribute 'client_ready_async'", or "Management Operation error
                # occurred" from its management link): a script reopens it, and what it could not complete comes
                # back (to be sent again) once those locks expire.
                if not all(isinstance(outcome, (ServiceBusError, AttributeError)) for outcome in failed):
                    raise failed[0]
                await receiver.close()
                receiver = None
                released_at = time.perf_counter() + LOCK_SECONDS
    finally:
        if receiver is not None:
            await receiver.close()
        await asyncio.gather(*(sender.close() for sender in senders.values()))
    return moved, unsure


async def drain(secondary: str, primary: str, written: dict[str, int], deadline: float, *,
                singles: bool) -> tuple[int, int]:
    """Every backlog queue of ``written`` (queue -> messages it holds) at once: how many messages it moved, and
    how many it sent but could not complete."""
    from azure.servicebus.aio import ServiceBusClient

    async with ServiceBusClient.from_connection_string(secondary) as backlog, \
            ServiceBusClient.from_connection_string(primary) as destinations:
        moved = await asyncio.gather(*(move_queue(backlog, destinations, queue, count, deadline, singles=singles)
                                       for queue, count in written.items()))
    return sum(done for done, _ in moved), sum(failed for _, failed in moved)
