"""One syphon run as a user starts it: a fresh Python driver and JVM in a child process (``syphon_child``),
measured from the bench (``measure_syphon``: rate, CPU of every process of the run, broker requests, commits,
and whether every message arrived once and in order); and the broker operations of an idle continuous run
(``measure_idle``)."""
from __future__ import annotations

import collections
import json
import logging
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from process_cpu import CpuSampler, OwnCpu
from syphon_bench import BenchFailure
from syphon_bench.broker import (
    ROOT,
    arrivals,
    backlog_emulator,
    backlog_left,
    broker_ops,
    credits_since,
    credits_spent,
    dead_letter_reasons,
    duplicates_dropped,
    requests,
)
from syphon_bench.children import child_process, child_result, log_tail
from syphon_bench.figures import cycle_figures, steady_span
from syphon_bench.jvm_profile import jvm_samples_by_step
from syphon_bench.python_profile import cpu_by_step, sampled
from syphon_bench.rows import BACKLOG_QUEUES, LOOPBACK, DestinationShape, Scenario

IDLE_TRIGGER = "1 second"
STATE_TABLES = ("audit", "checkpoint", "checkpoint_lease")


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

    extra_conf = {"spark.sql.streaming.numRecentProgressUpdates": "100000"}
    from backlog_syphon.local_setup.jvm_options import DRIVER_JAVA_OPTIONS, driver_java_options

    if spec.get("jfr"):  # a Java Flight Recording of the driver JVM, beside the options the syphon gives it
        extra_conf["spark.driver.extraJavaOptions"] = (f"{driver_java_options()} -XX:StartFlightRecording="
                                                      f"filename={spec['jfr']},settings=profile")
    if (spec.get("master") or "").startswith("local-cluster"):
        # Executors of their own on this machine, started as a local driver JVM is (the quick compiler, one GC
        # thread): a cluster's long-lived executors keep their JVM's defaults, but on 2 cores their optimizing
        # compiler alone took more CPU than the run's messages.
        extra_conf["spark.executor.extraJavaOptions"] = DRIVER_JAVA_OPTIONS
    start = time.perf_counter()
    spark = build_spark_session("bench-syphon", master=spec.get("master"), extra_conf=extra_conf)
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

    from backlog_syphon.storage import audit_table, checkpoint_table, delta

    checkpoint = list(checkpoint_table.read_checkpoint(spark, config.storage.checkpoint_table).values())
    audit = delta.existing_table(spark, config.storage.audit_table).limit(1000).drop("outcome_date").localCheckpoint()
    audit.count()
    timings: dict[str, list[float]] = {"checkpoint rewrite": [], "audit append (1,000 rows)": []}
    for sample in range(samples):
        began = time.perf_counter()
        checkpoint_table.write_checkpoint(spark, config.storage.checkpoint_table, checkpoint)
        timings["checkpoint rewrite"].append(time.perf_counter() - began)
        began = time.perf_counter()
        audit_table.append_audit(config.storage.audit_table,
                                 audit.withColumn("batch_id", F.lit(-1 - sample).cast("long")),
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


def syphon_overrides(workdir: Path, **settings) -> dict[str, str]:
    state = workdir / "state"
    return {"storage.audit_table": str(state / "audit"), "storage.checkpoint_table": str(state / "checkpoint"),
            "storage.checkpoint_location": str(state / "checkpoint-stream"), "run.trigger": "available_now",
            **{key: str(value) for key, value in settings.items()}}


def delta_commits(state: Path) -> dict[str, int]:
    """Commits to each state table since its creation (its ``_delta_log`` JSON files, less the first)."""
    return {table: max(0, len(list((state / table / "_delta_log").glob("*.json"))) - 1) for table in STATE_TABLES}


def keep_run_log(args, tmp: str, name: str) -> None:
    """With ``--keep-logs``, the run's log kept there as ``syphon-<name>.log``."""
    if args.keep_logs:
        args.keep_logs.mkdir(parents=True, exist_ok=True)
        (args.keep_logs / f"syphon-{name}.log").write_bytes((Path(tmp) / "syphon.log").read_bytes())


def kept_failure_log(tmp: str) -> Path:
    """A failed run's log, copied out of its folder (which goes) to a dated file that stays."""
    kept = Path(tempfile.gettempdir()) / f"bench-syphon-{time.strftime('%Y%m%dT%H%M%S')}.log"
    kept.write_bytes((Path(tmp) / "syphon.log").read_bytes())
    return kept


def measure_syphon(scenario: Scenario, args, *, per_trigger: int | None = None, library: Path | None = None) -> dict:
    """One syphon run over a fresh backlog of ``scenario`` (from ``library``'s ``lib``: None, this checkout's)."""
    with backlog_emulator(scenario, scenario.geometry, args) as (emu, backlog), \
            tempfile.TemporaryDirectory(prefix="bench-syphon-") as tmp:
        ops_before, arrived_before, credits_before = broker_ops(emu), arrivals(emu), credits_spent(emu)
        timeout = 600 + scenario.messages / 10
        settings = {} if per_trigger is None else {"run.max_messages_per_trigger": per_trigger}
        if scenario.budget_known:
            settings.update({f"{role}.max_credits_per_second": scenario.credits_per_second
                             for role in ("primary", "secondary")})
        suffix = "" if library is None or library == args.library else "-before"
        spied = args.py_spy / f"{scenario.name}{suffix}.txt" if args.py_spy else None
        recording = args.jfr / f"{scenario.name}{suffix}.jfr" if args.jfr else None
        if recording is not None:
            recording.parent.mkdir(parents=True, exist_ok=True)
        spec = {"overrides": syphon_overrides(Path(tmp), **settings), "timeout_seconds": timeout,
                # an older checkout's lib (``--before``) may lack the table modules the commit timing uses
                "time_commits": scenario.time_commits and not suffix, "master": scenario.master,
                "jfr": str(recording) if recording else None}
        with OwnCpu() as own, child_process("syphon", spec, emu, Path(tmp), library, scenario.transport) as child, \
                CpuSampler(child.pid) as cpu, sampled(child.pid, spied) as follower:
            result = child_result(child, "syphon", Path(tmp), timeout + 300)
            cpu.wait_for_exit()  # the JVM ends after the child: its CPU until then is the run's too
        ops = broker_ops(emu) - ops_before
        credits = credits_since(emu, credits_before)
        arrived, (left, dead) = arrivals(emu) - arrived_before, backlog_left(emu)
        twice = duplicates_dropped(emu)
        disorder = backlog.arrival_problems(
            emu, keyless_unordered=scenario.destinations is DestinationShape.PARTITIONED_DEDUPE)
        reasons = dead_letter_reasons(emu) if dead else {}
        keep_run_log(args, tmp, f"{scenario.name}{suffix}")
        failure = None
        if not result["drained"] or arrived != scenario.messages or left or dead or twice or disorder:
            kept = kept_failure_log(tmp)
            failure = (f"drained={result['drained']}, destinations received {arrived} of {scenario.messages}, backlog "
                       f"queues hold {left}, {dead} dead-lettered, {twice} sent twice (dropped as duplicates)"
                       + "".join(f"; {n} x {why}" for why, n in reasons.items())
                       + "".join(f"; {problem}" for problem in disorder) + f"; the run's log: {kept}")
    if spied is not None and spied.exists():
        per_pid = {process.pid: process.seconds for process in cpu.processes()}
        result["python_steps"] = dict(cpu_by_step(spied.read_text(errors="replace"), per_pid).most_common())
    if recording is not None and recording.exists():
        result["jvm_steps"] = dict(jvm_samples_by_step(recording, result.get("process_origin"),
                                                       (result.get("timeline") or {}).get("FIRST_BATCH")))
    marks = result.get("timeline") or {}
    if result.get("process_origin") is not None and "FIRST_BATCH" in marks:
        # The start's CPU (every process, until the first batch) and the batches' per 1,000 messages.
        result["start_cpu_seconds"] = cpu.total_at(result["process_origin"] + marks["FIRST_BATCH"])
        result["batches_cpu_per_1000"] = (cpu.total() - result["start_cpu_seconds"]) / scenario.messages * 1000
    steady = steady_span(result)
    if steady is not None:  # the steady cycle's CPU: from the second non-empty batch's start to the last's end
        began, ended, rows = steady
        result["steady_cpu_per_1000"] = (cpu.total_at(ended) - cpu.total_at(began)) / rows * 1000
    # This process's CPU meanwhile, less its sampling: the emulator's (it runs in here), per 1,000 messages.
    result["emulator_cpu_per_1000"] = (own.seconds - cpu.own_seconds - follower.own_seconds) / scenario.messages * 1000
    return {**result, "e2e_rate": scenario.messages / result["seconds"], "ops": dict(ops), "credits": credits,
            "failure": failure, "cpu_per_1000": cpu.total() / scenario.messages * 1000,
            "cpu_by_role": {role: {"processes": n, "seconds": s} for role, (n, s) in cpu.by_role().items()},
            "cpu_processes": [asdict(p) for p in cpu.processes()], "jvm_threads": cpu.jvm_threads(),
            **cycle_figures(result)}


def measure_idle(probe_max: float, args) -> dict:
    """Broker operations of a continuous run on empty backlog queues, over six probe intervals after warm-up."""
    warm_up, window = 3 * probe_max, 6 * probe_max
    with backlog_emulator(None, LOOPBACK, args) as (emu, _), \
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

    per_queue_hour = requests(collections.Counter(ops)) / BACKLOG_QUEUES / window * 3600
    expected = 3600 / probe_max
    default = RunConfig().idle_probe_max_seconds
    return {"probe_max_seconds": probe_max, "window_seconds": window, "ops": dict(ops),
            "per_queue_hour": per_queue_hour, "expected_per_queue_hour": expected,
            "matches": abs(per_queue_hour / expected - 1) <= 0.25, "default_probe_max_seconds": default,
            "projected_per_queue_hour": per_queue_hour * probe_max / default}
