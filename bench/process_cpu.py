"""CPU seconds of a process and everything it starts, per process, sampled from /proc (Linux).

The syphon's work is spread over processes that come and go: the driver's Python, the JVM, PySpark's
worker daemon and the Python workers it forks (executor tasks, the streaming source's planner).
``CpuSampler`` walks the tree every ``interval`` seconds and keeps each process's last
``utime + stime``: its own CPU, never its reaped children's (those are counted as themselves), so
nothing is counted twice. What a process spends after its last sample is missed (at most one
interval each); Spark reuses its Python workers, so few processes are that short-lived. A process
seen once stays followed when its parent exits (the JVM of a driver that has exited, while it shuts
down): ``wait_for_exit`` waits for those before the last sample.
"""
from __future__ import annotations

import collections
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tools.testing import process_tree

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcessCpu:
    pid: int
    role: str
    seconds: float


def _stat(pid: int) -> list[str] | None:
    """proc(5)'s stat fields of a process after its name (the state first), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    """``utime + stime`` of a live process, None once it is gone."""
    fields = _stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / TICKS  # fields 14 and 15 of proc(5)


def running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def role_of(pid: int, parent: int | None, root: int, roles: dict[int, str]) -> str:
    """What a process is, from its command line and its parent's role."""
    if pid == root:
        return "driver (python)"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return roles.get(pid, "gone")
    if not argv[0]:
        return roles.get(pid, "?")  # a zombie: its command line is gone, its role was seen before
    program = os.path.basename(argv[0].decode(errors="replace"))
    if program == "java":
        return "JVM"
    if b"pyspark.daemon" in argv:
        return "python worker" if roles.get(parent) in ("worker daemon", "python worker") else "worker daemon"
    if b"-m" in argv:
        return f"python -m {argv[argv.index(b'-m') + 1].decode(errors='replace')}"
    return program


class CpuSampler:
    """Samples the CPU of ``root`` and its descendants in a background thread until ``stop()``; ``own_seconds``:
    the CPU that thread took itself (known once stopped)."""

    def __init__(self, root: int, interval: float = 0.2):
        self.root, self.interval = root, interval
        self._last: dict[int, float] = {}
        self._roles: dict[int, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self.own_seconds = 0.0
        self._threads: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, tid) -> (name, CPU s): JVMs' threads
        self._series: list[tuple[float, float]] = []  # (epoch seconds, total CPU s) of each sample

    def __enter__(self) -> "CpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._done.wait(self.interval):
                self.own_seconds = time.thread_time()  # this thread's CPU: the sampling's cost, not the run's
                return

    def sample(self) -> None:
        tree = {self.root: None, **process_tree(self.root)}
        for pid in [*tree, *(pid for pid in list(self._last) if pid not in tree)]:
            seconds = cpu_seconds(pid)
            if seconds is None:
                continue
            if pid in tree:  # asked again each time: spark-submit is a shell script until it execs the JVM
                self._roles[pid] = role_of(pid, tree[pid], self.root, self._roles)
            self._last[pid] = seconds
            if self._roles.get(pid) == "JVM":
                self._threads.update(thread_cpu(pid))
        self._series.append((time.time(), self.total()))

    def wait_for_exit(self, timeout: float = 60.0) -> None:
        """Wait (at most ``timeout`` s) until every process seen has exited, e.g. a JVM that shuts
        down after the driver that started it has gone; then take the last sample."""
        deadline = time.monotonic() + timeout
        while any(running(pid) for pid in list(self._last)) and time.monotonic() < deadline:
            time.sleep(self.interval)
        self.sample()

    def processes(self) -> list[ProcessCpu]:
        return sorted((ProcessCpu(pid, self._roles[pid], s) for pid, s in self._last.items()),
                      key=lambda p: -p.seconds)

    def by_role(self) -> dict[str, tuple[int, float]]:
        """Role -> (processes, CPU seconds), most CPU first."""
        count: collections.Counter = collections.Counter()
        seconds: collections.Counter = collections.Counter()
        for process in self.processes():
            count[process.role] += 1
            seconds[process.role] += process.seconds
        return {role: (count[role], total) for role, total in seconds.most_common()}

    def total(self) -> float:
        return sum(self._last.values())

    def total_at(self, epoch: float) -> float:
        """The processes' CPU seconds as sampled last at or before ``epoch`` (0 before the first sample)."""
        return max((total for at, total in self._series if at <= epoch), default=0.0)

    def jvm_threads(self) -> dict[str, float]:
        """The JVMs' CPU seconds by kind of thread (its name, numbers left out: ``C1 CompilerThre``, ``VM
        Thread`` (the serial collector's work), ``Executor task la``...), most first; a thread's CPU as last seen."""
        by_kind: collections.Counter = collections.Counter()
        for name, seconds in self._threads.values():
            by_kind[re.sub(r"\d+", "N", name)] += seconds
        return dict(by_kind.most_common())


def thread_cpu(pid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """Each live thread of ``pid``: its name (``comm``, 15 characters at most) and ``utime + stime``."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[(pid, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / TICKS)
    return out


class OwnCpu:
    """The CPU this process takes meanwhile (``os.times``: every thread's, user and system), for the part of
    it that is neither the bench's sampling nor its bookkeeping: the emulator's, when it runs in here."""

    def __enter__(self) -> "OwnCpu":
        self._began = _own_seconds()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = _own_seconds() - self._began


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system
