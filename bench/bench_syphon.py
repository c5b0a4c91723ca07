"""The syphon where a real failover puts it, against competent plain SDK loops and the emulator's ceiling.

    PYTHONPATH=lib:emulator/src PYSPARK_PYTHON=$PWD/.venv/bin/python \\
        .venv/bin/python bench/bench_syphon.py [--quick] [--rows NAME ...] [--json PATH] [--library PATH] [--before PATH]

After a failover the backlog queues live in the secondary namespace, a region away from the job
(30-80 ms), while the primary is near (1-3 ms). So the rows run at that *geometry*: the emulator
adds a latency per namespace (the secondary 25 ms one way, the primary 1 ms), and today's symmetric
rows (0 and 10 ms on both) stay for comparison. Every measurement gets a fresh emulator of
conf/emulator.yaml, run in this process on ephemeral ports on 127.0.0.1, and a legacy backlog
written before any clock starts (``backlog_writer.realistic_backlog`` over 10 backlog queues, a tenth
of it for the session queue unless the row says otherwise). The movers run in child processes,
which get the two connection strings by environment (the variables conf/local.yaml reads). The
parts, one role each, are in ``bench/syphon_bench/``: the rows (``rows.py``), the emulator and its
counters (``broker.py``), the loops (``loops.py``, ``async_loop.py``), a syphon run (``syphon_run.py``,
``figures.py``), the ceiling (``ceiling.py``) and the report (``report.py``).

- syphon: a fresh Python driver and JVM per run: ``build_spark_session`` (the row's Spark master:
  ``local[2]``, or ``local-cluster`` with executors of their own), then ``run_syphon`` (available-now)
  with conf/local.yaml as a new user has it, Delta state in a temporary folder.
- loop (threads): a thread per backlog queue, each with its own PeekLock receiver (prefetch 100);
  pages of 100; each page's messages sent batched per destination and session (consecutive runs, in
  order), then each message completed, one round trip after the other.
- loop (asyncio): ``azure.servicebus.aio``, a task per backlog queue, PeekLock with prefetch 300, pages
  of 100, the same sends, then the page's completions gathered (``asyncio.gather``): what a competent
  engineer writes today, and the faster loop wherever the backlog is far.
- loop (single): the same work in one thread, queue after queue, one send per message.
Every loop restores the four ``x-ms-*`` properties (destination, SessionId, TimeToLive, scheduled
enqueue time) and knows how many messages each queue holds. The loops are bounded by time
(``--loop-seconds``): each stops after the page in flight, and its rate is what it moved in the time it
ran. Every geometry row runs the threads and asyncio loops; every ratio against a loop is against the
faster loop of the same row.
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
all partitioned, without and with duplicate detection; there the loops send one message per send, as a
deduplicating partitioned entity takes one MessageId per batch), ``standard-credits`` and
``standard-credits-partitioned`` (the 30k row, plain and over partitioned backlog queues, both namespaces
with a Standard namespace's 1,000 credits a second: a peek, a receive and a send cost one per message, a
settlement one per lock token; every other row runs with the emulator's credits off, so that it measures the
syphon, not the budget), ``scale-local2``, ``scale-1x1``, ``scale-2x1``
and ``scale-2x2`` (100,000 x 1 KB: on one JVM with two task slots, then on ``local-cluster``, executors of
their own: one of one core, two of one, two of two, more cores than the loop's one process can use; how the
syphon grows with executors, against the first row's loops), ``30k-0ms`` and ``30k-10ms`` (symmetric),
``30k-tls`` and ``30k-websockets`` (the 30k row with the syphon reaching both namespaces over AMQP over TLS,
a real namespace's 5671, and over AMQP over WebSockets over TLS, 443: what a firewalled workspace costs
against the plain row of the same run, its ``/30k``; no loops). The figures per row:

- e2e msg/s: messages / time from just before the Spark session is built to the return of
  ``run_syphon``; ``/loop``: that over the faster loop's rate in the same row; ``/30k``: that over the
  30k row's (the non-partitioned entities) in the same run.
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
  messages; the detail lines give it per kind of process; loop CPU: the faster loop's, the same way.
- cycle/ceiling: cycle msg/s over the emulator's combined ceiling at the row's geometry.

Also measured: one Delta commit of each kind on this machine, the syphon's memory at 20,000 and
100,000 messages (0 ms), the CPU profile at 50,000 (0 ms; the asyncio loop's on the same backlog beside
it), and the broker operations of an idle continuous run. ``--library PATH`` runs the syphon from
another checkout's ``lib``; ``--before PATH`` runs it from there *as well*, beside this checkout's on
every row and the profile, in the same run (the before/after of a change on a machine whose speed
varies from week to week).

A run, the syphon's or a loop's, must end with every message it moved arrived at its destination once
and in order (the emulator's stored messages: per backlog queue, or partition of a partitioned one, in
the order the backlog stored them; keyless messages to a partitioned destination with duplicate
detection in any order, as design.md's invariant 3 says). A syphon run that does not end drained that
way fails the bench: its figures are still shown, with what went wrong, and the bench exits 1 at the
end. A loop that does not, a child that crashes or times out, stop the bench at once (exit 1).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY_ENV = "BENCH_SYPHON_LIBRARY"  # a child's syphon library (``--library``), before this checkout's
# bench_emulator, process_cpu and syphon_bench sit next to this file (the script's folder is on the path);
# tools/ is under ROOT.
sys.path[:0] = [os.environ.get(LIBRARY_ENV) or str(ROOT / "lib"), str(ROOT / "emulator" / "src"), str(ROOT)]

from syphon_bench import BenchFailure  # noqa: E402  (after the path: its modules import tools.testing)
from syphon_bench.broker import requests  # noqa: E402
from syphon_bench.ceiling import geometry_ceilings  # noqa: E402
from syphon_bench.children import run_child  # noqa: E402
from syphon_bench.figures import time_split  # noqa: E402
from syphon_bench.loops import measure_loop  # noqa: E402
from syphon_bench import report  # noqa: E402
from syphon_bench.rows import LOOPBACK, QUICK_MESSAGES, SCENARIOS, Loop, Scenario  # noqa: E402
from syphon_bench.syphon_run import measure_idle, measure_syphon  # noqa: E402
from syphon_bench import migration_row  # noqa: E402  (registers the migration row)


def _for_migration(backlog_way, migration_way):
    """``backlog_way``, or ``migration_way`` where the call's scenario is the migration row."""
    def either(*args, **kwargs):
        scenario = next(arg for arg in args if isinstance(arg, Scenario))
        return (migration_way if isinstance(scenario, migration_row.MigrationScenario) else backlog_way)(*args, **kwargs)
    return either


measure_syphon = _for_migration(measure_syphon, migration_row.measure_migration_syphon)
measure_loop = _for_migration(measure_loop, lambda kind, scenario, args: migration_row.measure_migration_loop(
    scenario, args))

MEMORY_PER_TRIGGER = 5000


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(args.child, json.loads(args.spec), args.result)
    try:
        return run_bench(args)
    except BenchFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr, flush=True)
        return 1


def run_bench(args) -> int:
    began = time.monotonic()
    scenarios = [SCENARIOS[name] for name in args.rows]
    cap = QUICK_MESSAGES if args.quick else args.messages
    if cap:
        scenarios = [replace(s, messages=min(s.messages, cap)) for s in scenarios]
    print(f"bench_syphon: rows {', '.join(s.name + ' (' + s.describe() + ')' for s in scenarios)}; syphon "
          f"{'from ' + str(args.library) if args.library else 'from this checkout'}"
          f"{', and from ' + str(args.before) + ' beside it' if args.before else ''} with "
          f"{args.max_per_trigger or 'conf/local.yaml'}'s messages per trigger; loops bounded at "
          f"{args.loop_seconds:g} s; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - began:6.0f} s] {text} (load {os.getloadavg()[0]:.1f})", flush=True)

    failures = []  # runs that did not deliver everything: their figures are shown, the bench fails

    def check(run: str, result: dict) -> None:
        if result["failure"]:
            failures.append(f"{run}: {result['failure']}")
            progress(f"VERIFICATION FAILED: {failures[-1]}")

    def syphon_runs(scenario: Scenario, name: str, per_trigger: int | None) -> tuple[dict, dict | None]:
        """The row's syphon from this checkout (or ``--library``) and, with ``--before``, from there too."""
        runs = {}
        for label, library in (("syphon", args.library), ("before", args.before)):
            if label == "before" and library is None:
                continue
            runs[label] = result = measure_syphon(scenario, args, per_trigger=per_trigger, library=library)
            progress(f"{name}: {label}: {scenario.messages} msgs in {result['seconds']:.1f} s = "
                     f"{result['e2e_rate']:.0f} msg/s, CPU {result['cpu_per_1000']:.2f} s/1k, the emulator's "
                     f"{result['emulator_cpu_per_1000']:.2f}; {time_split(result)}")
            check(f"{label}, row {name}", result)
        return runs["syphon"], runs.get("before")

    ceilings = geometry_ceilings(scenarios, args.ceiling_messages)
    for ceiling in ceilings.values():
        progress(f"emulator ceiling at {ceiling.line()}")
    figures: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": [],
                     "ceilings": [asdict(c) | {"combined": c.combined} for c in ceilings.values()]}
    table, before_table, details = [], [], []
    loops_by_row: dict[str, dict] = {}
    for scenario in scenarios:
        loops = loops_by_row[scenario.name] = {}
        for kind in scenario.loops if args.loops is None else [k for k in scenario.loops if k.value in args.loops]:
            loops[kind] = measure_loop(kind, scenario, args)
            progress(f"{scenario.name}: loop ({kind.value}): {loops[kind]['moved']} msgs in "
                     f"{loops[kind]['seconds']:.1f} s = {loops[kind]['rate']:.0f} msg/s, CPU "
                     f"{loops[kind]['cpu_per_1000']:.2f} s/1k, the emulator's {loops[kind]['emulator_cpu_per_1000']:.2f}"
                     + (f"; {loops[kind]['sent_twice']} sent twice, {loops[kind]['out_of_order']} order problem(s)"
                        if loops[kind]["sent_twice"] or loops[kind]["out_of_order"] else ""))
        syphon, before = syphon_runs(scenario, scenario.name, args.max_per_trigger)
        if not loops and scenario.loops_of:  # the same backlog's loops, measured on another row of this run
            loops = loops_by_row.get(scenario.loops_of, {})
        ceiling = ceilings[(scenario.geometry, scenario.body_size)]
        table.append(report.row_cells(scenario, syphon, loops, ceiling))
        if before is not None:
            before_table.append(report.before_cells(scenario, syphon, before, loops))
        details += report.details_lines(scenario, syphon)
        if scenario.credits_per_second:
            details += report.credit_lines(scenario, syphon, loops)
        if before is not None:
            details += report.details_lines(replace(scenario, name=f"{scenario.name}, before"), before)
        figures["rows"].append({"scenario": asdict(scenario), "syphon": syphon, "before": before,
                                "loops": {kind.value: loop for kind, loop in loops.items()},
                                "ceiling": ceiling.combined})

    memory = []
    for count in args.memory_counts:
        scenario = Scenario(f"memory {count}", count, LOOPBACK)
        result = measure_syphon(scenario, args, per_trigger=MEMORY_PER_TRIGGER, library=args.library)
        progress(f"memory: syphon at {count} msgs: python {report.megabytes(result['python_peak_mb'])}, jvm "
                 f"{report.megabytes(result['jvm_peak_mb'])}; {result['e2e_rate']:.0f} msg/s e2e; {time_split(result)}")
        check(f"syphon at {count:,} messages", result)
        memory.append((count, result))
    figures["memory"] = [{"messages": count, **result} for count, result in memory]

    profile = None
    if args.profile_messages:
        scenario = Scenario("profile", args.profile_messages, LOOPBACK, session_share=0.2)
        loop = measure_loop(Loop.ASYNCIO, scenario, args)
        progress(f"profile: the asyncio loop: {loop['moved']} msgs = {loop['rate']:.0f} msg/s, CPU "
                 f"{loop['cpu_per_1000']:.2f} s/1k, the emulator's {loop['emulator_cpu_per_1000']:.2f}")
        syphon, before = syphon_runs(scenario, "profile", MEMORY_PER_TRIGGER)
        profile = {"syphon": syphon, "before": before, "loop": loop}
        details += report.details_lines(scenario, syphon)
        if before is not None:
            details += report.details_lines(replace(scenario, name="profile, before"), before)
    figures["profile"] = profile

    idle = measure_idle(args.idle_probe_seconds, args) if args.idle_probe_seconds else None
    figures["idle"] = idle
    if idle:
        progress(f"idle: {requests(collections.Counter(idle['ops']))} broker requests in {idle['window_seconds']:g} s: "
                 f"{idle['ops']}")

    plain = next((row["syphon"]["e2e_rate"] for row in figures["rows"] if row["scenario"]["name"] == "30k"), None)
    for cells, row in zip(table, figures["rows"]):  # each row's rate over the non-partitioned row's, this run
        cells[report.COLUMNS.index("/30k")] = f"{row['syphon']['e2e_rate'] / plain:.2f}" if plain else "-"
    figures["seconds"] = time.monotonic() - began
    print()
    print("\n".join(report.format_table(report.COLUMNS, table)))
    if before_table:
        print(f"\nthis checkout against --before {args.before}, row by row in the same run:")
        print("\n".join(report.format_table(report.BEFORE_COLUMNS, before_table)))
    print("\n".join(report.legend(args) + details + ["emulator ceilings:"] + [f"  {c.line()}" for c in ceilings.values()]
                    + report.memory_lines(memory, MEMORY_PER_TRIGGER) + report.idle_lines(idle)
                    + report.cpu_profile(profile, args.profile_messages, MEMORY_PER_TRIGGER)))
    print(f"bench wall time {figures['seconds'] / 60:.1f} min; load average now "
          f"{', '.join(f'{l:.2f}' for l in os.getloadavg())} on {os.cpu_count()} cores")
    figures["failures"] = failures
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr, flush=True)
    return 1 if failures else 0


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Default: every row, memory, profile and idle runs (well over an hour on 2 "
                                       "cores).")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run of a few minutes: at most {QUICK_MESSAGES:,} messages per row in batches of 1,000, "
                        "the 30k and 30k-0ms rows, no memory or profile runs, a short idle measurement")
    p.add_argument("--rows", nargs="*", choices=list(SCENARIOS), help="the rows to run (default: all; none: only the "
                                                                      "memory, profile and idle runs)")
    p.add_argument("--messages", type=int, help="at most this many messages per row (a smoke run of the rows)")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--library", type=Path,
                   help="run the syphon from this lib folder (another checkout's, for before/after figures)")
    p.add_argument("--before", type=Path,
                   help="also run the syphon from this lib folder, beside this checkout's, on every row and the "
                        "profile: a before/after in one run")
    p.add_argument("--keep-logs", type=Path, help="copy each syphon run's log into this folder")
    p.add_argument("--py-spy", type=Path, help="sample every Python process of each syphon run with py-spy into this "
                                               "folder, and give their CPU step by step (py-spy on the PATH or PY_SPY)")
    p.add_argument("--jfr", type=Path, help="record each syphon run's driver JVM with Java Flight Recorder into this "
                                            "folder, and give its samples step by step (the JDK's jfr on the PATH)")
    p.add_argument("--max-per-trigger", type=int, help="syphon run.max_messages_per_trigger (default: conf/local.yaml's)")
    p.add_argument("--loops", nargs="*", choices=[loop.value for loop in Loop],
                   help="run only these of each row's loops (none: the syphon alone, a profiling run)")
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
    for name in ("py_spy", "jfr"):
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    for name in ("library", "before"):
        if getattr(args, name) is not None:
            setattr(args, name, staged_library(getattr(args, name).resolve(), name))
    return args


def staged_library(lib: Path, label: str) -> Path:
    """``lib`` (a ``lib`` folder holding ``backlog_syphon``) where its runs find this checkout's Delta JARs and JVM
    class archive: those live in ``<repo>/.cache``, found from the library's own place, and another checkout (a
    ``git worktree`` of main, say) has none. So it is copied to ``.bench-lib-<label>`` in this checkout, where
    its session's class path is this checkout's and the class archive fits it: the two runs start alike."""
    if not (lib / "backlog_syphon").is_dir():
        raise SystemExit(f"--{label} {lib}: no backlog_syphon package in it (give the lib folder of a checkout)")
    if (lib.parent / ".cache" / "jars").is_dir():
        return lib
    staged = ROOT / f".bench-lib-{label}"
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(lib / "backlog_syphon", staged / "backlog_syphon", ignore=shutil.ignore_patterns("__pycache__"))
    return staged


if __name__ == "__main__":
    sys.exit(main())
