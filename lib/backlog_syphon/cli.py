"""Command line of the syphon (``jobs/syphon.py``, the ``backlog-syphon`` entry point, wheel tasks).

Operators get plain answers: every way a run can end prints one closing line and exits with a code
that says what to do. Tracebacks go to the log file (named in the closing line), or also to the
console with ``--verbose``.

Exit codes: 0 done (or stopped on request), 1 a batch failed (nothing lost: the next run resumes
from the tables), 2 a setting is wrong (configuration, credentials, endpoint, rights), 3 another run
holds the backlog, 4 an available-now run ended with messages left in the backlog (never a re-drive,
``--redrive-dead-letters``, which leaves what it does not select or cannot deliver by design).

Signals: the first SIGTERM or SIGINT (a cancelled job, YARN or Kubernetes stopping the driver,
Ctrl-C) stops the run at the next batch boundary: the batch in flight is recorded and purged, and
the run exits 0. A second one stops the process at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading

import backlog_syphon
from backlog_syphon.config import AVAILABLE_NOW, ConfigError, parse_overrides
from backlog_syphon.model import RunSource
from backlog_syphon.run.host import load_config

from backlog_syphon.errors import (  # noqa: F401 - the exit codes are part of this module's interface
    BATCH_FAILED_MARK,
    EXIT_BATCH_FAILED,
    EXIT_NOT_DRAINED,
    EXIT_OK,
    EXIT_SETTINGS,
    SyphonError,
)

logger = logging.getLogger("backlog_syphon")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="backlog-syphon", description="Drain Service Bus paired-namespace "
                                     "backlog queues back to their destinations.")
    parser.add_argument("--config", required=True, help="YAML file, e.g. conf/local.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key (repeatable), e.g. --set run.trigger='10 seconds'")
    parser.add_argument("--dry-run", action="store_true",
                        help="peek the backlog and report what a replay would do; change nothing")
    parser.add_argument("--redrive-dead-letters", action="store_true",
                        help="re-drive the backlog queues' dead-letter sub-queues (run.source=dead_letters), "
                             "filtered by the redrive.* settings; with --dry-run, show what would move")
    parser.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                        help="run over Spark Connect (default: the SPARK_REMOTE variable, if set)")
    parser.add_argument("--timeout", type=float, default=None, help="stop a continuous run after this many seconds")
    parser.add_argument("--quiet", action="store_true", help="no progress line per micro-batch")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks and Spark's warnings on the console")
    parser.add_argument("--log-file", default=os.environ.get("SYPHON_LOG_FILE"),
                        help="where the full log goes, tracebacks included (default: a file in the temp folder)")
    parser.add_argument("--log-level", default="INFO")
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


def configure_logging(level: str, log_file: str, verbose: bool) -> None:
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter(fmt) if verbose else _NoTraceback(fmt))
    console.setLevel(level.upper())
    to_file = logging.FileHandler(log_file, encoding="utf-8")
    to_file.setFormatter(logging.Formatter(fmt))
    to_file.setLevel(logging.DEBUG)
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    root.handlers[:] = [console, to_file]
    for noisy in ("azure", "py4j", "uamqp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class StopOnSignal:
    """First SIGTERM/SIGINT: stop at the next batch boundary. Second: stop at once."""

    def __init__(self):
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
            print(f"{name} again: stopping now; the next run resumes from the tables", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.requested = True
        print(f"{name}: stopping after the batch in flight (send it again to stop at once)", file=sys.stderr,
              flush=True)
        if self.run is not None:
            self.run.request_stop()


def fail(message: str, log_file: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    print(f"(details in {log_file})", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_file = args.log_file or os.path.join(tempfile.gettempdir(), f"backlog-syphon-{os.getpid()}.log")
    configure_logging(args.log_level, log_file, args.verbose)
    try:
        overrides = parse_overrides(args.set)
        if args.redrive_dead_letters:
            overrides["run.source"] = RunSource.DEAD_LETTERS.value
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SETTINGS

    from backlog_syphon.servicebus.probes import preflight
    from backlog_syphon.timeline import Milestone, Timeline

    timeline = Timeline()
    stopper = StopOnSignal()
    stopper.install()

    def check_access() -> None:
        try:
            preflight(config)
        except SyphonError as exc:
            # Say it at once, even while Spark is still starting: the JVM ends with this process.
            code = fail(str(exc), log_file, EXIT_SETTINGS)
            logging.shutdown()
            os._exit(code)

    # The pre-flight (a few round trips to each namespace) runs while Spark starts.
    checking = threading.Thread(target=check_access, name="preflight", daemon=True)
    checking.start()

    from backlog_syphon.run.spark_session import build_spark_session
    from backlog_syphon.run.dry_run import dry_run
    from backlog_syphon.run.syphon import run_syphon

    logger.info("backlog-syphon library from %s; log file %s", os.path.dirname(backlog_syphon.__file__), log_file)
    spark = build_spark_session(verbose=args.verbose, remote=args.remote)
    timeline.mark(Milestone.SPARK_READY)
    checking.join()
    try:
        if args.dry_run:
            print("\n".join(dry_run(spark, config).lines()))
            return EXIT_OK
        progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        summary = run_syphon(spark, config, timeout_seconds=args.timeout, on_progress=progress, check_access=False,
                             on_start=stopper.attach, timeline=timeline)
    except SyphonError as exc:  # the run's own errors carry their exit code and their one line
        logger.debug("the run failed", exc_info=True)
        return fail(closing_line(exc), log_file, exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - Spark's streaming exception around a batch failure (Connect)
        logger.debug("the run failed", exc_info=True)
        return fail(closing_line(exc), log_file, EXIT_BATCH_FAILED)
    print("\n".join(summary.lines()))
    if args.verbose:
        print("\n".join(timeline.lines()))
    if stopper.requested:
        print("stopped on request at a batch boundary; the next run resumes from the tables", file=sys.stderr)
        return EXIT_OK
    if config.run.trigger == AVAILABLE_NOW and not summary.drained:
        print("warning: messages remain in the backlog (see 'remaining' above)", file=sys.stderr)
        return EXIT_NOT_DRAINED
    return EXIT_OK


def closing_line(exc: BaseException) -> str:
    """The one line that ends a failed run. A batch failure says its batch, step and cause, and that
    nothing was lost; Spark Connect hands the client only its text, where the sink's line is found."""
    text = str(exc)
    at = text.rfind(BATCH_FAILED_MARK)
    if at >= 0:
        line = text[at + len(BATCH_FAILED_MARK):].strip().splitlines()[0]
        return (f"{line}. Nothing was lost: the next run resumes safely from the audit and checkpoint tables")
    if isinstance(exc, SyphonError):
        return text
    first = (text.strip().splitlines() or [""])[0][:300]
    return f"the run failed: {type(exc).__name__}" + (f": {first}" if first else "")


def run() -> None:
    """Console-script and Databricks wheel-task entry point: the exit code must reach the runner.

    Databricks' wheel task runner ignores an entry point's return value, so a failed run would
    show as succeeded unless the process exits with the code.
    """
    sys.exit(main())
