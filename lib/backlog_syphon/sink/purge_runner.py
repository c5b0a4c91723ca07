"""The background purge: settle what the tables record while the next micro-batch runs.

Settling is a few small broker calls per queue (``servicebus.purge``), so it runs in threads on the
driver rather than as a Spark job, one round at a time, each round's queues in parallel.

A round that fails for a queue (a lost connection, a lock lost, the secondary unreachable) is logged
and counted as having settled nothing there: what it did settle is found gone by the next round's
verification (a peek), so a failure never surfaces in a batch and never re-sends anything.

What each queue's rounds measured (its locks, its round trips: ``settle_timing.SettleTiming``) is kept here
for the run, so every round sizes its first page from the rounds before.

A test harness's hooks (``sink.micro_batch.Hooks``) may stop a round inside its settlement
(``CrashPoint.MID_SETTLE``: a page's completions sent, its dead-letterings not), so the test can kill the
process there.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from backlog_syphon.errors import describe
from backlog_syphon.purge.plan import PurgePlan, PurgeResult
from backlog_syphon.purge.settle_timing import SettleTiming
from backlog_syphon.sink.micro_batch import NO_HOOKS, Hooks

logger = logging.getLogger(__name__)


class PurgeRunner:
    """``sink.micro_batch.PurgePort``: one round at a time in the background, each round's queues in parallel."""

    def __init__(self, secondary, hooks: Hooks = NO_HOOKS):
        self._secondary = secondary
        self._hooks = hooks  # a test harness's; none outside the tests
        self._rounds: ThreadPoolExecutor | None = None  # started with the first round, in the process that runs them
        self._pending: list[Future] = []
        self._lock = threading.Lock()
        self._timings: dict[str, SettleTiming] = {}  # per queue; each touched by one round at a time

    def __getstate__(self):
        return {"_secondary": self._secondary, "_hooks": self._hooks}

    def __setstate__(self, state):
        self.__init__(state["_secondary"], state["_hooks"])

    def busy(self) -> bool:
        with self._lock:
            return any(not future.done() for future in self._pending)

    def submit(self, plans: dict[str, PurgePlan]) -> None:
        if plans:
            with self._lock:
                if self._rounds is None:
                    self._rounds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="purge-round")
                self._pending.append(self._rounds.submit(self._run, plans))

    def finished(self) -> dict[str, PurgeResult]:
        """Results of the rounds done so far, without waiting."""
        with self._lock:
            done = [future for future in self._pending if future.done()]
            self._pending = [future for future in self._pending if not future.done()]
        return _merged(future.result() for future in done)

    def wait(self) -> dict[str, PurgeResult]:
        with self._lock:
            pending, self._pending = self._pending, []
        return _merged(future.result() for future in pending)

    def _run(self, plans: dict[str, PurgePlan]) -> dict[str, PurgeResult]:
        with ThreadPoolExecutor(max_workers=min(8, len(plans)), thread_name_prefix="purge") as pool:
            return dict(zip(plans, pool.map(lambda queue: self._purge_one(plans[queue]), plans)))

    def _purge_one(self, plan: PurgePlan) -> PurgeResult:
        from backlog_syphon.servicebus.purge import purge_backlog

        try:
            timing = self._timings.setdefault(plan.queue, SettleTiming())
            batch_ids = frozenset(span.batch_id for span in plan.spans)
            result = purge_backlog(self._secondary, plan, timing=timing,
                                   on_completions_sent=lambda: self._hooks.completions_sent(batch_ids))
        except Exception as exc:  # noqa: BLE001 - a purge failure never fails a batch: retried later
            logger.warning("backlog=%s purge round failed (%s); what it settled is checked again by the next round",
                           plan.queue, describe(exc), exc_info=True)
            return PurgeResult(0, 0, 0, plan.spans, ())
        if result.remaining and not result.throttled:  # a throttled round said so (``purge_backlog``)
            logger.warning("backlog=%s purge incomplete: %d recorded span(s) still there (completed=%d "
                           "dead_lettered=%d released=%d); retried with the next batch", plan.queue,
                           len(result.remaining), result.completed, result.dead_lettered, result.released)
        return result


def _merged(rounds) -> dict[str, PurgeResult]:
    merged: dict[str, PurgeResult] = {}
    for results in rounds:
        for queue, result in results.items():
            known = merged.get(queue)
            merged[queue] = result if known is None else PurgeResult(
                known.completed + result.completed, known.dead_lettered + result.dead_lettered,
                known.released + result.released, result.remaining, known.settled + result.settled,
                known.throttled or result.throttled)
    return merged
