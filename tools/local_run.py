"""``make run``: the whole story on one machine, against the embedded emulator (``python -m tools.local_run``).

Starts the emulator (both namespaces of ``conf/emulator.yaml``, on free ports), recreates the last
backlog queue partitioned (16 partitions, as an operator-created backlog queue on Standard may be),
writes a realistic legacy backlog plus a few poison messages, and a share for the partitioned,
deduplicating destination ``partitioned-dedupe-orders`` into the partitioned backlog queue, runs the
syphon with ``available_now``, prints its summary, checks that every destination got what it should
(the partitioned one: each message once, no duplicate dropped, partition keys kept) and that the poison messages were dead-lettered with their reasons, prints the backlog's status (what
``jobs/syphon.py --status`` prints: drained, with the poison messages in the dead-letter queues),
then stops the emulator. Exit 0 only if all checks pass.

``--scenario migration`` (``make run SCENARIO=migration``): the migration mode instead, rehearsed on
conf/emulator-migration.yaml: a Standard namespace as a Standard -> Premium migration leaves it (reached by its
post-migration name) is filled with queues with sessions and their states, a partitioned queue, a topic with two
subscriptions and one with one, scheduled, deferred and dead-lettered messages (``tools.migration_writer``); the
dry run shows what matched and where it goes; the run drains it into the Premium namespace; every message is
checked to have arrived once, exact, in order per session, the scheduled ones as scheduled, the session states
moved, and the source left with nothing but the message that expired; then the status per entity.

``--transport amqp-websockets`` (``make run TRANSPORT=amqp-websockets``): the syphon reaches both namespaces
the way a firewalled workspace does, over AMQP over WebSockets (TLS, the emulator's stand-in for 443) through
an HTTP CONNECT proxy that asks for credentials (proxy.py, ``tools.http_proxy``), trusting the emulator's
certificate authority; a last check says that every connection it made went that way. ``amqps``: AMQP over
TLS (the stand-in for 5671). The default, ``amqp``, is the emulators' plain AMQP.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import logging
import os
import sys
import time
from pathlib import Path

from backlog_syphon.config import load_config
from backlog_syphon.model import FINAL_OUTCOMES
from backlog_syphon.restore.queue_names import backlog_queue_name
from tools import backlog_writer
from tools.http_proxy import HttpProxy
from tools.testing import (
    backlog_dead_letters, drain_destinations, emulator_environment, expected_arrivals, received_counts
)

PRIMARY, SECONDARY = "contoso", "contoso-secondary"
PARTITIONED_DESTINATION = "partitioned-dedupe-orders"  # conf/emulator.yaml: partitioned, duplicate detection on
PARTITIONED_SHARE = 10  # one message in ten of the backlog is for it, over 8 partition keys and none


def partitioned_backlog(count: int, *, seed: int) -> list[backlog_writer.OriginalMessage]:
    """Messages for the partitioned, deduplicating destination: most with a partition key (a tenant), some
    without (spread over the partitions by MessageId, as the service does with duplicate detection on)."""
    return [backlog_writer.OriginalMessage(PARTITIONED_DESTINATION, f"partitioned order {index}".encode(),
                                           message_id=f"part-{seed}-{index}",
                                           partition_key=f"tenant-{index % 9}" if index % 9 else None)
            for index in range(count)]


def check_partitioned(connection_string: str, originals, duplicates: int) -> list[str]:
    """What the partitioned destination holds: every message once with its partition key, and no copy dropped
    as a duplicate (nothing was sent twice)."""
    arrived = drain_destinations(connection_string, [PARTITIONED_DESTINATION])[PARTITIONED_DESTINATION]
    keys = {m.message_id: m.partition_key for m in originals}
    got = collections.Counter(m.message_id for m in arrived)
    wrong_keys = sum(1 for m in arrived if m.partition_key != keys.get(m.message_id))
    ok = got == collections.Counter(list(keys)) and not wrong_keys and not duplicates
    print(f"check {PARTITIONED_DESTINATION} (partitioned, deduplicating): {len(arrived)} of {len(keys)} arrived, "
          f"{sum(n > 1 for n in got.values())} twice, {wrong_keys} with another partition key, {duplicates} "
          f"dropped as duplicates {'ok' if ok else 'MISMATCH'}")
    return [] if ok else [PARTITIONED_DESTINATION]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulator-config", default="conf/emulator.yaml")
    parser.add_argument("--config", default="conf/local.yaml")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--state-dir", default="var/local")
    parser.add_argument("--scenario", choices=("backlog", "migration"), default="backlog",
                        help="what to rehearse: a paired namespace's backlog (default), or a Standard -> Premium "
                             "migration's leftovers (the migration mode)")
    parser.add_argument("--transport", choices=("amqp", "amqps", "amqp-websockets"), default="amqp",
                        help="how the syphon reaches the emulator: plain AMQP, AMQP over TLS, or over WebSockets "
                             "through an HTTP proxy")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("azure", "py4j", "servicebus_emulator"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    if args.scenario == "migration":
        return rehearse_migration(args)

    from servicebus_emulator import Emulator, load_config as load_emulator_config

    from backlog_syphon.model import BacklogState
    from backlog_syphon.run.spark_session import build_spark_session
    from backlog_syphon.run.dry_run import dry_run
    from backlog_syphon.run.status import status as backlog_status
    from backlog_syphon.run.syphon import run_syphon

    emulator_config = load_emulator_config(args.emulator_config)
    # Free ports, so a `make emulator` running elsewhere does not collide with this run.
    websockets = args.transport == "amqp-websockets"
    with Emulator(emulator_config, ports={PRIMARY: 0, SECONDARY: 0}) as emulator, \
            HttpProxy(user="local-run", password=os.urandom(8).hex()) if websockets else contextlib.nullcontext() as proxy:
        os.environ.update(emulator_environment(emulator, PRIMARY, SECONDARY, transport=args.transport, proxy=proxy))
        # A fresh state folder per run: the emulator's sequence numbers start again with it.
        state = Path(args.state_dir) / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        config = load_config(args.config, overrides={
            "storage.audit_table": str((state / "tables/audit").resolve()),
            "storage.checkpoint_table": str((state / "tables/checkpoint").resolve()),
            "storage.checkpoint_location": str((state / "checkpoint").resolve()),
        })
        partitioned_queue = backlog_queue_name(config.primary.namespace, config.backlog.queue_count - 1)
        emulator.recreate_queue(SECONDARY, partitioned_queue, enable_partitioning=True)
        originals = backlog_writer.realistic_backlog(args.count, seed=7)
        poison = backlog_writer.poison_backlog(seed=7)
        written = backlog_writer.write_backlog(config.secondary, config.primary.namespace,
                                               originals + [message for message, _ in poison],
                                               queue_count=config.backlog.queue_count, seed=7)
        # The legacy client's copies one transfer each, so that they go round the queue's partitions.
        partitioned = partitioned_backlog(args.count // PARTITIONED_SHARE, seed=7)
        backlog_writer.send_legacy_backlog(config.secondary, {partitioned_queue: partitioned}, singly=True)
        written[partitioned_queue] = written.get(partitioned_queue, 0) + len(partitioned)
        print(f"wrote {sum(written.values())} legacy messages ({len(poison)} poison) over {len(written)} "
              f"backlog queues; {partitioned_queue} is partitioned ({emulator.stats(SECONDARY)[partitioned_queue]['partitions']} "
              f"partitions) and holds {written[partitioned_queue]}")

        spark = build_spark_session("backlog-syphon-local")
        print(f"the syphon reaches the emulator over {args.transport}"
              f"{f' through the proxy {proxy.host}:{proxy.port}' if proxy else ''}: {config.primary.connect_endpoint} "
              f"(primary), {config.secondary.connect_endpoint} (secondary)")
        before = {namespace: emulator.connection_stats(namespace) for namespace in (PRIMARY, SECONDARY)}
        print("\n".join(dry_run(spark, config).lines()))
        started = time.monotonic()
        summary = run_syphon(spark, config, on_progress=print)
        elapsed = time.monotonic() - started
        taken = {transport: sum(emulator.connection_stats(namespace)[transport] - before[namespace][transport]
                                for namespace in before) for transport in before[PRIMARY]}
        print("\n".join(summary.lines()))
        moved = sum(c.get(outcome, 0) for c in summary.per_destination.values() for outcome in FINAL_OUTCOMES)
        print(f"moved {moved} messages in {elapsed:.1f} s ({moved / elapsed:.0f} msg/s); audit and checkpoint "
              f"tables in {state}")

        expected = expected_arrivals(originals)
        print(f"checking: receiving what arrived at {len(expected)} destinations, and peeking the backlog queues' "
              f"dead-letters ...", flush=True)
        arrived = received_counts(emulator.connection_string(PRIMARY), sorted(expected))
        dead = collections.Counter(message.dead_letter_reason for message in backlog_dead_letters(config.secondary,
                                                                                                 written))
        failures = []
        for entity, count in sorted(expected.items()):
            status = "ok" if arrived[entity] == count else "MISMATCH"
            print(f"check {entity:<20} expected {count:>6} received {arrived[entity]:>6} {status}")
            if arrived[entity] != count:
                failures.append(entity)
        duplicates = emulator.stats(PRIMARY)[PARTITIONED_DESTINATION].get("duplicates", 0)
        failures += check_partitioned(emulator.connection_string(PRIMARY), partitioned, duplicates)
        want_dead = collections.Counter(str(reason) for _, reason in poison)
        print(f"check dead-lettered by reason: {dict(dead)} (expected {dict(want_dead)})")
        if dead != want_dead:
            failures.append("dead-letter reasons")
        if not summary.drained:
            failures.append("backlog not drained")
        others = sum(count for transport, count in taken.items() if transport != args.transport)
        print(f"check connections the syphon made: {taken} (all over {args.transport}"
              f"{f', {len(proxy.tunnels())} tunnels through the proxy so far' if proxy else ''})")
        if others or not taken[args.transport]:
            failures.append("transport")
        print("status (what jobs/syphon.py --status prints for these tables):")
        report = backlog_status(spark, config)
        print("\n".join(report.lines()))
        if report.verdict.state != BacklogState.DEAD_LETTERS:  # drained, but for the poison messages
            failures.append("status")
        spark.stop()
    if failures:
        print(f"FAILED: {', '.join(failures)}")
        return 1
    print("all checks passed")
    return 0


def rehearse_migration(args) -> int:
    """``--scenario migration``: see the module docstring."""
    from servicebus_emulator import Emulator, load_config as load_emulator_config

    from backlog_syphon.run.dry_run import dry_run
    from backlog_syphon.run.spark_session import build_spark_session
    from backlog_syphon.run.status import status as source_status
    from backlog_syphon.run.syphon import run_syphon
    from tools.migration_writer import SOURCE, TARGET, check_migration, write_migration_backlog

    emulator_config = load_emulator_config("conf/emulator-migration.yaml")
    with Emulator(emulator_config, ports={TARGET: 0, SOURCE: 0}) as emulator:
        os.environ.update(emulator_environment(emulator, TARGET, SOURCE, transport=args.transport))
        state = Path(args.state_dir) / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S-migration")
        config = load_config("conf/local-migration.yaml", overrides={
            "storage.audit_table": str((state / "tables/audit").resolve()),
            "storage.checkpoint_table": str((state / "tables/checkpoint").resolve()),
            "storage.checkpoint_location": str((state / "checkpoint").resolve()),
        })
        written = write_migration_backlog(config.secondary, count=args.count // 20 or 30)
        print(f"wrote the Standard namespace {SOURCE} (as its post-migration name reaches it): "
              f"{sum(len(ids) for ids in written.queues.values())} messages in queues, "
              f"{sum(len(ids) for ids in written.sessions.values())} in {len(written.sessions)} sessions, "
              f"{sum(len(ids) for ids in written.scheduled.values())} scheduled, {len(written.deferred)} deferred, "
              f"{len(written.dead_lettered)} dead-lettered, {len(written.expired)} expired")
        spark = build_spark_session("backlog-syphon-local-migration")
        print("\n".join(dry_run(spark, config).lines()))
        started = time.monotonic()
        summary = run_syphon(spark, config, on_progress=print)
        elapsed = time.monotonic() - started
        print("\n".join(summary.lines()))
        moved = sum(c.get(outcome, 0) for c in summary.per_destination.values() for outcome in FINAL_OUTCOMES)
        print(f"moved {moved} messages in {elapsed:.1f} s; audit and checkpoint tables in {state}")
        print(f"checking what the Premium namespace {TARGET} holds and what {SOURCE} still holds ...", flush=True)
        failures = check_migration(emulator, written)
        for failure in failures:
            print(f"check MISMATCH: {failure}")
        if not failures:
            print("check every message arrived once, exact, in order per session; scheduled ones as scheduled; "
                  "session states moved; the source holds only the expired message, in its dead-letter sub-queue: ok")
        if not summary.drained:
            failures.append("sources not drained")
        print("status (what jobs/syphon.py --status prints for these tables):")
        report = source_status(spark, config)
        print("\n".join(report.lines()))
        spark.stop()
    if failures:
        print(f"FAILED: {len(failures)} check(s)")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
