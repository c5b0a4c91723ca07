"""Available-now batches and a send task's Python worker peak memory, on this interpreter's pyspark.

How the syphon splits an available-now run into micro-batches, and how much memory the Python worker
of a send task needs, on the pyspark of the interpreter that runs this file.

    PYTHONPATH=lib .venv/bin/python bench/bench_runtime.py [--messages 30000] [--per-trigger 5000] \\
        [--windows 20000 200000] [--skip-batches] [--skip-memory] [--json PATH]

Run it with each Spark line's interpreter (``.venv`` for Spark 4.2, ``.venv-spark4.0``, ``.venv-spark4.1``)
to compare them. Everything runs in this process and the one JVM it starts: each measurement gets a
fresh emulator of conf/emulator.yaml (ephemeral ports, no added latency), a fresh temporary folder for
the Delta state, and a fresh Spark session (``build_spark_session``, a new SparkContext in the same
JVM, so fresh PySpark daemons and workers), stopped after it. The backlog is written with
``tools.backlog_writer.write_backlog`` before any clock starts: legacy copies of messages with 256-byte
bodies, for "payments" and "orders" alternately. Then one available-now run (``run_syphon``,
conf/local.yaml with the state in the temporary folder).

1. Batches (``--messages`` N over the 10 backlog queues, ``run.max_messages_per_trigger`` =
   ``--per-trigger`` M): the micro-batches of the run and the size of each (``numInputRows`` of each
   batch id, from the query's progress). Spark 4.2 bounds an available-now run's batches by M itself;
   Spark 4.0/4.1 have no read limits for Python sources, and the syphon plays the run there in bounded
   batches (``start_syphon``). Expect about N / M batches (a few more where the queues' shares of a
   trigger leave some short), none larger than M.
2. Memory (one run per ``--windows`` W: W messages all in backlog queue 0, M = W, so one batch whose
   one send task delivers the whole window): the peak resident set of the PySpark Python processes.
   A sampler thread reads, every 0.2 s, ``VmHWM`` (/proc/<pid>/status, the kernel's peak RSS) of every
   descendant of this process run as ``python -m pyspark.<module>`` (the daemon, the workers it forks,
   and the source's and planner's own Python runners) and keeps the largest value per process and
   overall. A forked worker's VmHWM starts from its daemon's size at the fork: it is reported as it is.
   The overall peak is normally a forked ``pyspark.worker`` (workers are reused, so the one that ran
   the send task may have run other tasks of the run too); the report names the process. A flat
   ratio between windows means the worker's memory does not grow with the window; a ratio near the
   windows' ratio means it holds the whole window.

The wall time is that of ``run_syphon`` (lease, pre-flight, every batch, the closing count of what
is left); the Spark session's start is shown apart. Every run must end drained (``summary.drained``)
with every message arrived at its destination (the emulator's ``in`` counters of "payments" and
"orders"); otherwise the figures are still shown, marked FAILED, and the bench exits 1. Linux only.
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "lib"), str(ROOT / "emulator" / "src"), str(ROOT)]  # tools/ lives under ROOT

from syphon_bench.rows import PRIMARY, SECONDARY  # noqa: E402 - this file's neighbour
from syphon_bench.syphon_run import peak_rss_mb, syphon_overrides  # noqa: E402
from tools.testing import emulator_environment, process_tree  # noqa: E402
DESTINATIONS = ("payments", "orders")  # conf/emulator.yaml's plain queues, used alternately
BACKLOG_QUEUES = 10  # conf/emulator.yaml's backlog queues, conf/local.yaml's backlog.queue_count
BODY_SIZE = 256
WRITE_CHUNK = 20_000  # messages per write_backlog call (each sends its queues in full batches)
SAMPLE_SECONDS = 0.2


@dataclass
class WorkerPeak:
    """The largest VmHWM seen of one PySpark Python process."""

    pid: int
    module: str  # ``pyspark_module`` (a forked worker shows its daemon's)
    forked: bool  # its parent is a PySpark Python process too (a worker forked by the daemon)
    peak_mb: float = 0.0

    def describe(self) -> str:
        return f"pid {self.pid}, {self.module}{' (forked worker)' if self.forked else ''}"


@dataclass
class RunResult:
    """One available-now run of the syphon and what the emulator saw of it."""

    messages: int
    queues: int
    per_trigger: int
    session_seconds: float  # building the Spark session
    run_seconds: float  # run_syphon, start to return
    batches: list[tuple[int, int]]  # (batch id, numInputRows)
    drained: bool
    arrived: int
    dead_lettered: int
    workers: list[WorkerPeak] = field(default_factory=list)

    @property
    def failure(self) -> str | None:
        if self.drained and self.arrived == self.messages:
            return None
        return (f"drained={self.drained}, destinations received {self.arrived} of {self.messages}, "
                f"{self.dead_lettered} dead-lettered in the backlog queues")

    @property
    def peak(self) -> WorkerPeak | None:
        return max(self.workers, key=lambda w: w.peak_mb, default=None)

    def outcome(self) -> str:
        return (f"run_syphon {self.run_seconds:.1f} s (Spark session {self.session_seconds:.1f} s before it); "
                f"drained {'yes' if self.drained else 'NO'}; arrived {self.arrived:,} of {self.messages:,}"
                + (f"; FAILED: {self.failure}" if self.failure else ""))


# --- PySpark Python processes under this one ------------------------------------------------------

def pyspark_module(pid: int) -> str | None:
    """What follows ``-m`` on a process's command line when it runs a ``pyspark.*`` module (a daemon
    shows the worker module it serves, e.g. ``pyspark.daemon pyspark.worker``), else None."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    module = next((" ".join(filter(None, args[i + 1:])) for i, arg in enumerate(args[:-1]) if arg == "-m"), "")
    return module if module.startswith("pyspark.") else None


class WorkerSampler:
    """Every ``SAMPLE_SECONDS`` (and once more on ``stop``), the VmHWM of each PySpark Python process
    descending from this process; keeps the largest value per process."""

    def __init__(self):
        self.peaks: dict[int, WorkerPeak] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-sampler", daemon=True)

    def __enter__(self) -> WorkerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sampling (the processes must still run: call it before the Spark session stops)."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.sample()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.sample()

    def sample(self) -> None:
        parents = process_tree(os.getpid())
        modules = {pid: module for pid in parents if (module := pyspark_module(pid))}
        for pid, module in modules.items():
            peak = peak_rss_mb(pid)
            if peak is None:
                continue
            known = self.peaks.setdefault(pid, WorkerPeak(pid, module, parents.get(pid) in modules))
            known.peak_mb = max(known.peak_mb, peak)


# --- one run --------------------------------------------------------------------------------------

def originals(start: int, stop: int):
    """Messages ``start`` to ``stop`` of the backlog: 256-byte bodies, payments and orders alternately."""
    from tools.backlog_writer import OriginalMessage

    for index in range(start, stop):
        body = (f"message {index} ".encode() * BODY_SIZE)[:BODY_SIZE]
        yield OriginalMessage(DESTINATIONS[index % 2], body, message_id=f"bench-runtime-{index}")


def write_messages(emu, config, messages: int, queues: int) -> None:
    """Write the backlog in chunks of ``WRITE_CHUNK`` (each batched by the writer), showing progress."""
    from tools.backlog_writer import write_backlog

    began = time.perf_counter()
    per_queue: collections.Counter = collections.Counter()
    for start in range(0, messages, WRITE_CHUNK):
        stop = min(messages, start + WRITE_CHUNK)
        per_queue.update(write_backlog(config.secondary, PRIMARY, originals(start, stop), queue_count=queues))
        elapsed = time.perf_counter() - began
        print(f"    wrote {stop:,} of {messages:,} messages ({stop / elapsed:.0f} msg/s)", flush=True)
    stored = sum(emu.stats(SECONDARY)[queue]["total"] for queue in per_queue)
    if stored != messages:
        raise SystemExit(f"the backlog queues hold {stored} messages after writing {messages}")
    print(f"    backlog: {len(per_queue)} queue(s), {min(per_queue.values()):,} to {max(per_queue.values()):,} "
          f"messages each", flush=True)


def syphon_config(emu, state: Path, per_trigger: int):
    """conf/local.yaml on this emulator, with the Delta state under ``state`` and ``per_trigger`` per trigger."""
    from backlog_syphon.config import load_config

    environ = emulator_environment(emu, PRIMARY, SECONDARY)
    overrides = syphon_overrides(state, **{"run.max_messages_per_trigger": per_trigger})
    return load_config(ROOT / "conf/local.yaml", environ=environ, overrides=overrides)


def batch_sizes(query) -> list[tuple[int, int]]:
    """(batch id, numInputRows) per micro-batch, from the query's progress (the first report of each id)."""
    sizes: dict[int, int] = {}
    for progress in query.recentProgress:
        sizes.setdefault(progress.batchId, progress.numInputRows)
    return sorted(sizes.items())


def measure(messages: int, queues: int, per_trigger: int) -> RunResult:
    """Write the backlog, then one available-now run in a fresh Spark session, its Python workers sampled."""
    from backlog_syphon.run.spark_session import build_spark_session
    from backlog_syphon.run.syphon import run_syphon
    from servicebus_emulator import Emulator, load_config

    with Emulator(load_config(ROOT / "conf/emulator.yaml"), ports={PRIMARY: 0, SECONDARY: 0}) as emu, \
            tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        config = syphon_config(emu, Path(tmp), per_trigger)
        write_messages(emu, config, messages, queues)
        started = []
        with WorkerSampler() as sampler:
            began = time.perf_counter()
            spark = build_spark_session("bench-runtime",
                                        extra_conf={"spark.sql.streaming.numRecentProgressUpdates": "100000"})
            try:
                if spark.sparkContext.getConf().contains("spark.executor.pyspark.memory"):
                    raise SystemExit("spark.executor.pyspark.memory is set (spark-defaults?): it would cap the "
                                     "Python workers this bench measures")
                session_ready = time.perf_counter()
                summary = run_syphon(spark, config, on_start=started.append,
                                     on_progress=lambda line: print(f"    {line}", flush=True))
                run_seconds = time.perf_counter() - session_ready
                batches = batch_sizes(started[0].query)
                sampler.stop()
            finally:
                spark.stop()
        primary, secondary = emu.stats(PRIMARY), emu.stats(SECONDARY)
        arrived = sum(primary[destination]["in"] for destination in DESTINATIONS)
        dead = sum(secondary[f"{PRIMARY}/x-servicebus-transfer/{index}"].get("dead_letter_count", 0)
                   for index in range(queues))
    return RunResult(messages, queues, per_trigger, session_ready - began, run_seconds, batches, summary.drained,
                     arrived, dead, sorted(sampler.peaks.values(), key=lambda w: -w.peak_mb))


# --- the bench ------------------------------------------------------------------------------------

def batches_line(result: RunResult) -> str:
    sizes = [rows for _, rows in result.batches]
    largest = max(sizes, default=0)
    bound = "within" if largest <= result.per_trigger else "LARGER THAN"
    return (f"{len(sizes)} micro-batches of {', '.join(f'{n:,}' for n in sizes)} messages (largest {largest:,}, "
            f"{bound} {result.per_trigger:,} per trigger)")


def memory_line(result: RunResult) -> str:
    peak = result.peak
    if peak is None:
        return "no PySpark Python process seen"
    return (f"peak PySpark Python worker {peak.peak_mb:.0f} MB ({peak.describe()}; "
            f"{len(result.workers)} PySpark Python processes seen)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import pyspark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    header = (f"pyspark {pyspark.__version__} (Python {sys.version.split()[0]}, {sys.executable}); "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print(header, flush=True)

    batches = None
    if not args.skip_batches:
        print(f"batches: {args.messages:,} messages over {BACKLOG_QUEUES} queues, {args.per_trigger:,} per trigger",
              flush=True)
        batches = measure(args.messages, BACKLOG_QUEUES, args.per_trigger)
        print(f"    {batches_line(batches)}; {batches.outcome()}", flush=True)
    memory = []
    for window in [] if args.skip_memory else args.windows:
        print(f"memory: window {window:,} (all in 1 queue, {window:,} per trigger)", flush=True)
        memory.append(measure(window, 1, window))
        print(f"    {memory_line(memory[-1])}; {memory[-1].outcome()}", flush=True)

    lines = [header]
    if batches:
        lines.append(f"batches ({batches.messages:,} messages, {BACKLOG_QUEUES} queues): {batches_line(batches)}; "
                     f"{batches.outcome()}")
    for result in memory:
        lines.append(f"memory (window {result.messages:,}): {memory_line(result)}; {result.outcome()}")
    peaks = [(r.messages, r.peak.peak_mb) for r in memory if r.peak]
    if len(peaks) >= 2:
        smallest, base = min(peaks)
        lines += [f"memory: peak ratio {size:,} / {smallest:,}: {peak / base:.2f} (windows' ratio "
                  f"{size / smallest:g})" for size, peak in peaks if size != smallest]
    runs = ([("batches", batches)] if batches else []) + [(f"window {r.messages:,}", r) for r in memory]
    failures = [f"{name}: {run.failure}" for name, run in runs if run.failure]
    print("\n" + "\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"pyspark": pyspark.__version__, "args": vars(args),
                                         "batches": asdict(batches) if batches else None,
                                         "memory": [asdict(r) for r in memory], "failures": failures},
                                        indent=2, default=str))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=30_000, help="backlog of the batches run (default 30000)")
    p.add_argument("--per-trigger", type=int, default=5_000,
                   help="run.max_messages_per_trigger of the batches run (default 5000)")
    p.add_argument("--windows", type=int, nargs="+", default=[20_000, 200_000], metavar="W",
                   help="window sizes of the memory runs (default 20000 200000)")
    p.add_argument("--skip-batches", action="store_true", help="no batches run")
    p.add_argument("--skip-memory", action="store_true", help="no memory runs")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    args = p.parse_args(argv)
    if min(args.messages, args.per_trigger, *args.windows) < 1:
        p.error("--messages, --per-trigger and --windows must be positive")
    return args


if __name__ == "__main__":
    sys.exit(main())
