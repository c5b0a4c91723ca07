"""The continuous syphon over a long life: does the thousandth batch cost what the first did?

    make soak SOAK_ARGS="--batches 40"      # a short run; the default is 2,000 batches (about 80 minutes)
    # Ctrl-C (SIGINT to this process), or a SIGTERM, ends a run early: the run stops as after its last batch,
    # and reports.
    PYTHONPATH=lib:emulator/src .venv/bin/python bench/soak.py [--batches N | --minutes M] [--rate R]
        [--library PATH] [--json PATH]

A fresh emulator of conf/emulator.yaml runs in this process on ephemeral ports on 127.0.0.1, with 4 of
its backlog queues (``--queues``). The job is the command line (``backlog_syphon.cli``, what
``jobs/syphon.py`` runs) in a child process, with conf/local.yaml as a user has it but for the
continuous trigger (``--trigger``, ``2 seconds``), ``backlog.queue_count`` (the 4 queues) and its
Delta state in a temporary folder; it gets the connection strings by environment, as in
``bench/bench_syphon.py``. ``--library PATH`` runs it from another checkout's ``lib`` (the "before"
figures of an older commit, on the same machine).

Once its query has started, a thread writes new legacy backlog messages at ``--rate`` per second (20)
over the backlog queues, for the destination queues ``orders`` and ``payments``, each carrying its
write time; receivers on those queues time every arrival and count how often each message came.
After ``--batches`` batches (or ``--minutes``), the writing stops, everything written must arrive,
and the job gets SIGTERM: it must exit 0 with every message received exactly once, recorded once (one
``delivered`` row in the audit table, read with an independent Delta reader, across all the compactions
of the run) and the backlog queues empty (none dead-lettered). Any of these failing fails the bench
(exit code 1).

Measured (``bench/soak_sampler.py``): each batch's ``foreachBatch`` seconds and its step split (plan,
read+send, aggregate, record) from the sink's batch line in the job's log; every ``--sample-seconds``
the resident memory of the job's processes (its Python driver, the JVM, PySpark's daemon and workers)
and the state tables' files (the audit table's data files, those it holds now as its log says, and its
``_delta_log`` entries on disk; the
checkpoint table's and the streaming checkpoint's in the JSON); every ``--heap-seconds`` the JVM's
heap after a full GC (jcmd). The ``--status`` command's wall time (a fresh process against the same
configuration and state, while the job runs) after about 20 batches and at the end.

The report (``bench/soak_report.py``): a line per tenth of the run's batches, then the issue's target
table (last tenth over first tenth, the audit's data files at the end, the status's end over its
early time), and the last tenth over the first tenth's second half: the first tenth also holds the job's
start, which flatters a ratio against it. ``--json PATH`` writes every figure, every batch and sample
included.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY_ENV = "SOAK_SYPHON_LIBRARY"  # the job's library (``--library``), before this checkout's
sys.path[:0] = [os.environ.get(LIBRARY_ENV) or str(ROOT / "lib"), str(ROOT / "emulator" / "src"), str(ROOT)]

import soak_report as report  # noqa: E402  (the script's folder is on the path)
from soak_report import BatchFigure  # noqa: E402
from soak_sampler import AUDIT_TABLE, CHECKPOINT_TABLE, STREAMING_CHECKPOINT, BatchLog, JobSampler  # noqa: E402
from soak_traffic import Receiver, Traffic  # noqa: E402

PRIMARY, SECONDARY = "contoso", "contoso-secondary"
STARTED_MARK = "started run_id="  # the job's log line once its query runs (``run.syphon.start_syphon``)
STATUS_EARLY_BATCHES = 20
START_TIMEOUT = 600.0
DRAIN_TIMEOUT = 300.0
STOP_TIMEOUT = 300.0


class SoakFailure(RuntimeError):
    """The run went wrong (a message lost or doubled, the job failed): the bench exits 1."""


def emulator_config(queues: int):
    """conf/emulator.yaml with only the first ``queues`` backlog queues in the secondary namespace."""
    import yaml
    from servicebus_emulator.config import EmulatorConfig

    raw = yaml.safe_load((ROOT / "conf/emulator.yaml").read_text())
    for namespace in raw["namespaces"]:
        if namespace["name"] == SECONDARY:
            namespace["queues"] = namespace["queues"][:queues]
    return EmulatorConfig.from_dict(raw, source="conf/emulator.yaml")


def job_environment(emu, library: Path | None) -> dict[str, str]:
    """This process's environment with the emulator's settings for the job (those ``library`` knows: see
    ``bench_syphon.connection_env``) and its library first on the path."""
    from bench_syphon import connection_env

    return {**os.environ, **connection_env(emu, library), LIBRARY_ENV: str(library or ""),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(library or ROOT / "lib"), str(ROOT / "emulator" / "src"),
                                                        os.environ.get("PYTHONPATH")])),
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}


def job_arguments(state: Path, args) -> list[str]:
    """The job's command line but its log file (``--log-file``)."""
    settings = {"run.trigger": args.trigger, "backlog.queue_count": args.queues,
                "storage.audit_table": state / AUDIT_TABLE, "storage.checkpoint_table": state / CHECKPOINT_TABLE,
                "storage.checkpoint_location": state / STREAMING_CHECKPOINT}
    return ["--config", str(ROOT / "conf/local.yaml"), *(f"--set={key}={value}" for key, value in settings.items())]


def start_job(arguments: list[str], environ: dict, workdir: Path, name: str) -> subprocess.Popen:
    """This script as the job's command line with ``arguments``, in its own session (its JVM goes with it):
    its console in ``<name>.out``, its log in ``<name>.log``."""
    with open(workdir / f"{name}.out", "w") as out:
        return subprocess.Popen([sys.executable, __file__, "--child", "--", *arguments,
                                 f"--log-file={workdir / (name + '.log')}"], env=environ, stdout=out,
                                stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True)


@dataclass(frozen=True)
class StatusTime:
    """One ``--status`` run: when (batches done), how long, and its exit code (3 while the job holds the lease)."""

    batches: int
    seconds: float
    exit_code: int


class Soak:
    """One soak run: the emulator, the job, the trickle, the receiver and the sampler, from ``start`` to ``stop``."""

    def __init__(self, args, emu, workdir: Path):
        from backlog_syphon.config import load_config
        from tools.testing import emulator_environment

        self.args, self.emu, self.workdir, self.state = args, emu, workdir, workdir / "state"
        self.began = time.monotonic()
        self.environ = job_environment(emu, args.library)
        self.arguments = job_arguments(self.state, args)
        config = load_config(ROOT / "conf/local.yaml", environ=emulator_environment(emu, PRIMARY, SECONDARY))
        self.queues = [f"{PRIMARY}/x-servicebus-transfer/{n}" for n in range(args.queues)]
        self.traffic = Traffic(config.secondary, self.queues, args.rate)
        self.receiver = Receiver(emu.connection_string(PRIMARY))
        self.log = BatchLog(workdir / "job.log", marks=(STARTED_MARK,))
        self.sampler: JobSampler | None = None
        self.job: subprocess.Popen | None = None
        self.status_run: subprocess.Popen | None = None  # the ``--status`` in flight, if any
        self.status: dict[str, StatusTime] = {}

    def progress(self, text: str) -> None:
        print(f"[{time.monotonic() - self.began:6.0f} s] {text}", flush=True)

    def start(self) -> None:
        """The job, then (once its query runs) the receiver, the trickle and the sampler."""
        self.job = start_job(self.arguments, self.environ, self.workdir, "job")
        self.wait_for(lambda: self.log.saw(STARTED_MARK), START_TIMEOUT, "started query")
        self.receiver.start()
        self.traffic.start()
        self.sampler = JobSampler(self.job.pid, self.state, interval=self.args.sample_seconds,
                                  heap_interval=self.args.heap_seconds)
        self.sampler.start()
        self.progress("the job's query runs: writing")

    def run(self) -> list[BatchFigure]:
        """Until ``--batches`` batches (or ``--minutes``), or a Ctrl-C (SIGINT), which ends the run early and
        keeps its figures: the batches of the run, the status timed early and at the end."""
        args = self.args
        early = STATUS_EARLY_BATCHES if args.minutes else min(STATUS_EARLY_BATCHES, max(1, args.batches // 2))
        deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
        reported = done = 0
        try:
            while True:
                done = len(self.log.read())
                if done >= early and "early" not in self.status:
                    self.time_status("early", done)
                if (time.monotonic() >= deadline) if deadline is not None else done >= args.batches:
                    break
                if self.job.poll() is not None:
                    raise SoakFailure(f"the job exited ({self.job.returncode}) after {done} batches:\n{self.tail()}")
                if self.traffic.error is not None:
                    self.traffic.stop()  # raises what stopped the writing
                if done >= reported + max(1, args.batches // 10):
                    reported = done
                    self.progress(f"{done} batches, {len(self.traffic.written)} written, {self.receiver.count()} "
                                  f"received")
                time.sleep(1.0)
        except KeyboardInterrupt:
            # The job runs in its own process group: the terminal's SIGINT reached this process only.
            self.progress(f"interrupted after {done} batches: the run ends here, its report follows "
                          f"(a second Ctrl-C abandons it)")
            if self.status_run is not None and self.status_run.poll() is None:
                self.status_run.wait()  # an early status in flight: it finishes, unrecorded
        self.time_status("end", done)
        return self.log.batches[:done]  # the batches after (the drain at the end) are not the run's

    def time_status(self, when: str, batches: int) -> None:
        began = time.monotonic()
        self.status_run = start_job([*self.arguments, "--status"], self.environ, self.workdir, f"status-{when}")
        try:
            code = self.status_run.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise SoakFailure(f"--status still ran after {START_TIMEOUT:.0f} s") from None
        self.status[when] = StatusTime(batches, time.monotonic() - began, code)
        self.progress(f"--status after {batches} batches: {self.status[when].seconds:.1f} s (exit {code})")

    def stop(self) -> int:
        """Stop writing, wait for every message to arrive, SIGTERM the job: its exit code."""
        self.sampler.stop()
        self.traffic.stop()
        written = len(self.traffic.written)
        self.progress(f"writing stopped: {written} written; waiting for them to arrive")
        self.wait_for(lambda: self.receiver.count() >= written, DRAIN_TIMEOUT, "arrival of every message")
        self.job.send_signal(signal.SIGTERM)
        exit_code = self.job.wait(STOP_TIMEOUT)
        self.progress(f"SIGTERM: the job exited with {exit_code}")
        time.sleep(2.0)  # anything sent twice at the end would arrive now
        self.receiver.stop()
        return exit_code

    def close(self) -> None:
        """Whatever is still running after a failure: the job's (and a status's) whole process group is killed."""
        for child in (self.job, self.status_run):
            if child is not None and child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        if self.sampler is not None:
            self.sampler.stop()
        self.traffic.close()
        self.receiver.close()

    def wait_for(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.job.poll() is not None:
                raise SoakFailure(f"the job exited ({self.job.returncode}) while waiting for {what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise SoakFailure(f"no {what} after {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.5)

    def tail(self, lines: int = 30) -> str:
        return "\n".join((self.workdir / "job.out").read_text(errors="replace").splitlines()[-lines:])


def run_soak(args) -> tuple[dict, list[report.Tenth], list[report.Target]]:
    """One soak run: every figure (for the JSON), the tenths and the targets."""
    from servicebus_emulator import Emulator

    print(f"soak: continuous syphon, trigger {args.trigger}, {args.rate:g} msg/s over {args.queues} backlog queues, "
          + (f"{args.minutes:g} minutes" if args.minutes else f"{args.batches} batches")
          + f"; job from {args.library or 'this checkout'}; load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} cores", flush=True)
    with Emulator(emulator_config(args.queues), ports={PRIMARY: 0, SECONDARY: 0}) as emu, \
            tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        soak = Soak(args, emu, Path(tmp))
        try:
            soak.start()
            batches = soak.run()
            exit_code = soak.stop()
        finally:
            soak.close()
            if args.keep_log and (Path(tmp) / "job.log").exists():
                args.keep_log.write_bytes((Path(tmp) / "job.log").read_bytes())
        figures = {"args": {k: str(v) for k, v in vars(args).items()},
                   **checks(soak.traffic, soak.receiver, emu, soak.queues, exit_code,
                            recorded_rows(soak.state / AUDIT_TABLE))}
    samples, arrivals, status = soak.sampler.samples, soak.receiver.arrivals, soak.status
    rows = report.tenths(batches, samples, arrivals)
    early, end = status.get("early"), status["end"]
    targets = report.targets(rows, audit_files_end=rows[-1].audit_files if rows else None,
                             status_early=early and early.seconds, status_end=end.seconds, batches=len(batches),
                             status_early_batches=early.batches if early else 0)
    settled = report.past_start(batches, rows)
    targets += [settled] if settled else []
    figures.update(batches=[asdict(b) for b in batches], samples=[asdict(s) for s in samples],
                   latencies=[asdict(a) for a in arrivals], status={k: asdict(v) for k, v in status.items()},
                   tenths=[asdict(r) for r in rows], targets=[{**asdict(t), "met": t.met} for t in targets],
                   seconds=time.monotonic() - soak.began)
    return figures, rows, targets


def recorded_rows(audit_table: Path) -> collections.Counter:
    """(MessageId, outcome) -> the audit rows that record it, read with delta-rs (no JVM); empty without a table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        rows = DeltaTable(str(audit_table)).to_pyarrow_table(columns=["message_id", "outcome"])
    except TableNotFoundError:
        return collections.Counter()
    return collections.Counter(zip(rows["message_id"].to_pylist(), rows["outcome"].to_pylist()))


def checks(traffic: Traffic, receiver: Receiver, emu, queues: list[str], exit_code: int,
           recorded: collections.Counter) -> dict:
    stats = emu.stats(SECONDARY)
    left = sum(stats[q]["total"] for q in queues)
    dead = sum(stats[q].get("dead_letter_count", 0) for q in queues)
    written = set(traffic.written)
    lost = written - set(receiver.received)
    doubled = {m for m, times in receiver.received.items() if len(times) > 1}
    unknown = set(receiver.received) - written
    # One delivered row per message written, and no other row.
    misrecorded = {m for m in written if recorded[(m, "delivered")] != 1} | {
        m for m, outcome in recorded if outcome != "delivered" or m not in written}
    return {"exit_code": exit_code, "written": len(written), "received": len(receiver.received), "lost": len(lost),
            "doubled": len(doubled), "unknown": len(unknown), "misrecorded": len(misrecorded),
            "backlog_left": left, "dead_lettered": dead,
            "failures": [text for bad, text in (
                (exit_code != 0, f"the job exited with {exit_code} after SIGTERM"),
                (lost, f"{len(lost)} of {len(written)} messages never arrived (e.g. {sorted(lost)[:3]})"),
                (doubled, f"{len(doubled)} messages arrived more than once (e.g. {sorted(doubled)[:3]})"),
                (unknown, f"{len(unknown)} messages arrived that were not written"),
                (misrecorded, f"{len(misrecorded)} messages without exactly one delivered audit row "
                              f"(e.g. {sorted(misrecorded)[:3]})"),
                (left or dead, f"the backlog queues hold {left} messages, {dead} dead-lettered")) if bad]}


def print_report(figures: dict, rows, targets) -> None:
    print()
    print("\n".join(report.format_table(report.TENTH_HEADER, [report.tenth_cells(r) for r in rows])))
    print("fb: foreachBatch seconds (median, p95) and its steps' medians; lat: written -> received; RSS: the job's "
          "processes together (median of the tenth's samples); heap: the JVM's after a full GC; audit files: the data "
          "files the audit table holds (its log replayed; compacted-away ones stay on disk until VACUUM, in the JSON), "
          "log entries: its _delta_log files on disk, at the tenth's last sample")
    print()
    print("\n".join(report.format_table(report.TARGET_HEADER, [report.target_cells(t) for t in targets])))
    print(f"messages: {figures['written']} written, {figures['received']} received, {figures['lost']} lost, "
          f"{figures['doubled']} doubled, {figures['misrecorded']} not recorded once; backlog left "
          f"{figures['backlog_left']}, dead-lettered "
          f"{figures['dead_lettered']}; job exit code {figures['exit_code']}; soak wall time "
          f"{figures['seconds'] / 60:.1f} min; load average now {os.getloadavg()[0]:.2f}")


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=2000, help="run this many non-empty batches (default 2000)")
    p.add_argument("--minutes", type=float, help="run this long instead of a number of batches")
    p.add_argument("--rate", type=float, default=20.0, help="new backlog messages per second (default 20)")
    p.add_argument("--queues", type=int, default=4, help="backlog queues (default 4)")
    p.add_argument("--trigger", default="2 seconds", help="the job's run.trigger (default '2 seconds')")
    p.add_argument("--sample-seconds", type=float, default=5.0, help="memory and files sampled this often (5)")
    p.add_argument("--heap-seconds", type=float, default=30.0, help="the JVM's heap after GC this often (30)")
    p.add_argument("--library", type=Path, help="run the job from this lib folder (another checkout's)")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--keep-log", type=Path, help="copy the job's log to this file")
    args = p.parse_args(argv)
    if args.library is not None:
        args.library = args.library.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--child", "--"]:  # the job itself: its own command line, from the library on the path
        from backlog_syphon.cli import main as job_main

        return job_main(argv[2:])
    args = parse_args(argv)
    # A run started in the background (``make soak ... &``) inherits SIGINT ignored, and SIGTERM would end it
    # without a report: both end the run early instead, as Ctrl-C does in a terminal.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    try:
        figures, rows, targets = run_soak(args)
    except SoakFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    print_report(figures, rows, targets)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    for failure in figures["failures"]:
        print(f"FAILED: {failure}", file=sys.stderr, flush=True)
    return 1 if figures["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
