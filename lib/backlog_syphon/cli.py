"""Command line of the syphon (``jobs/syphon.py``, the ``backlog-syphon`` entry point, wheel tasks).

Operators get plain answers: every way a run can end prints one closing line and exits with a code
that says what to do. Tracebacks go to the log file (named in the closing line), or also to the
console with ``--verbose``.

Exit codes: 0 done (or stopped on request), 1 a batch failed (nothing lost: the next run resumes
from the tables), 2 a setting is wrong (configuration, credentials, endpoint, rights), 3 another run
holds the backlog, 4 an available-now run ended with messages left in the backlog (never a re-drive,
``--redrive-dead-letters``, which leaves what it does not select or cannot deliver by design).
``--maintain`` compacts and vacuums the state tables (``run.maintain``): 0 done, 1 a table failed.
``--status`` reads and changes nothing, and exits in the same family: 0 drained, 3 a run holds the
lease now, 4 messages wait, 5 the backlog is drained but its dead-letter sub-queues are not
(``run.run_end``, ``run.status_report``). ``--decommission`` says which backlog queues are safe to remove
(a dry run) and, with ``--confirm``, removes them: 0 all removable (removed), 4 messages or unsettled
records hold a queue, 5 only dead-letters do, 3 a run holds the lease, 2 Manage is missing
(``run.decommission``).

``--log-format json`` (or ``run.log_format: json``): every line the command writes is one JSON object on
stderr (``run.logs``), its results (run summary, status, dry run) included, and stdout stays empty.

Signals: the first SIGTERM or SIGINT (a cancelled job, YARN or Kubernetes stopping the driver,
Ctrl-C) stops the run at the next batch boundary: the batch in flight is recorded and purged, and
the run exits 0. A second one stops the process at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import os
import signal
import sys
import tempfile
import threading

import backlog_syphon
from backlog_syphon.config import ConfigError, parse_overrides
from backlog_syphon.model import JobIds, LogFormat, RunSource, new_run_id
from backlog_syphon.run import logs
from backlog_syphon.run.databricks_host import load_config
from backlog_syphon.run.run_end import failure_end
from backlog_syphon.sink.micro_batch import NO_HOOKS, Hooks

from backlog_syphon.errors import EXIT_BATCH_FAILED, EXIT_OK, EXIT_SETTINGS, SyphonError

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="backlog-syphon", description="Drain Service Bus paired-namespace "
                                     "backlog queues back to their destinations.")
    parser.add_argument("--config", required=True, help="YAML file, e.g. conf/local.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key (repeatable), e.g. --set run.trigger='10 seconds'")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="peek the backlog and report what a replay would do; change nothing")
    mode.add_argument("--status", action="store_true",
                      help="is the backlog drained, and if not, why not: the broker's counts, the tables' marks, "
                           "the lease, the last runs and a verdict; change nothing (exit 0 drained, 3 a run holds "
                           "the lease, 4 messages wait, 5 dead-letters wait)")
    mode.add_argument("--maintain", action="store_true",
                      help="compact (OPTIMIZE) and vacuum (VACUUM) the state tables; safe while a syphon runs, "
                           "takes no lease, reads no queue (exit 0 done, 1 a table could not be maintained)")
    mode.add_argument("--decommission", action="store_true",
                      help="once a migration is over: say which backlog queues are drained and safe to remove, and "
                           "what holds the others; with --confirm, remove the drained ones (needs Manage: Azure "
                           "Service Bus Data Owner) under the backlog's lease (exit 0 all removable or removed, 4 "
                           "messages or unsettled records hold a queue, 5 only dead-letters do, 3 a run holds the "
                           "lease, 2 a right is missing)")
    parser.add_argument("--confirm", action="store_true",
                        help="with --decommission: remove the drained backlog queues (without it, a dry run)")
    parser.add_argument("--redrive-dead-letters", action="store_true",
                        help="re-drive the backlog queues' dead-letter sub-queues (run.source=dead_letters), "
                             "filtered by the redrive.* settings (with a migration section: the migration's sources'); "
                             "with --dry-run, show what would move")
    parser.add_argument("--migrate", action="store_true",
                        help="the migration mode (run.source=migration): drain the entities the migration section "
                             "selects in the source namespace (secondary) into the target (primary); with --dry-run, "
                             "show what matched, what each holds and where it goes")
    parser.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                        help="run over Spark Connect (default: the SPARK_REMOTE variable, if set)")
    parser.add_argument("--timeout", type=float, default=None, help="stop a continuous run after this many seconds")
    parser.add_argument("--quiet", action="store_true", help="no progress line per micro-batch")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks and Spark's warnings on the console")
    parser.add_argument("--log-file", default=os.environ.get("SYPHON_LOG_FILE"),
                        help="where the full log goes, tracebacks included (default: a file in the temp folder)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=[f.value for f in LogFormat], default=None,
                        help="text, or json: one JSON object per line with the run's ids (default: run.log_format)")
    parser.add_argument("--job-id", default=None, help="the Databricks job's id ({{job.id}}), for the runs table "
                        "and the logs")
    parser.add_argument("--job-run-id", default=None, help="the Databricks job run's id ({{job.run_id}}), for the "
                        "runs table and the logs")
    return parser


class _NoTraceback(logging.Formatter):
    """Console lines without tracebacks: those go to the log file."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def configure_logging(level: str, log_file: str, verbose: bool, log_format: str = LogFormat.TEXT) -> None:
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    json_lines = log_format == LogFormat.JSON
    console = logging.StreamHandler(sys.stderr)
    if json_lines:
        console.setFormatter(logs.JsonFormatter(tracebacks=verbose))
    else:
        console.setFormatter(logging.Formatter(fmt) if verbose else _NoTraceback(fmt))
    console.setLevel(level.upper())
    to_file = logging.FileHandler(log_file, encoding="utf-8")
    to_file.setFormatter(logs.JsonFormatter() if json_lines else logging.Formatter(fmt))
    to_file.setLevel(logging.DEBUG)
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    root.handlers[:] = [console, to_file]
    for noisy in ("azure", "py4j", "uamqp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class Output:
    """Where the command's own lines go: for people, results on stdout and notes and errors on stderr;
    with ``--log-format json``, each as one JSON object on stderr, through the log (its fields say what
    the text says), and nothing on stdout."""

    def __init__(self, json_lines: bool):
        self.json_lines = json_lines

    def result(self, lines: list[str], message: str, **fields) -> None:
        if self.json_lines:
            logger.info("%s", message, extra=fields)
        else:
            print("\n".join(lines))

    def note(self, line: str) -> None:
        """A line on stderr. Safe in a signal handler: it bypasses the log's locks."""
        if self.json_lines:
            line = logs.json_line(logs.record_fields("WARNING", logger.name, line))
        print(line, file=sys.stderr, flush=True)

    def fail(self, message: str, log_file: str | None, code: int) -> int:
        if self.json_lines:
            logger.error("%s", message, extra={"event": "failed", "exit_code": code, "log_file": log_file})
        else:
            print(f"error: {message}", file=sys.stderr)
            if log_file:
                print(f"(details in {log_file})", file=sys.stderr)
        return code


class StopOnSignal:
    """First SIGTERM/SIGINT: stop at the next batch boundary. Second: stop at once."""

    def __init__(self, output: Output):
        self.output = output
        self.run = None
        self.requested = False

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def attach(self, run) -> None:
        self.run = run
        if self.requested:
            run.request_stop()

    def _handle(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            self.output.note(f"{name} again: stopping now; the next run resumes from the tables")
            os._exit(128 + signum)
        self.requested = True
        self.output.note(f"{name}: stopping after the batch in flight (send it again to stop at once)")
        if self.run is not None:
            self.run.request_stop()


def main(argv: list[str] | None = None, *, hooks: Hooks = NO_HOOKS) -> int:
    """The job's command line (``argv``: the process's arguments if None). ``hooks``: a test harness's
    (``tools/faulty_job.py``), for a run; none otherwise."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.confirm and not args.decommission:
        parser.error("--confirm goes with --decommission")
    log_file = args.log_file or os.path.join(tempfile.gettempdir(), f"backlog-syphon-{os.getpid()}.log")
    configure_logging(args.log_level, log_file, args.verbose, args.log_format or LogFormat.TEXT)
    output = Output(args.log_format == LogFormat.JSON)
    job = JobIds(args.job_id, args.job_run_id)
    running = not (args.dry_run or args.status or args.maintain or args.decommission) or args.confirm
    run_id = new_run_id(dt.datetime.now(dt.timezone.utc)) if running else None
    logs.set_context(run_id=run_id, job_id=job.job_id, job_run_id=job.job_run_id)
    try:
        overrides = parse_overrides(args.set)
        if args.redrive_dead_letters and args.migrate:
            parser.error("--migrate and --redrive-dead-letters: a re-drive of what the migration dead-lettered is "
                         "--redrive-dead-letters with the migration section")
        if args.redrive_dead_letters:
            overrides["run.source"] = RunSource.DEAD_LETTERS.value
        if args.migrate:
            overrides["run.source"] = RunSource.MIGRATION.value
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        return output.fail(str(exc), None, EXIT_SETTINGS)
    if args.log_format is None and config.run.log_format != LogFormat.TEXT:
        configure_logging(args.log_level, log_file, args.verbose, config.run.log_format)
        output = Output(config.run.log_format == LogFormat.JSON)

    from backlog_syphon.servicebus.preflight import preflight
    from backlog_syphon.timeline import Milestone, Timeline

    timeline = Timeline()
    stopper = StopOnSignal(output)
    stopper.install()

    def check_access() -> None:
        try:
            preflight(config)
        except SyphonError as exc:
            # Say it at once, even while Spark is still starting: the JVM ends with this process.
            code = output.fail(str(exc), log_file, EXIT_SETTINGS)
            logging.shutdown()
            os._exit(code)

    # The pre-flight (a few round trips to each namespace) runs while Spark starts. The status and
    # decommission commands read the secondary namespace only, and check it themselves; maintenance reads
    # no namespace.
    checking = threading.Thread(target=check_access, name="preflight", daemon=True)
    broker_free = args.status or args.maintain or args.decommission
    if not broker_free:
        checking.start()

    from backlog_syphon.run.spark_session import build_spark_session
    from backlog_syphon.run.dry_run import dry_run
    from backlog_syphon.run.runs import summary_end
    from backlog_syphon.run.status import status
    from backlog_syphon.run.syphon import run_syphon

    logger.info("backlog-syphon library from %s; log file %s", os.path.dirname(backlog_syphon.__file__), log_file)
    spark = build_spark_session(verbose=args.verbose, remote=args.remote)
    timeline.mark(Milestone.SPARK_READY)
    if not broker_free:
        checking.join()
    try:
        if args.dry_run:
            lines = dry_run(spark, config).lines()
            output.result(lines, "dry run: nothing was sent, settled or written", event="dry_run", plan=lines)
            return EXIT_OK
        if args.maintain:
            from backlog_syphon.run.maintain import maintain

            upkeep = maintain(spark, config)
            output.result(upkeep.lines(), f"maintenance: {upkeep.lines()[-1]}", event="maintenance",
                          tables=[dataclasses.asdict(table) for table in upkeep.tables])
            return EXIT_BATCH_FAILED if upkeep.failed else EXIT_OK
        if args.decommission:
            from backlog_syphon.run.decommission import decommission

            removal = decommission(spark, config, confirm=args.confirm, run_id=run_id, job=job)
            output.result(removal.lines(), f"decommission: {removal.closing_line}", event="decommission",
                          exit_code=removal.exit_code, confirmed=removal.confirmed, removed=list(removal.removed),
                          refused={r.queue: r.reason() for r in removal.refused})
            return removal.exit_code
        if args.status:
            report = status(spark, config)
            verdict = report.verdict
            output.result(report.lines(), f"status: {verdict.line}", event="status", **report.as_dict())
            return verdict.exit_code
        # In JSON the listener logs each batch's line with its facts as fields (``progress_fields``).
        progress = None if args.quiet or output.json_lines else (
            lambda line: print(line, file=sys.stderr, flush=True))
        summary = run_syphon(spark, config, run_id=run_id, timeout_seconds=args.timeout, on_progress=progress,
                             check_access=False, on_start=stopper.attach, timeline=timeline, job=job, hooks=hooks)
    except Exception as exc:  # noqa: BLE001 - the run's own errors carry their exit code and their one line;
        # anything else is Spark's streaming exception around a batch failure (Connect)
        logger.debug("the run failed", exc_info=True)
        end = failure_end(exc)
        return output.fail(end.line, log_file, end.exit_code)
    end = summary_end(summary, config.run.trigger)
    output.result(summary.lines(), f"run summary: {end.line}", event="run_summary",
                  per_destination=summary.per_destination, remaining=summary.remaining, exit_code=end.exit_code,
                  closing_line=end.line)
    if args.verbose:
        output.result(timeline.lines(), "timeline", event="timeline", timeline=timeline.lines()[1:])
    if summary.stopped or end.exit_code != EXIT_OK:
        output.note(("warning: " if end.exit_code != EXIT_OK else "") + end.line)
    return end.exit_code


def run() -> None:
    """Console-script and Databricks wheel-task entry point: the exit code must reach the runner.

    Databricks' wheel task runner ignores an entry point's return value, so a failed run would
    show as succeeded unless the process exits with the code.
    """
    sys.exit(main())
