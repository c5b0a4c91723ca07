"""The syphon where a real failover puts it, against competent plain SDK loops and the emulator's ceiling.

    PYTHONPATH=lib:emulator/src PYSPARK_PYTHON=$PWD/.venv/bin/python \\
        .venv/bin/python bench/bench_syphon.py [--quick] [--rows NAME ...] [--json PATH] [--library PATH]

After a failover the backlog queues live in the secondary namespace, a region away from the job
(30-80 ms), while the primary is near (1-3 ms). So the rows run at that *geometry*: the emulator
adds a latency per namespace (the secondary 25 ms one way, the primary 1 ms), and today's symmetric
rows (0 and 10 ms on both) stay for comparison. Every measurement gets a fresh emulator of
conf/emulator.yaml, run in this process on ephemeral ports on 127.0.0.1, and a legacy backlog
written before any clock starts (``backlog_writer.realistic_backlog`` over 10 backlog queues, a tenth
of it for the session queue unless the row says otherwise). The movers run in child processes,
which get the two connection strings by environment (the variables conf/local.yaml reads):

- syphon: a fresh Python driver and JVM per run: ``build_spark_session``, then ``run_syphon``
  (available-now) with conf/local.yaml as a new user has it, Delta state in a temporary folder.
- loop (threads): the competent plain loop: one thread per backlog queue, each with its own
  PeekLock receiver (prefetch 100) and senders; pages of 100; each page's messages sent batched per
  destination and session (consecutive runs, in order), then each message completed. It knows how
  many messages each queue holds and never asks for more.
- loop (single): the same work in one thread, queue after queue, one send per message (today's
  baseline).
Both loops are bounded by time (``--loop-seconds``): each stops after the page in flight, and its
rate is what it moved in the time it ran.
- emulator ceiling: ``bench_emulator.ceiling`` at each namespace's latency: batched sends at the
  primary's, peeks of 250 and PeekLock receives of 100 with one bulk completion each at the
  secondary's, combined as ``1 / (1/send + 1/peek + 1/(receive+complete))``.

The rows (``--rows``): ``30k`` (30,000 x 1 KB), ``200k`` (200,000 x 1 KB, the steady state),
``skewed`` (30,000, 80% of them in one queue), ``30k-short-pages`` (the 30k row with peek pages cut to
64 KB, about 60 messages, as a distant namespace streams them), ``sessions`` (30,000 for the session queue, 500
sessions over the 10 queues, interleaved), ``64k`` (20,000 x 64 KB), ``partitioned-pages`` (the 30k row
over partitioned backlog queues, 16 partitions, a peek answering whole pages of one partition),
``partitioned-peek-one`` (the same over partitioned backlog queues whose peeks answer one message per call,
as reported), ``partitioned-dest`` and ``partitioned-dedupe-dest`` (the 30k row into destinations that are
all partitioned, without and with duplicate detection; there the loop sends one message per send, as a
deduplicating partitioned entity takes one MessageId per batch), ``standard-credits`` and
``standard-credits-partitioned`` (the 30k row, plain and over partitioned backlog queues, both namespaces
with a Standard namespace's 1,000 credits a second: a peek, a receive and a send cost one per message, a
settlement one per lock token; every other row runs with the emulator's credits off, so that it measures the
syphon, not the budget), ``30k-0ms`` and ``30k-10ms`` (symmetric), ``30k-tls`` and ``30k-websockets`` (the
30k row with the syphon reaching both namespaces over AMQP over TLS, a real namespace's 5671, and over AMQP
over WebSockets over TLS, 443: what a firewalled workspace costs against the plain row of the same run, its
``/30k``; no loops). The figures per row:

- e2e msg/s: messages / time from just before the Spark session is built to the return of
  ``run_syphon``; ``/threads`` and ``/single``: that over each loop's rate in the same row; ``/30k``: that
  over the 30k row's (the non-partitioned entities) in the same run.
- cycle msg/s: the steady rate of the whole batch cycle: the input rows of the non-empty batches
  after the first / the time from the start of the second to the end of the last (Spark's progress
  timestamps and durations): planning, reading, sending, recording, and the gaps between batches.
- send msg/s: the send step alone: delivered / the time from a batch's first send to its last (the
  sink's own measure), over the same batches; cycle/send is their ratio.
- between s: the mean time per batch outside ``foreachBatch`` (from one trigger's start to the next's,
  less the first one's ``addBatch``); lease->1st s: from the lease taken to the first batch started
  (the run's timeline).
- probes/batch: what planning a batch costs: the most probes (single-message peeks, each a round trip
  to the secondary) any plan after the first took, as the source reports them with its latest offset
  (the first plan also fixes the available-now target); from a library that does not report them,
  the emulator's ``peek_one`` count over the non-empty batches (the start's probes included);
  rt/batch: every request the broker answered (management requests, transfers sent, link attaches)
  over the same batches.
- commits/batch: Delta commits to the audit and checkpoint tables (their ``_delta_log``, less the
  creation) over the non-empty batches; the lease's are listed per run.
- CPU s/1k: ``utime + stime`` of the syphon's child process and every process under it (the JVM,
  PySpark's daemon and workers), sampled every 0.2 s (``process_cpu.CpuSampler``), per 1,000
  messages; the detail lines give it per kind of process.
- cycle/ceiling: cycle msg/s over the emulator's combined ceiling at the row's geometry.

Also measured: one Delta commit of each kind on this machine (``--commit-samples``), the syphon's
memory at 20,000 and 100,000 messages (0 ms), the CPU profile at 50,000 (0 ms), and the broker
operations of an idle continuous run. ``--library PATH`` runs the syphon from another checkout's
``lib`` (a "before" run of the same bench on the same machine).

A syphon run that does not end drained with every message arrived at its destination (the
emulator's counters) fails the bench: its figures are still shown, with what went wrong, and the
bench exits 1 at the end. A loop whose arrivals differ from what it reports, a child that crashes
or times out, stop the bench at once (exit 1).
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY_ENV = "BENCH_SYPHON_LIBRARY"  # a child's syphon library (``--library``), before this checkout's
# bench_emulator and process_cpu sit next to this file (the script's folder is on the path); tools/ is under ROOT.
sys.path[:0] = [os.environ.get(LIBRARY_ENV) or str(ROOT / "lib"), str(ROOT / "emulator" / "src"), str(ROOT)]

from process_cpu import CpuSampler  # noqa: E402  (after the path: it imports tools.testing)
from tools.testing import emulator_environment  # noqa: E402

PRIMARY, SECONDARY = "contoso", "contoso-secondary"
CONNECTION_ENV = {PRIMARY: "SYPHON_PRIMARY_CONNECTION_STRING", SECONDARY: "SYPHON_SECONDARY_CONNECTION_STRING"}
BACKLOG_QUEUES = 10  # conf/emulator.yaml's backlog queues, conf/local.yaml's backlog.queue_count
RECEIVE_PAGE = 100
IDLE_TRIGGER = "1 second"
MEMORY_PER_TRIGGER = 5000
STATE_TABLES = ("audit", "checkpoint", "checkpoint_lease")
# Broker operations that are one request and its answer each (a receive is counted per message delivered,
# a settlement inside a bulk update_disposition per message: neither is a round trip of its own).
ROUND_TRIP_OPS = ("peek", "update_disposition", "renew_lock", "renew_session_lock", "receive_by_sequence_number",
                  "get_session_state", "set_session_state", "schedule_message", "cancel_scheduled_message",
                  "send", "attach")


class BenchFailure(RuntimeError):
    """A measurement that cannot be trusted: the bench stops with exit code 1."""


@dataclass(frozen=True)
class Geometry:
    """One-way latencies: the secondary namespace (the backlog) and the primary (the destinations)."""

    secondary_ms: float
    primary_ms: float

    def label(self) -> str:
        if self.secondary_ms == self.primary_ms:
            return f"{self.secondary_ms:g} ms"
        return f"{self.secondary_ms:g}/{self.primary_ms:g} ms"

    def emulator_latency(self) -> dict[str, float]:
        """The emulator's latency per namespace: it delays what it sends, so a round trip takes it once."""
        return {SECONDARY: 2 * self.secondary_ms, PRIMARY: 2 * self.primary_ms}


FAR = Geometry(25.0, 1.0)


class DestinationShape(str, Enum):
    """The primary's destinations in a row: as conf/emulator.yaml has them, or every one partitioned (16
    partitions, as on Standard), with or without duplicate detection."""

    PLAIN = "plain"
    PARTITIONED = "partitioned"
    PARTITIONED_DEDUPE = "partitioned, deduplicating"


@dataclass(frozen=True)
class Scenario:
    name: str
    messages: int
    geometry: Geometry
    body_size: int = 1024
    session_share: float = 0.1
    sessions: int = 20
    first_queue_share: float | None = None  # a skewed backlog: that share in queue 0
    loops: tuple[str, ...] = ("threads",)
    time_commits: bool = False  # time single Delta commits in this row's syphon process, after its run
    # The secondary's peek pages, at most this many bytes of messages (the emulator's peek_page_bytes; None:
    # its default, the service's ~256 KB): how a distant namespace streams a page.
    peek_page_bytes: int | None = None
    # Partitioned backlog queues (16 partitions): a peek answers from one partition, whole pages of it, or
    # one message per call as once reported (the emulator's peek_one_per_call).
    backlog_partitioned: bool = False
    peek_one_per_call: bool = False
    destinations: DestinationShape = DestinationShape.PLAIN
    # The namespaces' credits a second while the movers run (a Standard namespace's 1,000; 0: off, the emulator's
    # budget kept out of the way of the other rows). The backlog is written before, with them off.
    credits_per_second: float = 0.0
    # How the syphon reaches the emulator (``testing.emulator_environment``): plain AMQP (the emulators'
    # shortcut), ``amqps`` (TLS) or ``amqp-websockets`` (over TLS); the backlog is written plain either way.
    transport: str = "amqp"

    def describe(self) -> str:
        shape = [f"{self.messages:,} x {self.body_size // 1024 if self.body_size >= 1024 else self.body_size}"
                 f"{' KB' if self.body_size >= 1024 else ' B'}"]
        if self.first_queue_share:
            shape.append(f"{self.first_queue_share:.0%} in one queue")
        if self.session_share >= 1:
            shape.append(f"{self.sessions} sessions")
        if self.peek_page_bytes:
            shape.append(f"peek pages of {self.peek_page_bytes // 1024} KB")
        if self.backlog_partitioned:
            shape.append("partitioned backlog, " + ("one message per peek" if self.peek_one_per_call
                                                     else "whole-partition peek pages"))
        if self.destinations is not DestinationShape.PLAIN:
            shape.append(f"{self.destinations.value} destinations")
        if self.credits_per_second:
            shape.append(f"{self.credits_per_second:,.0f} credits a second per namespace")
        if self.transport != "amqp":
            shape.append(f"over {self.transport}")
        return ", ".join(shape) + f", {self.geometry.label()}"


SCENARIOS = {
    "30k": Scenario("30k", 30_000, FAR, loops=("threads", "single"), time_commits=True),
    "200k": Scenario("200k", 200_000, FAR),
    "skewed": Scenario("skewed", 30_000, FAR, first_queue_share=0.8),
    "sessions": Scenario("sessions", 30_000, FAR, session_share=1.0, sessions=500),
    "64k": Scenario("64k", 20_000, FAR, body_size=64 * 1024),
    # Peeks answer as a namespace a region away streams them: about 60 messages of 1 KB a page, not 250.
    "30k-short-pages": Scenario("30k-short-pages", 30_000, FAR, peek_page_bytes=64 * 1024),
    # Partitioned entities at the same geometry: the 30k backlog over partitioned backlog queues (whole
    # pages, and one message per peek: the same size, so that a run's fixed start weighs on it as on the
    # others), and into partitioned destinations with and without duplicate detection.
    "partitioned-pages": Scenario("partitioned-pages", 30_000, FAR, backlog_partitioned=True),
    "partitioned-peek-one": Scenario("partitioned-peek-one", 30_000, FAR, backlog_partitioned=True,
                                     peek_one_per_call=True),
    "partitioned-dest": Scenario("partitioned-dest", 30_000, FAR, destinations=DestinationShape.PARTITIONED),
    "partitioned-dedupe-dest": Scenario("partitioned-dedupe-dest", 30_000, FAR,
                                        destinations=DestinationShape.PARTITIONED_DEDUPE),
    # A Standard namespace at each end, throttling as the service does once its 1,000 credits a second are spent.
    "standard-credits": Scenario("standard-credits", 30_000, FAR, credits_per_second=1000),
    "standard-credits-partitioned": Scenario("standard-credits-partitioned", 30_000, FAR, backlog_partitioned=True,
                                             credits_per_second=1000),
    # The network a deployment has: TLS (5671), and WebSockets over TLS (443) where only 443 is open.
    "30k-tls": Scenario("30k-tls", 30_000, FAR, loops=(), transport="amqps"),
    "30k-websockets": Scenario("30k-websockets", 30_000, FAR, loops=(), transport="amqp-websockets"),
    "30k-0ms": Scenario("30k-0ms", 30_000, Geometry(0.0, 0.0), loops=("threads", "single")),
    "30k-10ms": Scenario("30k-10ms", 30_000, Geometry(10.0, 10.0), loops=("threads", "single")),
}
QUICK_MESSAGES = 3_000


# --- the emulator, the backlog and the counters (this process) -----------------------------------

@contextmanager
def backlog_emulator(scenario: Scenario | None, geometry: Geometry, args):
    """A fresh emulator at ``geometry`` whose backlog queues hold ``scenario``'s backlog (none: empty)."""
    from tools.backlog_writer import realistic_backlog, write_backlog
    from backlog_syphon.config import load_config as load_syphon_config
    from servicebus_emulator import Emulator

    with Emulator(emulator_config(scenario), ports={PRIMARY: 0, SECONDARY: 0},
                  latency_ms=geometry.emulator_latency()) as emu:
        written = {}
        if scenario is not None and scenario.messages:
            config = load_syphon_config(ROOT / "conf/local.yaml", environ=connection_env(emu))
            backlog = realistic_backlog(scenario.messages, seed=args.seed, body_size=scenario.body_size,
                                        session_share=scenario.session_share, sessions=scenario.sessions)
            with batch_headroom():
                # A partitioned backlog queue takes a batch into one partition whole: the legacy client's
                # copies one transfer each, so that they go round the partitions as they did on the day.
                written = write_backlog(config.secondary, config.primary.namespace, backlog, queue_count=BACKLOG_QUEUES,
                                        seed=args.seed, first_queue_share=scenario.first_queue_share,
                                        singly=scenario.backlog_partitioned)
            if backlog_left(emu) != (scenario.messages, 0):
                raise BenchFailure(f"the backlog holds {backlog_left(emu)} (stored, dead-lettered) after "
                                   f"writing {scenario.messages} messages")
        if scenario is not None and scenario.credits_per_second:
            for namespace in CONNECTION_ENV:
                emu.set_credits_per_second(namespace, scenario.credits_per_second)
        yield emu, written


def emulator_config(scenario: Scenario | None):
    """conf/emulator.yaml, with the row's peek page size and partitioned backlog queues on the secondary and
    its destinations' shape on the primary."""
    import yaml
    from servicebus_emulator.config import EmulatorConfig

    raw = yaml.safe_load((ROOT / "conf/emulator.yaml").read_text())
    for namespace in raw["namespaces"]:
        namespace["credits_per_second"] = 0  # on only while a row's movers run (``backlog_emulator``)
    for namespace in raw["namespaces"] if scenario is not None else ():
        entities = [*namespace.get("queues", []), *namespace.get("topics", [])]
        if namespace["name"] == SECONDARY:
            if scenario.peek_page_bytes:
                namespace["peek_page_bytes"] = scenario.peek_page_bytes
            if scenario.backlog_partitioned:
                namespace["peek_one_per_call"] = scenario.peek_one_per_call
                for entity in entities:
                    if entity["name"] in backlog_queue_names():
                        entity["enable_partitioning"] = True
        elif namespace["name"] == PRIMARY and scenario.destinations is not DestinationShape.PLAIN:
            dedupe = scenario.destinations is DestinationShape.PARTITIONED_DEDUPE
            for entity in entities:  # (conf/emulator.yaml's orders deduplicates: off here unless the row's is)
                entity["enable_partitioning"] = True
                entity["duplicate_detection_window_seconds"] = 600 if dedupe else 0
    return EmulatorConfig.from_dict(raw, source="conf/emulator.yaml")


@contextmanager
def batch_headroom(headroom_bytes: int = 1024):
    """Batches created in this process stay ``headroom_bytes`` under the link's limit meanwhile.

    azure-servicebus 7.15.0 counts a batch's size before it sets the envelope's own properties (the
    first message's MessageId and SessionId), and the backlog writer keeps the same count, so a batch
    filled to within a few bytes of the limit is refused (``MessageSizeExceededError``). Only the
    backlog writing (never measured) runs here; the movers run in their own processes, untouched.
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


def connection_env(emu, library: Path | None = None, transport: str = "amqp") -> dict[str, str]:
    """The environment a syphon needs for ``emu``: its connection strings, and its administration API where
    ``library`` (this checkout's by default) knows the settings (an older checkout's may not); ``transport``:
    the syphon's way to it."""
    environ = emulator_environment(emu, PRIMARY, SECONDARY, transport=transport)
    package = Path(library or os.environ.get(LIBRARY_ENV) or ROOT / "lib") / "backlog_syphon"
    if not any("administration_endpoint" in path.read_text() for path in package.rglob("*.py")):
        environ = {name: value for name, value in environ.items() if name in CONNECTION_ENV.values()}
    return environ


def backlog_queue_names() -> list[str]:
    return [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(BACKLOG_QUEUES)]


def requests(ops: collections.Counter) -> int:
    """The broker requests among ``ops``: ``peek_one`` counts the single-message ones again among ``peek``."""
    return sum(n for kind, n in ops.items() if kind != "peek_one")


def broker_ops(emu) -> collections.Counter:
    """Every entity's ``ops`` counters in both namespaces, summed per kind of operation."""
    total: collections.Counter = collections.Counter()
    for namespace in CONNECTION_ENV:
        for entity in emu.stats(namespace).values():
            total.update(entity.get("ops", {}))
    return total


def credits_spent(emu) -> dict[str, tuple[int, int]]:
    """Per namespace: (credits spent, operations throttled) since the emulator started."""
    stats = {namespace: emu.credit_stats(namespace) for namespace in CONNECTION_ENV}
    return {namespace: (entry["spent_total"], entry["throttled_total"]) for namespace, entry in stats.items()}


def credits_since(emu, before: dict[str, tuple[int, int]]) -> dict[str, dict[str, int]]:
    return {namespace: {"spent": spent - before[namespace][0], "throttled": throttled - before[namespace][1]}
            for namespace, (spent, throttled) in credits_spent(emu).items()}


def arrivals(emu) -> int:
    """Messages the primary namespace's queues and topics have taken in so far."""
    primary = next(ns for ns in emu.config.namespaces if ns.name == PRIMARY)
    stats = emu.stats(PRIMARY)
    return sum(stats[entity.name]["in"] for entity in [*primary.queues, *primary.topics])


def duplicates_dropped(emu) -> int:
    """Messages the primary's deduplicating entities dropped as duplicates: sent twice, arrived once."""
    primary = next(ns for ns in emu.config.namespaces if ns.name == PRIMARY)
    stats = emu.stats(PRIMARY)
    return sum(stats[entity.name].get("duplicates", 0) for entity in [*primary.queues, *primary.topics])


def backlog_left(emu) -> tuple[int, int]:
    """(messages stored, messages dead-lettered) over the backlog queues."""
    stats = emu.stats(SECONDARY)
    queues = [stats[name] for name in backlog_queue_names()]
    return sum(q["total"] for q in queues), sum(q.get("dead_letter_count", 0) for q in queues)


# --- child processes ------------------------------------------------------------------------------

@contextmanager
def child_process(role: str, spec: dict, emu, workdir: Path, library: Path | None = None, transport: str = "amqp"):
    """This script as ``role`` with ``spec`` (reaching ``emu`` over ``transport``); its output goes to ``<role>.log``.

    The child runs in its own session (so that its JVM goes with it): on any error here, a timeout
    or Ctrl-C included, the whole group is killed.
    """
    env = {**os.environ, **(connection_env(emu, library, transport) if emu is not None else {}),
           LIBRARY_ENV: str(library or ""),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(library or ROOT / "lib"), str(ROOT / "emulator" / "src"),
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


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _restored(message):
    """A backlog message as its sender meant it, as a plain loop would build it: body, MessageId,
    session, and the application properties without the legacy x-ms-* ones."""
    from azure.servicebus import ServiceBusMessage

    properties = {_text(k): v for k, v in (message.application_properties or {}).items()}
    destination = _text(properties.get("x-ms-path"))
    session = _text(properties.get("x-ms-sessionid"))
    kept = {k: v for k, v in properties.items() if not k.startswith("x-ms-")}
    return destination, session, ServiceBusMessage(b"".join(message.body), session_id=session,
                                                   message_id=message.message_id, application_properties=kept)


def _send_in_batches(sender, messages) -> None:
    """``messages`` in as few sends as the entity's largest message batch allows (large bodies need several),
    each send asked again while the namespace answers it busy."""
    from azure.servicebus.exceptions import MessageSizeExceededError

    batch = sender.create_message_batch()
    for message in messages:
        try:
            batch.add_message(message)
        except MessageSizeExceededError:
            while_busy(lambda: sender.send_messages(batch))  # noqa: B023
            batch = sender.create_message_batch()
            batch.add_message(message)
    while_busy(lambda: sender.send_messages(batch))


BUSY_PAUSE_SECONDS = 2.0  # what a throttled namespace asks a client to wait
EMPTY_RECEIVES = 6  # receives in a row that may come back empty (5 s each) before a loop is taken as stuck


def while_busy(operation):
    """``operation()``, asked again after the service's pause while the namespace answers it server-busy (the
    SDK's own retries gave up): what a competent loop does on a Standard namespace out of credits."""
    from azure.servicebus.exceptions import ServiceBusServerBusyError

    while True:
        try:
            return operation()
        except ServiceBusServerBusyError:
            time.sleep(BUSY_PAUSE_SECONDS)


def move_queue(backlog, primary, queue: str, count: int, deadline: float, *, batched: bool) -> int:
    """One backlog queue, page by page (PeekLock, prefetch 100): send each page's messages (``batched``:
    consecutive messages for the same destination and session in one send; a deduplicating partitioned
    destination takes one MessageId per send, so there the loop sends one by one), then complete each one.
    A busy answer is waited out (``while_busy``); a receive throttled on a detached link gets a new receiver."""
    from azure.servicebus import ServiceBusReceiveMode
    from azure.servicebus.exceptions import ServiceBusServerBusyError

    moved, senders, empty = 0, {}, 0
    receiver = None
    try:
        left = count
        while left and time.perf_counter() < deadline:
            if receiver is None:
                receiver = backlog.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                                                      prefetch_count=RECEIVE_PAGE)
            try:
                page = receiver.receive_messages(max_message_count=min(RECEIVE_PAGE, left), max_wait_time=5)
            except ServiceBusServerBusyError:  # the link is detached: the SDK's receiver keeps raising it
                receiver.close()
                receiver = None
                time.sleep(BUSY_PAUSE_SECONDS)
                continue
            if not page:  # a namespace out of credits holds a receive on a link with locks: asked again
                empty += 1
                if empty > EMPTY_RECEIVES:
                    raise BenchFailure(f"loop: {queue} gave nothing {empty} times in a row with {left} messages left")
                continue
            empty = 0
            run_key, run = None, []
            for message in page:
                destination, session, restored = _restored(message)
                if destination not in senders:
                    senders[destination] = primary.get_queue_sender(destination)
                if not batched:
                    while_busy(lambda: senders[destination].send_messages(restored))  # noqa: B023
                    continue
                if (destination, session) != run_key and run:
                    _send_in_batches(senders[run_key[0]], run)
                    run = []
                run_key = (destination, session)
                run.append(restored)
            if run:
                _send_in_batches(senders[run_key[0]], run)
            for message in page:
                while_busy(lambda: receiver.complete_message(message))  # noqa: B023
            moved += len(page)
            left -= len(page)
    finally:
        if receiver is not None:
            receiver.close()
        for sender in senders.values():
            sender.close()
    return moved


def loop_child(spec: dict) -> dict:
    """A plain SDK loop (child process): ``threads`` (a thread per queue, batched sends unless ``singles``)
    or ``single``."""
    from azure.servicebus import ServiceBusClient

    start = time.perf_counter()
    deadline = start + spec["max_seconds"]
    threaded = spec["kind"] == "threads"
    moved: dict[str, int] = {}
    errors: list[BaseException] = []
    with ServiceBusClient.from_connection_string(os.environ[CONNECTION_ENV[SECONDARY]]) as backlog, \
            ServiceBusClient.from_connection_string(os.environ[CONNECTION_ENV[PRIMARY]]) as primary:
        def run(queue: str, count: int) -> None:
            try:
                moved[queue] = move_queue(backlog, primary, queue, count, deadline,
                                          batched=threaded and not spec.get("singles"))
            except BaseException as exc:  # noqa: BLE001 - raised below, after the other threads
                errors.append(exc)

        if threaded:
            threads = [threading.Thread(target=run, args=item, name=f"loop-{item[0]}")
                       for item in spec["written"].items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for queue, count in spec["written"].items():
                if time.perf_counter() < deadline:
                    run(queue, count)
    if errors:
        raise errors[0]
    return {"moved": sum(moved.values()), "seconds": time.perf_counter() - start}


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
    logging.getLogger("backlog_syphon").info("summary:\n%s", "\n".join(summary.lines()))  # credits by kind
    run, query_started = started[0]
    batches = [{"batch_id": p.batchId, "rows": p.numInputRows, "ms": p.batchDuration, "timestamp": p.timestamp,
                "duration_ms": dict(p.durationMs), "plan": planned_with(p)} for p in run.query.recentProgress]
    # The send step of each batch, as its send tasks measured it (from the first send to the last).
    sends = [{"batch_id": point.batch_id, "sent": point.stats.pacing.sent,
              "send_seconds": point.stats.pacing.last_send_at - point.stats.pacing.first_send_at}
             for point in summary.progress if point.stats is not None and point.stats.pacing is not None
             and point.stats.pacing.first_send_at is not None and point.stats.pacing.last_send_at is not None]
    jvm_peak = peak_rss_mb(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # noqa: SLF001
    timeline = getattr(summary, "timeline", None)  # None from a library older than the timeline
    marks = {milestone.name: timeline.seconds(milestone) for milestone in timeline.marks} if timeline else {}
    state = Path(config.storage.checkpoint_table).parent
    commits = delta_commits(state)  # before any commit timed below
    commit_ms = time_commits(spark, config) if spec.get("time_commits") else None
    # No spark.stop(): like jobs/syphon.py, the child leaves its JVM to end with it (the JVM exits
    # once this process has, on the end of its input), so "last record -> exit" is the job's own.
    return {"seconds": end - start, "spark_start_seconds": session_ready - start,
            "timeline": marks, "process_origin": timeline.origin if timeline else None,
            "max_messages_per_trigger": config.run.max_messages_per_trigger,
            "until_query_seconds": query_started - start, "drained": summary.drained,
            "remaining": dict(summary.remaining), "batches": batches, "sends": sends, "jvm_peak_mb": jvm_peak,
            "python_peak_mb": peak_rss_mb("self"), "returned_at": returned_at, "commits": commits,
            "commit_ms": commit_ms}


def planned_with(progress) -> dict | None:
    """The probes and rounds of the plan behind a batch, as the source reports them with its latest offset
    (Spark 4.2+; None from a library that does not)."""
    try:
        return json.loads(progress.sources[0].latestOffset).get("(last plan)")
    except (IndexError, TypeError, ValueError, AttributeError):
        return None


def time_commits(spark, config, samples: int = 7) -> dict[str, float]:
    """Median milliseconds of one Delta commit of each kind the syphon makes, on this machine's disk: the
    checkpoint table's rewrite and an audit append of 1,000 rows (the tables the run just wrote)."""
    from pyspark.sql import functions as F

    from backlog_syphon.storage import tables

    checkpoint = list(tables.read_checkpoint(spark, config.storage.checkpoint_table).values())
    audit = tables.existing_table(spark, config.storage.audit_table).limit(1000).drop("outcome_date").localCheckpoint()
    audit.count()
    timings: dict[str, list[float]] = {"checkpoint rewrite": [], "audit append (1,000 rows)": []}
    for sample in range(samples):
        began = time.perf_counter()
        tables.write_checkpoint(spark, config.storage.checkpoint_table, checkpoint)
        timings["checkpoint rewrite"].append(time.perf_counter() - began)
        began = time.perf_counter()
        tables.append_audit(config.storage.audit_table, audit.withColumn("batch_id", F.lit(-1 - sample).cast("long")),
                            "bench-commit-timing", sample)
        timings["audit append (1,000 rows)"].append(time.perf_counter() - began)
    return {kind: statistics.median(values[1:]) * 1000 for kind, values in timings.items()}


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


def measure_loop(kind: str, scenario: Scenario, args) -> dict:
    with backlog_emulator(scenario, scenario.geometry, args) as (emu, written), \
            tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        arrived_before, credits_before = arrivals(emu), credits_spent(emu)
        spec = {"kind": kind, "written": written, "max_seconds": args.loop_seconds,
                "singles": scenario.destinations is DestinationShape.PARTITIONED_DEDUPE}
        with child_process("loop", spec, emu, Path(tmp)) as child:
            result = child_result(child, "loop", Path(tmp), args.loop_seconds + 300)
        arrived, (left, dead) = arrivals(emu) - arrived_before, backlog_left(emu)
        credits = credits_since(emu, credits_before)
    moved = result["moved"]
    if arrived != moved or left != scenario.messages - moved or dead:
        raise BenchFailure(f"loop ({kind}): reports {moved} moved, destinations received {arrived}, backlog holds "
                           f"{left} and {dead} dead-lettered (of {scenario.messages})")
    return {"rate": moved / result["seconds"], "moved": moved, "seconds": result["seconds"],
            "time_bound": moved < scenario.messages, "credits": credits}


def delta_commits(state: Path) -> dict[str, int]:
    """Commits to each state table since its creation (its ``_delta_log`` JSON files, less the first)."""
    return {table: max(0, len(list((state / table / "_delta_log").glob("*.json"))) - 1) for table in STATE_TABLES}


def measure_syphon(scenario: Scenario, args, *, per_trigger: int | None = None) -> dict:
    with backlog_emulator(scenario, scenario.geometry, args) as (emu, _), \
            tempfile.TemporaryDirectory(prefix="bench-syphon-") as tmp:
        ops_before, arrived_before, credits_before = broker_ops(emu), arrivals(emu), credits_spent(emu)
        timeout = 600 + scenario.messages / 10
        settings = {} if per_trigger is None else {"run.max_messages_per_trigger": per_trigger}
        spec = {"overrides": syphon_overrides(Path(tmp), **settings), "timeout_seconds": timeout,
                "time_commits": scenario.time_commits}
        with child_process("syphon", spec, emu, Path(tmp), args.library, scenario.transport) as child, \
                CpuSampler(child.pid) as cpu:
            result = child_result(child, "syphon", Path(tmp), timeout + 300)
            cpu.wait_for_exit()  # the JVM ends after the child: its CPU until then is the run's too
        ops = broker_ops(emu) - ops_before
        credits = credits_since(emu, credits_before)
        arrived, (left, dead) = arrivals(emu) - arrived_before, backlog_left(emu)
        twice = duplicates_dropped(emu)
        reasons = dead_letter_reasons(emu) if dead else {}
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            (args.keep_logs / f"syphon-{scenario.name}.log").write_bytes((Path(tmp) / "syphon.log").read_bytes())
        failure = None
        if not result["drained"] or arrived != scenario.messages or left or dead or twice:
            kept = Path(tempfile.gettempdir()) / f"bench-syphon-{time.strftime('%Y%m%dT%H%M%S')}.log"
            kept.write_bytes((Path(tmp) / "syphon.log").read_bytes())  # the run's folder goes; its log stays
            failure = (f"drained={result['drained']}, destinations received {arrived} of {scenario.messages}, backlog "
                       f"queues hold {left}, {dead} dead-lettered, {twice} sent twice (dropped as duplicates)"
                       + "".join(f"; {n} x {why}" for why, n in reasons.items()) + f"; the run's log: {kept}")
    return {**result, "e2e_rate": scenario.messages / result["seconds"], "ops": dict(ops), "credits": credits,
            "failure": failure, "cpu_per_1000": cpu.total() / scenario.messages * 1000,
            "cpu_by_role": {role: {"processes": n, "seconds": s} for role, (n, s) in cpu.by_role().items()},
            "cpu_processes": [asdict(p) for p in cpu.processes()], **cycle_figures(result)}


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


def _epoch_ms(timestamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000


def cycle_figures(result: dict) -> dict:
    """The batch cycle's steady figures (see the module docstring) from Spark's progress and the sink's sends."""
    busy = [b for b in sorted(result["batches"], key=lambda b: b["batch_id"]) if b["rows"]]
    later = busy[1:]
    figures: dict = {"busy_batches": len(busy), "cycle_rate": None, "send_rate": None, "between_seconds": None,
                     "between_max_seconds": None}
    if later:
        began = _epoch_ms(later[0]["timestamp"])
        ended = _epoch_ms(later[-1]["timestamp"]) + later[-1]["ms"]
        figures["cycle_rate"] = sum(b["rows"] for b in later) / max(1e-3, (ended - began) / 1000)
        starts = [_epoch_ms(b["timestamp"]) for b in busy]
        gaps = [(next_start - start) / 1000 - batch["duration_ms"].get("addBatch", 0) / 1000
                for batch, start, next_start in zip(busy, starts, starts[1:])]
        if gaps:
            figures["between_seconds"] = statistics.mean(gaps)
            figures["between_max_seconds"] = max(gaps)
    later_ids = {b["batch_id"] for b in later}
    sends = [s for s in result.get("sends", ()) if s["batch_id"] in later_ids and s["send_seconds"] > 0]
    if sends:
        figures["send_rate"] = sum(s["sent"] for s in sends) / sum(s["send_seconds"] for s in sends)
    marks = result.get("timeline") or {}
    if "LEASE_TAKEN" in marks and "FIRST_BATCH" in marks:
        figures["lease_to_first_batch_seconds"] = marks["FIRST_BATCH"] - marks["LEASE_TAKEN"]
    return figures


def per_batch(result: dict) -> dict:
    """Probes, round trips and commits per non-empty batch. Probes: the most any plan after the first took,
    as the source reports them; else every single-message peek of the run (the start's too) per batch."""
    batches = max(1, result["busy_batches"])
    ops = result["ops"]
    plans = [b["plan"]["probes"] for b in sorted(result["batches"], key=lambda b: b["batch_id"])[1:]
             if b.get("plan")]
    return {"probes": max(plans) if plans else ops.get("peek_one", 0) / batches,
            "round_trips": sum(ops.get(kind, 0) for kind in ROUND_TRIP_OPS) / batches,
            "commits": (result["commits"]["audit"] + result["commits"]["checkpoint"]) / batches}


def time_split(result: dict) -> str:
    """Where a syphon run's time went: Spark start, set-up, the batches (by step), between and after them."""
    batches_s = sum(b["ms"] for b in result["batches"]) / 1000
    steps: collections.Counter = collections.Counter()
    for batch in result["batches"]:
        steps.update({step: ms for step, ms in batch["duration_ms"].items() if step != "triggerExecution"})
    by_step = ", ".join(f"{step} {ms / 1000:.1f}" for step, ms in steps.most_common() if ms >= 100)
    return (f"spark start {result['spark_start_seconds']:.1f} s, set-up before the query "
            f"{result['until_query_seconds'] - result['spark_start_seconds']:.1f} s, {result['busy_batches']} non-empty "
            f"of {len(result['batches'])} batches {batches_s:.1f} s ({by_step}), between and after the batches "
            f"{result['seconds'] - result['until_query_seconds'] - batches_s:.1f} s; {fixed_costs(result)}")


def fixed_costs(result: dict) -> str:
    """From the run's timeline: process start to the first message sent, and the last batch's record to the
    process's exit (as this process saw it end, less the child's bench-only work), with the steps between."""
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
    with backlog_emulator(None, Geometry(0.0, 0.0), args) as (emu, _), \
            tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        workdir = Path(tmp)
        spec = {"overrides": syphon_overrides(workdir, **{"run.trigger": IDLE_TRIGGER,
                                                           "run.idle_probe_max_seconds": probe_max}),
                "timeout_seconds": warm_up + window + 10}
        with child_process("syphon", spec, emu, workdir, args.library) as child:
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

    per_queue_hour = requests(ops) / BACKLOG_QUEUES / window * 3600
    expected = 3600 / probe_max
    default = RunConfig().idle_probe_max_seconds
    return {"probe_max_seconds": probe_max, "window_seconds": window, "ops": dict(ops),
            "per_queue_hour": per_queue_hour, "expected_per_queue_hour": expected,
            "matches": abs(per_queue_hour / expected - 1) <= 0.25, "default_probe_max_seconds": default,
            "projected_per_queue_hour": per_queue_hour * probe_max / default}


# --- the ceiling at a geometry --------------------------------------------------------------------

@dataclass(frozen=True)
class GeometryCeiling:
    """The emulator's ceiling where each operation meets its namespace's latency."""

    geometry: Geometry
    body_size: int
    send: float  # at the primary's latency
    peek: float  # at the secondary's
    receive_complete: float  # at the secondary's

    @property
    def combined(self) -> float:
        return 1 / (1 / self.send + 1 / self.peek + 1 / self.receive_complete)

    def line(self) -> str:
        return (f"{self.geometry.label()}, {self.body_size} B: send {self.send:.0f} (primary), peek {self.peek:.0f}, "
                f"receive+complete {self.receive_complete:.0f} (secondary), combined {self.combined:.0f} msg/s")


def geometry_ceilings(scenarios: list[Scenario], messages: int) -> dict[tuple, GeometryCeiling]:
    """``bench_emulator.ceiling`` at every round trip the rows need, combined per geometry and body size."""
    from bench_emulator import ceiling

    at: dict[tuple[float, int], object] = {}
    out = {}
    for scenario in scenarios:
        geometry, size = scenario.geometry, scenario.body_size
        for one_way in (geometry.primary_ms, geometry.secondary_ms):
            if (one_way, size) not in at:
                at[(one_way, size)] = ceiling(2 * one_way, min(messages, scenario.messages), size)
        near, far = at[(geometry.primary_ms, size)], at[(geometry.secondary_ms, size)]
        out[(geometry, size)] = GeometryCeiling(geometry, size, near.send, far.peek, far.receive_complete)
    return out


# --- the whole bench ------------------------------------------------------------------------------

COLUMNS = ["row", "geometry", "e2e msg/s", "loop thr", "loop 1", "/thr", "/1", "/30k", "cycle", "send", "cyc/send",
           "between s", "lease>1st s", "probes/b", "rt/b", "commits/b", "CPU s/1k", "cyc/ceil"]


def row_cells(scenario: Scenario, syphon: dict, loops: dict, ceiling: GeometryCeiling) -> list[str]:
    def rate(value):
        return "-" if value is None else f"{value:.0f}"

    def ratio(a, b):
        return "-" if a is None or not b else f"{a / b:.2f}"

    def seconds(value):
        return "-" if value is None else f"{value:.2f}"

    threads, single = loops.get("threads"), loops.get("single")
    counts = per_batch(syphon)
    loop_cell = lambda loop: "-" if loop is None else f"{loop['rate']:.0f}{'*' if loop['time_bound'] else ''}"  # noqa: E731
    return [scenario.name, scenario.geometry.label(), rate(syphon["e2e_rate"]), loop_cell(threads), loop_cell(single),
            ratio(syphon["e2e_rate"], threads and threads["rate"]), ratio(syphon["e2e_rate"], single and single["rate"]),
            rate(syphon["cycle_rate"]), rate(syphon["send_rate"]), ratio(syphon["cycle_rate"], syphon["send_rate"]),
            seconds(syphon["between_seconds"]), seconds(syphon.get("lease_to_first_batch_seconds")),
            f"{counts['probes']:.1f}", f"{counts['round_trips']:.0f}", f"{counts['commits']:.2f}",
            f"{syphon['cpu_per_1000']:.2f}", ratio(syphon["cycle_rate"], ceiling.combined)]


def drain_seconds(syphon: dict) -> float:
    """A syphon run's drain: from its query's start to its stop (the run's timeline), when the namespaces' credits
    are spent; the Spark start and the set-up before it spend none. The whole run where the timeline lacks it."""
    marks = syphon.get("timeline") or {}
    if "QUERY_STARTED" in marks and "QUERY_STOPPED" in marks:
        return marks["QUERY_STOPPED"] - marks["QUERY_STARTED"]
    return syphon["seconds"]


def credit_lines(scenario: Scenario, syphon: dict, loops: dict) -> list[str]:
    """What a row with the namespaces' credits on spent: per second and per moved message, per namespace, and
    the share of the secondary's budget the syphon turned into moved messages (its rate over the rate its
    credits per message allow); the loops' the same way."""
    budget, moved = scenario.credits_per_second, scenario.messages

    def spending(name: str, seconds: float, messages: int, credits: dict) -> str:
        secondary, primary = credits[SECONDARY], credits[PRIMARY]
        per_message = secondary["spent"] / max(1, messages)
        allowed = budget / per_message if per_message else None
        rate = messages / seconds
        share = f", {rate / allowed:.0%} of what its credits per message allow" if allowed else ""
        return (f"  {scenario.name}: {name}: {rate:.0f} msg/s over {seconds:.1f} s; secondary {secondary['spent']:,} "
                f"credits ({secondary['spent'] / seconds:.0f}/s, {per_message:.2f} a moved message{share}), "
                f"{secondary['throttled']} operations throttled; primary {primary['spent']:,} credits "
                f"({primary['spent'] / seconds:.0f}/s, {primary['spent'] / max(1, messages):.2f} a message), "
                f"{primary['throttled']} throttled")

    lines = [spending("syphon (its query's drain)", drain_seconds(syphon), moved, syphon["credits"])]
    lines += [spending(f"loop ({kind})", loop["seconds"], loop["moved"], loop["credits"]) for kind, loop in loops.items()]
    return lines


def format_table(header: list[str], rows: list[list[str]]) -> list[str]:
    cells = [header] + rows
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
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
    began = time.monotonic()
    scenarios = [SCENARIOS[name] for name in args.rows]
    if args.quick:
        scenarios = [replace(s, messages=min(s.messages, QUICK_MESSAGES)) for s in scenarios]
    print(f"bench_syphon: rows {', '.join(s.name + ' (' + s.describe() + ')' for s in scenarios)}; syphon "
          f"{'from ' + str(args.library) if args.library else 'from this checkout'} with "
          f"{args.max_per_trigger or 'conf/local.yaml'}'s messages per trigger; loops bounded at "
          f"{args.loop_seconds:g} s; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - began:6.0f} s] {text}", flush=True)

    failures = []  # runs that did not deliver everything: their figures are shown, the bench fails

    def check(run: str, result: dict) -> None:
        if result["failure"]:
            failures.append(f"{run}: {result['failure']}")
            progress(f"VERIFICATION FAILED: {failures[-1]}")

    ceilings = geometry_ceilings(scenarios, args.ceiling_messages)
    for ceiling in ceilings.values():
        progress(f"emulator ceiling at {ceiling.line()}")
    figures: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": [],
                     "ceilings": [asdict(c) | {"combined": c.combined} for c in ceilings.values()]}
    table, details = [], []
    for scenario in scenarios:
        loops = {}
        for kind in scenario.loops:
            loops[kind] = measure_loop(kind, scenario, args)
            progress(f"{scenario.name}: loop ({kind}): {loops[kind]['moved']} msgs in {loops[kind]['seconds']:.1f} s "
                     f"= {loops[kind]['rate']:.0f} msg/s")
        syphon = measure_syphon(scenario, args, per_trigger=args.max_per_trigger)
        counts = per_batch(syphon)
        progress(f"{scenario.name}: syphon: {scenario.messages} msgs in {syphon['seconds']:.1f} s = "
                 f"{syphon['e2e_rate']:.0f} msg/s; {time_split(syphon)}")
        check(f"syphon, row {scenario.name}", syphon)
        ceiling = ceilings[(scenario.geometry, scenario.body_size)]
        table.append(row_cells(scenario, syphon, loops, ceiling))
        details.append(f"  {scenario.name} ({scenario.describe()}): commits audit {syphon['commits']['audit']}, checkpoint "
                       f"{syphon['commits']['checkpoint']}, lease {syphon['commits']['checkpoint_lease']} over "
                       f"{syphon['busy_batches']} batches; probes {syphon['ops'].get('peek_one', 0)}, round trips "
                       f"{counts['round_trips'] * max(1, syphon['busy_batches']):.0f}; between batches max "
                       f"{syphon['between_max_seconds'] or 0:.2f} s; CPU per 1k by process: "
                       + ", ".join(f"{role} {entry['seconds'] * 1000 / scenario.messages:.2f}"
                                   for role, entry in syphon["cpu_by_role"].items()
                                   if entry["seconds"] * 1000 / scenario.messages >= 0.01))
        if scenario.credits_per_second:
            details += credit_lines(scenario, syphon, loops)
        if syphon.get("commit_ms"):
            details.append("  one Delta commit on this machine's disk (median of 6): " + ", ".join(
                f"{kind} {ms:.0f} ms" for kind, ms in syphon["commit_ms"].items()))
        figures["rows"].append({"scenario": asdict(scenario), "syphon": syphon, "loops": loops,
                                "ceiling": ceiling.combined})

    memory = []
    for count in args.memory_counts:
        scenario = Scenario(f"memory {count}", count, Geometry(0.0, 0.0))
        result = measure_syphon(scenario, args, per_trigger=MEMORY_PER_TRIGGER)
        progress(f"memory: syphon at {count} msgs: python {megabytes(result['python_peak_mb'])}, jvm "
                 f"{megabytes(result['jvm_peak_mb'])}; {result['e2e_rate']:.0f} msg/s e2e; {time_split(result)}")
        check(f"syphon at {count:,} messages", result)
        memory.append((count, result))
    figures["memory"] = [{"messages": count, **result} for count, result in memory]

    profile = None
    if args.profile_messages:
        scenario = Scenario("profile", args.profile_messages, Geometry(0.0, 0.0), session_share=0.2)
        profile = measure_syphon(scenario, args, per_trigger=MEMORY_PER_TRIGGER)
        progress(f"profile: syphon at {args.profile_messages} msgs: {profile['e2e_rate']:.0f} msg/s e2e, "
                 f"{profile['cpu_per_1000']:.2f} CPU s per 1,000 messages; {time_split(profile)}")
        check(f"syphon at {args.profile_messages:,} messages (profile)", profile)
    figures["profile"] = profile

    idle = measure_idle(args.idle_probe_seconds, args) if args.idle_probe_seconds else None
    figures["idle"] = idle
    if idle:
        progress(f"idle: {requests(collections.Counter(idle['ops']))} broker requests in {idle['window_seconds']:g} s: {idle['ops']}")

    plain = next((row["syphon"]["e2e_rate"] for row in figures["rows"] if row["scenario"]["name"] == "30k"), None)
    for cells, row in zip(table, figures["rows"]):  # each row's rate over the non-partitioned row's, this run
        cells.insert(COLUMNS.index("/30k"), f"{row['syphon']['e2e_rate'] / plain:.2f}" if plain else "-")
    figures["seconds"] = time.monotonic() - began
    print()
    print("\n".join(format_table(COLUMNS, table)))
    print("\n".join(legend(args) + details + ["emulator ceilings:"] + [f"  {c.line()}" for c in ceilings.values()]
                    + memory_lines(memory) + idle_lines(idle) + cpu_profile(profile, args)))
    print(f"bench wall time {figures['seconds'] / 60:.1f} min; load average now "
          f"{', '.join(f'{l:.2f}' for l in os.getloadavg())} on {os.cpu_count()} cores")
    figures["failures"] = failures
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr, flush=True)
    return 1 if failures else 0


def legend(args) -> list[str]:
    return [
        "geometry: one-way latency of the secondary/primary namespace (one figure: both); e2e: from just before the "
        "Spark session is built to the return of run_syphon; loop thr / loop 1: the plain loops (a thread per queue "
        f"with batched sends / one thread), * = stopped at their {args.loop_seconds:g} s bound; /thr, /1: e2e over them; "
        "/30k: e2e over the 30k row's in this run;",
        "cycle: steady rate of the whole batch cycle (batches after the first); send: the send step alone; between s: "
        "mean time per batch outside foreachBatch; lease>1st s: lease taken to first batch started;",
        "probes/b: the most probes a plan after the first took (the source's report); rt/b, commits/b: broker "
        "requests, Delta commits (audit + checkpoint) per non-empty batch; CPU s/1k: every process of the run, per 1,000 messages; cyc/ceil: cycle over the emulator's "
        "combined ceiling at the row's geometry."]


def memory_lines(memory: list) -> list[str]:
    lines = []
    for count, result in memory:
        lines.append(f"memory: driver peak at {count:,} messages (0 ms, {BACKLOG_QUEUES} queues, {MEMORY_PER_TRIGGER} per "
                     f"trigger): python {megabytes(result['python_peak_mb'])}, jvm {megabytes(result['jvm_peak_mb'])}; "
                     f"e2e {result['e2e_rate']:.0f} msg/s")
    if len(memory) == 2 and all(r[key] for _, r in memory for key in ("python_peak_mb", "jvm_peak_mb")):
        (small_count, small), (large_count, large) = memory
        lines.append(f"memory: ratio of the peaks at {large_count:,} / {small_count:,} messages: python "
                     f"{large['python_peak_mb'] / small['python_peak_mb']:.2f}, jvm "
                     f"{large['jvm_peak_mb'] / small['jvm_peak_mb']:.2f} (target: both within 0.90..1.10)")
    return lines


def idle_lines(idle: dict | None) -> list[str]:
    if not idle:
        return []
    return [f"idle: broker ops per backlog queue per hour: {idle['per_queue_hour']:.0f} measured with "
            f"run.idle_probe_max_seconds={idle['probe_max_seconds']:g} over {idle['window_seconds']:g} s (one peek per "
            f"queue per interval would be {idle['expected_per_queue_hour']:.0f}: "
            f"{'matches' if idle['matches'] else 'DOES NOT MATCH, so the projection does not hold'}); projected for the "
            f"default {idle['default_probe_max_seconds']:g} s: {idle['projected_per_queue_hour']:.1f} (target: at most 4)"]


def cpu_profile(profile: dict | None, args) -> list[str]:
    """The profile run's CPU seconds per 1,000 messages, per kind of process and per process."""
    if not profile:
        return []
    per_1000 = 1000 / args.profile_messages
    lines = [f"CPU per 1,000 messages, {args.profile_messages:,} messages at 0 ms, {BACKLOG_QUEUES} queues, "
             f"{MEMORY_PER_TRIGGER} per trigger, the job's processes together: {profile['cpu_per_1000']:.2f} s "
             f"(e2e {profile['e2e_rate']:.0f} msg/s); by kind:"]
    lines += [f"  {role}: {entry['seconds'] * per_1000:.3f} s over {entry['processes']} process"
              f"{'es' if entry['processes'] > 1 else ''}" for role, entry in profile["cpu_by_role"].items()
              if entry["seconds"] * per_1000 >= 0.001]  # not the shell tools spark-submit runs
    lines.append("  each process with at least 1% of the total: " + ", ".join(
        f"{p['role']} {p['pid']} {p['seconds'] * per_1000:.3f} s" for p in profile["cpu_processes"]
        if p["seconds"] >= 0.01 * profile["cpu_per_1000"] / per_1000))
    return lines


def megabytes(value: float | None, unit: str = " MB") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Default: every row, memory, profile and idle runs (about an hour on 2 cores).")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run of a few minutes: at most {QUICK_MESSAGES:,} messages per row in batches of 1,000, "
                        "the 30k and 30k-0ms rows, no memory or profile runs, a short idle measurement")
    p.add_argument("--rows", nargs="+", choices=list(SCENARIOS), help="the rows to run (default: all)")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--library", type=Path,
                   help="run the syphon from this lib folder (another checkout's, for before/after figures)")
    p.add_argument("--keep-logs", type=Path, help="copy each syphon run's log into this folder")
    p.add_argument("--max-per-trigger", type=int, help="syphon run.max_messages_per_trigger (default: conf/local.yaml's)")
    p.add_argument("--loop-seconds", type=float, default=60.0, help="time bound of the plain loops (default 60)")
    p.add_argument("--ceiling-messages", type=int, default=10_000, help="messages of each ceiling measurement")
    p.add_argument("--memory-counts", type=int, nargs="*",
                   help="backlog sizes of the memory runs (default 20000 100000; --quick none)")
    p.add_argument("--idle-probe-seconds", type=float,
                   help="run.idle_probe_max_seconds of the idle measurement, 0 to skip it (default 10; --quick 5)")
    p.add_argument("--profile-messages", type=int,
                   help="backlog of the CPU profile run, 0 to skip it (default 50000; --quick none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", choices=["loop", "syphon"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = dict(rows=["30k", "30k-0ms"], memory_counts=[], idle_probe_seconds=5.0, profile_messages=0,
                    ceiling_messages=QUICK_MESSAGES, max_per_trigger=1000) if args.quick else dict(
        rows=list(SCENARIOS), memory_counts=[20000, 100000], idle_probe_seconds=10.0, profile_messages=50000)
    for name, value in defaults.items():
        if getattr(args, name, None) is None or (name == "ceiling_messages" and args.quick):
            setattr(args, name, value)
    if args.library is not None:
        args.library = args.library.resolve()
    return args



# --- the migration row (issue 60) -----------------------------------------------------------------
# Self-contained at the end of the file (it was being split by role meanwhile): the row ``migration`` is a
# ``MigrationScenario``, and the three functions it needs its own way (the loop's measure and child, the
# syphon's measure) are wrapped here for it; every other row runs as above. The source namespace is the
# secondary at 25 ms holding 10 plain queues ``bench-0..9`` as a Standard namespace left them after a
# migration; the primary at 1 ms has the same queues (the Premium namespace). The syphon runs its
# migration mode (``run.source=migration``, ``migration.entities=["bench-*"]``) on conf/local.yaml; the loop
# is the threads loop above, each message copied into the queue of its own name (body, ids, properties).

@dataclass(frozen=True)
class MigrationScenario(Scenario):
    """A migration drain: ``messages`` spread evenly over ``MIGRATION_QUEUES`` plain source queues."""

    def describe(self) -> str:
        return (f"migration: {self.messages:,} x {self.body_size // 1024} KB over {MIGRATION_QUEUES} plain "
                f"queues, {self.geometry.label()}")


MIGRATION_QUEUES = 10
SCENARIOS["migration"] = MigrationScenario("migration", 30_000, FAR)


def migration_queue_names() -> list[str]:
    return [f"bench-{index}" for index in range(MIGRATION_QUEUES)]


@contextmanager
def migration_emulator(scenario: MigrationScenario, args):
    """A fresh emulator of conf/emulator.yaml plus the bench queues in both namespaces, the secondary's
    holding ``scenario``'s messages: ``(emu, {queue: [(message id, body), ...]})``."""
    import random

    import yaml
    from azure.servicebus import ServiceBusClient, ServiceBusMessage
    from servicebus_emulator import Emulator
    from servicebus_emulator.config import EmulatorConfig

    raw = yaml.safe_load((ROOT / "conf/emulator.yaml").read_text())
    for namespace in raw["namespaces"]:
        namespace["queues"] += [{"name": name, "lock_duration_seconds": 60} for name in migration_queue_names()]
    rng = random.Random(args.seed)
    written: dict[str, list[tuple[str, bytes]]] = {name: [] for name in migration_queue_names()}
    for index in range(scenario.messages):
        written[f"bench-{index % MIGRATION_QUEUES}"].append((f"m-{index}", rng.randbytes(scenario.body_size)))
    with Emulator(EmulatorConfig.from_dict(raw, source="conf/emulator.yaml + bench queues"),
                  ports={PRIMARY: 0, SECONDARY: 0}, latency_ms=scenario.geometry.emulator_latency()) as emu, \
            ServiceBusClient.from_connection_string(emu.connection_string(SECONDARY)) as client, batch_headroom():
        for queue, messages in written.items():
            with client.get_queue_sender(queue) as sender:
                _send_in_batches(sender, [
                    ServiceBusMessage(body, message_id=message_id, content_type="application/x-bench",
                                      application_properties={"index": int(message_id[2:])})
                    for message_id, body in messages])
        if migration_left(emu) != (scenario.messages, 0):
            raise BenchFailure(f"the source queues hold {migration_left(emu)} (stored, dead-lettered) after writing "
                               f"{scenario.messages} messages")
        yield emu, written


def migration_left(emu) -> tuple[int, int]:
    """(messages stored, messages dead-lettered) over the source namespace's bench queues."""
    stats = emu.stats(SECONDARY)
    queues = [stats[name] for name in migration_queue_names()]
    return sum(q["total"] for q in queues), sum(q.get("dead_letter_count", 0) for q in queues)


def migration_arrived_exact(emu, written: dict) -> str | None:
    """What differs between the destinations' bench queues (peeked) and what was written: None if nothing."""
    from azure.servicebus import ServiceBusClient

    with ServiceBusClient.from_connection_string(emu.connection_string(PRIMARY)) as client:
        for queue, messages in written.items():
            arrived = []
            with client.get_queue_receiver(queue) as receiver:
                while len(arrived) <= len(messages):
                    page = receiver.peek_messages(max_message_count=250,
                                                  sequence_number=arrived[-1][0] + 1 if arrived else 0)
                    if not page:
                        break
                    arrived += [(m.sequence_number, m.message_id, b"".join(m.body),
                                 {_text(k): v for k, v in (m.application_properties or {}).items()}) for m in page]
            expected = [(message_id, body, {"index": int(message_id[2:])}) for message_id, body in messages]
            if [a[1:] for a in arrived] != expected:
                return f"{queue}: {len(arrived)} messages arrived, not the {len(messages)} written, exact and in order"
    return None


def _copied(message):
    """A received message as a plain loop copies it: body, ids, content type and application properties."""
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(b"".join(message.body), message_id=message.message_id, content_type=message.content_type,
                             correlation_id=message.correlation_id, subject=message.subject,
                             application_properties=dict(message.application_properties or {}))


def migration_loop_child(spec: dict) -> dict:
    """The threads loop (child process) over the source queues: each page sent batched into the queue of its
    own name in the primary, then each message completed; bounded by ``max_seconds``."""
    from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

    start = time.perf_counter()
    deadline = start + spec["max_seconds"]
    moved: dict[str, int] = {}
    errors: list[BaseException] = []
    with ServiceBusClient.from_connection_string(os.environ[CONNECTION_ENV[SECONDARY]]) as source, \
            ServiceBusClient.from_connection_string(os.environ[CONNECTION_ENV[PRIMARY]]) as target:
        def run(queue: str, count: int) -> None:
            moved[queue] = 0
            try:
                with source.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                                               prefetch_count=RECEIVE_PAGE) as receiver, \
                        target.get_queue_sender(queue) as sender:
                    while moved[queue] < count and time.perf_counter() < deadline:
                        page = receiver.receive_messages(max_message_count=min(RECEIVE_PAGE, count - moved[queue]),
                                                         max_wait_time=5)
                        if not page:
                            raise BenchFailure(f"loop: {queue} gave nothing with {count - moved[queue]} messages left")
                        _send_in_batches(sender, [_copied(message) for message in page])
                        for message in page:
                            receiver.complete_message(message)
                        moved[queue] += len(page)
            except BaseException as exc:  # noqa: BLE001 - raised below, after the other threads
                errors.append(exc)

        threads = [threading.Thread(target=run, args=item, name=f"loop-{item[0]}") for item in spec["written"].items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return {"moved": sum(moved.values()), "seconds": time.perf_counter() - start}


def measure_migration_loop(scenario: MigrationScenario, args) -> dict:
    with migration_emulator(scenario, args) as (emu, written), tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        spec = {"migration": True, "written": {queue: len(messages) for queue, messages in written.items()},
                "max_seconds": args.loop_seconds}
        with child_process("loop", spec, emu, Path(tmp)) as child:
            result = child_result(child, "loop", Path(tmp), args.loop_seconds + 300)
        arrived, (left, dead) = arrivals(emu), migration_left(emu)
    moved = result["moved"]
    if arrived != moved or left != scenario.messages - moved or dead:
        raise BenchFailure(f"loop (migration): reports {moved} moved, destinations received {arrived}, sources hold "
                           f"{left} and {dead} dead-lettered (of {scenario.messages})")
    return {"rate": moved / result["seconds"], "moved": moved, "seconds": result["seconds"],
            "time_bound": moved < scenario.messages}


def measure_migration_syphon(scenario: MigrationScenario, args, *, per_trigger: int | None = None) -> dict:
    """The syphon's migration mode on ``scenario``; its failure: not drained, a message missing, twice or
    different, or one left in a source queue."""
    with migration_emulator(scenario, args) as (emu, written), \
            tempfile.TemporaryDirectory(prefix="bench-syphon-") as tmp:
        ops_before = broker_ops(emu)
        timeout = 600 + scenario.messages / 10
        settings = {"run.source": "migration", "migration.entities": '["bench-*"]',
                    **({} if per_trigger is None else {"run.max_messages_per_trigger": per_trigger})}
        spec = {"overrides": syphon_overrides(Path(tmp), **settings), "timeout_seconds": timeout}
        with child_process("syphon", spec, emu, Path(tmp), args.library) as child, CpuSampler(child.pid) as cpu:
            result = child_result(child, "syphon", Path(tmp), timeout + 300)
            cpu.wait_for_exit()
        ops = broker_ops(emu) - ops_before
        arrived, (left, dead), twice = arrivals(emu), migration_left(emu), duplicates_dropped(emu)
        different = migration_arrived_exact(emu, written) if arrived == scenario.messages else None
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            (args.keep_logs / f"syphon-{scenario.name}.log").write_bytes((Path(tmp) / "syphon.log").read_bytes())
        failure = None
        if not result["drained"] or arrived != scenario.messages or left or dead or twice or different:
            kept = Path(tempfile.gettempdir()) / f"bench-syphon-{time.strftime('%Y%m%dT%H%M%S')}.log"
            kept.write_bytes((Path(tmp) / "syphon.log").read_bytes())
            failure = (f"drained={result['drained']}, destinations received {arrived} of {scenario.messages}, source "
                       f"queues hold {left}, {dead} dead-lettered, {twice} sent twice; {different or 'exact'}; "
                       f"the run's log: {kept}")
    return {**result, "e2e_rate": scenario.messages / result["seconds"], "ops": dict(ops),
            "failure": failure, "cpu_per_1000": cpu.total() / scenario.messages * 1000,
            "cpu_by_role": {role: {"processes": n, "seconds": s} for role, (n, s) in cpu.by_role().items()},
            "cpu_processes": [asdict(p) for p in cpu.processes()], **cycle_figures(result)}


def _for_migration(backlog_way, migration_way):
    """``backlog_way``, or ``migration_way`` where its first argument is a migration row (or spec)."""
    def either(first, *args, **kwargs):
        migrating = isinstance(first, MigrationScenario) or (isinstance(first, dict) and first.get("migration"))
        return (migration_way if migrating else backlog_way)(first, *args, **kwargs)
    return either


measure_syphon = _for_migration(measure_syphon, measure_migration_syphon)
loop_child = _for_migration(loop_child, migration_loop_child)
_measure_loop = measure_loop


def measure_loop(kind: str, scenario: Scenario, args) -> dict:  # noqa: F811 - the migration row's, else the above
    if isinstance(scenario, MigrationScenario):
        return measure_migration_loop(scenario, args)
    return _measure_loop(kind, scenario, args)


if __name__ == "__main__":
    sys.exit(main())
