"""Where a test stops or breaks a run: a small record, read once from the job's environment by the fault harness
(``tools/faulty_job.py``), which hands it to the run as hooks (``tools.fault_hooks.FaultHooks``). The library
reads no environment for it and ships none of this: its runs have no hooks (``sink.micro_batch.NO_HOOKS``).

The variables (what the integration tests set on the job; ``tests/integration/helpers.py``'s ``start_job``
then runs the harness instead of ``jobs/syphon.py``):
- ``SYPHON_FAULT_PAUSE_AT=<crash point>`` (``sink.micro_batch.CrashPoint``): the process that reaches
  it appends ``<point> <pid>`` to the file named by ``SYPHON_FAULT_MARKER`` and stops there, so a test
  can SIGKILL it; with ``SYPHON_FAULT_PAUSE_SECONDS`` it goes on after that long instead, or as soon as
  the test removes the marker.
- ``SYPHON_FAULT_PAUSE_PURGE_FROM_BATCH=<batch id>``: with ``mid_settle``, only a purge round that settles
  messages of that batch or a later one stops (the last batch's purge, say), not the first round to get there.
- ``SYPHON_FAULT_LOSE_TASK_AT=mid_send`` ends a send task's first attempt after its first send, as a
  lost executor would.

Pure: the record and its parsing, on a mapping given to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from backlog_syphon.sink.micro_batch import CrashPoint

PAUSE_AT = "SYPHON_FAULT_PAUSE_AT"
PAUSE_SECONDS = "SYPHON_FAULT_PAUSE_SECONDS"
PAUSE_PURGE_FROM_BATCH = "SYPHON_FAULT_PAUSE_PURGE_FROM_BATCH"
MARKER = "SYPHON_FAULT_MARKER"
LOSE_TASK_AT = "SYPHON_FAULT_LOSE_TASK_AT"


@dataclass(frozen=True)
class FaultPlan:
    """What a test asked for (picklable: it travels in the hooks with the sink to Spark Connect's server and to
    the send tasks)."""

    pause_at: CrashPoint | None = None  # where the process stops (or pauses)
    marker: str | None = None  # the file the paused process writes to, and whose removal lets it go on
    pause_seconds: float | None = None  # None: it stops for good (until killed)
    lose_task_at: CrashPoint | None = None  # where a send task's first attempt ends, as a lost executor
    pause_purge_from_batch: int = 0  # ``mid_settle``: the first batch whose purge round stops

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> FaultPlan:
        """The plan the ``SYPHON_FAULT_*`` variables of ``environ`` describe (empty ones count as unset)."""
        pause = environ.get(PAUSE_SECONDS) or None
        return cls(pause_at=_crash_point(environ, PAUSE_AT), marker=environ.get(MARKER) or None,
                   pause_seconds=None if pause is None else float(pause),
                   lose_task_at=_crash_point(environ, LOSE_TASK_AT),
                   pause_purge_from_batch=int(environ.get(PAUSE_PURGE_FROM_BATCH) or 0))

    def pauses_purge_of(self, batch_ids) -> bool:
        """Whether a purge round settling messages of these batches stops inside its settlement."""
        return self.pause_at == CrashPoint.MID_SETTLE and max(batch_ids, default=-1) >= self.pause_purge_from_batch


NO_FAULTS = FaultPlan()


def _crash_point(environ: Mapping[str, str], name: str) -> CrashPoint | None:
    value = environ.get(name) or None
    if value is None:
        return None
    try:
        return CrashPoint(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} names no crash point: one of "
                         f"{', '.join(point.value for point in CrashPoint)}") from None
