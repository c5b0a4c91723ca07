"""``make run``: the whole story on one machine, against the embedded emulator.

Starts the emulator (both namespaces of ``conf/emulator.yaml``, on free ports), writes a
realistic legacy backlog plus a few poison messages, runs the syphon with ``available_now``,
prints its summary, checks that every destination got what it should and that the poison
messages were dead-lettered with their reasons, then stops the emulator. Exit 0 only if all
checks pass.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import logging
import os
import sys
import time
from pathlib import Path

from backlog_syphon import backlog_writer
from backlog_syphon.config import load_config

PRIMARY, SECONDARY = "contoso", "contoso-secondary"


def expected_arrivals(originals) -> collections.Counter:
    """Messages each destination entity should receive (topic fan-out by subscription filter)."""
    expected = collections.Counter()
    for message in originals:
        if message.destination == "events":
            expected["events/all"] += 1
            if message.application_properties.get("region") == "eu":
                expected["events/eu"] += 1
        else:
            expected[message.destination] += 1
    return expected


def received_counts(client, entities, *, settle_seconds: float = 5.0) -> collections.Counter:
    """Drain each destination (receive and delete) and count what arrived."""
    from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode
    from azure.servicebus.exceptions import OperationTimeoutError

    counts = collections.Counter()
    mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
    for entity in entities:
        topic, _, subscription = entity.partition("/")
        if entity == "sessions-orders":
            while True:
                try:
                    receiver = client.get_queue_receiver(entity, session_id=NEXT_AVAILABLE_SESSION,
                                                         receive_mode=mode, max_wait_time=2)
                    with receiver:
                        while batch := receiver.receive_messages(max_message_count=500, max_wait_time=1):
                            counts[entity] += len(batch)
                except OperationTimeoutError:
                    break
            continue
        receiver = (client.get_subscription_receiver(topic, subscription, receive_mode=mode) if subscription
                    else client.get_queue_receiver(entity, receive_mode=mode))
        with receiver:
            deadline = time.monotonic() + settle_seconds  # scheduled messages appear a little later
            while True:
                batch = receiver.receive_messages(max_message_count=500, max_wait_time=1)
                counts[entity] += len(batch)
                if not batch and time.monotonic() > deadline:
                    break
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulator-config", default="conf/emulator.yaml")
    parser.add_argument("--config", default="conf/local.yaml")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--state-dir", default="var/local")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("azure", "py4j", "servicebus_emulator"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from azure.servicebus import ServiceBusClient
    from servicebus_emulator import Emulator, load_config as load_emulator_config

    from backlog_syphon.servicebus_io import backlog_dead_letters
    from backlog_syphon.spark_session import build_spark_session
    from backlog_syphon.syphon import dry_run, run_syphon

    emulator_config = load_emulator_config(args.emulator_config)
    # Free ports, so a `make emulator` running elsewhere does not collide with this run.
    with Emulator(emulator_config, ports={PRIMARY: 0, SECONDARY: 0}) as emulator:
        os.environ["SYPHON_PRIMARY_CONNECTION_STRING"] = emulator.connection_string(PRIMARY)
        os.environ["SYPHON_SECONDARY_CONNECTION_STRING"] = emulator.connection_string(SECONDARY)
        # A fresh state folder per run: the emulator's sequence numbers start again with it.
        state = Path(args.state_dir) / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        config = load_config(args.config, overrides={
            "storage.audit_table": str((state / "tables/audit").resolve()),
            "storage.checkpoint_table": str((state / "tables/checkpoint").resolve()),
            "storage.checkpoint_location": str((state / "checkpoint").resolve()),
        })
        originals = backlog_writer.realistic_backlog(args.count, seed=7)
        poison = backlog_writer.poison_backlog(seed=7)
        written = backlog_writer.write_backlog(config.secondary, config.primary.namespace,
                                               originals + [message for message, _ in poison],
                                               queue_count=config.backlog.queue_count, seed=7)
        print(f"wrote {sum(written.values())} legacy messages ({len(poison)} poison) over {len(written)} "
              f"backlog queues")

        spark = build_spark_session("backlog-syphon-local")
        print("\n".join(dry_run(spark, config).lines()))
        started = time.monotonic()
        summary = run_syphon(spark, config, on_progress=print)
        elapsed = time.monotonic() - started
        print("\n".join(summary.lines()))
        moved = sum(sum(c.values()) for c in summary.per_destination.values())
        print(f"moved {moved} messages in {elapsed:.1f} s ({moved / elapsed:.0f} msg/s); audit and checkpoint "
              f"tables in {state}")

        expected = expected_arrivals(originals)
        with ServiceBusClient.from_connection_string(emulator.connection_string(PRIMARY)) as client:
            arrived = received_counts(client, sorted(expected))
        dead = collections.Counter()
        for queue in written:
            for message in backlog_dead_letters(config.secondary, queue):
                dead[message.dead_letter_reason] += 1
        failures = []
        for entity, count in sorted(expected.items()):
            status = "ok" if arrived[entity] == count else "MISMATCH"
            print(f"check {entity:<20} expected {count:>6} received {arrived[entity]:>6} {status}")
            if arrived[entity] != count:
                failures.append(entity)
        want_dead = collections.Counter(reason for _, reason in poison)
        print(f"check dead-lettered by reason: {dict(dead)} (expected {dict(want_dead)})")
        if dead != want_dead:
            failures.append("dead-letter reasons")
        if not summary.drained:
            failures.append("backlog not drained")
        spark.stop()
    if failures:
        print(f"FAILED: {', '.join(failures)}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
