"""One micro-batch as a state machine (``sink.micro_batch.run_batch``), driven in a small fake world.

The world: a backlog (queues of messages with a sequence number, an enqueue time and a destination),
the tables (audit rows, checkpoint rows, Delta's idempotent transaction versions), the destinations
(counting what arrives), a lease and a purge that settles by identity against the backlog. The
fakes implement the ports (``BatchPorts``, ``LeasePort``, ``PurgePort``) the way
``sink.spark_ports`` has the real ones: one delivery task per backlog queue, every row's latest
outcome aggregated with ``combine_groups``. A crash is a ``BaseException`` raised at a crash point
(nothing in the batch handles it, as nothing handles SIGKILL): the run's state is thrown away and
a new run replays the batch. Everything runs on a fake clock, in milliseconds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from backlog_syphon.config import SinkConfig
from backlog_syphon.errors import BatchFailedError, DestinationUnavailableError, LeaseLostError
from backlog_syphon.model import Action, CheckpointRow, DeadLetterOrder, Outcome, ReasonCode
from backlog_syphon.purge.bulk_settlement import BulkSettlement
from backlog_syphon.purge.plan import PurgePlan, PurgeResult
from backlog_syphon.purge.progress import PurgeProgress
from backlog_syphon.sink.delivery import Outgoing, PartialSendError, RoundLimits, SendFailure, deliver_rows
from backlog_syphon.sink.micro_batch import (
    ATTEMPTS_PER_BATCH,
    BatchAggregate,
    CrashPoint,
    NoHooks,
    Recovery,
    SinkState,
    begin_run,
    finish,
    run_batch,
    settle_recorded,
)
from backlog_syphon.sink.outcome_aggregate import combine_groups

NOW = dt.datetime(2026, 11, 25, 8, 0, tzinfo=dt.timezone.utc)
T0 = 1_700_000_000_000  # enqueue times (ms): message n entered its queue at T0 + 10 n
Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"
SINK = SinkConfig(max_send_attempts=3, retry_backoff_seconds=1.0, max_retry_backoff_seconds=2.0,
                  outage_wait_seconds=60.0)


# --- the fake world ---------------------------------------------------------------------------------

class Crash(BaseException):
    """The process was killed: nothing catches it."""


class Refused(Exception):
    pass


class Clock:
    """Epoch seconds, moved by sleeps and sends only."""

    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class Message:
    queue: str
    seq: int
    enqueued_ms: int
    destination: str | None  # None: no x-ms-path, dead-lettered by the restore rules
    session: str | None = None

    @property
    def identity(self) -> tuple[int, int]:
        return self.seq, self.enqueued_ms

    @property
    def message_id(self) -> str:
        return f"{self.queue[-1]}:{self.seq}"

    def row(self) -> dict:
        """The row the source reads and the restore rules classify."""
        deliver = self.destination is not None
        return {"backlog_queue": self.queue, "sequence_number": self.seq, "enqueued_ms": self.enqueued_ms,
                "message_id": self.message_id, "destination": self.destination, "session_id": self.session,
                "partition_key": None, "action": Action.DELIVER if deliver else Action.DEAD_LETTER,
                "reason_code": None if deliver else ReasonCode.MISSING_PATH.value,
                "reason": None if deliver else "no x-ms-path"}


LOCK_SECONDS = 60.0  # the backlog queues' lock


class Backlog:
    """The secondary namespace's backlog queues, and what the purge dead-lettered. A purge that dies holding
    locks (``CrashPoint.MID_SETTLE``) leaves them for ``LOCK_SECONDS``, as the service keeps a lost link's."""

    def __init__(self, clock: Clock | None = None):
        self.clock = clock if clock is not None else Clock()
        # (queue, sequence number) -> when the lock a dead receiver left on it ends
        self.locked_until: dict[tuple[str, int], float] = {}
        self.lock_waits: list[float] = []  # how long the purges waited for such locks (fake seconds)
        self.queues: dict[str, list[Message]] = defaultdict(list)
        self.dead_lettered: list[tuple[str, int, str]] = []  # (queue, sequence number, reason code)
        self.numbered: Counter[str] = Counter()  # the last sequence number each queue gave
        self.released: list[tuple[str, int]] = []  # received by a purge, not recorded, given back
        self.overasked: list[tuple[str, int, int]] = []  # (queue, expected, recorded ones still there)
        self.created_ms: dict[str, int] = defaultdict(lambda: T0)  # message n enters at created + 10 n
        self.losing_locks: set[tuple[str, int]] = set()  # (queue, sequence number) whose next completion fails
        self.settle_requests = 0

    def add(self, queue: str, *destinations: str | None, sessions=None) -> list[Message]:
        start, created = self.numbered[queue] + 1, self.created_ms[queue]
        added = [Message(queue, seq, created + 10 * seq, destination, None if sessions is None else sessions[i])
                 for i, (seq, destination) in enumerate(enumerate(destinations, start))]
        self.numbered[queue] += len(added)
        self.queues[queue].extend(added)
        return added

    def complete(self, queue: str, sequence_numbers) -> list[int]:
        """``settle.settle_all``: bulk requests split on a lost lock (``BulkSettlement``). A message in
        ``losing_locks`` loses its lock once (a request holding it is refused; it is available again)."""
        completion = BulkSettlement(sequence_numbers, deadline=float("inf"))
        while (request := completion.next_request(0.0)) is not None:
            lost = [seq for seq in request if (queue, seq) in self.losing_locks]
            if lost:
                if len(request) == 1:
                    self.losing_locks.discard((queue, request[0]))
                completion.lock_lost(request)
            else:
                completion.succeeded(request)
            self.settle_requests += 1
        return completion.completed

    def recreate(self, queue: str, created_ms: int) -> None:
        """The queue deleted (with what it held) and created again: it numbers from 1 again."""
        self.queues[queue] = []
        self.numbered[queue] = 0
        self.created_ms[queue] = created_ms

    def read(self, messages: list[Message]) -> list[dict]:
        """A batch's rows: the window of ``messages``, as far as they are still in the backlog."""
        return [m.row() for m in messages if m in self.queues[m.queue]]

    def left(self) -> dict[str, list[int]]:
        return {queue: [m.seq for m in held] for queue, held in sorted(self.queues.items()) if held}

    def locked(self, message: Message) -> bool:
        return self.locked_until.get((message.queue, message.seq), 0.0) > self.clock()

    def purge(self, plan: PurgePlan, hooks=None) -> PurgeResult:
        """``settle.purge_backlog`` against this backlog: verify, receive in order (past messages a dead
        receiver left locked, waiting for their locks where the round says so), settle what the plan holds.
        ``hooks`` reach ``MID_SETTLE`` after a page's completions: a crash there leaves the page's
        dead-letterings undone and their messages locked."""
        held = self.queues[plan.queue]
        present = [m.identity for m in held if any(first <= m.seq <= last for first, last in plan.ranges)]
        if plan.verify and plan.expected:
            plan = plan.verified(present)
        there = sum(plan.holds(m.identity) for m in held)
        if plan.expected > there:
            self.overasked.append((plan.queue, plan.expected, there))
        progress = PurgeProgress(plan)
        while (credit := progress.credit()) or progress.wants_look:
            if not credit:
                progress.on_look([m.identity for m in held if any(a <= m.seq <= b for a, b in plan.ranges)],
                                 self.clock())
                continue
            self.clock.sleep(progress.pause_before_receive(self.clock()))
            wait = progress.receive_wait(self.clock(), 5.0)
            ends = sorted(until for (queue, _), until in self.locked_until.items()
                          if queue == plan.queue and self.clock() < until <= self.clock() + wait)
            if not [m for m in held if not self.locked(m)] and ends:  # a receive answers once a lock ends
                self.lock_waits.append(ends[0] - self.clock())
                self.clock.now = ends[0]
            page = [m for m in held if not self.locked(m)][:credit]  # the head of what is not locked
            actions = progress.on_page([m.identity for m in page])
            self.released += [(plan.queue, seq) for seq in actions.release]
            completed = self.complete(plan.queue, actions.complete)
            held[:] = [m for m in held if m.seq not in set(completed)]
            if hooks is not None and actions.dead_letter:
                try:
                    hooks.completions_sent(frozenset(span.batch_id for span in plan.spans))
                except Crash:
                    for seq, _, _ in actions.dead_letter:  # the dead process held them: locked until the lock ends
                        self.locked_until[(plan.queue, seq)] = self.clock() + LOCK_SECONDS
                    raise
            self.dead_lettered += [(plan.queue, seq, code) for seq, code, _ in actions.dead_letter]
            held[:] = [m for m in held if m.seq not in {seq for seq, _, _ in actions.dead_letter}]
            progress.on_settled(len(completed), [seq for seq, _, _ in actions.dead_letter])
        heads = {span.first: next((m.identity for m in held if m.seq >= span.first), None) for span in plan.spans}
        return progress.result(heads)


class Destinations:
    """The primary namespace (``delivery.Sender``): what arrived where, in order."""

    def __init__(self, clock: Clock, send_seconds: float = 0.0):
        self.clock, self.send_seconds = clock, send_seconds
        self.received: dict[str, list[str]] = defaultdict(list)
        self.arrivals: Counter[str] = Counter()
        self.down: set[str] = set()  # refuse every send
        self.refusals: Counter[str] = Counter()  # refuse this many more sends

    def send(self, destination: str, messages) -> int:
        self.clock.now += self.send_seconds
        if destination in self.down or self.refusals[destination] > 0:
            self.refusals[destination] -= 1
            raise PartialSendError(0, Refused(destination))
        for message in messages:
            self.received[destination].append(message.message_id)
            self.arrivals[message.message_id] += 1
        return len(messages)

    def reset(self, destination: str) -> None:
        pass

    @property
    def resent(self) -> int:
        return sum(n - 1 for n in self.arrivals.values())


def classify(exc: BaseException, destination: str) -> SendFailure:
    return SendFailure(True, ReasonCode.TRANSIENT, f"Refused while sending to '{destination}'")


def aggregate(outcomes: list[dict]) -> BatchAggregate:
    """``spark_ports.aggregate_outcomes`` on plain rows: islands of final outcomes cut at every unsent
    row, per run, batch and queue; grouped by destination, outcome and reason; then ``combine_groups``."""
    groups: dict[tuple, dict] = {}
    parts = defaultdict(list)
    for row in outcomes:
        parts[(row["run_id"], row["batch_id"], row["backlog_queue"])].append(row)
    for (run_id, batch_id, queue), rows in parts.items():
        island = 0
        for row in sorted(rows, key=lambda r: (r["sequence_number"], r["enqueued_ms"])):
            island += row["outcome"] == Outcome.UNSENT
            key = (run_id, batch_id, queue, island, row["destination"], row["outcome"], row["reason_code"])
            seq, enqueued = row["sequence_number"], row["enqueued_ms"]
            group = groups.setdefault(key, {
                "run_id": run_id, "batch_id": batch_id, "backlog_queue": queue, "island": island,
                "destination": row["destination"], "outcome": row["outcome"], "reason_code": row["reason_code"],
                "first": seq, "last": seq, "enqueued_from": enqueued, "enqueued_to": enqueued, "n": 0,
                "reason": row["reason"], "since": row["outcome_ms"]})
            group["first"], group["last"] = min(group["first"], seq), max(group["last"], seq)
            group["enqueued_from"] = min(group["enqueued_from"], enqueued)
            group["enqueued_to"] = max(group["enqueued_to"], enqueued)
            group["since"] = min(group["since"], row["outcome_ms"])
            group["n"] += 1
    return combine_groups(list(groups.values()))


def dead_letter_orders(outcomes: list[dict]) -> list[DeadLetterOrder]:
    return [DeadLetterOrder(o["backlog_queue"], o["sequence_number"], o["enqueued_ms"], o["reason_code"],
                            o["reason"] or "") for o in outcomes if o["outcome"] == Outcome.DEAD_LETTERED]


class Tables:
    """The audit and checkpoint tables, written together and idempotently: Delta skips a write whose
    transaction version is not above the last one of its app id."""

    def __init__(self):
        self.audit: list[dict] = []
        self.checkpoint: dict[str, CheckpointRow] = {}
        self.versions: list[int] = []  # versions written, in order
        self.skipped: list[int] = []

    def recover(self) -> Recovery:
        """What ``spark_ports.read_recovery`` reads: the checkpoint rows, the audit rows above each queue's
        purge mark aggregated, and their dead-letters."""
        if not self.versions:
            return Recovery(dict(self.checkpoint), (), ())

        def above_mark(row: dict) -> bool:
            mark = self.checkpoint.get(row["backlog_queue"])
            if mark is None:
                return True
            if mark.purged_enqueued_ms is not None:
                return row["enqueued_ms"] > mark.purged_enqueued_ms
            return row["sequence_number"] > mark.purged_through

        recorded = [row for row in self.audit if above_mark(row)]
        return Recovery(dict(self.checkpoint), aggregate(recorded).spans, tuple(dead_letter_orders(recorded)))

    def rows_of_batch(self, batch_id: int) -> int:
        """The rows earlier attempts of a batch recorded (``SparkBatch.recorded_rows_of_batch``)."""
        return sum(row["batch_id"] == batch_id for row in self.audit)

    def record(self, outcomes: list[dict], checkpoint: list[CheckpointRow] | None, version: int) -> None:
        if self.versions and version <= self.versions[-1]:
            self.skipped.append(version)
            return
        self.versions.append(version)
        self.audit.extend(outcomes)
        if checkpoint is not None:
            self.checkpoint = {row.backlog_queue: row for row in checkpoint}

    def final_outcomes(self) -> Counter:
        """How many final outcome rows each message has."""
        return Counter(f"{o['backlog_queue'][-1]}:{o['sequence_number']}" for o in self.audit
                       if o["outcome"] != Outcome.UNSENT)


class World:
    def __init__(self, *, send_seconds: float = 0.0, sink: SinkConfig = SINK):
        self.clock = Clock()
        self.backlog = Backlog(self.clock)
        self.destinations = Destinations(self.clock, send_seconds)
        self.tables = Tables()
        self.sink = sink


class Lease:
    """``LeasePort``: the n-th round may send for ``round_seconds[n]`` (the last one for every round after);
    ``lost_at``: the call that finds the lease lost."""

    def __init__(self, clock: Clock, *, round_seconds: float | list[float] = 3_600.0, lost_at: int | None = None):
        self.clock, self.lost_at = clock, lost_at
        self.round_seconds = round_seconds if isinstance(round_seconds, list) else [round_seconds]
        self.calls = 0

    def send_deadline(self) -> float:
        self.calls += 1
        if self.lost_at is not None and self.calls >= self.lost_at:
            raise LeaseLostError("the lease was taken over by run other on host (pid 1); this run stops sending")
        return self.clock() + self.round_seconds[min(self.calls, len(self.round_seconds)) - 1]

    def confirm_held(self) -> None:
        self.calls += 1
        if self.lost_at is not None and self.calls >= self.lost_at:
            raise LeaseLostError("the lease was taken over by run other on host (pid 1); this run stops sending")


class Purges:
    """``PurgePort``: each round settles at once (against the backlog) and is reported by ``finished``.
    ``failing``: how many more rounds fail for a queue (they come back with nothing settled)."""

    def __init__(self, backlog: Backlog, failing: dict[str, int] | None = None, hooks=None):
        self.backlog, self.hooks = backlog, hooks
        self.failing = Counter(failing or {})
        self.submitted: list[dict[str, PurgePlan]] = []
        self.results: dict[str, PurgeResult] = {}

    def busy(self) -> bool:
        return False

    def submit(self, plans: dict[str, PurgePlan]) -> None:
        if not plans:
            return
        self.submitted.append(plans)
        for queue, plan in plans.items():
            if self.failing[queue] > 0:
                self.failing[queue] -= 1
                result = PurgeResult(0, 0, 0, plan.spans, ())
            else:
                result = self.backlog.purge(plan, self.hooks)
            known = self.results.get(queue)
            self.results[queue] = result if known is None else PurgeResult(
                known.completed + result.completed, known.dead_lettered + result.dead_lettered,
                known.released + result.released, result.remaining, known.settled + result.settled)

    def finished(self) -> dict[str, PurgeResult]:
        results, self.results = self.results, {}
        return results

    def wait(self) -> dict[str, PurgeResult]:
        return self.finished()


class RacingPurges(Purges):
    """``PurgePort`` whose rounds run in the background: a round submitted is done by the time anyone
    asks whether one is ``busy`` (a thread that finished between the sink's two questions)."""

    def __init__(self, backlog: Backlog):
        super().__init__(backlog)
        self.in_flight: list[dict[str, PurgePlan]] = []

    def _complete(self) -> None:
        for plans in self.in_flight:
            super().submit(plans)
        self.in_flight = []

    def busy(self) -> bool:
        self._complete()
        return False

    def submit(self, plans: dict[str, PurgePlan]) -> None:
        if plans:
            self.in_flight.append(plans)

    def wait(self) -> dict[str, PurgeResult]:
        self._complete()
        return self.finished()


class CrashAt:
    """``Hooks`` that kill the process at one crash point."""

    def __init__(self, point: CrashPoint):
        self.point = point

    def reached(self, point: CrashPoint) -> None:
        if point == self.point:
            raise Crash(point)

    def task_sent(self) -> None:
        self.reached(CrashPoint.MID_SEND)

    def completions_sent(self, batch_ids: frozenset[int]) -> None:
        self.reached(CrashPoint.MID_SETTLE)


class FakeBatch:
    """``BatchPorts`` for one micro-batch's rows, as ``spark_ports.SparkBatch``: one task per backlog
    queue, a later round sends only what the last one left unsent, every row kept in its latest state."""

    def __init__(self, world: World, rows: list[dict], batch_id: int, run_id: str, hooks,
                 learns: dict[int, set[str]] | None = None):
        self.world, self.batch_id, self.run_id, self.hooks = world, batch_id, run_id, hooks
        self.pending = list(rows)
        self.latest: list[dict] | None = None
        self.rounds: list[RoundLimits] = []
        self.told: list[frozenset[str]] = []  # what each round was told takes single messages only
        # By round (1, 2, ...): the destinations its tasks learn take single messages only (a batch refused for
        # its shape), as the send tasks report it.
        self.learns = learns or {}
        self.excluded: list[int] = []

    def recover(self) -> Recovery:
        return self.world.tables.recover()

    def recorded_rows_of_batch(self) -> int:
        return self.world.tables.rows_of_batch(self.batch_id)

    def exclude(self, spans) -> None:
        kept = [row for row in self.pending if not any(
            span.backlog_queue == row["backlog_queue"] and span.holds(row["sequence_number"], row["enqueued_ms"])
            for span in spans)]
        self.excluded += [row["sequence_number"] for row in self.pending if row not in kept]
        self.pending = kept

    def send_round(self, limits: RoundLimits, single_message_destinations: frozenset[str]) -> BatchAggregate:
        self.rounds.append(limits)
        self.told.append(single_message_destinations)
        rows = self.pending
        if self.latest is not None:
            unsent = {(o["backlog_queue"], o["sequence_number"]) for o in self.latest if o["outcome"] == Outcome.UNSENT}
            rows = [row for row in rows if (row["backlog_queue"], row["sequence_number"]) in unsent]
        world, outcomes = self.world, []
        for queue in sorted({row["backlog_queue"] for row in rows}):  # one task per backlog queue
            for result in deliver_rows([row for row in rows if row["backlog_queue"] == queue], build=build,
                                       sender=world.destinations, classify=classify, sink=world.sink, limits=limits,
                                       clock=world.clock, sleep=world.clock.sleep,
                                       on_sent=self.hooks.task_sent):
                at = result.at if result.outcome == Outcome.UNSENT and result.at is not None else world.clock()
                outcomes.append({**result.row, "run_id": self.run_id, "batch_id": self.batch_id,
                                 "outcome": result.outcome,
                                 "reason_code": None if result.reason_code is None else str(result.reason_code),
                                 "reason": result.reason, "outcome_ms": int(at * 1000)})
        kept = [] if self.latest is None else [o for o in self.latest if o["outcome"] != Outcome.UNSENT]
        self.latest = kept + outcomes
        return dataclasses.replace(aggregate(self.latest),
                                   single_message_destinations=frozenset(self.learns.get(len(self.rounds), ())))

    def dead_letters(self) -> list[DeadLetterOrder]:
        return dead_letter_orders(self.latest or [])

    def record(self, checkpoint: list[CheckpointRow] | None, version: int) -> None:
        self.world.tables.record(list(self.latest or []), checkpoint, version)


def build(row: dict) -> Outgoing:
    return Outgoing(b"", row["message_id"], row["session_id"], None)


class Run:
    """One run of the syphon: the sink's state and its purges live as long as the run (a crash loses them)."""

    def __init__(self, world: World, run_id: str, *, hooks=None, lease: Lease | None = None,
                 failing_purges: dict[str, int] | None = None):
        self.world, self.run_id = world, run_id
        self.hooks = NoHooks() if hooks is None else hooks
        self.lease = Lease(world.clock) if lease is None else lease
        self.state = SinkState()
        self.purges = Purges(world.backlog, failing_purges, self.hooks)
        self.batches: list[FakeBatch] = []

    def begin(self) -> int:
        """``DeliverySink.begin``: the run's start, under its lease, reads the tables and starts purging what
        earlier runs recorded and did not settle, before any batch."""
        begin_run(self.state, self.world.tables.recover(), run_id=self.run_id, now=NOW)
        return settle_recorded(self.state, self.purges)

    def batch(self, rows: list[dict], batch_id: int, *, settle_now: bool = False, now: dt.datetime = NOW,
              checkpoint_every: float = 0.0, learns: dict[int, set[str]] | None = None):
        ports = FakeBatch(self.world, rows, batch_id, self.run_id, self.hooks, learns)
        self.batches.append(ports)
        return run_batch(self.state, ports, self.lease, self.purges, batch_id=batch_id, run_id=self.run_id, now=now,
                         settle_now=settle_now, hooks=self.hooks, checkpoint_every=checkpoint_every)

    def finish(self) -> None:
        """``DeliverySink.flush``: settle what is left, then write the final checkpoint rows."""
        finish(self.state, self.purges, NOW)
        rows = self.state.final_checkpoint(self.run_id)
        if rows is not None:
            self.world.tables.checkpoint = {row.backlog_queue: row for row in rows}
            self.hooks.reached(CrashPoint.AFTER_FINAL_CHECKPOINT)


def usual_backlog(world: World) -> list[Message]:
    """Q0: orders and payments interleaved, one message without a destination; Q1: orders, four sessions."""
    return (world.backlog.add(Q0, "orders", "payments", "orders", None, "payments", "orders")
            + world.backlog.add(Q1, "orders", "orders", "orders", "orders", sessions=["s1", "s2", "s3", "s4"]))


DELIVERABLE = ["0:1", "0:2", "0:3", "0:5", "0:6", "1:1", "1:2", "1:3", "1:4"]
ALL = sorted(DELIVERABLE + ["0:4"])


# --- crashes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("point, resent", [
    (CrashPoint.BEFORE_SEND, []),
    (CrashPoint.MID_SEND, ["0:1", "0:3", "0:6"]),  # the first send (Q0's orders) went before the kill
    (CrashPoint.AFTER_SEND, DELIVERABLE),  # sent, not recorded: the duplicate window
    (CrashPoint.AFTER_RECORD, []),
])
def test_a_run_killed_at_any_crash_point_delivers_everything_when_the_batch_is_replayed(point, resent):
    world = World()
    window = usual_backlog(world)
    rows = world.backlog.read(window)
    with pytest.raises(Crash):
        Run(world, "r1", hooks=CrashAt(point)).batch(rows, 7)
    assert world.backlog.left() == {Q0: [1, 2, 3, 4, 5, 6], Q1: [1, 2, 3, 4]}  # nothing settled before a record

    replay = Run(world, "r2")  # the sink's state died with the process
    report = replay.batch(world.backlog.read(window), 7)
    replay.finish()

    destinations = world.destinations
    assert sorted(destinations.arrivals) == DELIVERABLE  # every message delivered at least once
    assert sorted(m for m, n in destinations.arrivals.items() if n > 1) == sorted(resent)
    assert all(n <= 2 for n in destinations.arrivals.values())
    assert destinations.received["payments"] == ["0:2", "0:5"] * (2 if "0:2" in resent else 1)  # in order
    assert world.tables.final_outcomes() == Counter(ALL)  # one recorded outcome per message, never two
    assert world.backlog.left() == {}
    assert world.backlog.dead_lettered == [(Q0, 4, "missing_path")]
    assert report.replayed == (10 if point == CrashPoint.AFTER_RECORD else 0)
    checkpoint = world.tables.checkpoint
    assert [(r.backlog_queue, r.incarnation, r.delivered_through, r.delivered_count, r.dead_lettered_count,
             r.purged_through, r.purged_enqueued_ms) for r in checkpoint.values()] == [
        (Q0, 1, 6, 5, 1, 6, T0 + 60), (Q1, 1, 4, 4, 0, 4, T0 + 40)]


@pytest.mark.parametrize("point, replayed, resent", [
    (CrashPoint.BEFORE_SEND, True, []),
    (CrashPoint.MID_SEND, True, ["0:1", "0:3", "0:6"]),
    (CrashPoint.AFTER_SEND, True, DELIVERABLE),
    (CrashPoint.AFTER_RECORD, True, []),
    # the batch had returned (its purge runs beside the next): Spark committed it, nothing is read again
    (CrashPoint.MID_SETTLE, False, []),
    (CrashPoint.AFTER_FINAL_CHECKPOINT, False, []),
])
def test_the_run_after_a_kill_at_any_step_of_the_last_batch_and_its_purge_ends_drained(point, replayed, resent):
    """The run after the kill begins by purging what the killed one recorded (``begin_run``,
    ``settle_recorded``), whether or not Spark gives it a batch: the last batch of an available-now run
    that committed leaves nothing to read, and its recorded messages are settled all the same. A purge killed
    mid-settlement leaves its page's dead-lettering locked for a lock (the service keeps a lost link's
    locks): the next purge waits it out, within one lock."""
    world = World()
    window = usual_backlog(world)
    killed = Run(world, "r1", hooks=CrashAt(point))
    with pytest.raises(Crash):
        killed.batch(world.backlog.read(window), 7)
        killed.finish()
    if point == CrashPoint.MID_SETTLE:
        assert world.backlog.left() == {Q0: [4], Q1: [1, 2, 3, 4]}  # Q0's completions went, its dead-letter not
        assert list(world.backlog.locked_until) == [(Q0, 4)]

    rerun = Run(world, "r2")
    waiting = rerun.begin()
    assert waiting == {CrashPoint.AFTER_RECORD: 10, CrashPoint.MID_SETTLE: 10}.get(point, 0)  # what r1 recorded
    if replayed:
        report = rerun.batch(world.backlog.read(window), 7)
        assert report.replayed == (10 if point == CrashPoint.AFTER_RECORD else 0)
    rerun.finish()

    assert sorted(world.destinations.arrivals) == DELIVERABLE
    assert sorted(m for m, n in world.destinations.arrivals.items() if n > 1) == sorted(resent)
    assert world.tables.final_outcomes() == Counter(ALL)
    assert world.backlog.left() == {} and world.backlog.dead_lettered == [(Q0, 4, "missing_path")]
    assert world.backlog.lock_waits == ([LOCK_SECONDS] if point == CrashPoint.MID_SETTLE else [])
    if waiting:  # purged once, from the start: the replayed batch plans none of it again
        assert [list(plans) for plans in rerun.purges.submitted] == [[Q0, Q1]]
    checkpoint = world.tables.checkpoint
    assert [(r.backlog_queue, r.delivered_through, r.purged_through, r.ended_run_id) for r in checkpoint.values()] == [
        (Q0, 6, 6, "r2"), (Q1, 4, 4, "r2")]
    assert Run(world, "r3").begin() == 0  # nothing left for any later run to settle


def test_a_run_that_died_before_its_first_checkpoint_write_gets_its_rows_and_marks_from_the_next():
    """The checkpoint rows are written only when due (or at a clean end): a run killed in its first minute
    leaves audit rows and no checkpoint row. The next run makes the rows from what was recorded, so the
    purge marks it moves are recorded and no later run reads those rows back, or counts them as waiting."""
    world = World()
    window = usual_backlog(world)
    with pytest.raises(Crash):
        Run(world, "r1", hooks=CrashAt(CrashPoint.AFTER_RECORD)).batch(world.backlog.read(window), 0,
                                                                          checkpoint_every=60)
    assert world.tables.checkpoint == {}
    rerun = Run(world, "r2")
    assert rerun.begin() == 10
    rerun.finish()
    checkpoint = world.tables.checkpoint
    assert [(r.backlog_queue, r.delivered_through, r.delivered_count, r.dead_lettered_count, r.purged_through)
            for r in checkpoint.values()] == [(Q0, 6, 5, 1, 6), (Q1, 4, 4, 0, 4)]
    assert world.backlog.left() == {} and Run(world, "r3").begin() == 0


def test_a_replay_after_the_record_sends_nothing_and_writes_under_a_new_transaction_version():
    world = World()
    window = usual_backlog(world)
    with pytest.raises(Crash):
        Run(world, "r1", hooks=CrashAt(CrashPoint.AFTER_RECORD)).batch(world.backlog.read(window), 7)
    replay = Run(world, "r2")
    replay.batch(world.backlog.read(window), 7)
    assert sorted(replay.batches[0].excluded) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 6]  # every row of both queues
    assert world.tables.versions == [7 * ATTEMPTS_PER_BATCH, 7 * ATTEMPTS_PER_BATCH + 10]
    assert world.tables.skipped == []


def test_successive_batches_of_one_run_purge_what_the_one_before_recorded():
    world = World()
    run = Run(world, "r1")
    first = world.backlog.add(Q0, "orders", "orders")
    run.batch(world.backlog.read(first), 0)
    assert world.backlog.left() == {}  # settled by the purge the batch submitted
    second = world.backlog.add(Q0, "payments")
    report = run.batch(world.backlog.read(second), 1)
    assert report.aggregate.total(Outcome.DELIVERED) == 1
    assert [list(plans) for plans in run.purges.submitted] == [[Q0], [Q0]]
    assert world.tables.checkpoint[Q0].purged_through == 2  # the first batch's mark, recorded with the second
    run.finish()
    assert world.tables.checkpoint[Q0].purged_through == 3


def test_a_queue_the_administration_api_calls_partitioned_is_purged_as_one_even_with_partition_0s_numbers_only():
    """Its recorded numbers carry no partition bits (partition 0's), so only what the run's start read of the
    administration API tells the purge that its receives interleave partitions (``PurgePlan.interleaved``)."""
    world = World()
    run = Run(world, "r1")
    run.state = SinkState(partitioned_queues=frozenset({Q1.lower()}))
    messages = world.backlog.add(Q0, "orders") + world.backlog.add(Q1, "orders")
    run.batch(world.backlog.read(messages), 0)
    plans = run.purges.submitted[0]
    assert (plans[Q0].partitioned, plans[Q1].partitioned) == (False, True)
    assert (plans[Q0].interleaved, plans[Q1].interleaved) == (False, True)
    assert world.backlog.left() == {}


def test_the_checkpoint_rows_are_rewritten_only_when_due_and_a_crash_between_costs_a_longer_read_only():
    """One commit per batch (the audit append); the checkpoint rows every ``checkpoint_every`` seconds and
    at the run's clean end, naming it as ended. A run that dies between two rewrites leaves older marks:
    the next run reads more audit rows above them, verifies those messages by peeking, and sends nothing
    again."""
    world = World()
    run = Run(world, "r1")
    first = world.backlog.add(Q0, "orders", "orders")
    run.batch(world.backlog.read(first), 0, checkpoint_every=60)
    assert world.tables.checkpoint == {} and len(world.tables.versions) == 1  # the audit only
    second = world.backlog.add(Q0, "payments")
    run.batch(world.backlog.read(second), 1, now=NOW + dt.timedelta(seconds=61), checkpoint_every=60)
    assert world.tables.checkpoint[Q0].delivered_through == 3  # due: written with the audit append
    assert world.tables.checkpoint[Q0].purged_through == 2 and world.tables.checkpoint[Q0].ended_run_id is None
    third = world.backlog.add(Q0, "orders", "payments")
    run.batch(world.backlog.read(third), 2, now=NOW + dt.timedelta(seconds=70), checkpoint_every=60)
    assert world.tables.checkpoint[Q0].delivered_through == 3  # not due yet: the table lags ...
    assert world.backlog.left() == {}  # ... though everything is delivered, recorded and settled

    # The run dies here (no clean end). The next one finds the audit rows above the older marks.
    after = Run(world, "r2")
    later = world.backlog.add(Q0, "orders")
    after.batch(world.backlog.read(later), 3, now=NOW + dt.timedelta(seconds=80), checkpoint_every=60)
    after.finish()
    assert world.destinations.resent == 0 and sorted(world.destinations.arrivals) == ["0:1", "0:2", "0:3", "0:4",
                                                                                      "0:5", "0:6"]
    row = world.tables.checkpoint[Q0]
    assert (row.delivered_through, row.purged_through, row.ended_run_id) == (6, 6, "r2")
    assert world.backlog.left() == {}


def test_a_lock_lost_in_the_last_round_is_settled_by_the_runs_end_which_leaves_the_backlog_drained():
    """A bulk completion refused for one lost lock is split: the rest of the page is completed at once, in a
    few requests; the message whose lock was lost is available again and the run's end settles it."""
    world = World()
    run = Run(world, "r1")
    window = world.backlog.add(Q0, *["orders"] * 100)
    world.backlog.losing_locks = {(Q0, 37)}
    run.batch(world.backlog.read(window), 0)
    assert world.backlog.left() == {Q0: [37]}  # everything else completed in the same round ...
    assert world.backlog.settle_requests <= 2 * 7 + 1  # ... splitting the refused request, never one by one
    run.finish()
    assert world.backlog.left() == {} and world.destinations.resent == 0
    assert world.tables.checkpoint[Q0].purged_through == 100


# --- a purge round that fails ----------------------------------------------------------------------

def test_a_failed_purge_round_never_fails_the_batch_and_the_next_batch_settles_it():
    world = World()
    run = Run(world, "r1", failing_purges={Q1: 1})
    first = usual_backlog(world)
    report = run.batch(world.backlog.read(first), 0)
    assert report.aggregate.rows == 10
    assert world.backlog.left() == {Q1: [1, 2, 3, 4]}  # its round failed: still there

    second = world.backlog.add(Q1, "payments")
    run.batch(world.backlog.read(second), 1)
    assert world.backlog.left() == {}
    last_plan = run.purges.submitted[-1][Q1]
    assert (last_plan.verify, last_plan.expected) == (True, 5)  # counted again (peeked) before receiving
    assert world.destinations.resent == 0
    run.finish()
    assert world.tables.checkpoint[Q1].purged_through == 5


def test_a_purge_round_that_ends_just_before_the_next_plan_is_not_asked_for_again():
    # Batch 0's round is still running when batch 1 records (nothing finished yet), and has ended by the
    # time batch 1 plans its own: that plan must not ask again for batch 0's messages, already gone, or
    # the broker fills the credit with messages nobody recorded (locked, then given back).
    world = World()
    run = Run(world, "r1")
    run.purges = RacingPurges(world.backlog)
    first = world.backlog.add(Q0, "orders", "orders", "orders")
    run.batch(world.backlog.read(first), 0)
    second = world.backlog.add(Q0, "orders")
    world.backlog.add(Q0, "orders", "orders", "orders")  # arrived since: not read, not recorded
    run.batch(world.backlog.read(second), 1)
    run.finish()
    assert world.backlog.left() == {Q0: [5, 6, 7]}
    assert world.backlog.released == []  # nothing unrecorded was received
    assert world.backlog.overasked == []  # no plan asked for more recorded messages than were there


# --- a recreated queue -----------------------------------------------------------------------------

def test_a_recreated_queues_messages_are_delivered_and_settled_in_a_new_incarnation():
    world = World()
    run = Run(world, "r1", failing_purges={Q0: 1})
    old = world.backlog.add(Q0, "orders", "orders", "orders")
    run.batch(world.backlog.read(old), 0)
    assert world.backlog.left() == {Q0: [1, 2, 3]}  # recorded, not yet settled (the purge round failed)
    world.backlog.recreate(Q0, created_ms=T0 + 3_600_000)  # the old messages went with the old queue
    new = world.backlog.add(Q0, "payments", "payments")

    report = run.batch(world.backlog.read(new), 1)
    assert report.aggregate.total(Outcome.DELIVERED) == 2  # not taken for the recorded 1 and 2 of the old queue
    assert world.destinations.received == {"orders": ["0:1", "0:2", "0:3"], "payments": ["0:1", "0:2"]}
    assert world.backlog.left() == {}
    row = world.tables.checkpoint[Q0]
    assert (row.incarnation, row.delivered_through, row.delivered_enqueued_ms, row.delivered_count) == (
        2, 2, T0 + 3_600_020, 5)
    run.finish()
    row = world.tables.checkpoint[Q0]
    assert (row.purged_through, row.purged_enqueued_ms) == (2, T0 + 3_600_020)


# --- the lease ---------------------------------------------------------------------------------------

def test_a_lease_lost_after_sending_records_nothing_and_purges_nothing():
    world = World()
    window = usual_backlog(world)
    run = Run(world, "r1", lease=Lease(world.clock, lost_at=2))  # good for the send round, lost after it
    with pytest.raises(BatchFailedError) as failed:
        run.batch(world.backlog.read(window), 3)
    assert str(failed.value) == ("syphon batch failed: batch 3, step send: the lease was taken over by run other on "
                                 "host (pid 1); this run stops sending")
    assert isinstance(failed.value.cause, LeaseLostError) and failed.value.exit_code == 1
    assert sorted(world.destinations.arrivals) == DELIVERABLE  # sent before the lease was found lost
    assert (world.tables.audit, world.tables.checkpoint, world.tables.versions) == ([], {}, [])
    assert run.purges.submitted == []
    assert world.backlog.left() == {Q0: [1, 2, 3, 4, 5, 6], Q1: [1, 2, 3, 4]}


def test_a_lease_lost_before_the_first_round_sends_nothing():
    world = World()
    window = usual_backlog(world)
    run = Run(world, "r1", lease=Lease(world.clock, lost_at=1))
    with pytest.raises(BatchFailedError, match="batch 0, step send: the lease was taken over"):
        run.batch(world.backlog.read(window), 0)
    assert world.destinations.arrivals == Counter()
    assert world.tables.audit == [] and run.purges.submitted == []


# --- a destination unavailable ------------------------------------------------------------------------

def test_an_unavailable_destination_fails_the_batch_after_recording_the_rest_and_the_replay_sends_only_its_own():
    world = World()
    window = usual_backlog(world)
    world.destinations.down = {"payments"}
    first_run = Run(world, "r1")
    with pytest.raises(BatchFailedError) as failed:
        first_run.batch(world.backlog.read(window), 4)
    text = str(failed.value)
    assert text.startswith("syphon batch failed: batch 4, step ")
    assert text.endswith(": 2 message(s) could not be sent: destination 'payments' stayed unavailable for 60 s "
                         "(Refused while sending to 'payments'); nothing was lost: its messages stay in the backlog "
                         "for the next run. What was delivered is recorded; the next run sends the rest")
    assert isinstance(failed.value.cause, DestinationUnavailableError)
    assert world.destinations.received["orders"] == ["0:1", "0:3", "0:6", "1:1", "1:2", "1:3", "1:4"]
    assert sorted((o["sequence_number"], o["outcome"]) for o in world.tables.audit if o["backlog_queue"] == Q0) == [
        (1, "delivered"), (2, "unsent"), (3, "delivered"), (4, "dead_lettered"), (5, "unsent"), (6, "delivered")]
    first_run.finish()  # the run ends: what it recorded is settled, up to the first unsent message
    assert world.backlog.left() == {Q0: [2, 5, 6]}  # 6 waits behind 2: the purge never passes an unrecorded one

    world.destinations.down = set()
    replay = Run(world, "r2")
    replay.batch(world.backlog.read(window), 4)
    replay.finish()
    assert world.destinations.received["payments"] == ["0:2", "0:5"]  # only they were sent, in order
    assert world.destinations.resent == 0
    assert world.tables.final_outcomes() == Counter(ALL)
    assert world.backlog.left() == {}
    assert world.tables.checkpoint[Q0].delivered_count == 5


def test_a_batch_replayed_by_three_runs_while_its_destinations_come_back_records_every_attempt():
    world = World()
    window = world.backlog.add(Q0, "orders", "payments", "billing", "orders")
    world.destinations.down = {"payments", "billing"}
    for run_id, back in (("r1", None), ("r2", "payments"), ("r3", "billing")):
        world.destinations.down.discard(back)
        run = Run(world, run_id)
        try:
            run.batch(world.backlog.read(window), 4)
        except BatchFailedError:
            pass
        run.finish()
    assert world.tables.skipped == []  # no attempt's write was taken for a repeat of an earlier one
    assert world.tables.versions == sorted(set(world.tables.versions)) and len(world.tables.versions) == 3
    assert world.tables.final_outcomes() == Counter(["0:1", "0:2", "0:3", "0:4"])
    assert world.backlog.left() == {}
    assert world.destinations.resent == 0


# --- rounds ------------------------------------------------------------------------------------------

def test_a_round_deadline_leaves_the_rest_to_a_second_round_of_the_same_batch():
    world = World(send_seconds=1.0)
    window = usual_backlog(world)  # six sends: Q0's orders and payments, Q1's four sessions
    run = Run(world, "r1", lease=Lease(world.clock, round_seconds=3.0))
    report = run.batch(world.backlog.read(window), 0)
    assert report.rounds == 2
    first_round, second_round = run.batches[0].rounds
    assert second_round.deadline == first_round.deadline + 3.0
    assert second_round.unavailable_since == {}  # orders was only cut off by the deadline, never failing
    assert sorted(world.destinations.arrivals) == DELIVERABLE and world.destinations.resent == 0
    assert world.destinations.received["orders"] == ["0:1", "0:3", "0:6", "1:1", "1:2", "1:3", "1:4"]
    assert all(o["outcome"] != Outcome.UNSENT for o in world.tables.audit)  # the record holds the latest state
    assert world.tables.final_outcomes() == Counter(ALL)
    assert len(world.tables.versions) == 1
    assert world.backlog.left() == {}


def test_a_destination_that_was_only_cut_off_by_a_deadline_gets_its_full_outage_wait_in_the_next_round():
    # Q0 holds 80 sends (1 s each) to payments; the first round ends after 10 s, before Q1's task ran, so
    # Q1's messages to orders (which never refused anything) are left unsent at the deadline. In the next
    # round Q1's task starts after Q0's 70 remaining sends (tasks wait for a free slot); orders refuses
    # once, then takes everything: a single refusal is retried, not an outage of 60 s.
    world = World(send_seconds=1.0)
    window = (world.backlog.add(Q0, *["payments"] * 80, sessions=[f"s{i}" for i in range(80)])
              + world.backlog.add(Q1, "orders", "orders"))
    run = Run(world, "r1", lease=Lease(world.clock, round_seconds=[10.0, 1_000.0]))
    world.destinations.refusals["orders"] = 1
    report = run.batch(world.backlog.read(window), 0)
    assert report.rounds == 2
    assert world.destinations.received["orders"] == ["1:1", "1:2"]
    assert len(world.destinations.received["payments"]) == 80


def test_what_a_round_learned_reaches_the_later_rounds_through_its_result_and_the_runs_state():
    """A round's send tasks learn that a destination takes single messages only (a batch refused for its shape).
    The round's result says so (``BatchAggregate.single_message_destinations``), the run's state folds it in at
    once, and every later round is told: the batch's next round, the next batch's; a batch that fails after its
    round keeps it too. The ports are made anew per batch and hold nothing of the run's."""
    world = World(send_seconds=1.0)
    window = usual_backlog(world)
    run = Run(world, "r1", lease=Lease(world.clock, round_seconds=3.0))
    run.batch(world.backlog.read(window), 0, learns={1: {"orders"}})
    assert run.batches[0].told == [frozenset(), frozenset({"orders"})]
    assert run.state.single_message_destinations == {"orders"}

    run.batch(world.backlog.read(world.backlog.add(Q0, "payments")), 1, learns={1: {"payments"}})
    assert run.batches[1].told == [frozenset({"orders"})]
    assert run.state.single_message_destinations == {"orders", "payments"}

    run.lease = Lease(world.clock, lost_at=2)  # found lost once the round has sent
    with pytest.raises(BatchFailedError):
        run.batch(world.backlog.read(world.backlog.add(Q1, "events")), 2, learns={1: {"events"}})
    assert run.batches[2].told == [frozenset({"orders", "payments"})]
    assert run.state.single_message_destinations == {"orders", "payments", "events"}


# --- an empty batch ------------------------------------------------------------------------------------

def test_an_empty_batch_records_nothing_and_purges_nothing():
    world = World()
    run = Run(world, "r1")
    report = run.batch([], 0)
    assert (report.batch_id, report.aggregate, report.replayed, report.rounds) == (0, BatchAggregate(), 0, 1)
    assert (world.tables.audit, world.tables.checkpoint, world.tables.versions) == ([], {}, [])
    assert run.purges.submitted == []


def test_a_batch_whose_rows_were_all_recorded_by_an_earlier_run_and_settled_records_nothing():
    world = World()
    window = world.backlog.add(Q0, "orders", "orders")
    first = Run(world, "r1")
    first.batch(world.backlog.read(window), 0)
    first.finish()
    replay = Run(world, "r2")  # Spark replays the batch: its messages are gone, nothing is read
    report = replay.batch(world.backlog.read(window), 0)
    assert (report.aggregate.rows, report.replayed) == (0, 0)
    assert world.tables.versions == [0]
    assert world.destinations.resent == 0


# --- the fake world is Spark-free ------------------------------------------------------------------------

def test_these_tests_import_no_spark():
    """The state machine, its aggregate and the delivery rounds are walked without a JVM: importing this
    module (in a fresh interpreter, without the suite's fixtures) loads no pyspark."""
    root = Path(__file__).resolve().parents[2]
    check = ("import sys, tests.unit.test_micro_batch\n"
             "spark = sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.'))\n"
             "assert not spark, spark\n")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=root,
                            env={"PYTHONPATH": os.pathsep.join([str(root / "lib"), str(root)]), "PATH": ""})
    assert result.returncode == 0, result.stderr
