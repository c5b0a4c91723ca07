"""Command line of the syphon (``jobs/syphon.py``, the ``backlog-syphon`` entry point, wheel tasks)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import backlog_syphon
from backlog_syphon.config import ConfigError, load_config, parse_overrides

EXIT_CONFIG = 2  # the configuration is wrong: fix it and run again
EXIT_ACCESS = 3  # a namespace or entity cannot be used as configured
EXIT_NOT_DRAINED = 4  # the run ended with messages still in the backlog


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="backlog-syphon", description="Drain Service Bus paired-namespace "
                                     "backlog queues back to their destinations.")
    parser.add_argument("--config", required=True, help="YAML file, e.g. conf/local.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key (repeatable), e.g. --set run.trigger='10 seconds'")
    parser.add_argument("--dry-run", action="store_true",
                        help="peek the backlog and report what a replay would do; change nothing")
    parser.add_argument("--timeout", type=float, default=None, help="stop a continuous run after this many seconds")
    parser.add_argument("--quiet", action="store_true", help="no progress line per micro-batch")
    parser.add_argument("--log-level", default="INFO")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("azure", "py4j", "uamqp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        config = load_config(args.config, overrides=parse_overrides(args.set))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    from backlog_syphon.servicebus_io import ServiceBusAccessError
    from backlog_syphon.spark_session import build_spark_session
    from backlog_syphon.syphon import dry_run, run_syphon

    logging.getLogger(__name__).info("backlog-syphon library from %s", os.path.dirname(backlog_syphon.__file__))
    spark = build_spark_session()
    try:
        if args.dry_run:
            print("\n".join(dry_run(spark, config).lines()))
            return 0
        progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        summary = run_syphon(spark, config, timeout_seconds=args.timeout, on_progress=progress)
    except ServiceBusAccessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ACCESS
    print("\n".join(summary.lines()))
    if config.run.trigger == "available_now" and not summary.drained:
        print("warning: messages remain in the backlog (see 'remaining' above)", file=sys.stderr)
        return EXIT_NOT_DRAINED
    return 0


def run() -> None:
    """Console-script and Databricks wheel-task entry point: the exit code must reach the runner.

    Databricks' wheel task runner ignores an entry point's return value, so a failed run would
    show as succeeded unless the process exits with the code.
    """
    sys.exit(main())
