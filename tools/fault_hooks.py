"""Acting on a test's ``FaultPlan`` (``tools.fault_plan``): ``FaultHooks``, the ``sink.micro_batch.Hooks`` the
fault harness (``tools/faulty_job.py``) gives a run. They stop the process at a crash point so a test can kill
it there, or end a send task's first attempt as a lost executor would. With ``NO_FAULTS`` each call returns at
once.

The driver reaches its crash points, the send tasks ``mid_send`` (the hooks go to them in their closure, pickled
by this module's name: Spark's Python workers import it from the repository's root, which the harness puts on
their ``PYTHONPATH``), the purge's threads ``mid_settle``.
"""

from __future__ import annotations

import os
import time

from backlog_syphon.sink.micro_batch import CrashPoint
from tools.fault_plan import FaultPlan

# Points this process paused at already (one Python worker may run several tasks, one after the other).
_paused_at: set[CrashPoint] = set()


def pause_at(plan: FaultPlan, point: CrashPoint) -> None:
    """Park the process at ``point`` if the plan says so, so a test can kill it there.

    With ``pause_seconds`` the process pauses that long, once, and goes on; sooner if the marker file is
    removed (a test that has seen what it waited for need not wait out the pause). Once removed, the
    marker stays removed: Python workers that reach the point later (another task's worker, started
    after the first) go on without pausing.
    """
    if plan.pause_at != point or point in _paused_at:
        return
    marker, pause = plan.marker, plan.pause_seconds
    if marker:
        if pause is not None and os.path.exists(f"{marker}.paused") and not os.path.exists(marker):
            return  # released by the test
        with open(marker, "a") as handle:
            handle.write(f"{point.value} {os.getpid()}\n")
        if pause is not None:
            open(f"{marker}.paused", "a").close()
    if pause is not None:
        _paused_at.add(point)
        until = time.monotonic() + pause
        while time.monotonic() < until and (not marker or os.path.exists(marker)):
            time.sleep(0.1)
        return
    while True:
        time.sleep(3600)


def lose_first_attempt(plan: FaultPlan, point: CrashPoint) -> None:
    """End the Python worker of a task's first attempt at ``point`` if the plan says so, as a lost executor
    would; Spark then runs the task again (``spark.task.maxFailures``)."""
    if plan.lose_task_at != point:
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0:
        os._exit(1)


class FaultHooks:
    """``sink.micro_batch.Hooks`` from a test's plan (picklable: the plan is a frozen record)."""

    def __init__(self, plan: FaultPlan):
        self.plan = plan

    def reached(self, point: CrashPoint) -> None:
        pause_at(self.plan, point)

    def task_sent(self) -> None:
        pause_at(self.plan, CrashPoint.MID_SEND)
        lose_first_attempt(self.plan, CrashPoint.MID_SEND)

    def completions_sent(self, batch_ids: frozenset[int]) -> None:
        if self.plan.pauses_purge_of(batch_ids):
            pause_at(self.plan, CrashPoint.MID_SETTLE)
