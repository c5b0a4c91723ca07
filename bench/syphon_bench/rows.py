"""The bench's rows: a backlog, the latencies it sits at, the entities' shapes and the loops it is measured
against. Plain values, no I/O."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

PRIMARY, SECONDARY = "contoso", "contoso-secondary"
CONNECTION_ENV = {PRIMARY: "SYPHON_PRIMARY_CONNECTION_STRING", SECONDARY: "SYPHON_SECONDARY_CONNECTION_STRING"}
BACKLOG_QUEUES = 10  # conf/emulator.yaml's backlog queues, conf/local.yaml's backlog.queue_count
QUICK_MESSAGES = 3_000


class Loop(str, Enum):
    """The plain SDK loops a row's syphon is measured against (``loops``, ``async_loop``)."""

    THREADS = "threads"  # a thread per backlog queue, one completion at a time
    ASYNCIO = "asyncio"  # a task per backlog queue, the page's completions gathered
    SINGLE = "single"  # one thread, queue after queue, one send per message


# Every geometry row's loops: the syphon's ratio is against the faster of them in the same run.
PLAIN_LOOPS = (Loop.THREADS, Loop.ASYNCIO)


@dataclass(frozen=True)
class Geometry:
    """One-way latencies: the secondary namespace (the backlog) and the primary (the destinations)."""

    secondary_ms: float
    primary_ms: float

    def label(self) -> str:
        if self.secondary_ms == self.primary_ms:
            return f"{self.secondary_ms:g} ms"
        return f"{self.secondary_ms:g}/{self.primary_ms:g} ms"

    def emulator_latency(self) -> dict[str, float]:
        """The emulator's latency per namespace: it delays what it sends, so a round trip takes it once."""
        return {SECONDARY: 2 * self.secondary_ms, PRIMARY: 2 * self.primary_ms}


FAR = Geometry(25.0, 1.0)
LOOPBACK = Geometry(0.0, 0.0)


class DestinationShape(str, Enum):
    """The primary's destinations in a row: as conf/emulator.yaml has them, or every one partitioned (16
    partitions, as on Standard), with or without duplicate detection."""

    PLAIN = "plain"
    PARTITIONED = "partitioned"
    PARTITIONED_DEDUPE = "partitioned, deduplicating"


@dataclass(frozen=True)
class Scenario:
    name: str
    messages: int
    geometry: Geometry
    body_size: int = 1024
    session_share: float = 0.1
    sessions: int = 20
    first_queue_share: float | None = None  # a skewed backlog: that share in queue 0
    loops: tuple[Loop, ...] = PLAIN_LOOPS
    time_commits: bool = False  # time single Delta commits in this row's syphon process, after its run
    # The secondary's peek pages, at most this many bytes of messages (the emulator's peek_page_bytes; None:
    # its default, the service's ~256 KB): how a distant namespace streams a page.
    peek_page_bytes: int | None = None
    # Partitioned backlog queues (16 partitions): a peek answers from one partition, whole pages of it, or
    # one message per call as once reported (the emulator's peek_one_per_call).
    backlog_partitioned: bool = False
    peek_one_per_call: bool = False
    destinations: DestinationShape = DestinationShape.PLAIN
    # The namespaces' credits a second while the movers run (a Standard namespace's 1,000; 0: off, the emulator's
    # budget kept out of the way of the other rows). The backlog is written before, with them off.
    credits_per_second: float = 0.0
    # The syphon is told that budget (``<namespace>.max_credits_per_second``, as the operating pages advise on
    # Standard): it paces to it; without, it slows down only once the namespace answers busy.
    budget_known: bool = False
    # The Spark master of the syphon's session (None: the session builder's default, local[*]); a
    # ``local-cluster[N,C,M]`` row runs N executor JVMs, as a cluster does, on this one machine.
    master: str | None = None
    loops_of: str | None = None  # a row of the same backlog whose loops this row's ratios are against
    # How the syphon reaches the emulator (``testing.emulator_environment``): plain AMQP (the emulators'
    # shortcut), ``amqps`` (TLS) or ``amqp-websockets`` (over TLS); the backlog is written plain either way.
    transport: str = "amqp"

    def describe(self) -> str:
        shape = [f"{self.messages:,} x {self.body_size // 1024 if self.body_size >= 1024 else self.body_size}"
                 f"{' KB' if self.body_size >= 1024 else ' B'}"]
        if self.first_queue_share:
            shape.append(f"{self.first_queue_share:.0%} in one queue")
        if self.session_share >= 1:
            shape.append(f"{self.sessions} sessions")
        if self.peek_page_bytes:
            shape.append(f"peek pages of {self.peek_page_bytes // 1024} KB")
        if self.backlog_partitioned:
            shape.append("partitioned backlog, " + ("one message per peek" if self.peek_one_per_call
                                                     else "whole-partition peek pages"))
        if self.destinations is not DestinationShape.PLAIN:
            shape.append(f"{self.destinations.value} destinations")
        if self.credits_per_second:
            shape.append(f"{self.credits_per_second:,.0f} credits a second per namespace"
                         + (", the syphon told so" if self.budget_known else ""))
        if self.master:
            shape.append(f"on {self.master}")
        if self.transport != "amqp":
            shape.append(f"over {self.transport}")
        return ", ".join(shape) + f", {self.geometry.label()}"


SCENARIOS = {
    "30k": Scenario("30k", 30_000, FAR, loops=(*PLAIN_LOOPS, Loop.SINGLE), time_commits=True),
    "200k": Scenario("200k", 200_000, FAR),
    "skewed": Scenario("skewed", 30_000, FAR, first_queue_share=0.8),
    "sessions": Scenario("sessions", 30_000, FAR, session_share=1.0, sessions=500),
    "64k": Scenario("64k", 20_000, FAR, body_size=64 * 1024),
    # Peeks answer as a namespace a region away streams them: about 60 messages of 1 KB a page, not 250.
    "30k-short-pages": Scenario("30k-short-pages", 30_000, FAR, peek_page_bytes=64 * 1024),
    # Partitioned entities at the same geometry: the 30k backlog over partitioned backlog queues (whole
    # pages, and one message per peek: the same size, so that a run's fixed start weighs on it as on the
    # others), and into partitioned destinations with and without duplicate detection.
    "partitioned-pages": Scenario("partitioned-pages", 30_000, FAR, backlog_partitioned=True),
    "partitioned-peek-one": Scenario("partitioned-peek-one", 30_000, FAR, backlog_partitioned=True,
                                     peek_one_per_call=True),
    "partitioned-dest": Scenario("partitioned-dest", 30_000, FAR, destinations=DestinationShape.PARTITIONED),
    "partitioned-dedupe-dest": Scenario("partitioned-dedupe-dest", 30_000, FAR,
                                        destinations=DestinationShape.PARTITIONED_DEDUPE),
    # A Standard namespace at each end, throttling as the service does once its 1,000 credits a second are spent.
    "standard-credits": Scenario("standard-credits", 30_000, FAR, credits_per_second=1000),
    "standard-credits-partitioned": Scenario("standard-credits-partitioned", 30_000, FAR, backlog_partitioned=True,
                                             credits_per_second=1000),
    # The same, with the syphon told the namespaces' budget; the loops' figures are the rows' above.
    "standard-credits-budget": Scenario("standard-credits-budget", 30_000, FAR, credits_per_second=1000,
                                        budget_known=True, loops=(), loops_of="standard-credits"),
    "standard-credits-partitioned-budget": Scenario("standard-credits-partitioned-budget", 30_000, FAR,
                                                    backlog_partitioned=True, credits_per_second=1000,
                                                    budget_known=True, loops=(),
                                                    loops_of="standard-credits-partitioned"),
    # Scale out: 100,000 messages on one JVM with two task slots (the default local[2]), then on executors of
    # their own (local-cluster[N,C,MB]: a JVM and its Python workers per executor, as a cluster has): one of one
    # core, two of one, two of two (more cores than the loop's one process can use). The loops' figures are
    # the first row's (the same backlog). On a 2-core machine a curve, not a record.
    "scale-local2": Scenario("scale-local2", 100_000, FAR),
    "scale-1x1": Scenario("scale-1x1", 100_000, FAR, loops=(), loops_of="scale-local2",
                          master="local-cluster[1,1,2048]"),
    "scale-2x1": Scenario("scale-2x1", 100_000, FAR, loops=(), loops_of="scale-local2",
                          master="local-cluster[2,1,2048]"),
    "scale-2x2": Scenario("scale-2x2", 100_000, FAR, loops=(), loops_of="scale-local2",
                          master="local-cluster[2,2,2048]"),
    # The network a deployment has: TLS (5671), and WebSockets over TLS (443) where only 443 is open.
    "30k-tls": Scenario("30k-tls", 30_000, FAR, loops=(), transport="amqps"),
    "30k-websockets": Scenario("30k-websockets", 30_000, FAR, loops=(), transport="amqp-websockets"),
    "30k-0ms": Scenario("30k-0ms", 30_000, LOOPBACK, loops=(*PLAIN_LOOPS, Loop.SINGLE)),
    "30k-10ms": Scenario("30k-10ms", 30_000, Geometry(10.0, 10.0), loops=(*PLAIN_LOOPS, Loop.SINGLE)),
}


def backlog_queue_names() -> list[str]:
    return [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(BACKLOG_QUEUES)]
