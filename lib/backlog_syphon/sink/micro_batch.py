"""One micro-batch as a state machine: recover -> exclude -> (fence -> send)* -> fence -> record -> purge.

Pure: every step's I/O is a port (``BatchPorts`` for the batch's rows and the tables, ``LeasePort`` for
the fence, ``PurgePort`` for the background purge), so every transition, crash point and failure
is tested with fakes in milliseconds (``tests/unit/test_micro_batch.py``); ``sink.spark_ports`` has the
real ports (Spark, Delta, Service Bus).

Transitions and what a crash at each leaves behind (the invariants the tests walk):
- ``begin_run`` (a run's start, once it holds the lease, before or beside its first batch): the tables say
  what is recorded and not yet settled; nothing else is trusted from memory. ``settle_recorded`` starts
  purging it at once, in the background, so a run that finds nothing new to read settles it too (an
  available-now run with no batch would otherwise leave it, run after run). Where the sink is not in the
  starting process for the whole run (Spark Connect's server), the first batch's ``recover`` reads it.
- ``exclude``: rows that a recorded, unsettled span holds are dropped, by identity: a replayed batch
  sends only what its earlier attempt did not record.
- ``fence`` then ``send``, in rounds: each round gets a deadline before the lease could expire, so
  the lease is extended between rounds (when Spark has slots free) and no task sends under a lease
  that may have passed to another run. Crash points ``before_send``, ``mid_send`` (executors),
  ``after_send``: a crash there re-sends, on replay, what was sent and not recorded (the duplicate
  window; MessageIds are kept).
- ``fence`` again: a batch whose lease was lost neither records nor purges.
- ``record``: the audit append, idempotent per attempt: the batch's one commit. The checkpoint rows
  (each queue's marks, a shortcut over the audit) are rewritten with it only when
  ``checkpoint_every`` has passed since they last were (``checkpoint_due``), and always at the run's
  clean end (``final_checkpoint``). A crash in between costs the next run a longer read of the
  audit (the rows above older marks, whose messages it verifies by peeking): nothing is re-sent or
  lost. Also a batch that failed to deliver some messages (a destination unavailable past the wait)
  records what it delivered first, so its replay re-sends nothing that was delivered; then it fails.
  Crash point ``after_record``: nothing is re-sent.
- ``purge``: submitted in the background (settled within the batch over Spark Connect). A failed
  purge round is logged and retried later; it never fails a batch. Crash point ``mid_settle`` (the purge's
  threads): a page's completions went out, its dead-letterings not; the messages the killed process held
  stay locked until their locks end (the service keeps a lost link's locks), and the next run's purge
  waits them out (``purge.lock_wait``).
- ``finish`` (the run's end): the last purge rounds, then the checkpoint rows with the final purge marks,
  which free the lease (``run.syphon.SyphonRun.finish``). Crash point ``after_final_checkpoint``: nothing
  is left to do; the next run finds the lease free and the marks moved.

Messages left where they are on purpose (``Outcome.stays``: HELD for ``restore.skip_destinations``,
NOT_SELECTED in a re-drive) are recorded like unsent ones (their audit rows cut the spans) but neither
fail the batch nor go to another round. The purge passes over them instead of stopping there: where
held ones lie goes to it (``BatchAggregate.held``); in a dead-letter sub-queue any message no span
holds may be one that stays (``PurgePlan.passing``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, Sequence

from backlog_syphon.errors import BatchFailedError, DestinationUnavailableError
from backlog_syphon.model import (
    CheckpointRow,
    DeadLetterOrder,
    HeldSpan,
    Outcome,
    ReasonCode,
    RecordedSpan,
    SettleOrder,
)
from backlog_syphon.purge.plan import PurgePlan, PurgeResult
from backlog_syphon.sink import queue_marks
from backlog_syphon.sink.delivery import RoundLimits

logger = logging.getLogger(__name__)

# Delta transaction versions: one range per batch, one version per attempt within it (an attempt's
# version is the number of rows earlier attempts of the batch recorded), so a replay that records
# what an earlier attempt left unsent is not skipped as a repeat.
ATTEMPTS_PER_BATCH = 1 << 32
MAX_ROUNDS = 1000  # a bound, never reached in practice: each round ends at most a lease's fraction later


class Step(StrEnum):
    RECOVER = "recover"
    SEND = "send"
    RECORD = "record"
    PURGE = "purge"


class CrashPoint(StrEnum):
    """Where a test may stop the run (``Hooks.reached``); ``mid_send`` is reached on the executors,
    ``mid_settle`` on the purge's threads, ``after_final_checkpoint`` at the run's end."""

    BEFORE_SEND = "before_send"
    MID_SEND = "mid_send"
    AFTER_SEND = "after_send"
    AFTER_RECORD = "after_record"
    MID_SETTLE = "mid_settle"
    AFTER_FINAL_CHECKPOINT = "after_final_checkpoint"


@dataclass(frozen=True)
class Recovery:
    """What the tables say at a run's start."""

    checkpoint: dict[str, CheckpointRow]
    unsettled: tuple[RecordedSpan, ...]  # recorded, maybe not settled (verified before purging)
    dead_letters: tuple[DeadLetterOrder, ...]
    # The migration mode's: recorded scheduled and deferred messages, and per session-settled source its recorded
    # messages per session.
    settle_orders: tuple[SettleOrder, ...] = ()
    sessions: dict[str, dict[str, int]] = field(default_factory=dict)


NOTHING_RECORDED = Recovery({}, (), ())  # state a run created: no checkpoint rows, nothing unsettled


@dataclass(frozen=True)
class Unsent:
    """Messages of one destination a round left unsent."""

    count: int
    reason_code: ReasonCode
    reason: str
    since: float  # when the destination started failing (epoch seconds)


@dataclass(frozen=True)
class BatchAggregate:
    """Every row of the batch in its latest state, aggregated: what the driver works from."""

    spans: tuple[RecordedSpan, ...] = ()
    per_destination: dict[tuple[str, Outcome], int] = field(default_factory=dict)  # (destination, outcome) -> n
    unsent: dict[str, Unsent] = field(default_factory=dict)
    # Messages held for skipped destinations: not sent, not settled, and no reason to fail or to send again.
    held: tuple[HeldSpan, ...] = ()
    first_outcome_ms: int | None = None  # when the batch's first final outcome was reached (its first send)
    # The migration mode's: per source settled session by session, its recorded messages per session; and how
    # many recorded messages a receive does not bring (scheduled, deferred: ``BatchPorts.settle_orders``).
    sessions: dict[str, dict[str, int]] = field(default_factory=dict)
    special: int = 0
    # Final outcomes whose message stays where it is: dead-lettered (or expired) where that cannot be carried out
    # (in a dead-letter sub-queue; a scheduled message), so what is left in the source is not all unfinished work.
    left_in_place: int = 0
    # Destinations the round's send tasks learned take single messages only (a batch refused for its shape,
    # ``sink.send_shape``): the run's later rounds start knowing (``SinkState.single_message_destinations``).
    single_message_destinations: frozenset[str] = frozenset()

    @property
    def rows(self) -> int:
        return sum(self.per_destination.values())

    def total(self, outcome: Outcome) -> int:
        return sum(n for (_, o), n in self.per_destination.items() if o == outcome)

    @property
    def final_unavailable(self) -> dict[str, Unsent]:
        return {d: u for d, u in self.unsent.items() if u.reason_code != ReasonCode.ROUND_DEADLINE}


class BatchPorts(Protocol):
    def recover(self) -> Recovery:
        """Read the tables: the checkpoint rows and what is recorded but maybe not settled."""

    def recorded_rows_of_batch(self) -> int:
        """Rows (final or unsent) earlier attempts of this batch recorded."""

    def exclude(self, spans: Sequence[RecordedSpan]) -> None:
        """Drop the batch's rows that these spans hold (already recorded)."""

    def send_round(self, limits: RoundLimits, single_message_destinations: frozenset[str]) -> BatchAggregate:
        """Send what is pending (everything, then what the last round left unsent), to
        ``single_message_destinations`` one message at a time; aggregate every row, with what the round learned."""

    def dead_letters(self) -> list[DeadLetterOrder]:
        """The batch's recorded dead-letter outcomes (asked for only when there are some)."""

    def settle_orders(self) -> list[SettleOrder]:
        """The batch's recorded messages a receive does not bring (asked for only when there are some)."""

    def record(self, checkpoint: list[CheckpointRow] | None, version: int) -> None:
        """Append the final outcomes to the audit, idempotently on ``version``, and rewrite the checkpoint
        table with ``checkpoint`` unless it is None."""


class LeasePort(Protocol):
    def send_deadline(self) -> float:
        """Extend the lease if due; raise ``LeaseLostError`` if it is not this run's; return until when
        (epoch seconds) a task may send under it."""

    def confirm_held(self) -> None:
        """Raise ``LeaseLostError`` unless the lease is still this run's (extended if it ran out): recording
        needs no margin, only that no other run holds the backlog."""


class PurgePort(Protocol):
    def busy(self) -> bool: ...

    def submit(self, plans: dict[str, PurgePlan]) -> None: ...

    def finished(self) -> dict[str, PurgeResult]:
        """Results of the rounds done so far (a failed queue comes back with nothing settled); never raises."""

    def wait(self) -> dict[str, PurgeResult]: ...


class Hooks(Protocol):
    """Where a test harness stops or breaks a run, one call per crash point (``CrashPoint``); every real run has
    ``NO_HOOKS``. They go with the sink (a Spark Connect server gets a pickled copy) and, in the send tasks'
    closure, to the executors: picklable, from a module the Python workers import."""

    def reached(self, point: CrashPoint) -> None:
        """The driver reached ``point`` (``BEFORE_SEND``, ``AFTER_SEND``, ``AFTER_RECORD``,
        ``AFTER_FINAL_CHECKPOINT``)."""

    def task_sent(self) -> None:
        """``MID_SEND``, on an executor: a send task's first send went out. A harness pauses the task there,
        or ends its first attempt as a lost executor would."""

    def completions_sent(self, batch_ids: frozenset[int]) -> None:
        """``MID_SETTLE``, on a purge thread: a purge round that settles messages of ``batch_ids`` sent a page's
        completions, not yet its dead-letterings."""


class NoHooks:
    """``Hooks`` of every real run: each returns at once."""

    def reached(self, point: CrashPoint) -> None:
        pass

    def task_sent(self) -> None:
        pass

    def completions_sent(self, batch_ids: frozenset[int]) -> None:
        pass


NO_HOOKS = NoHooks()


@dataclass
class SinkState:
    """What the sink keeps between batches of a run (the tables' content, once read)."""

    checkpoint: dict[str, CheckpointRow] | None = None
    unpurged: dict[str, queue_marks.Unpurged] = field(default_factory=dict)
    checkpoint_unrecorded: bool = False  # the checkpoint rows moved on since the table was last written
    checkpoint_written_at: dt.datetime | None = None  # when this run last wrote (or first read) the table
    # The backlog queues the administration API called partitioned at the run's start (lower-case names): their
    # purges expect interleaved receives even where every recorded number is partition 0's.
    partitioned_queues: frozenset[str] = frozenset()
    # Their lock durations in seconds, where it said (lower-case names): what a purge waits out at most for
    # recorded messages an earlier receiver left locked.
    lock_seconds: dict[str, float] = field(default_factory=dict)
    # What the run's start recovered as recorded and maybe unsettled, until its first batch has counted the
    # replayed rows among it (None: the run has not begun, or its first batch has run).
    recovered: tuple[RecordedSpan, ...] | None = None

    # The migration mode's sources settled session by session (lower-case names).
    session_entities: frozenset[str] = frozenset()
    # Destinations the run's send rounds learned take single messages only (``BatchAggregate``'s, folded in after
    # each round): every later round's tasks start knowing.
    single_message_destinations: frozenset[str] = frozenset()

    def purge_plans(self) -> dict[str, PurgePlan]:
        return queue_marks.purge_plans(self.unpurged, self.partitioned_queues, self.lock_seconds,
                                       self.session_entities)

    def apply_purges(self, results: dict[str, PurgeResult], now: dt.datetime) -> None:
        if not results or self.checkpoint is None:
            return
        self.unpurged = queue_marks.after_purge(self.unpurged, results)
        marked = queue_marks.mark_purged(self.checkpoint, results, self.unpurged, now=now)
        self.checkpoint_unrecorded = self.checkpoint_unrecorded or marked != self.checkpoint
        self.checkpoint = marked

    def checkpoint_due(self, now: dt.datetime, every_seconds: float) -> bool:
        """Whether the record step rewrites the checkpoint table too: ``every_seconds`` after it last did."""
        return self.checkpoint_written_at is None or (now - self.checkpoint_written_at).total_seconds() >= every_seconds

    def final_checkpoint(self, run_id: str) -> list[CheckpointRow] | None:
        """The rows a run's clean end writes (None: it has none): every queue's marks, each row naming the
        run as ended (``CheckpointRow.ended_run_id``), so that this one commit also frees its lease."""
        if not self.checkpoint:
            return None
        return [dataclasses.replace(row, ended_run_id=run_id)
                for row in sorted(self.checkpoint.values(), key=lambda row: row.backlog_queue)]


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    aggregate: BatchAggregate
    replayed: int  # outcomes an earlier attempt of this batch recorded
    rounds: int


def begin_run(state: SinkState, recovery: Recovery, *, run_id: str, now: dt.datetime) -> None:
    """A run's start, under its lease: the tables' content becomes the run's state. What earlier runs
    recorded and may not have settled is to be verified (peeked) before it is purged: a run that died may
    have settled some of it without recording that.

    A queue whose recorded messages have no checkpoint row (a run that died before it first wrote the
    table) gets one from them now, so that its purge marks can be recorded: otherwise every later run would
    read those audit rows again, and count them as waiting to be settled, for ever."""
    rowless = [span for span in recovery.unsettled if span.backlog_queue not in recovery.checkpoint]
    state.checkpoint = dict(recovery.checkpoint)
    if rowless:
        state.checkpoint = queue_marks.advance_checkpoint(state.checkpoint, rowless, run_id=run_id, now=now,
                                                          batch_id=max(span.batch_id for span in rowless))
    state.checkpoint_unrecorded = bool(rowless)
    state.checkpoint_written_at = now  # as read: the table says what the rows say
    # Held rows of earlier runs are not carried into this one: the run reads those messages again (and holds
    # them again, or sends them), and a mark held back by old rows would never move.
    state.unpurged = queue_marks.add_recorded({}, recovery.unsettled, recovery.dead_letters, verify=True,
                                              orders=recovery.settle_orders, sessions=recovery.sessions)
    state.recovered = recovery.unsettled


def settle_recorded(state: SinkState, purges: PurgePort) -> int:
    """Start purging what earlier runs recorded and did not settle, before or beside the run's first batch,
    so that a run with nothing new to read settles it too; return how many messages that is at most (0:
    nothing, no round started)."""
    plans = state.purge_plans()
    purges.submit(plans)
    return sum(plan.expected + len(plan.special) for plan in plans.values())


def run_batch(state: SinkState, ports: BatchPorts, lease: LeasePort, purges: PurgePort, *, batch_id: int,
              run_id: str, now: dt.datetime, settle_now: bool = False, hooks: Hooks = NO_HOOKS,
              checkpoint_every: float = 0.0) -> BatchReport:
    """Run one micro-batch; raise ``BatchFailedError`` naming the step and the cause. ``checkpoint_every``:
    seconds between rewrites of the checkpoint table (0: every batch records it)."""
    step = Step.RECOVER
    try:
        recorded_before = 0
        replayed = 0
        if state.checkpoint is None:  # the run did not begin at its start (the sink of a Spark Connect server)
            begin_run(state, ports.recover(), run_id=run_id, now=now)
        if state.recovered is not None:  # the run's first batch: maybe a replay of one an earlier run recorded
            recorded_before = ports.recorded_rows_of_batch()
            replayed = sum(span.count for span in state.recovered if span.batch_id == batch_id)
            state.recovered = None
        ports.exclude([span for pending in state.unpurged.values() for span in pending.spans])

        step = Step.SEND
        aggregate, rounds = BatchAggregate(), 0
        unavailable_since: dict[str, float] = {}
        while rounds < MAX_ROUNDS:
            hooks.reached(CrashPoint.BEFORE_SEND)  # a test's pause here must not eat into the round's deadline
            deadline = lease.send_deadline()
            aggregate = ports.send_round(RoundLimits(deadline, unavailable_since), state.single_message_destinations)
            state.single_message_destinations |= aggregate.single_message_destinations
            rounds += 1
            if not aggregate.unsent or aggregate.final_unavailable:
                break
            # Only destinations that were failing before the deadline carry their outage on; one merely
            # cut off by the deadline (its unsent rows are stamped at or after it) starts afresh.
            unavailable_since = {d: u.since for d, u in aggregate.unsent.items() if u.since < deadline}
            logger.info("batch_id=%s round %d ended at the lease's deadline with %d message(s) unsent; next round",
                        batch_id, rounds, sum(u.count for u in aggregate.unsent.values()))
        if not aggregate.rows and not replayed:
            return BatchReport(batch_id, aggregate, 0, rounds)  # an empty batch: nothing to record
        hooks.reached(CrashPoint.AFTER_SEND)
        lease.confirm_held()  # a batch that lost its lease neither records nor purges

        step = Step.RECORD
        dead_letters = ports.dead_letters() if aggregate.total(Outcome.DEAD_LETTERED) else []
        orders = ports.settle_orders() if aggregate.special else []
        state.apply_purges(purges.finished(), now)
        state.checkpoint = queue_marks.advance_checkpoint(state.checkpoint, aggregate.spans, batch_id=batch_id,
                                                          run_id=run_id, now=now)
        rewrite = state.checkpoint_due(now, checkpoint_every)
        ports.record(sorted(state.checkpoint.values(), key=lambda row: row.backlog_queue) if rewrite else None,
                     batch_id * ATTEMPTS_PER_BATCH + min(recorded_before, ATTEMPTS_PER_BATCH - 1))
        state.checkpoint_unrecorded = not rewrite
        if rewrite:
            state.checkpoint_written_at = now
        state.unpurged = queue_marks.add_recorded(state.unpurged, aggregate.spans, dead_letters, held=aggregate.held,
                                                  orders=orders, sessions=aggregate.sessions)
        hooks.reached(CrashPoint.AFTER_RECORD)
        unavailable = aggregate.final_unavailable
        if unavailable:
            step = Step.SEND  # what failed is the send; the record of what was delivered is done
            raise DestinationUnavailableError(
                f"{sum(u.count for u in unavailable.values())} message(s) could not be sent: "
                + "; ".join(u.reason for u in unavailable.values())
                + ". What was delivered is recorded; the next run sends the rest")

        step = Step.PURGE
        if not purges.busy():
            # A round that ended since the record step is applied first, so its spans are not planned twice.
            state.apply_purges(purges.finished(), now)
            purges.submit(state.purge_plans())
        if settle_now:
            state.apply_purges(purges.wait(), now)
        return BatchReport(batch_id, aggregate, replayed, rounds)
    except BatchFailedError:
        raise
    except Exception as exc:
        logger.error("batch_id=%s failed in step %s", batch_id, step, exc_info=True)
        raise BatchFailedError(batch_id, step, exc) from exc


FINAL_PURGE_ROUNDS = 3  # at a run's end, while each round still settles something


def finish(state: SinkState, purges: PurgePort, now: dt.datetime) -> None:
    """At the end of a run: wait for the purge in flight, then settle what is still left, in a few more
    rounds as long as each settles something: a message whose lock was lost in a round is available
    again at once, and a run whose messages all arrived should not end with them in the backlog. A round
    the secondary throttled is no answer and counts for none of them: the next goes on (each waits out
    the namespace's pause first, and past ``sink.outage_wait_seconds`` of busy answers the purge gives up)."""
    state.apply_purges(purges.wait(), now)
    rounds = 0
    while rounds < FINAL_PURGE_ROUNDS:
        plans = state.purge_plans()
        if not plans:
            return
        purges.submit(plans)
        results = purges.wait()
        state.apply_purges(results, now)
        if any(result.throttled for result in results.values()):
            continue
        rounds += 1
        if not any(result.completed or result.dead_lettered or result.settled for result in results.values()):
            return  # nothing moved: what is left waits for the next run
