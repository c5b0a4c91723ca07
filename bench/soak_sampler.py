"""What the soak benchmark reads from the running job (``bench/soak.py``), from outside its process.

- ``BatchLog``: the sink's one line per batch in the job's log file (``batch_id=... seconds=S (plan
  P, read+send R, aggregate A, record W)``), read as the file grows. The job already reports its
  step split there; nothing is added to the library for the bench.
- ``JobSampler``: every ``interval`` seconds the resident memory of the job's process tree (its
  Python driver, the JVM, PySpark's daemon and workers: ``VmRSS`` from /proc, summed) and the files
  of the state tables on disk; every ``heap_interval`` seconds the JVM's heap after a full GC
  (``jcmd <pid> GC.run``, then ``GC.heap_info``).
"""
from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import threading
import time
from pathlib import Path

from soak_report import BatchFigure, Sample
from tools.testing import process_tree

# The sink's batch line (``sink.foreach_batch``), after the log format's time, level and logger name.
BATCH_LINE = re.compile(r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ \S+: batch_id=(?P<batch>\d+) .*"
                        r"\bseconds=(?P<seconds>[\d.]+) \((?P<steps>[^)]*)\)\s*$")
# The job's state under its state folder (``bench/soak.py`` configures the job with these).
AUDIT_TABLE, CHECKPOINT_TABLE, STREAMING_CHECKPOINT = "audit", "checkpoint", "checkpoint-stream"
# The job's processes by kind, for ``Sample.rss_parts``: the job's own (the Python driver), the JVM, and every
# other (PySpark's daemon and Python workers, the streaming source's planner).
RSS_DRIVER, RSS_JVM, RSS_PYTHON_WORKERS = "python driver", "jvm", "python workers"
HEAP_USED = re.compile(r"total \d+K, used (\d+)K")  # a generation's (serial, parallel) or G1's whole heap


def parse_batch_line(line: str) -> BatchFigure | None:
    match = BATCH_LINE.match(line)
    if match is None:
        return None
    steps = {}
    for part in filter(None, (p.strip() for p in match["steps"].split(","))):
        name, _, seconds = part.rpartition(" ")
        steps[name] = float(seconds)
    ended = dt.datetime.strptime(match["time"], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logged
    return BatchFigure(int(match["batch"]), ended, float(match["seconds"]), steps)


class BatchLog:
    """The batches logged so far in ``path`` (read on each ``read()`` from where the last one stopped)."""

    def __init__(self, path: Path, marks: tuple[str, ...] = ()):
        self.path, self.marks = path, marks
        self.batches: list[BatchFigure] = []
        self.seen: set[str] = set()  # those of ``marks`` some line held
        self._offset = 0
        self._partial = b""

    def read(self) -> list[BatchFigure]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return self.batches
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            line = raw.decode(errors="replace")
            figure = parse_batch_line(line)
            if figure is not None:
                self.batches.append(figure)
            self.seen.update(mark for mark in self.marks if mark in line)
        return self.batches

    def saw(self, mark: str) -> bool:
        """Whether a line so far held ``mark`` (one of ``marks``)."""
        self.read()
        return mark in self.seen


def rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), None)


def is_jvm(pid: int) -> bool:
    try:
        program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return program.endswith(b"/java") or program == b"java"


def heap_after_gc_mb(pid: int) -> float | None:
    """The JVM's heap in use right after a full collection (None where jcmd cannot reach it)."""
    try:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60, check=True)
        info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return heap_used_mb(info)


def heap_used_mb(heap_info: str) -> float | None:
    """The heap in use in ``jcmd <pid> GC.heap_info``'s answer: its generations' (or G1's heap's) ``used``."""
    used = [int(k) for k in HEAP_USED.findall(heap_info)]
    return sum(used) / 1024 if used else None


def table_files(table: Path) -> tuple[int, int]:
    """(data files, _delta_log entries) of a Delta table on disk; Hadoop's hidden .crc files not counted."""
    if not table.exists():
        return 0, 0
    log = table / "_delta_log"
    data = sum(1 for p in table.rglob("*.parquet") if log not in p.parents and not p.name.startswith("."))
    entries = sum(1 for p in log.rglob("*") if p.is_file() and not p.name.startswith(".")) if log.exists() else 0
    return data, entries


class LiveFiles:
    """The data files a Delta table holds now (what a reader lists and opens), from its ``_delta_log``:
    each commit's ``add`` and ``remove`` actions replayed in version order, each commit read once.

    Not the files on disk: a compaction removes its small files from the table at once, but they stay
    on disk until ``VACUUM`` deletes them (a day later). The replay starts at version 0, which the log
    keeps until the day after next (Delta drops expired entries a whole day at a time), longer than a soak."""

    def __init__(self, table: Path):
        self.log = table / "_delta_log"
        self.live: set[str] = set()
        self.next_version = 0

    def count(self) -> int:
        while (commit := self.log / f"{self.next_version:020d}.json").exists():
            for line in commit.read_text().splitlines():
                action = json.loads(line) if line.strip() else {}
                if "add" in action:
                    self.live.add(action["add"]["path"])
                elif "remove" in action:
                    self.live.discard(action["remove"]["path"])
            self.next_version += 1
        return len(self.live)


def folder_files(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")) if folder.exists() else 0


def state_files(state: Path) -> dict[str, int]:
    """The files of the job's other state (``bench/soak.py``'s layout under ``state``) that may grow with
    its batches: the checkpoint table's, and the streaming checkpoint's offsets and commits."""
    data, entries = table_files(state / CHECKPOINT_TABLE)
    stream = state / STREAMING_CHECKPOINT
    return {"checkpoint data files": data, "checkpoint log entries": entries,
            "streaming offsets": folder_files(stream / "offsets"), "streaming commits": folder_files(stream / "commits")}


class JobSampler:
    """Samples the job rooted at ``root`` (its state under ``state``) in a background thread until ``stop()``."""

    def __init__(self, root: int, state: Path, *, interval: float, heap_interval: float):
        self.root, self.state = root, state
        self.interval, self.heap_interval = interval, heap_interval
        self.samples: list[Sample] = []
        self._audit = LiveFiles(state / AUDIT_TABLE)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        next_heap = time.monotonic() + self.heap_interval
        while not self._done.wait(self.interval):
            heap = time.monotonic() >= next_heap
            if heap:
                next_heap = time.monotonic() + self.heap_interval
            self.samples.append(self.sample(heap=heap))

    def sample(self, *, heap: bool) -> Sample:
        pids = [self.root, *process_tree(self.root)]
        parts: dict[str, float] = {}
        for pid in pids:
            size = rss_mb(pid)
            if size is not None:
                kind = RSS_DRIVER if pid == self.root else RSS_JVM if is_jvm(pid) else RSS_PYTHON_WORKERS
                parts[kind] = parts.get(kind, 0.0) + size
        heap_mb = None
        if heap:
            jvm = next((pid for pid in pids if is_jvm(pid)), None)
            heap_mb = heap_after_gc_mb(jvm) if jvm is not None else None
        on_disk, entries = table_files(self.state / AUDIT_TABLE)
        return Sample(time.time(), sum(parts.values()) if parts else None, heap_mb, self._audit.count(), entries,
                      {**state_files(self.state), "audit data files on disk": on_disk}, parts)
