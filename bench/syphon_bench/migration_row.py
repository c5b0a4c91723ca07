"""The migration row (issue 60): ``migration`` drains 30,000 x 1 KB from 10 plain source queues ``bench-0..9``
(the secondary at 25 ms, as a Standard namespace left them after a migration) into the same queues of the
primary at 1 ms (the Premium namespace). The syphon runs its migration mode (``run.source=migration``,
``migration.entities=["bench-*"]``) on conf/local.yaml; its loop is the threads loop, each message copied into the
queue of its own name (body, ids, properties), then completed. ``bench_syphon`` and the children dispatch a
``MigrationScenario`` (or a spec with ``migration``) here."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from process_cpu import CpuSampler, OwnCpu
from syphon_bench import BenchFailure
from syphon_bench.broker import ROOT, arrivals, batch_headroom, broker_ops, duplicates_dropped
from syphon_bench.children import child_process, child_result
from syphon_bench.figures import cycle_figures
from syphon_bench.loops import RECEIVE_PAGE, send_in_batches, property_text
from syphon_bench.rows import CONNECTION_ENV, FAR, PRIMARY, SCENARIOS, SECONDARY, Loop, Scenario
from syphon_bench.syphon_run import kept_failure_log, keep_run_log, syphon_overrides


@dataclass(frozen=True)
class MigrationScenario(Scenario):
    """A migration drain: ``messages`` spread evenly over ``MIGRATION_QUEUES`` plain source queues."""

    def describe(self) -> str:
        return (f"migration: {self.messages:,} x {self.body_size // 1024} KB over {MIGRATION_QUEUES} plain "
                f"queues, {self.geometry.label()}")


MIGRATION_QUEUES = 10
SCENARIOS["migration"] = MigrationScenario("migration", 30_000, FAR, loops=(Loop.THREADS,))


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
                send_in_batches(sender, [
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
                                 {property_text(k): v for k, v in (m.application_properties or {}).items()}) for m in page]
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
                        send_in_batches(sender, [_copied(message) for message in page])
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
        with OwnCpu() as own, child_process("loop", spec, emu, Path(tmp)) as child, CpuSampler(child.pid) as cpu:
            result = child_result(child, "loop", Path(tmp), args.loop_seconds + 300)
            cpu.wait_for_exit()
        arrived, (left, dead) = arrivals(emu), migration_left(emu)
    moved = result["moved"]
    if arrived != moved or left != scenario.messages - moved or dead:
        raise BenchFailure(f"loop (migration): reports {moved} moved, destinations received {arrived}, sources hold "
                           f"{left} and {dead} dead-lettered (of {scenario.messages})")
    return {"rate": moved / result["seconds"], "moved": moved, "seconds": result["seconds"],
            "time_bound": moved < scenario.messages, "cpu_per_1000": cpu.total() / max(1, moved) * 1000,
            # this process's CPU meanwhile, less its sampling: the emulator's, which runs in here
            "emulator_cpu_per_1000": (own.seconds - cpu.own_seconds) / max(1, moved) * 1000}


def measure_migration_syphon(scenario: MigrationScenario, args, *, per_trigger: int | None = None,
                             library: Path | None = None) -> dict:
    """The syphon's migration mode on ``scenario``; its failure: not drained, a message missing, twice or
    different, or one left in a source queue."""
    with migration_emulator(scenario, args) as (emu, written), \
            tempfile.TemporaryDirectory(prefix="bench-syphon-") as tmp:
        ops_before = broker_ops(emu)
        timeout = 600 + scenario.messages / 10
        settings = {"run.source": "migration", "migration.entities": '["bench-*"]',
                    **({} if per_trigger is None else {"run.max_messages_per_trigger": per_trigger})}
        spec = {"overrides": syphon_overrides(Path(tmp), **settings), "timeout_seconds": timeout}
        with OwnCpu() as own, child_process("syphon", spec, emu, Path(tmp), library) as child, \
                CpuSampler(child.pid) as cpu:
            result = child_result(child, "syphon", Path(tmp), timeout + 300)
            cpu.wait_for_exit()
        ops = broker_ops(emu) - ops_before
        arrived, (left, dead), twice = arrivals(emu), migration_left(emu), duplicates_dropped(emu)
        different = migration_arrived_exact(emu, written) if arrived == scenario.messages else None
        keep_run_log(args, tmp, scenario.name)
        failure = None
        if not result["drained"] or arrived != scenario.messages or left or dead or twice or different:
            kept = kept_failure_log(tmp)
            failure = (f"drained={result['drained']}, destinations received {arrived} of {scenario.messages}, source "
                       f"queues hold {left}, {dead} dead-lettered, {twice} sent twice; {different or 'exact'}; "
                       f"the run's log: {kept}")
    # This process's CPU meanwhile, less its sampling: the emulator's (it runs in here), per 1,000 messages.
    result["emulator_cpu_per_1000"] = (own.seconds - cpu.own_seconds) / scenario.messages * 1000
    return {**result, "e2e_rate": scenario.messages / result["seconds"], "ops": dict(ops),
            "failure": failure, "cpu_per_1000": cpu.total() / scenario.messages * 1000,
            "cpu_by_role": {role: {"processes": n, "seconds": s} for role, (n, s) in cpu.by_role().items()},
            "cpu_processes": [asdict(p) for p in cpu.processes()], "jvm_threads": cpu.jvm_threads(),
            **cycle_figures(result)}
