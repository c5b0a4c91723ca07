"""The syphon against a plain SDK loop at real network latency, with the emulator's ceiling, memory and idle cost.

    PYTHONPATH=lib:emulator/src PYSPARK_PYTHON=$PWD/.venv/bin/python \\
        .venv/bin/python bench/bench_syphon.py [--quick] [--json PATH]

Every measurement gets a fresh emulator of conf/emulator.yaml, run in this process on ephemeral
ports on 127.0.0.1 with the row's latency, and a legacy backlog written before any clock starts
(``backlog_writer.realistic_backlog`` with 1 KB bodies, ``write_backlog`` over 10 backlog queues,
or with 1 all into queue 0). The movers run in child processes, which get the two connection
strings by environment (the variables conf/local.yaml reads):

- plain loop: one process, one client per namespace; per backlog queue, PeekLock receives of 100,
  then for each message one ``send_messages`` of its body to ``x-ms-path`` with the session id of
  ``x-ms-sessionid``, then ``complete_message`` for each. It knows how many messages each queue
  holds (what an operator reads from the queue) and never asks for more, so it never waits on an
  empty or short queue. It is bounded by time (``--loop-seconds``): it stops after the page in
  flight, and its rate is what it moved in the time it ran.
- syphon: a fresh Python driver and JVM per run: ``build_spark_session``, then ``run_syphon``
  (available-now) with conf/local.yaml as a new user has it (``--max-per-trigger`` overrides its
  ``run.max_messages_per_trigger``) and Delta state in a temporary folder.
- emulator ceiling: ``bench_emulator.ceiling`` at each latency: the same broker work (batched send,
  peeks of 250, PeekLock receives of 100 with one bulk completion each) from one SDK client process.

The figures:

- latency: one way; the emulator adds twice this to every client round trip (its ``latency_ms``).
- loop msg/s: messages the loop moved / its wall time (clients opened included); ``*`` marks a
  loop that stopped at its time bound.
- syphon e2e msg/s: messages / time from just before the Spark session is built to the return of
  ``run_syphon`` (JVM start, Delta tables, pre-flight, every batch and the closing count of what is
  left in the backlog queues).
- steady msg/s: input rows / ``batchDuration`` summed over the batches after the first non-empty
  one (``query.recentProgress``); the first batch carries the JIT warm-up and first table reads.
  "-" when the run had a single non-empty batch. With 6,000 messages and 5,000 per trigger that
  is one batch of 1,000, so per-batch costs weigh more than in a long run; the memory runs' steady
  rates (full batches of 5,000) show the long-run figure at 0 ms.
- e2e/loop: syphon e2e / loop at the same latency and queue count.
- steady/ceiling: steady / the emulator's combined ceiling at the same latency (see bench_emulator).
- ops/msg: the emulator's ``ops`` counters summed over both namespaces and every entity, from just
  before the mover's process starts to its exit, / messages moved. They count what the emulator
  did: a batched send counts ``send`` and ``send_batch``, a bulk completion ``update_disposition``
  once and ``complete`` per message, a receive one per message delivered, plus link attaches.
- driver peak MB: the peak resident set (``VmHWM`` in /proc, read once ``run_syphon`` has returned) of
  the driver's Python process (it calls ``run_syphon`` and runs ``foreachBatch``) and of the driver
  JVM (in local mode it hosts the executors too). The Python workers Spark starts (executor reads,
  the source's driver-side methods) are in neither. Linux only ("-" elsewhere).
- CPU s per 1k msgs: ``utime + stime`` of the syphon's child process and every process under it (the
  JVM, PySpark's daemon and workers), sampled every 0.2 s (``process_cpu.CpuSampler``), per 1,000
  messages. The profile run (``--profile-messages``, 50,000 at 0 ms) lists it per kind of process and
  per process.
- memory: the syphon at 20,000 and 100,000 messages (latency 0, 10 queues, 5,000 per trigger):
  both peaks and their ratio (flat means within 10%).
- idle: a continuous run (trigger "1 second") on empty backlog queues with a short
  ``run.idle_probe_max_seconds``; after a warm-up of three probe intervals, the broker operations
  over six intervals, per backlog queue per hour; checked against one peek per queue per interval,
  then projected to ``RunConfig().idle_probe_max_seconds`` by the ratio of the two intervals.

A syphon run that does not end drained with every message arrived at its destination (the
emulator's counters) fails the bench: its figures are still shown, with what went wrong (the
dead-letter reasons, peeked), and the bench exits 1 at the end. A loop whose arrivals differ from
what it reports, a child that crashes or times out, stop the bench at once (exit 1).
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench_emulator and process_cpu sit next to this file (the script's folder is on the path); tools/ is under ROOT.
sys.path[:0] = [str(ROOT / "lib"), str(ROOT / "emulator" / "src"), str(ROOT)]

from process_cpu import CpuSampler  # noqa: E402  (after the path: it imports tools.testing)

PRIMARY, SECONDARY = "contoso", "contoso-secondary"
CONNECTION_ENV = {PRIMARY: "SYPHON_PRIMARY_CONNECTION_STRING", SECONDARY: "SYPHON_SECONDARY_CONNECTION_STRING"}
BACKLOG_QUEUES = 10  # conf/emulator.yaml's backlog queues, conf/local.yaml's backlog.queue_count
RECEIVE_PAGE = 100
IDLE_TRIGGER = "1 second"
MEMORY_PER_TRIGGER = 5000


class BenchFailure(RuntimeError):
    """A measurement that cannot be trusted: the bench stops with exit code 1."""


@dataclass(frozen=True)
class Row:
    """One latency and queue count: the loop, the syphon and the ceiling measured in this run."""

    one_way_ms: float
    queues: int
    messages: int
    loop_rate: float
    loop_moved: int
    loop_time_bound: bool
    loop_ops_per_msg: float
    e2e_rate: float
    steady_rate: float | None
    ceiling_rate: float
    ops_per_msg: float
    python_peak_mb: float | None
    jvm_peak_mb: float | None
    cpu_per_1000: float

    def cells(self) -> list[str]:
        steady = "-" if self.steady_rate is None else f"{self.steady_rate:.0f}"
        share = "-" if self.steady_rate is None else f"{self.steady_rate / self.ceiling_rate:.2f}"
        return [f"{self.one_way_ms:g} ms", str(self.queues), str(self.messages),
                f"{self.loop_rate:.0f}{'*' if self.loop_time_bound else ''}", f"{self.e2e_rate:.0f}", steady,
                f"{self.e2e_rate / self.loop_rate:.2f}", share,
                f"{self.ops_per_msg:.2f} / {self.loop_ops_per_msg:.2f}",
                f"{megabytes(self.python_peak_mb, '')} / {megabytes(self.jvm_peak_mb, '')}",
                f"{self.cpu_per_1000:.2f}"]


COLUMNS = ["latency", "queues", "msgs", "loop msg/s", "syphon e2e msg/s", "steady msg/s", "e2e/loop",
           "steady/ceiling", "ops/msg syphon / loop", "driver peak MB python / jvm", "CPU s per 1k msgs"]


# --- the emulator, the backlog and the counters (this process) -----------------------------------

@contextmanager
def backlog_emulator(one_way_ms: float, messages: int, queues: int, args):
    """A fresh emulator whose backlog queues hold ``messages`` legacy messages over ``queues`` queues."""
    from tools.backlog_writer import realistic_backlog, write_backlog
    from backlog_syphon.config import load_config as load_syphon_config
    from servicebus_emulator import Emulator, load_config

    with Emulator(load_config(ROOT / "conf/emulator.yaml"), ports={PRIMARY: 0, SECONDARY: 0},
                  latency_ms=2 * one_way_ms) as emu:
        if messages:
            config = load_syphon_config(ROOT / "conf/local.yaml", environ=connection_env(emu))
            with batch_headroom():
                written = write_backlog(config.secondary, config.primary.namespace,
                                        realistic_backlog(messages, seed=args.seed, body_size=args.body_size),
                                        queue_count=queues, seed=args.seed)
            if backlog_left(emu) != (messages, 0):
                raise BenchFailure(f"the backlog holds {backlog_left(emu)} (stored, dead-lettered) after "
                                   f"writing {messages} messages")
        else:
            written = {}
        yield emu, written


@contextmanager
def batch_headroom(headroom_bytes: int = 1024):
    """Batches created in this process stay ``headroom_bytes`` under the link's limit meanwhile.

    azure-servicebus 7.15.0 counts a batch's size before it sets the envelope's own properties (the
    first message's MessageId and SessionId), and the backlog writer keeps the same count, so a batch
    filled to within a few bytes of the limit is refused (``MessageSizeExceededError``). Only the
    backlog writing (never measured) runs here; the movers run in their own processes, untouched
    (the syphon's own batched sends are measured as they are).
    """
    from azure.servicebus import ServiceBusSender

    create = ServiceBusSender.create_message_batch

    def with_headroom(sender, *args, **kwargs):
        batch = create(sender, *args, **kwargs)
        batch._max_size_in_bytes -= headroom_bytes  # noqa: SLF001
        return batch

    ServiceBusSender.create_message_batch = with_headroom
    try:
        yield
    finally:
        ServiceBusSender.create_message_batch = create


def connection_env(emu) -> dict[str, str]:
    return {variable: emu.connection_string(namespace) for namespace, variable in CONNECTION_ENV.items()}


def backlog_queue_names() -> list[str]:
    return [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(BACKLOG_QUEUES)]


def broker_ops(emu) -> collections.Counter:
    """Every entity's ``ops`` counters in both namespaces, summed per kind of operation."""
    total: collections.Counter = collections.Counter()
    for namespace in CONNECTION_ENV:
        for entity in emu.stats(namespace).values():
            total.update(entity.get("ops", {}))
    return total


def arrivals(emu) -> int:
    """Messages the primary namespace's queues and topics have taken in so far."""
    primary = next(ns for ns in emu.config.namespaces if ns.name == PRIMARY)
    stats = emu.stats(PRIMARY)
    return sum(stats[entity.name]["in"] for entity in [*primary.queues, *primary.topics])


def backlog_left(emu) -> tuple[int, int]:
    """(messages stored, messages dead-lettered) over the backlog queues."""
    stats = emu.stats(SECONDARY)
    queues = [stats[name] for name in backlog_queue_names()]
    return sum(q["total"] for q in queues), sum(q.get("dead_letter_count", 0) for q in queues)


# --- child processes ------------------------------------------------------------------------------

@contextmanager
def child_process(role: str, spec: dict, emu, workdir: Path):
    """This script as ``role`` (loop or syphon) with ``spec``; its output goes to ``<role>.log``.

    The child runs in its own session (so that its JVM goes with it): on any error here, a timeout
    or Ctrl-C included, the whole group is killed.
    """
    env = {**os.environ, **connection_env(emu),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "lib"), str(ROOT / "emulator" / "src"),
                                                       os.environ.get("PYTHONPATH")])),
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    command = [sys.executable, __file__, "--child", role, "--spec", json.dumps(spec),
               "--result", str(workdir / f"{role}.json")]
    with open(workdir / f"{role}.log", "w") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                                 start_new_session=True)
    try:
        yield child
    except BaseException:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        raise


def child_result(child: subprocess.Popen, role: str, workdir: Path, timeout: float) -> dict:
    """The child's result, with ``exited_at``: when this process saw it end (epoch seconds)."""
    try:
        code = child.wait(timeout)
        exited_at = time.time()
    except subprocess.TimeoutExpired:
        raise BenchFailure(f"{role}: still running after {timeout:.0f} s; killed. Log:\n{log_tail(workdir, role)}") \
            from None
    result = workdir / f"{role}.json"
    if code != 0 or not result.exists():
        raise BenchFailure(f"{role}: exit code {code}. Log:\n{log_tail(workdir, role)}")
    return {**json.loads(result.read_text()), "exited_at": exited_at}


def log_tail(workdir: Path, role: str, lines: int = 40) -> str:
    return "\n".join((workdir / f"{role}.log").read_text(errors="replace").splitlines()[-lines:])


def loop_child(spec: dict) -> dict:
    """The plain SDK loop (child process): receive 100, send each restored message, complete each."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

    start = time.perf_counter()
    deadline = start + spec["max_seconds"]
    moved = 0
    with ServiceBusClient.from_connection_string(os.environ[CONNECTION_ENV[SECONDARY]]) as backlog, \
            ServiceBusClient.from_connection_string(os.environ[CONNECTION_ENV[PRIMARY]]) as primary:
        senders = {}
        try:
            for queue, count in spec["written"].items():
                if time.perf_counter() >= deadline:
                    break
                with backlog.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK) as receiver:
                    left = count
                    while left and time.perf_counter() < deadline:
                        page = receiver.receive_messages(max_message_count=min(RECEIVE_PAGE, left), max_wait_time=5)
                        if not page:
                            raise BenchFailure(f"loop: {queue} gave nothing with {left} messages left")
                        for message in page:
                            properties = {_text(k): v for k, v in message.application_properties.items()}
                            destination = _text(properties["x-ms-path"])
                            if destination not in senders:
                                senders[destination] = primary.get_queue_sender(destination)
                            senders[destination].send_messages(ServiceBusMessage(
                                b"".join(message.body), session_id=_text(properties.get("x-ms-sessionid"))))
                        for message in page:
                            receiver.complete_message(message)
                        moved += len(page)
                        left -= len(page)
        finally:
            for sender in senders.values():
                sender.close()
    return {"moved": moved, "seconds": time.perf_counter() - start}


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def syphon_child(spec: dict) -> dict:
    """One syphon run in a fresh driver (child process): timings, batches and peak memory."""
    from backlog_syphon.config import load_config
    from backlog_syphon.run.spark_session import build_spark_session
    from backlog_syphon.run.syphon import run_syphon

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("backlog_syphon").setLevel(logging.INFO)  # per-batch lines in the child's log
    config = load_config(ROOT / "conf/local.yaml", overrides=spec["overrides"])
    started: list = []

    def on_start(run) -> None:
        started.append((run, time.perf_counter()))
        Path("started").touch()  # the idle measurement waits for it (the child runs in its own folder)

    start = time.perf_counter()
    spark = build_spark_session("bench-syphon", extra_conf={"spark.sql.streaming.numRecentProgressUpdates": "100000"})
    session_ready = time.perf_counter()
    summary = run_syphon(spark, config, timeout_seconds=spec["timeout_seconds"], on_start=on_start)
    end = time.perf_counter()
    returned_at = time.time()
    run, query_started = started[0]
    batches = [{"batch_id": p.batchId, "rows": p.numInputRows, "ms": p.batchDuration,
                "duration_ms": dict(p.durationMs)} for p in run.query.recentProgress]
    jvm_peak = peak_rss_mb(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # noqa: SLF001
    # No spark.stop(): like jobs/syphon.py, the child leaves its JVM to end with it (the JVM exits
    # once this process has, on the end of its input), so "last record -> exit" is the job's own.
    timeline = getattr(summary, "timeline", None)  # None from a library older than the timeline (a "before" run)
    marks = {milestone.name: timeline.seconds(milestone) for milestone in timeline.marks} if timeline else {}
    return {"seconds": end - start, "spark_start_seconds": session_ready - start,
            "timeline": marks, "process_origin": timeline.origin if timeline else None,
            "max_messages_per_trigger": config.run.max_messages_per_trigger,
            "until_query_seconds": query_started - start, "drained": summary.drained,
            "remaining": dict(summary.remaining), "batches": batches, "jvm_peak_mb": jvm_peak,
            "python_peak_mb": peak_rss_mb("self"), "returned_at": returned_at}


def peak_rss_mb(pid: int | str) -> float | None:
    """A live process's peak resident set (``VmHWM``, Linux /proc), None elsewhere.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries that over ``exec``, so a child started
    from this bench would report at least the bench's own size when it forked (the emulator's
    backlog included), and it grew from run to run.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next(int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:"))


# --- measurements (this process) ------------------------------------------------------------------

def syphon_overrides(workdir: Path, **settings) -> dict[str, str]:
    state = workdir / "state"
    return {"storage.audit_table": str(state / "audit"), "storage.checkpoint_table": str(state / "checkpoint"),
            "storage.checkpoint_location": str(state / "checkpoint-stream"), "run.trigger": "available_now",
            **{key: str(value) for key, value in settings.items()}}


def measure_loop(one_way_ms: float, queues: int, args) -> dict:
    with backlog_emulator(one_way_ms, args.messages, queues, args) as (emu, written), \
            tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        ops_before, arrived_before = broker_ops(emu), arrivals(emu)
        with child_process("loop", {"written": written, "max_seconds": args.loop_seconds}, emu, Path(tmp)) as child:
            result = child_result(child, "loop", Path(tmp), args.loop_seconds + 300)
        ops = broker_ops(emu) - ops_before
        arrived, (left, dead) = arrivals(emu) - arrived_before, backlog_left(emu)
    moved = result["moved"]
    if arrived != moved or left != args.messages - moved or dead:
        raise BenchFailure(f"loop: reports {moved} moved, destinations received {arrived}, backlog holds {left} "
                           f"and {dead} dead-lettered (of {args.messages})")
    return {"rate": moved / result["seconds"], "moved": moved, "seconds": result["seconds"],
            "time_bound": moved < args.messages, "ops": dict(ops), "ops_per_msg": sum(ops.values()) / moved}


def measure_syphon(one_way_ms: float, queues: int, messages: int, per_trigger: int | None, args) -> dict:
    with backlog_emulator(one_way_ms, messages, queues, args) as (emu, _), \
            tempfile.TemporaryDirectory(prefix="bench-syphon-") as tmp:
        ops_before, arrived_before = broker_ops(emu), arrivals(emu)
        timeout = 600 + messages / 10
        settings = {} if per_trigger is None else {"run.max_messages_per_trigger": per_trigger}
        spec = {"overrides": syphon_overrides(Path(tmp), **settings), "timeout_seconds": timeout}
        with child_process("syphon", spec, emu, Path(tmp)) as child, CpuSampler(child.pid) as cpu:
            result = child_result(child, "syphon", Path(tmp), timeout + 300)
            cpu.wait_for_exit()  # the JVM ends after the child: its CPU until then is the run's too
        ops = broker_ops(emu) - ops_before
        arrived, (left, dead) = arrivals(emu) - arrived_before, backlog_left(emu)
        reasons = dead_letter_reasons(emu) if dead else {}
        failure = None
        if not result["drained"] or arrived != messages or left or dead:
            kept = Path(tempfile.gettempdir()) / f"bench-syphon-{time.strftime('%Y%m%dT%H%M%S')}.log"
            kept.write_bytes((Path(tmp) / "syphon.log").read_bytes())  # the run's folder goes; its log stays
            failure = (f"drained={result['drained']}, destinations received {arrived} of {messages}, backlog "
                       f"queues hold {left}, {dead} dead-lettered"
                       + "".join(f"; {n} x {why}" for why, n in reasons.items()) + f"; the run's log: {kept}")
    return {**result, "e2e_rate": messages / result["seconds"], "steady_rate": steady_rate(result["batches"]),
            "ops": dict(ops), "ops_per_msg": sum(ops.values()) / messages, "failure": failure,
            "cpu_per_1000": cpu.total() / messages * 1000,
            "cpu_by_role": {role: {"processes": n, "seconds": s} for role, (n, s) in cpu.by_role().items()},
            "cpu_processes": [asdict(p) for p in cpu.processes()]}


def dead_letter_reasons(emu) -> collections.Counter:
    """Why backlog messages were dead-lettered ("reason: description" -> count), peeked from each queue's DLQ."""
    from azure.servicebus import ServiceBusClient, ServiceBusSubQueue

    reasons: collections.Counter = collections.Counter()
    with ServiceBusClient.from_connection_string(emu.connection_string(SECONDARY)) as client:
        for queue in backlog_queue_names():
            with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
                reasons.update(f"{m.dead_letter_reason}: {m.dead_letter_error_description}"
                               for m in receiver.peek_messages(max_message_count=250))
    return reasons


def steady_rate(batches: list[dict]) -> float | None:
    """Rows per second of batch time over the non-empty batches after the first non-empty one."""
    later = [b for b in sorted(batches, key=lambda b: b["batch_id"]) if b["rows"]][1:]
    if not later:
        return None
    return sum(b["rows"] for b in later) / (sum(b["ms"] for b in later) / 1000)


def time_split(result: dict) -> str:
    """Where a syphon run's time went: Spark start, set-up, the batches (by step), between and after them."""
    batches_s = sum(b["ms"] for b in result["batches"]) / 1000
    steps: collections.Counter = collections.Counter()
    for batch in result["batches"]:
        steps.update({step: ms for step, ms in batch["duration_ms"].items() if step != "triggerExecution"})
    by_step = ", ".join(f"{step} {ms / 1000:.1f}" for step, ms in steps.most_common() if ms >= 100)
    busy = sum(1 for b in result["batches"] if b["rows"])
    return (f"spark start {result['spark_start_seconds']:.1f} s, set-up before the query "
            f"{result['until_query_seconds'] - result['spark_start_seconds']:.1f} s, {busy} non-empty of "
            f"{len(result['batches'])} batches {batches_s:.1f} s ({by_step}), between and after the batches "
            f"{result['seconds'] - result['until_query_seconds'] - batches_s:.1f} s; {fixed_costs(result)}")


def fixed_costs(result: dict) -> str:
    """From the run's timeline (``RunSummary.timeline``): process start to the first message sent, and the
    last batch's record to the process's exit (as this process saw it end, less the child's bench-only
    work after ``run_syphon`` returned), with the steps between."""
    marks = result.get("timeline") or {}
    first_send, last_record = marks.get("FIRST_SEND"), marks.get("LAST_RECORD")
    steps = ", ".join(f"{name.lower()} {seconds:.1f}" for name, seconds in sorted(marks.items(), key=lambda m: m[1]))
    out = "process start -> first send " + ("-" if first_send is None else f"{first_send:.1f} s")
    if last_record is not None and "exited_at" in result:
        exit_at = result["exited_at"] - result["process_origin"] - result.get("bench_only_seconds", 0.0)
        out += f", last record -> exit {exit_at - last_record:.1f} s"
    return f"{out} (timeline, s from process start: {steps})"


def measure_idle(probe_max: float, args) -> dict:
    """Broker operations of a continuous run on empty backlog queues, over six probe intervals after warm-up."""
    warm_up, window = 3 * probe_max, 6 * probe_max
    with backlog_emulator(0, 0, BACKLOG_QUEUES, args) as (emu, _), \
            tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        workdir = Path(tmp)
        spec = {"overrides": syphon_overrides(workdir, **{"run.trigger": IDLE_TRIGGER,
                                                           "run.idle_probe_max_seconds": probe_max}),
                "timeout_seconds": warm_up + window + 10}
        with child_process("syphon", spec, emu, workdir) as child:
            deadline = time.monotonic() + 600
            while not (workdir / "started").exists():
                if child.poll() is not None or time.monotonic() > deadline:
                    raise BenchFailure(f"idle: the syphon's query did not start. Log:\n{log_tail(workdir, 'syphon')}")
                time.sleep(0.2)
            time.sleep(warm_up)
            before = broker_ops(emu)
            time.sleep(window)
            ops = broker_ops(emu) - before
            child_result(child, "syphon", workdir, 300)
    from backlog_syphon.config import RunConfig

    per_queue_hour = sum(ops.values()) / BACKLOG_QUEUES / window * 3600
    expected = 3600 / probe_max
    default = RunConfig().idle_probe_max_seconds
    return {"probe_max_seconds": probe_max, "window_seconds": window, "ops": dict(ops),
            "per_queue_hour": per_queue_hour, "expected_per_queue_hour": expected,
            "matches": abs(per_queue_hour / expected - 1) <= 0.25, "default_probe_max_seconds": default,
            "projected_per_queue_hour": per_queue_hour * probe_max / default}


# --- the whole bench ------------------------------------------------------------------------------

def format_table(rows: list[Row]) -> list[str]:
    cells = [COLUMNS] + [row.cells() for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        result = (loop_child if args.child == "loop" else syphon_child)(json.loads(args.spec))
        if "returned_at" in result:  # what the bench alone did after the run (progress, peaks): not the job's
            result["bench_only_seconds"] = time.time() - result["returned_at"]
        Path(args.result).write_text(json.dumps(result))
        return 0
    try:
        return run_bench(args)
    except BenchFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr, flush=True)
        return 1


def run_bench(args) -> int:
    from bench_emulator import ceiling

    began = time.monotonic()
    per_trigger = args.max_per_trigger or "conf/local.yaml's"
    print(f"bench_syphon: {args.messages} messages of {args.body_size} B, latencies (one way) "
          f"{', '.join(f'{l:g} ms' for l in args.latencies)}, backlog queues {args.queues}; syphon with "
          f"{per_trigger} messages per trigger; loop bounded at {args.loop_seconds:g} s; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - began:6.0f} s] {text}", flush=True)

    failures = []  # runs that did not deliver everything: their figures are shown, the bench fails

    def check(run: str, result: dict) -> None:
        if result["failure"]:
            failures.append(f"{run}: {result['failure']}")
            progress(f"VERIFICATION FAILED: {failures[-1]}")

    ceilings = {}
    for one_way in args.latencies:
        ceilings[one_way] = ceiling(2 * one_way, args.messages, args.body_size)
        progress(f"emulator ceiling at {one_way:g} ms: {ceilings[one_way].line()}")
    figures = {"args": vars(args), "ceilings": {str(k): asdict(v) | {"combined": v.combined}
                                                 for k, v in ceilings.items()}, "rows": []}
    rows = []
    for queues in args.queues:
        for one_way in args.latencies:
            loop = measure_loop(one_way, queues, args)
            progress(f"loop {one_way:g} ms, {queues} queues: {loop['moved']} msgs in {loop['seconds']:.1f} s = "
                     f"{loop['rate']:.0f} msg/s")
            syphon = measure_syphon(one_way, queues, args.messages, args.max_per_trigger, args)
            progress(f"syphon {one_way:g} ms, {queues} queues: {args.messages} msgs in {syphon['seconds']:.1f} s "
                     f"= {syphon['e2e_rate']:.0f} msg/s ({syphon['max_messages_per_trigger']} per trigger); "
                     f"{time_split(syphon)}")
            check(f"syphon at {one_way:g} ms, {queues} queues", syphon)
            rows.append(Row(one_way, queues, args.messages, loop["rate"], loop["moved"], loop["time_bound"],
                            loop["ops_per_msg"], syphon["e2e_rate"], syphon["steady_rate"],
                            ceilings[one_way].combined, syphon["ops_per_msg"], syphon["python_peak_mb"],
                            syphon["jvm_peak_mb"], syphon["cpu_per_1000"]))
            figures["rows"].append({"row": asdict(rows[-1]), "loop": loop, "syphon": syphon})

    memory = []
    for count in args.memory_counts:
        result = measure_syphon(0, BACKLOG_QUEUES, count, MEMORY_PER_TRIGGER, args)
        progress(f"memory: syphon at {count} msgs: python {megabytes(result['python_peak_mb'])}, jvm "
                 f"{megabytes(result['jvm_peak_mb'])}; {result['e2e_rate']:.0f} msg/s e2e; {time_split(result)}")
        check(f"syphon at {count:,} messages", result)
        memory.append((count, result))
    figures["memory"] = [{"messages": count, **result} for count, result in memory]

    profile = None
    if args.profile_messages:
        profile = measure_syphon(0, BACKLOG_QUEUES, args.profile_messages, MEMORY_PER_TRIGGER, args)
        progress(f"profile: syphon at {args.profile_messages} msgs: {profile['e2e_rate']:.0f} msg/s e2e, "
                 f"{profile['cpu_per_1000']:.2f} CPU s per 1,000 messages; {time_split(profile)}")
        check(f"syphon at {args.profile_messages:,} messages (profile)", profile)
    figures["profile"] = profile

    idle = measure_idle(args.idle_probe_seconds, args) if args.idle_probe_seconds else None
    figures["idle"] = idle
    if idle:
        progress(f"idle: {sum(idle['ops'].values())} broker ops in {idle['window_seconds']:g} s: {idle['ops']}")

    figures["seconds"] = time.monotonic() - began
    figures["load_average"] = os.getloadavg()
    print()
    print("\n".join(report(rows, ceilings, memory, idle, args) + cpu_profile(profile, args)))
    print(f"bench wall time {figures['seconds'] / 60:.1f} min; load average now "
          f"{', '.join(f'{l:.2f}' for l in figures['load_average'])} on {os.cpu_count()} cores")
    figures["failures"] = failures
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr, flush=True)
    return 1 if failures else 0


def cpu_profile(profile: dict | None, args) -> list[str]:
    """The profile run's CPU seconds per 1,000 messages, per kind of process and per process."""
    if not profile:
        return []
    per_1000 = 1000 / args.profile_messages
    steady = "-" if profile["steady_rate"] is None else f"{profile['steady_rate']:.0f} msg/s"
    lines = [f"CPU per 1,000 messages, {args.profile_messages:,} messages at 0 ms, {BACKLOG_QUEUES} queues, "
             f"{MEMORY_PER_TRIGGER} per trigger, the job's processes together: {profile['cpu_per_1000']:.2f} s "
             f"(e2e {profile['e2e_rate']:.0f} msg/s; steady {steady}); by kind:"]
    lines += [f"  {role}: {entry['seconds'] * per_1000:.3f} s over {entry['processes']} process"
              f"{'es' if entry['processes'] > 1 else ''}" for role, entry in profile["cpu_by_role"].items()
              if entry["seconds"] * per_1000 >= 0.001]  # not the shell tools spark-submit runs
    lines.append("  each process with at least 1% of the total: " + ", ".join(
        f"{p['role']} {p['pid']} {p['seconds'] * per_1000:.3f} s" for p in profile["cpu_processes"]
        if p["seconds"] >= 0.01 * profile["cpu_per_1000"] / per_1000))
    return lines


def megabytes(value: float | None, unit: str = " MB") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def report(rows: list[Row], ceilings: dict, memory: list, idle: dict | None, args) -> list[str]:
    lines = format_table(rows)
    if any(row.loop_time_bound for row in rows):
        lines.append(f"* the loop stopped at its {args.loop_seconds:g} s bound: "
                     + ", ".join(f"{r.loop_moved} of {r.messages} moved at {r.one_way_ms:g} ms, {r.queues} queues"
                                 for r in rows if r.loop_time_bound))
    lines += [
        "latency is one way (the emulator adds twice this to each round trip); e2e counts from just before the "
        "Spark session is built to the return of run_syphon;",
        "steady = input rows / batch duration over the batches after the first non-empty one; ceiling = the "
        "combined rate below; ops/msg = the emulator's ops counters, both namespaces, / messages moved;",
        "driver peak: peak RSS (VmHWM) of the driver's Python process and of the driver JVM (which hosts the "
        "executors in local mode); Spark's Python workers are in neither;",
        "CPU s per 1k msgs: CPU seconds of every process of the syphon's run (driver, JVM, Python workers), "
        "sampled from /proc, per 1,000 messages."]
    lines.append(f"emulator ceiling (no Spark; one SDK client process, {args.messages} msgs of {args.body_size} B), "
                 f"at each latency (one way):")
    lines += [f"  {one_way:g} ms: {c.line()}" for one_way, c in ceilings.items()]
    for count, result in memory:
        steady = "-" if result["steady_rate"] is None else f"{result['steady_rate']:.0f} msg/s"
        lines.append(f"memory: driver peak at {count:,} messages (0 ms, {BACKLOG_QUEUES} queues, "
                     f"{MEMORY_PER_TRIGGER} per trigger): python {megabytes(result['python_peak_mb'])}, jvm "
                     f"{megabytes(result['jvm_peak_mb'])}; e2e {result['e2e_rate']:.0f} msg/s, steady {steady}")
    if len(memory) == 2 and all(r[key] for _, r in memory for key in ("python_peak_mb", "jvm_peak_mb")):
        (small_count, small), (large_count, large) = memory
        lines.append(f"memory: ratio of the peaks at {large_count:,} / {small_count:,} messages: python "
                     f"{large['python_peak_mb'] / small['python_peak_mb']:.2f}, jvm "
                     f"{large['jvm_peak_mb'] / small['jvm_peak_mb']:.2f} (target: both within 0.90..1.10)")
    if idle:
        lines.append(
            f"idle: broker ops per backlog queue per hour: {idle['per_queue_hour']:.0f} measured with "
            f"run.idle_probe_max_seconds={idle['probe_max_seconds']:g} over {idle['window_seconds']:g} s "
            f"(one peek per queue per interval would be {idle['expected_per_queue_hour']:.0f}: "
            f"{'matches' if idle['matches'] else 'DOES NOT MATCH, so the projection does not hold'}); projected "
            f"for the default {idle['default_probe_max_seconds']:g} s: {idle['projected_per_queue_hour']:.1f} "
            f"(measured x {idle['probe_max_seconds']:g} / {idle['default_probe_max_seconds']:g}; target: at most 4)")
    for one_way, want in ((2.5, 4.0), (0.0, 1.0)):
        row = next((r for r in rows if r.one_way_ms == one_way and r.queues == BACKLOG_QUEUES), None)
        if row:
            share = "-" if row.steady_rate is None else f"{row.steady_rate / row.ceiling_rate:.2f}"
            lines.append(f"targets at {one_way:g} ms, {BACKLOG_QUEUES} queues: e2e/loop "
                         f"{row.e2e_rate / row.loop_rate:.2f} (target at least {want:g}); steady/ceiling {share} "
                         f"(target at least 0.5 on loopback)")
    lines.append("fixed costs per run (targets: process start -> first send at most 10 s, last record -> exit at most "
                 "3 s): see each syphon line above")
    return lines


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Default: the full matrix (about half an hour on 2 cores).")
    p.add_argument("--quick", action="store_true",
                   help="smoke run of a few minutes: 1,000 messages, 0 and 2.5 ms, 10 queues, no memory runs, "
                        "a short idle measurement")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--messages", type=int, help="backlog messages per row (default 6000; --quick 1000)")
    p.add_argument("--latencies", type=float, nargs="+", metavar="MS",
                   help="one-way latencies (default 0 2.5 10; --quick 0 2.5)")
    p.add_argument("--queues", type=int, nargs="+", choices=[1, BACKLOG_QUEUES],
                   help="backlog queues the backlog is spread over (default 10 1; --quick 10)")
    p.add_argument("--max-per-trigger", type=int,
                   help="syphon run.max_messages_per_trigger in the table's runs (default: conf/local.yaml's; "
                        "--quick 250, so that 1,000 messages make several batches)")
    p.add_argument("--loop-seconds", type=float, default=60.0, help="time bound of the plain loop (default 60)")
    p.add_argument("--memory-counts", type=int, nargs="*",
                   help="backlog sizes of the memory runs (default 20000 100000; --quick none)")
    p.add_argument("--idle-probe-seconds", type=float,
                   help="run.idle_probe_max_seconds of the idle measurement, 0 to skip it (default 10; --quick 5)")
    p.add_argument("--profile-messages", type=int,
                   help="backlog of the CPU profile run, 0 to skip it (default 50000; --quick none)")
    p.add_argument("--body-size", type=int, default=1024, help="body bytes per message (default 1024)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", choices=["loop", "syphon"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = dict(messages=1000, latencies=[0.0, 2.5], queues=[BACKLOG_QUEUES], max_per_trigger=250,
                    memory_counts=[], idle_probe_seconds=5.0, profile_messages=0) if args.quick else dict(
        messages=6000, latencies=[0.0, 2.5, 10.0], queues=[BACKLOG_QUEUES, 1], memory_counts=[20000, 100000],
        idle_probe_seconds=10.0, profile_messages=50000)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.messages < 1 or (args.max_per_trigger or 1) < 1 or min(args.latencies) < 0:
        p.error("--messages and --max-per-trigger must be positive, latencies at least 0")
    return args


if __name__ == "__main__":
    sys.exit(main())
