"""Reading one window of a backlog queue in a task: its pages peeked in order (``peek_pages.PagedRead``), each
message decoded once into its row (``restore.backlog_rows.peeked_message``), the next page read ahead while
Spark takes the one before, a partitioned queue's lanes read at once. I/O through ``servicebus/``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import InputPartition

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.restore.amqp.decoding import AmqpDecodeError
from backlog_syphon.restore.backlog_rows import peeked_message
from backlog_syphon.peek_pages import PEEK_PAGE_SIZE

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BacklogWindow(InputPartition):
    """Messages ``start <= sequence number < end`` of one backlog queue (``batch_queues``: every queue
    of the batch, whose links a process opens together the first time). A partitioned queue's window is one
    range per partition lane (``lanes``, by partition; ``start`` and ``end`` then are the first's), read at
    once, each on a link of its own, by the one task that sends the queue's rows, and yielded partition by
    partition, each in order."""

    queue: str
    start: int
    end: int
    batch_queues: tuple[str, ...] = ()
    lanes: tuple[tuple[int, int], ...] = ()

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return self.lanes or ((self.start, self.end),)


def read_window(namespace: NamespaceConfig, window: BacklogWindow, *, copy: bool = False):
    """Yield the rows of one window as Arrow record batches (executor side): a queue's one per peeked page,
    as it is read; a partitioned queue's lane by lane (``_read_lanes_at_once``). ``copy``: the migration mode's
    rows (``restore.backlog_rows.copy_fields``).

    Contiguous by construction: the window ends only at its planned end, or where no message follows
    (``peek_pages.PagedRead``: a short page is read on from after its last message, an empty one is looked
    at twice before it counts, and a message the second look finds is read as a page of its own), so
    nothing of the window is skipped while the offsets count it as read. A queue that no longer exists
    has nothing left to read; a pooled link to a queue deleted and created since says "not found" too,
    so that is asked again on a fresh link.
    """
    from backlog_syphon.rows import BACKLOG_ROW_ARROW_SCHEMA, record_batch
    from backlog_syphon.servicebus.clients import open_peek_receivers

    open_peek_receivers(namespace, window.batch_queues)  # pooled: at once, the first time in this process
    if not window.lanes:
        yield from read_ahead(record_batch(rows, BACKLOG_ROW_ARROW_SCHEMA) for rows in _read_range(
            namespace, window.queue, window.queue, window.start, window.end, copy=copy))
        return
    yield from _read_lanes_at_once(namespace, window, copy)


_END = object()


def read_ahead(items: Iterator, depth: int = 1) -> Iterator:
    """``items``, produced in a thread of their own up to ``depth`` ahead of the consumer: a window's next page
    is peeked (a round trip to a namespace a region away) while Spark takes the one before, instead of after it.
    The peeks still go one after the other, on the one link; an error comes out where its item would have, and
    a consumer that stops early stops the thread at its next item."""
    import queue
    import threading

    handed: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand(item) -> bool:
        while not stop.is_set():
            try:
                handed.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not hand((item, None)):
                    return
        except BaseException as error:  # noqa: BLE001 - raised in the consumer, where the item would have been
            hand((_END, error))
            return
        finally:  # here, in the thread that iterated it: a pooled link it holds goes back at once
            close = getattr(items, "close", None)
            if close is not None:
                close()
        hand((_END, None))

    thread = threading.Thread(target=produce, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = handed.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()


# Rows per record batch of a partitioned queue's lanes. A lane's pages can be one message each (a peek
# answering one message per call, as reported of the service), and an Arrow batch costs the same half a
# millisecond of CPU to build whatever it holds (4.6 us a row in batches of 250): a lane is read whole
# before it is yielded anyway, so its rows go out in batches of a full page.
LANE_BATCH_ROWS = PEEK_PAGE_SIZE


def _read_lanes_at_once(namespace: NamespaceConfig, window: BacklogWindow, copy: bool):
    """A partitioned queue's lanes, each read on a link of its own at once, yielded partition by partition,
    each in order, in batches of ``LANE_BATCH_ROWS`` rows. A peek answers from one partition, perhaps one
    message a call (as reported of the service): one lane after the other, a window of a queue's 16 would
    cost 16 lanes' round trips end to end. The rows wait in memory until their lane's turn: a window is
    bounded by the batch's messages."""
    from concurrent.futures import ThreadPoolExecutor

    from backlog_syphon.partitions import lane_key, partition_of
    from backlog_syphon.rows import BACKLOG_ROW_ARROW_SCHEMA, record_batch
    from backlog_syphon.servicebus.clients import open_peek_receivers

    links = [lane_key(window.queue, partition_of(start)) for start, _ in window.lanes]
    open_peek_receivers(namespace, links)
    with ThreadPoolExecutor(max_workers=len(links), thread_name_prefix="lane-read") as pool:
        lanes = [pool.submit(_read_whole_range, namespace, window.queue, link, start, end, copy=copy, lane=True)
                 for link, (start, end) in zip(links, window.lanes)]
        for lane in lanes:
            rows = lane.result()
            for first in range(0, len(rows), LANE_BATCH_ROWS):
                yield record_batch(rows[first:first + LANE_BATCH_ROWS], BACKLOG_ROW_ARROW_SCHEMA)


def _read_whole_range(namespace: NamespaceConfig, queue: str, link: str, start: int, end: int, *,
                      copy: bool = False, lane: bool = False) -> list[dict]:
    return [row for rows in _read_range(namespace, queue, link, start, end, copy=copy, lane=lane) for row in rows]


def _read_range(namespace: NamespaceConfig, queue: str, link: str, start: int, end: int, *, copy: bool = False,
                lane: bool = False):
    """The rows of ``[start, end)`` of ``queue``, a list per peeked page, peeked through the pooled link ``link``
    (the queue's, or one lane's: ``lane``, a partition's range)."""
    from backlog_syphon.servicebus.clients import pooled_receiver

    reader = _WindowReader(queue, start, end, copy=copy, lane=lane)
    for fresh_link in (False, True):
        try:
            with pooled_receiver(namespace, link) as receiver:  # a failed link is dropped from the pool
                yield from reader.pages(receiver)
            return
        except BacklogQueueMissingError:
            if fresh_link:
                logger.warning("backlog=%s no longer exists: the rest of its window [%d, %d) went with it",
                               queue, reader.read.position, end)
                return


class _WindowReader:
    """Where the reading of one window (one lane's, for a partitioned queue) stands, across the links it is
    read through. Within a lane, a page from another partition is a miss, looked at again
    (``peek_pages.LANE_LOOKS``): a peek may answer from another partition while this one holds messages; only
    answers that keep missing end the lane (the next non-empty partition answers: nothing more here)."""

    def __init__(self, queue: str, start: int, end: int, *, copy: bool = False, lane: bool = False):
        from backlog_syphon.peek_pages import PagedRead

        self.queue, self.end, self.copy = queue, end, copy
        self.read = PagedRead(start, end - 1, lane=lane)

    def pages(self, receiver):
        """Each page's rows (``restore.backlog_rows.peeked_message``: one decode pass gives a message's place and
        its row), as a list, in order."""
        from backlog_syphon.servicebus.peek import peek_raw
        from backlog_syphon.worker_process import freeze_imports

        freeze_imports()  # once per process: its collections skip what it imported
        queue, read = self.queue, self.read
        while (ask := read.next_ask()) is not None:
            messages = []
            for raw in peek_raw(receiver, *ask):  # in order: once one lies past the range, the rest do too
                messages.append(placed(queue, raw, read.position, copy=self.copy))
                if messages[-1].sequence_number > read.last:
                    break
            taken = read.on_page([message.sequence_number for message in messages])
            if read.confirming:
                logger.info("backlog=%s a peek at %d before the window's end %d found nothing of its range: "
                            "looking again", queue, ask[0], self.end)
            if taken:
                yield [message.row for message in messages[:taken]]


def placed(queue: str, raw: bytes, position: int, *, copy: bool = False):
    """A peeked message decoded once (``backlog_rows.peeked_message``), which must say where the broker put it:
    its sequence number is read even when the rest is unreadable, and a message without one stops the read.
    ``copy``: the migration mode's row."""
    try:
        message = peeked_message(queue, raw, copy=copy)
    except AmqpDecodeError as error:
        why = str(error)
    else:
        if message.sequence_number is not None:
            return message
        why = "it has no x-opt-sequence-number annotation"
    # The broker writes this annotation itself: without it nothing can tell where the window is.
    raise RuntimeError(f"backlog queue {queue}: the message after sequence number {position - 1} cannot be "
                       f"placed ({why}); the broker's own annotations are unreadable")
