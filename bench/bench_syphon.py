"""Throughput of the syphon against a plain single-process SDK loop, same backlog, same emulator config.

    cd /work/main && PYTHONPATH=lib PYSPARK_PYTHON=$PWD/.venv/bin/python \
        .venv/bin/python bench/bench_syphon.py [--count 20000] [--body-size 1024] [--max-per-trigger 5000]

Each phase gets a fresh in-process emulator (conf/emulator.yaml, ephemeral ports on 127.0.0.1)
and the same legacy backlog (``backlog_writer.realistic_backlog`` over the 10 backlog queues):

- syphon: ``run_syphon`` (available-now trigger) with Delta state in a temporary directory;
- baseline: one process, one SDK client per namespace; per backlog queue, receive PEEK_LOCK
  pages, send each page's bodies to their ``x-ms-path`` destinations (one batch per run of
  messages with the same destination and session; the session id is kept because the session
  queue refuses messages without one), then complete the page. It stops a queue after as many
  messages as were written to it (what an operator reads from the queue's message count), so
  it never idles on an empty queue.

Measured: from just before the run to just after it (backlog writing and the Spark session start
are excluded and printed separately). Broker operations are the emulator's per-entity ``ops``
counters summed over both namespaces, counted from after the backlog was written to the end of
the run, divided by the messages moved. Each phase is verified (destinations received ``count``
messages; backlog queues and their dead-letter queues empty) and the script exits non-zero if not.
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
sys.path.insert(0, str(ROOT / "emulator" / "src"))    # the emulator is its own distribution (emulator/)

PRIMARY, SECONDARY = "contoso", "contoso-secondary"


class BenchFailure(RuntimeError):
    pass


# --- emulator helpers ---------------------------------------------------------------------------

def fresh_emulator():
    """A new emulator of conf/emulator.yaml on ephemeral ports (use as a context manager)."""
    from servicebus_emulator import Emulator, load_config

    return Emulator(load_config(ROOT / "conf/emulator.yaml"), ports={PRIMARY: 0, SECONDARY: 0})


def syphon_config(emu, state_dir: Path, max_per_trigger: int):
    from backlog_syphon.config import load_config

    environ = {"SYPHON_PRIMARY_CONNECTION_STRING": emu.connection_string(PRIMARY),
               "SYPHON_SECONDARY_CONNECTION_STRING": emu.connection_string(SECONDARY)}
    settings = {"storage.audit_table": str(state_dir / "audit"),
                "storage.checkpoint_table": str(state_dir / "checkpoint"),
                "storage.checkpoint_location": str(state_dir / "checkpoint-stream"),
                "run.trigger": "available_now",
                "run.max_messages_per_trigger": str(max_per_trigger)}
    return load_config(ROOT / "conf/local.yaml", environ=environ, overrides=settings)


def ops_snapshot(emu) -> collections.Counter:
    """Every entity's ``ops`` counters of both namespaces, summed per operation kind."""
    total: collections.Counter = collections.Counter()
    for ns in (PRIMARY, SECONDARY):
        for entity in emu.stats(ns).values():
            total.update(entity.get("ops", {}))
    return total


def destinations(emu) -> list[str]:
    ns = next(n for n in emu.config.namespaces if n.name == PRIMARY)
    return [q.name for q in ns.queues] + [t.name for t in ns.topics]


def received_by_destinations(emu) -> int:
    stats = emu.stats(PRIMARY)
    return sum(stats[name]["in"] for name in destinations(emu))


def backlog_queues(config) -> list[str]:
    from backlog_syphon.legacy_properties import backlog_queue_names

    return backlog_queue_names(config.primary.namespace, config.backlog.queue_count)


def backlog_left(emu, config) -> dict[str, tuple[int, int]]:
    """Backlog queue -> (messages still stored, dead-lettered), only queues with anything left."""
    stats = emu.stats(SECONDARY)
    left = {q: (stats[q]["total"], stats[q].get("dead_letter_count", 0)) for q in backlog_queues(config)}
    return {q: v for q, v in left.items() if any(v)}


def verify(name: str, emu, config, count: int, received_before: int) -> None:
    received = received_by_destinations(emu) - received_before
    left = backlog_left(emu, config)
    problems = []
    if received != count:
        problems.append(f"destinations received {received} messages, expected {count}")
    if left:
        problems.append("backlog not empty (queue: stored, dead-lettered): "
                        + ", ".join(f"{q}: {s}, {d}" for q, (s, d) in sorted(left.items())))
    if problems:
        raise BenchFailure(f"{name}: " + "; ".join(problems))
    print(f"{name}: verified: destinations received {received}, backlog queues empty", flush=True)


# --- the two movers -----------------------------------------------------------------------------

def run_syphon_phase(spark, config, emu, count: int, timeout: float) -> None:
    from backlog_syphon.syphon import run_syphon

    summary = run_syphon(spark, config, timeout_seconds=timeout)
    delivered = sum(c.get("delivered", 0) for c in summary.per_destination.values())
    other = {d: {k: v for k, v in c.items() if k != "delivered" and v} for d, c in summary.per_destination.items()}
    other = {d: c for d, c in other.items() if c}
    if delivered != count or other or not summary.drained:
        raise BenchFailure(f"syphon: run summary says delivered={delivered} (expected {count}), "
                           f"other outcomes={other}, remaining={summary.remaining}")


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _prop(props: dict, key: str):
    if not props:
        return None
    return props.get(key.encode(), props.get(key))


def _send_all(sender, messages) -> None:
    from backlog_syphon.servicebus_io import send_in_batches

    for _ in send_in_batches(sender, messages):
        pass


def run_baseline_phase(config, written: dict[str, int], receive_batch: int, timeout: float) -> None:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

    deadline = time.monotonic() + timeout
    primary_cs = config.primary.connection_string.reveal()
    secondary_cs = config.secondary.connection_string.reveal()
    with ServiceBusClient.from_connection_string(secondary_cs) as backlog, \
            ServiceBusClient.from_connection_string(primary_cs) as primary:
        senders: dict[str, object] = {}
        try:
            for queue in backlog_queues(config):
                expected, moved = written.get(queue, 0), 0
                if not expected:
                    continue
                with backlog.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                                                prefetch_count=receive_batch) as receiver:
                    while moved < expected:
                        if time.monotonic() > deadline:
                            raise BenchFailure(f"baseline: timed out after {timeout:.0f} s")
                        page = receiver.receive_messages(max_message_count=min(receive_batch, expected - moved),
                                                         max_wait_time=5)
                        if not page:
                            raise BenchFailure(f"baseline: {queue} ran dry after {moved} of {expected}")
                        # runs of messages with the same destination and session go in one batch
                        runs: list[tuple[tuple[str, str | None], list]] = []
                        for message in page:
                            props = message.application_properties
                            key = (_text(_prop(props, "x-ms-path")), _text(_prop(props, "x-ms-sessionid")))
                            out = ServiceBusMessage(b"".join(message.body), session_id=key[1])
                            if runs and runs[-1][0] == key:
                                runs[-1][1].append(out)
                            else:
                                runs.append((key, [out]))
                        for (destination, _), messages in runs:
                            if destination not in senders:
                                senders[destination] = primary.get_queue_sender(destination)
                            _send_all(senders[destination], messages)
                        for message in page:
                            receiver.complete_message(message)
                        moved += len(page)
        finally:
            for sender in senders.values():
                sender.close()


# --- step timings of the sink -------------------------------------------------------------------

class BatchTimings(logging.Handler):
    """Collects the sink's per-batch ``seconds={...}`` step timings (its log record's last argument)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.batches: list[dict] = []

    def emit(self, record):
        if record.getMessage().startswith("batch_id=") and record.args and isinstance(record.args[-1], dict):
            self.batches.append(dict(record.args[-1]))

    def totals(self) -> dict[str, float]:
        total: collections.Counter = collections.Counter()
        for timings in self.batches:
            total.update(timings)
        return {k: round(v, 2) for k, v in total.items()}


# --- driver -------------------------------------------------------------------------------------

def phase(name: str, args, mover) -> dict:
    """Fresh emulator, write the backlog, run ``mover``, verify; return the figures."""
    from backlog_syphon.backlog_writer import realistic_backlog, write_backlog

    with fresh_emulator() as emu, tempfile.TemporaryDirectory(prefix=f"bench-syphon-{name}-") as tmp:
        config = syphon_config(emu, Path(tmp), args.max_per_trigger)
        start = time.perf_counter()
        messages = realistic_backlog(args.count, seed=args.seed, body_size=args.body_size)
        written = write_backlog(config.secondary, config.primary.namespace, messages,
                                queue_count=config.backlog.queue_count, seed=args.seed)
        write_s = time.perf_counter() - start
        stored = sum(emu.stats(SECONDARY)[q]["total"] for q in backlog_queues(config))
        if stored != args.count:
            raise BenchFailure(f"{name}: the backlog holds {stored} messages after writing {args.count}")
        print(f"{name}: backlog written: {args.count} msgs of {args.body_size} B over "
              f"{len(written)} queues in {write_s:.1f} s (not measured)", flush=True)

        ops_before, received_before = ops_snapshot(emu), received_by_destinations(emu)
        start = time.perf_counter()
        mover(config, emu, written)
        seconds = time.perf_counter() - start
        ops = ops_snapshot(emu) - ops_before  # before verification, whose reads are not counted
        verify(name, emu, config, args.count, received_before)
    return {"seconds": seconds, "ops": ops, "write_seconds": write_s}


def report(name: str, count: int, figures: dict) -> float:
    rate = count / figures["seconds"]
    ops_total = sum(figures["ops"].values())
    print(f"{name}: {count} msgs in {figures['seconds']:.1f} s = {rate:.0f} msg/s; "
          f"{ops_total / count:.2f} broker ops/msg", flush=True)
    breakdown = ", ".join(f"{k}={v / count:.3f}" for k, v in sorted(figures["ops"].items()) if v)
    print(f"{name}: broker ops/msg by kind: {breakdown}", flush=True)
    return rate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=20000,
                   help="backlog messages (default 20000: about 4 minutes for both phases on a 2-core box)")
    p.add_argument("--body-size", type=int, default=1024, help="body bytes per message (default 1024)")
    p.add_argument("--max-per-trigger", type=int, default=5000, help="syphon run.max_messages_per_trigger")
    p.add_argument("--receive-batch", type=int, default=100, help="baseline receive page size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per phase run")
    p.add_argument("--phases", choices=["both", "syphon", "baseline"], default="both")
    p.add_argument("--quiet", action="store_true", help="no INFO log lines from the syphon")
    args = p.parse_args(argv)
    if args.count <= 0:
        p.error("--count must be positive")

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    timings = BatchTimings()
    sink_logger = logging.getLogger("backlog_syphon")
    sink_logger.setLevel(logging.INFO)
    logging.getLogger("backlog_syphon.delivery_sink").addHandler(timings)
    if args.quiet:
        logging.getLogger().handlers[0].setLevel(logging.WARNING)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(f"bench_syphon: {args.count} msgs of {args.body_size} B, realistic_backlog(seed={args.seed}), "
          f"max_messages_per_trigger={args.max_per_trigger}, baseline receive pages of {args.receive_batch}",
          flush=True)
    results, wall_start = {}, time.perf_counter()
    try:
        if args.phases in ("both", "syphon"):
            from backlog_syphon.spark_session import build_spark_session

            start = time.perf_counter()
            spark = build_spark_session("bench-syphon")
            print(f"spark session start: {time.perf_counter() - start:.1f} s (not measured; "
                  f"master {spark.sparkContext.master})", flush=True)
            try:
                results["syphon"] = phase("syphon", args, lambda config, emu, written: run_syphon_phase(
                    spark, config, emu, args.count, args.timeout))
            finally:
                spark.stop()
            totals = timings.totals()
            print(f"syphon: {len(timings.batches)} batches; sink step seconds summed: {totals} "
                  f"(sum {sum(totals.values()):.1f} s of {results['syphon']['seconds']:.1f} s)", flush=True)
        if args.phases in ("both", "baseline"):
            results["baseline"] = phase("baseline", args, lambda config, emu, written: run_baseline_phase(
                config, written, args.receive_batch, args.timeout))
    except BenchFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr, flush=True)
        return 1

    rates = {name: report(name, args.count, figures) for name, figures in results.items()}
    if len(rates) == 2:
        print(f"ratio syphon/baseline: {rates['syphon'] / rates['baseline']:.2f}")
    for name, figures in results.items():
        print(f"{name}: measured wall time {figures['seconds']:.1f} s "
              f"(backlog writing {figures['write_seconds']:.1f} s excluded)")
    print(f"total bench wall time: {time.perf_counter() - wall_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
