"""The soak benchmark's arithmetic (``bench/soak.py``): plain values in, figures and text out, no I/O.

A run is cut into tenths by its batches (the sink's per-batch log lines, in order): tenth k holds
batches ``k*n//10`` to ``(k+1)*n//10 - 1``, and the time from the end of the previous tenth's last
batch (for the first: the start of its first batch) to the end of its own last batch. Samples
(memory, heap, files) and received messages fall into the tenth whose time holds them; those before
the first batch (the job's start) or after the last (the drain at the end) into none.
"""
from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

TENTHS = 10
STEPS = ("plan", "read+send", "aggregate", "record")  # the sink's step split, in its order


@dataclass(frozen=True)
class BatchFigure:
    """One batch as the sink logged it: ``seconds`` of ``foreachBatch``, and its steps' seconds."""

    batch_id: int
    ended_at: float  # epoch seconds, the log line's time
    seconds: float
    steps: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """What the sampler read at one moment (None: not read this time)."""

    at: float  # epoch seconds
    rss_mb: float | None = None  # the job's processes together
    heap_mb: float | None = None  # the JVM's heap in use right after a full GC
    audit_files: int | None = None  # the audit table's data files (what it holds now; on disk: in state_files)
    audit_log_entries: int | None = None  # files in its _delta_log
    # The other state's files on disk (the checkpoint table's, the streaming checkpoint's offsets and commits):
    # in the JSON only.
    state_files: dict[str, int] = field(default_factory=dict)
    # ``rss_mb`` by kind of process (``soak_sampler``: the Python driver, the JVM, and PySpark's Python daemon
    # and workers with the source's planner): in the JSON only, to tell which one grows.
    rss_parts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Arrival:
    """A message received at its destination, ``latency`` seconds after it was written to the backlog."""

    received_at: float
    latency: float


@dataclass(frozen=True)
class Tenth:
    index: int
    first_batch: int | None  # batch ids
    last_batch: int | None
    batches: int
    seconds_median: float | None  # foreachBatch
    seconds_p95: float | None
    steps_median: dict[str, float | None]
    latency_median: float | None
    latency_p95: float | None
    rss_mb: float | None  # median of the tenth's samples
    heap_mb: float | None
    audit_files: int | None  # the tenth's last sample
    audit_log_entries: int | None


@dataclass(frozen=True)
class Target:
    measure: str
    value: float | None
    limit: float
    detail: str = ""

    @property
    def met(self) -> bool | None:
        return None if self.value is None else self.value <= self.limit


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile by nearest rank: the smallest value at least 95% of the values do not exceed."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def ratio(last: float | None, first: float | None) -> float | None:
    return None if last is None or not first else last / first


def tenth_groups(count: int, tenths: int = TENTHS) -> list[range]:
    """The indexes of ``count`` batches cut into ``tenths`` contiguous groups (fewer when fewer batches)."""
    groups = min(tenths, count)
    return [range(k * count // groups, (k + 1) * count // groups) for k in range(groups)]


def tenth_windows(batches: Sequence[BatchFigure], groups: Sequence[range]) -> list[tuple[float, float]]:
    """Each group's (start, end] in time: see the module's docstring."""
    windows, start = [], None
    for group in groups:
        first, last = batches[group[0]], batches[group[-1]]
        if start is None:
            start = first.ended_at - first.seconds
        windows.append((start, last.ended_at))
        start = last.ended_at
    return windows


def place(at: float, windows: Sequence[tuple[float, float]]) -> int | None:
    """The index of the window holding ``at``, None outside them all."""
    if not windows or at < windows[0][0] or at > windows[-1][1]:
        return None
    return bisect.bisect_left([end for _, end in windows], at)


def _split(items: Iterable, at: Callable, windows) -> list[list]:
    out: list[list] = [[] for _ in windows]
    for item in items:
        index = place(at(item), windows)
        if index is not None:
            out[index].append(item)
    return out


def _values(samples: Iterable[Sample], name: str) -> list:
    return [getattr(s, name) for s in samples if getattr(s, name) is not None]


def tenths(batches: Sequence[BatchFigure], samples: Iterable[Sample], arrivals: Iterable[Arrival]) -> list[Tenth]:
    """The run's figures per tenth (``batches`` in the order they ran)."""
    batches = sorted(batches, key=lambda b: b.ended_at)
    groups = tenth_groups(len(batches))
    windows = tenth_windows(batches, groups)
    samples_in = _split(samples, lambda s: s.at, windows)
    arrivals_in = _split(arrivals, lambda a: a.received_at, windows)
    out = []
    for index, group in enumerate(groups):
        mine = [batches[i] for i in group]
        seconds = [b.seconds for b in mine]
        latencies = [a.latency for a in arrivals_in[index]]
        files = _values(samples_in[index], "audit_files")
        entries = _values(samples_in[index], "audit_log_entries")
        out.append(Tenth(
            index, mine[0].batch_id, mine[-1].batch_id, len(mine), median(seconds), p95(seconds),
            {step: median([b.steps[step] for b in mine if step in b.steps]) for step in STEPS},
            median(latencies), p95(latencies), median(_values(samples_in[index], "rss_mb")),
            median(_values(samples_in[index], "heap_mb")), files[-1] if files else None,
            entries[-1] if entries else None))
    return out


def targets(rows: Sequence[Tenth], *, audit_files_end: int | None, status_early: float | None,
            status_end: float | None, batches: int, status_early_batches: int) -> list[Target]:
    """The issue's target table from a run's tenths and closing figures."""
    first, last = (rows[0], rows[-1]) if rows else (None, None)

    def last_over_first(name: str) -> float | None:
        return None if first is None else ratio(getattr(last, name), getattr(first, name))

    def pair(name: str, unit: str, digits: int) -> str:
        if first is None:
            return ""
        values = [getattr(row, name) for row in (first, last)]
        return " -> ".join("-" if v is None else f"{v:.{digits}f}{unit}" for v in values)

    return [
        Target("median foreachBatch seconds, last tenth / first tenth", last_over_first("seconds_median"), 1.1,
               pair("seconds_median", " s", 2)),
        Target("median latency written -> received, last tenth / first tenth", last_over_first("latency_median"),
               1.1, pair("latency_median", " s", 2)),
        Target("resident memory of the job's processes, last tenth / first tenth", last_over_first("rss_mb"), 1.1,
               pair("rss_mb", " MB", 0)),
        Target(f"audit table data files after {batches} batches", audit_files_end, 50),
        Target(f"--status wall time after {batches} batches / after {status_early_batches}",
               ratio(status_end, status_early), 1.2,
               " -> ".join("-" if v is None else f"{v:.1f} s" for v in (status_early, status_end))),
    ]


def past_start(batches: Sequence[BatchFigure], rows: Sequence[Tenth]) -> Target | None:
    """The last tenth's median ``foreachBatch`` against the first tenth's second half: the first tenth also
    holds the job's start (the JVM's compiler warming up, the catch-up's larger batches, the early
    ``--status`` beside it), which flatters a ratio against it. A figure to read beside the targets, with the
    same limit; None for a run too short to have a second half."""
    batches = sorted(batches, key=lambda b: b.ended_at)
    groups = tenth_groups(len(batches))
    if not groups or len(groups[0]) < 2:
        return None
    half = [batches[i] for i in groups[0][len(groups[0]) // 2:]]
    settled, last = median([b.seconds for b in half]), rows[-1].seconds_median
    return Target(f"median foreachBatch seconds, last tenth / batches {half[0].batch_id}-{half[-1].batch_id} "
                  "(past the start)", ratio(last, settled), 1.1,
                  " -> ".join("-" if v is None else f"{v:.2f} s" for v in (settled, last)))


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


TENTH_HEADER = ["tenth", "batches", "fb med s", "fb p95 s", *(f"{s} s" for s in STEPS), "lat med s", "lat p95 s",
                "RSS MB", "heap MB", "audit files", "log entries"]


def tenth_cells(row: Tenth) -> list[str]:
    span = "-" if row.first_batch is None else f"{row.first_batch}-{row.last_batch}"
    return [str(row.index + 1), span, _cell(row.seconds_median), _cell(row.seconds_p95),
            *(_cell(row.steps_median[s]) for s in STEPS), _cell(row.latency_median), _cell(row.latency_p95),
            _cell(row.rss_mb, 0), _cell(row.heap_mb, 0), _cell(row.audit_files), _cell(row.audit_log_entries)]


TARGET_HEADER = ["measure", "value", "target", "met", "figures"]


def target_cells(target: Target) -> list[str]:
    met = {None: "-", True: "yes", False: "NO"}[target.met]
    value = "-" if target.value is None else (str(target.value) if isinstance(target.value, int)
                                              else f"{target.value:.2f}")
    return [target.measure, value, f"<= {target.limit:g}", met, target.detail]


def format_table(header: list[str], rows: list[list[str]]) -> list[str]:
    cells = [header] + rows
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
