"""The emulator of a row, its backlog, and what its counters say: arrivals, broker requests, what is left,
and whether everything arrived once and in order. Runs in the bench's own process."""
from __future__ import annotations

import collections
import os
from contextlib import contextmanager
from pathlib import Path

from syphon_bench import BenchFailure
from syphon_bench.rows import (
    BACKLOG_QUEUES,
    CONNECTION_ENV,
    PRIMARY,
    SECONDARY,
    DestinationShape,
    Geometry,
    Scenario,
    backlog_queue_names,
)
from tools.testing import emulator_environment

ROOT = Path(__file__).resolve().parents[2]
LIBRARY_ENV = "BENCH_SYPHON_LIBRARY"  # a child's syphon library (``--library``), before this checkout's


@contextmanager
def backlog_emulator(scenario: Scenario | None, geometry: Geometry, args):
    """A fresh emulator at ``geometry`` whose backlog queues hold ``scenario``'s backlog (none: empty), and
    the backlog as stored (``Backlog``)."""
    from tools.backlog_writer import realistic_backlog, write_backlog
    from backlog_syphon.config import load_config as load_syphon_config
    from servicebus_emulator import Emulator

    with Emulator(emulator_config(scenario), ports={PRIMARY: 0, SECONDARY: 0},
                  latency_ms=geometry.emulator_latency()) as emu:
        if scenario is not None and scenario.messages:
            config = load_syphon_config(ROOT / "conf/local.yaml", environ=connection_env(emu))
            backlog = realistic_backlog(scenario.messages, seed=args.seed, body_size=scenario.body_size,
                                        session_share=scenario.session_share, sessions=scenario.sessions)
            with batch_headroom():
                # A partitioned backlog queue takes a batch into one partition whole: the legacy client's
                # copies one transfer each, so that they go round the partitions as they did on the day.
                write_backlog(config.secondary, config.primary.namespace, backlog, queue_count=BACKLOG_QUEUES,
                              seed=args.seed, first_queue_share=scenario.first_queue_share,
                              singly=scenario.backlog_partitioned)
            if backlog_left(emu) != (scenario.messages, 0):
                raise BenchFailure(f"the backlog holds {backlog_left(emu)} (stored, dead-lettered) after "
                                   f"writing {scenario.messages} messages")
        stored = Backlog.stored(emu)
        if scenario is not None and scenario.credits_per_second:
            for namespace in CONNECTION_ENV:
                emu.set_credits_per_second(namespace, scenario.credits_per_second)
        yield emu, stored


# The top 16 bits of a partitioned entity's sequence numbers are its partition (the emulator's, as the service's).
PARTITION_SHIFT = 48


class Backlog:
    """A row's backlog as the emulator stored it, in each queue's (each partition's) sequence order: what
    every mover must keep per backlog queue, and per partition of a partitioned one."""

    def __init__(self, stored: dict[str, list[tuple[int, object, str | None]]]):
        self.written = {queue: len(messages) for queue, messages in stored.items() if messages}
        # message id -> (its backlog queue and partition, its place there)
        self.place = {message_id: ((queue, seq >> PARTITION_SHIFT), index) for queue, messages in stored.items()
                      for index, (seq, message_id, _) in enumerate(messages)}

    @classmethod
    def stored(cls, emu) -> Backlog:
        names = set(backlog_queue_names())
        return cls({queue: messages for queue, messages in emu.stored_messages(SECONDARY).items() if queue in names})

    def arrival_problems(self, emu, *, keyless_unordered: bool = False) -> list[str]:
        """What is wrong with the destinations' messages (at most 10, and how many more): a message stored
        twice in one entity, or two of one backlog queue (partition) and session (or none) stored out of their
        order in one destination (partition): the order anyone can observe (design.md's invariant 3; a mover
        may send a destination's sessions one after the other). ``keyless_unordered``: messages without a
        session may arrive in any order (a partitioned destination with duplicate detection takes them one per
        send, several in flight, and spreads them over its partitions). Empty: everything arrived once, in order."""
        problems = []
        for entity, messages in emu.stored_messages(PRIMARY).items():
            last: dict[tuple, int] = {}
            seen: set = set()
            for seq, message_id, session in messages:
                if message_id in seen:
                    problems.append(f"{entity}: {message_id!r} stored twice")
                seen.add(message_id)
                origin, index = self.place.get(message_id, (None, None))
                if origin is None or (keyless_unordered and session is None):
                    continue
                key = (seq >> PARTITION_SHIFT, origin, session)
                if index < last.get(key, -1):
                    problems.append(f"{entity}: {message_id!r} ({origin[0]} #{index}) stored after #{last[key]}")
                last[key] = max(index, last.get(key, -1))
        return problems[:10] + ([f"and {len(problems) - 10} more"] if len(problems) > 10 else [])


def emulator_config(scenario: Scenario | None):
    """conf/emulator.yaml, with the row's peek page size and partitioned backlog queues on the secondary and
    its destinations' shape on the primary."""
    import yaml
    from servicebus_emulator.config import EmulatorConfig

    raw = yaml.safe_load((ROOT / "conf/emulator.yaml").read_text())
    for namespace in raw["namespaces"]:
        namespace["credits_per_second"] = 0  # on only while a row's movers run (``backlog_emulator``)
    for namespace in raw["namespaces"] if scenario is not None else ():
        entities = [*namespace.get("queues", []), *namespace.get("topics", [])]
        if namespace["name"] == SECONDARY:
            if scenario.peek_page_bytes:
                namespace["peek_page_bytes"] = scenario.peek_page_bytes
            if scenario.backlog_partitioned:
                namespace["peek_one_per_call"] = scenario.peek_one_per_call
                for entity in entities:
                    if entity["name"] in backlog_queue_names():
                        entity["enable_partitioning"] = True
        elif namespace["name"] == PRIMARY and scenario.destinations is not DestinationShape.PLAIN:
            dedupe = scenario.destinations is DestinationShape.PARTITIONED_DEDUPE
            for entity in entities:  # (conf/emulator.yaml's orders deduplicates: off here unless the row's is)
                entity["enable_partitioning"] = True
                entity["duplicate_detection_window_seconds"] = 600 if dedupe else 0
    return EmulatorConfig.from_dict(raw, source="conf/emulator.yaml")


@contextmanager
def batch_headroom(headroom_bytes: int = 1024):
    """Batches created in this process stay ``headroom_bytes`` under the link's limit meanwhile.

    azure-servicebus 7.15.0 counts a batch's size before it sets the envelope's own properties (the
    first message's MessageId and SessionId), and the backlog writer keeps the same count, so a batch
    filled to within a few bytes of the limit is refused (``MessageSizeExceededError``). Only the
    backlog writing (never measured) runs here; the movers run in their own processes, untouched.
    """
    from azure.servicebus import ServiceBusSender

    create = ServiceBusSender.create_message_batch

    def with_headroom(sender, *args, **kwargs):
        batch = create(sender, *args, **kwargs)
        batch._max_size_in_bytes -= headroom_bytes  # noqa: SLF001
        return batch

    ServiceBusSender.create_message_batch = with_headroom
    try:
        yield
    finally:
        ServiceBusSender.create_message_batch = create


def connection_env(emu, library: Path | None = None, transport: str = "amqp") -> dict[str, str]:
    """The environment a syphon needs for ``emu``: its connection strings, and its administration API where
    ``library`` (this checkout's by default) knows the settings (an older checkout's may not); ``transport``:
    the syphon's way to it."""
    environ = emulator_environment(emu, PRIMARY, SECONDARY, transport=transport)
    package = Path(library or os.environ.get(LIBRARY_ENV) or ROOT / "lib") / "backlog_syphon"
    if not any("administration_endpoint" in path.read_text() for path in package.rglob("*.py")):
        environ = {name: value for name, value in environ.items() if name in CONNECTION_ENV.values()}
    return environ


def credits_spent(emu) -> dict[str, tuple[int, int]]:
    """Per namespace: (credits spent, operations throttled) since the emulator started."""
    stats = {namespace: emu.credit_stats(namespace) for namespace in CONNECTION_ENV}
    return {namespace: (entry["spent_total"], entry["throttled_total"]) for namespace, entry in stats.items()}


def credits_since(emu, before: dict[str, tuple[int, int]]) -> dict[str, dict[str, int]]:
    return {namespace: {"spent": spent - before[namespace][0], "throttled": throttled - before[namespace][1]}
            for namespace, (spent, throttled) in credits_spent(emu).items()}


def requests(ops: collections.Counter) -> int:
    """The broker requests among ``ops``: ``peek_one`` counts the single-message ones again among ``peek``."""
    return sum(n for kind, n in ops.items() if kind != "peek_one")


def broker_ops(emu) -> collections.Counter:
    """Every entity's ``ops`` counters in both namespaces, summed per kind of operation."""
    total: collections.Counter = collections.Counter()
    for namespace in CONNECTION_ENV:
        for entity in emu.stats(namespace).values():
            total.update(entity.get("ops", {}))
    return total


def arrivals(emu) -> int:
    """Messages the primary namespace's queues and topics have taken in so far."""
    primary = next(ns for ns in emu.config.namespaces if ns.name == PRIMARY)
    stats = emu.stats(PRIMARY)
    return sum(stats[entity.name]["in"] for entity in [*primary.queues, *primary.topics])


def duplicates_dropped(emu) -> int:
    """Messages the primary's deduplicating entities dropped as duplicates: sent twice, arrived once."""
    primary = next(ns for ns in emu.config.namespaces if ns.name == PRIMARY)
    stats = emu.stats(PRIMARY)
    return sum(stats[entity.name].get("duplicates", 0) for entity in [*primary.queues, *primary.topics])


def backlog_left(emu) -> tuple[int, int]:
    """(messages stored, messages dead-lettered) over the backlog queues."""
    stats = emu.stats(SECONDARY)
    queues = [stats[name] for name in backlog_queue_names()]
    return sum(q["total"] for q in queues), sum(q.get("dead_letter_count", 0) for q in queues)


def dead_letter_reasons(emu) -> collections.Counter:
    """Why backlog messages were dead-lettered ("reason: description" -> count), peeked from each queue's DLQ."""
    from azure.servicebus import ServiceBusClient, ServiceBusSubQueue

    reasons: collections.Counter = collections.Counter()
    with ServiceBusClient.from_connection_string(emu.connection_string(SECONDARY)) as client:
        for queue in backlog_queue_names():
            with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
                reasons.update(f"{m.dead_letter_reason}: {m.dead_letter_error_description}"
                               for m in receiver.peek_messages(max_message_count=250))
    return reasons
