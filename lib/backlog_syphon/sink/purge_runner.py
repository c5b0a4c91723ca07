"""The background purge: settle what the tables record while the next micro-batch runs.

Settling is a few small broker calls per queue (``servicebus.settle``), so it runs in threads on the
driver rather than as a Spark job, one round at a time, each round's queues in parallel.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

logger = logging.getLogger(__name__)


class PurgeRunner:
    """Runs purges in the background, one round at a time, each round's queues in parallel threads.

    Settling what is already recorded can overlap the next batch: the next batch reads later
    windows by sequence number and sends other messages, so the two never touch the same message,
    and a round only starts after the one before it, so each round finds its messages at the head
    of its queues. What a round settled reaches the checkpoint table with the next batch's write
    (or ``flush``); a crash before that only makes the next run check again.
    """

    def __init__(self, secondary):
        self._secondary = secondary
        self._rounds: ThreadPoolExecutor | None = None  # started with the first round, in the process that runs them
        self._pending: list[Future] = []
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"_secondary": self._secondary}

    def __setstate__(self, state):
        self.__init__(state["_secondary"])

    def submit(self, plans: dict) -> None:
        if plans:
            with self._lock:
                if self._rounds is None:
                    self._rounds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="purge-round")
                self._pending.append(self._rounds.submit(self._run, plans))

    def finished(self) -> dict[str, int]:
        """Marks of the rounds done so far (without waiting); a failed round's error is raised here."""
        with self._lock:
            done = [future for future in self._pending if future.done()]
            self._pending = [future for future in self._pending if not future.done()]
        return _merged_marks(future.result() for future in done)

    def wait(self) -> dict[str, int]:
        with self._lock:
            pending, self._pending = self._pending, []
        return _merged_marks(future.result() for future in pending)

    def _run(self, plans: dict) -> dict[str, int]:
        from backlog_syphon.servicebus.settle import purge_backlog

        with ThreadPoolExecutor(max_workers=min(8, len(plans)), thread_name_prefix="purge") as pool:
            results = dict(zip(plans, pool.map(lambda queue: purge_backlog(self._secondary, plans[queue]), plans)))
        for queue, result in results.items():
            if result.settled_through < plans[queue].through:
                logger.warning("backlog=%s purge incomplete: settled through %s of %s (completed=%d "
                               "dead_lettered=%d released=%d); retried with the next batch", queue,
                               result.settled_through, plans[queue].through, result.completed,
                               result.dead_lettered, result.released)
        return {queue: result.settled_through for queue, result in results.items()}


def _merged_marks(rounds) -> dict[str, int]:
    marks: dict[str, int] = {}
    for settled in rounds:
        for queue, through in settled.items():
            marks[queue] = max(through, marks.get(queue, 0))
    return marks
