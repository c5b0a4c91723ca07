"""When a run reached each of its steps, in seconds from its process's start.

The run's fixed costs (Spark's start, the tables, the lease, the query's start, the end) decide how
long a scheduled run that finds a small backlog takes: ``--verbose`` prints the timeline under the
run's summary, and ``make bench`` reports it. Marks are wall-clock times (``time.time()``), so a
mark taken from an outcome row's time (the first message sent, on an executor) sits on the same
axis. Under Spark Connect the sink runs on the server: the marks it takes (first batch, first send,
last record) do not reach the client, and the timeline shows the client's own.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from enum import StrEnum

_IMPORTED_AT = time.time()


class Milestone(StrEnum):
    """A step of a run, in the order a run reaches them."""

    SPARK_READY = "Spark session ready"
    TABLES_READY = "state tables ready"
    LEASE_TAKEN = "lease taken"
    PREFLIGHT_DONE = "namespaces and executors checked"
    SOURCE_READY = "source registered, planners started"
    QUERY_STARTED = "streaming query started"
    FIRST_BATCH = "first batch started"
    FIRST_SEND = "first message sent"
    LAST_RECORD = "last batch recorded"
    QUERY_STOPPED = "query stopped, purges settled"
    STATE_SAVED = "purge marks saved, lease released"
    SUMMARISED = "what is left counted"


@dataclass
class Timeline:
    """Milestones of one run (the first time each is reached), as epoch seconds."""

    origin: float = field(default_factory=lambda: process_start())
    marks: dict[Milestone, float] = field(default_factory=dict)

    def mark(self, milestone: Milestone, at: float | None = None, *, again: bool = False) -> None:
        """Mark ``milestone`` now (or ``at``); only its first time, unless ``again`` (the last time counts)."""
        if again or milestone not in self.marks:
            self.marks[milestone] = time.time() if at is None else at

    def seconds(self, milestone: Milestone) -> float | None:
        """Seconds from the process's start to ``milestone``; None if it was not reached."""
        at = self.marks.get(milestone)
        return None if at is None else at - self.origin

    def lines(self) -> list[str]:
        """One line per milestone reached, in time order, with the time since the one before."""
        out = ["  timeline (seconds from the process's start):"]
        previous = self.origin
        for milestone, at in sorted(self.marks.items(), key=lambda item: item[1]):
            out.append(f"  {at - self.origin:>8.1f} s  {milestone.value:<36} (+{at - previous:.1f} s)")
            previous = at
        return out


def process_start() -> float:
    """When this process started (epoch seconds): on Linux its age from /proc (to 10 ms), else when
    this module was imported."""
    try:
        with open("/proc/self/stat") as handle:
            started_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT
