"""Acting on a test's ``FaultPlan`` (``sink.fault_plan``): stopping the process at a crash point so a test
can kill it there, or ending a send task's first attempt as a lost executor would. With ``NO_FAULTS``,
the plan of every real run, each call returns at once.

The driver reaches its crash points through ``PlannedFaults`` (``sink.micro_batch.Hooks``); the send
tasks reach ``mid_send`` (``sink.send_task``) with the plan their closure carries.
"""

from __future__ import annotations

import os
import time

from backlog_syphon.sink.fault_plan import FaultPlan
from backlog_syphon.sink.micro_batch import CrashPoint

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


class PlannedFaults:
    """``sink.micro_batch.Hooks`` for the driver's crash points, from the run's plan."""

    def __init__(self, plan: FaultPlan):
        self.plan = plan

    def reached(self, point: CrashPoint) -> None:
        pause_at(self.plan, point)
