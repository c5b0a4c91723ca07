"""How a backlog stands, decided on plain values: the status command's report (``--status``), its text and
its verdict. Pure: no Spark, no Service Bus, no tables (``run.status`` reads them).

The verdict's exit codes are the run's family (``errors.EXIT_*``, ``run.run_end``): 0 drained, 3 a run
holds the lease, 4 messages wait in the backlog, and one of its own, 5: the backlog is drained but its
dead-letter sub-queues are not.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from backlog_syphon.errors import EXIT_DEAD_LETTERS, EXIT_LEASE_HELD, EXIT_NOT_DRAINED, EXIT_OK
from backlog_syphon.model import BacklogState, BrokerCount, CheckpointRow, Lease, RunMode, RunRow
from backlog_syphon.partitions import sequence_label
from backlog_syphon.restore.queue_names import owning_queue
from backlog_syphon.run.decommission_plan import QueueRemoval, QueueState, removal_line, removal_plan

STATUS_EXIT_CODES = {BacklogState.DRAINED: EXIT_OK, BacklogState.DECOMMISSIONED: EXIT_OK,
                     BacklogState.LEASE_HELD: EXIT_LEASE_HELD, BacklogState.WAITING: EXIT_NOT_DRAINED,
                     BacklogState.DEAD_LETTERS: EXIT_DEAD_LETTERS}


@dataclass(frozen=True)
class Verdict:
    state: BacklogState
    line: str

    @property
    def exit_code(self) -> int:
        return STATUS_EXIT_CODES[self.state]


@dataclass(frozen=True)
class QueueStatus:
    """One backlog queue or dead-letter sub-queue: what the broker holds, and the checkpoint table's row."""

    queue: str
    count: BrokerCount
    checkpoint: CheckpointRow | None = None


@dataclass(frozen=True)
class StatusReport:
    """What ``--status`` shows: the broker's counts now, the tables' marks, the lease and the last runs."""

    at: dt.datetime
    backlog: tuple[QueueStatus, ...]
    dead_letters: tuple[QueueStatus, ...]
    lease: Lease | None
    runs: tuple[RunRow, ...]  # newest first
    # Per destination, messages the audit shows held (and not since sent) for a destination that
    # restore.skip_destinations still names: waiting on purpose.
    held: Mapping[str, int]
    counted_by: str  # how the broker's counts were taken (see ``servicebus.counts``)
    runs_table: str
    # The run the checkpoint table names as ended (``CheckpointRow.ended_run_id``): a run gives its lease
    # back with that last commit, so a lease of that run is free although its row has not expired.
    ended_run_id: str | None = None
    # Per backlog queue, messages recorded with a final outcome above its purge mark: not known settled yet
    # (``sink.queue_marks.awaiting_settlement``); and the dead-letters an operator acknowledged as exported
    # (backlog.exported_dead_letters). Both decide whether the backlog is safe to remove.
    unsettled: Mapping[str, int] = field(default_factory=dict)
    exported: Mapping[str, int] = field(default_factory=dict)
    # A migration's sources (``backlog`` then holds its source entities): per entity, and no backlog queue to remove.
    migration: bool = False

    @property
    def removal(self) -> tuple[QueueRemoval, ...]:
        """Each backlog queue's verdict: drained and safe to remove, or what holds it (``run.decommission_plan``)."""
        dead = {owning_queue(q.queue).lower(): q.count for q in self.dead_letters}
        unsettled = {queue.lower(): count for queue, count in self.unsettled.items()}
        exported = {queue.lower(): count for queue, count in self.exported.items()}
        states = []
        for queue in self.backlog:
            key = queue.queue.lower()
            letters = dead.get(key)
            states.append(QueueState(queue.queue, queue.count.messages, queue.count.exact, queue.count.exists,
                                     unsettled.get(key, 0), letters.messages if letters else 0,
                                     letters.exact if letters else True, exported.get(key)))
        return removal_plan(states)

    @property
    def lease_holder(self) -> str | None:
        """Who holds the lease now, or None when it is free."""
        lease = self.lease
        return lease.holder if lease is not None and lease_live(lease, self.at, self.ended_run_id) else None

    @property
    def last_progress(self) -> dt.datetime | None:
        """When a batch last recorded outcomes of the backlog queues."""
        times = [q.checkpoint.updated_at for q in self.backlog if q.checkpoint is not None]
        return max(times, default=None)

    @property
    def verdict(self) -> Verdict:
        return status_verdict(self)

    def lines(self) -> list[str]:
        at = self.at
        what, entity = ("migration", "source") if self.migration else ("backlog", "backlog queue")
        out = [f"{what} status at {at:%Y-%m-%d %H:%M:%S} UTC (read only: nothing was taken, written or settled)",
               f"  {entity:<40} {'messages':>9} {'oldest':>8} {'incarnation':>11} {'delivered':>10} "
               f"{'purged':>10}  last batch"]
        for queue in self.backlog:
            mark = queue.checkpoint
            marks = (f" {mark.incarnation:>11} {sequence_label(mark.delivered_through):>10} {sequence_label(mark.purged_through):>10}  "
                     f"{mark.updated_at:%Y-%m-%d %H:%M:%S} ({ago(at, mark.updated_at)} ago)") if mark else \
                f" {'-':>11} {'-':>10} {'-':>10}  -"
            out.append(f"  {queue.queue:<40} {_count_text(queue.count):>9} {_age_text(at, queue.count):>8}{marks}")
        full = [queue for queue in self.dead_letters if queue.count.messages]
        if full:
            out.append(f"  {'dead-letter queue':<56} {'messages':>9} {'oldest':>8}  reasons")
            for queue in full:
                reasons = ", ".join(f"{reason} {n}" for reason, n in _by_count(queue.count.reasons))
                if not queue.count.reasons_complete:
                    reasons += f" (of the first {sum(queue.count.reasons.values())})"
                out.append(f"  {queue.queue:<56} {_count_text(queue.count):>9} {_age_text(at, queue.count):>8}  "
                           f"{reasons}")
        empty = len(self.dead_letters) - len(full)
        if empty:
            out.append(f"  ({empty} {'other ' if full else ''}dead-letter queue(s) empty)")
        out.append(f"  counted with {self.counted_by}")
        waiting, exact = _total(self.backlog)
        out.append(f"  still to deliver: {'' if exact else 'at most '}{waiting} message(s) in the "
                   f"{'sources' if self.migration else 'backlog queues'}")
        unsettled = sum(self.unsettled.values())
        out.append(f"  recorded, not yet settled: {unsettled} message(s)" + (
            " (" + ", ".join(f"{queue} {n}" for queue, n in sorted(self.unsettled.items()) if n)
            + "): the next run settles them" if unsettled else ""))
        out.append(f"  lease: {lease_text(self.lease, at, self.ended_run_id)}")
        if self.held:
            out.append(f"  held for restore.skip_destinations: {sum(self.held.values())} message(s) ("
                       + ", ".join(f"{destination} {n}" for destination, n in sorted(self.held.items())) + ")")
        out.append(f"  last runs ({self.runs_table}):" if self.runs else f"  no runs recorded yet in {self.runs_table}")
        for run in self.runs:
            moved = run.delivered + run.dead_lettered + run.skipped
            left = "-" if run.remaining_total is None else run.remaining_total
            job = f"  job run {run.job_run_id}" if run.job_run_id else ""
            out.append(f"    {run.run_id}  {run.source:<12} {run.trigger:<14} ended {run.ended_at:%Y-%m-%d %H:%M:%S}  "
                       f"exit {run.exit_code}  moved {moved}  left {left}{credits_text(run, moved)}{job}  "
                       f"{run.closing_line}")
        if not self.migration:  # a migration's source namespace is deleted as a whole once drained
            out.append(f"  removal: {removal_line(self.removal, self.lease_holder)}")
        out.append(f"verdict: {self.verdict.line}")
        return out

    def as_dict(self) -> dict:
        """The report as JSON-ready values (``--status --log-format json``)."""
        def queue_dict(queue: QueueStatus) -> dict:
            count, mark = queue.count, queue.checkpoint
            fields = {"queue": queue.queue, "messages": count.messages, "exact": count.exact,
                      "oldest_enqueued": count.oldest_enqueued, "exists": count.exists}
            if mark is not None:
                fields.update(incarnation=mark.incarnation, delivered_through=mark.delivered_through,
                              purged_through=mark.purged_through, last_batch_at=mark.updated_at)
            return fields

        verdict = self.verdict
        return {"at": self.at, "verdict": verdict.line, "state": verdict.state.value, "exit_code": verdict.exit_code,
                "backlog": [queue_dict(q) for q in self.backlog],
                "dead_letters": [{**queue_dict(q), "reasons": q.count.reasons,
                                  "reasons_complete": q.count.reasons_complete} for q in self.dead_letters],
                "lease": None if self.lease is None else {**dataclasses.asdict(self.lease),
                                                          "state": lease_text(self.lease, self.at,
                                                                                      self.ended_run_id)},
                "held": dict(self.held), "last_progress": self.last_progress, "counted_by": self.counted_by,
                "unsettled": dict(self.unsettled),
                "removal": {"line": removal_line(self.removal, self.lease_holder),
                            "queues": [{"queue": r.queue, "exists": r.exists, "removable": r.removable,
                                        "holds": {h.kind.value: h.count for h in r.holds}} for r in self.removal]},
                "runs": [dataclasses.asdict(run) for run in self.runs]}


def credits_text(run: RunRow, moved: int) -> str:
    """``  credits 1,496+480 (3.3+1.1 a message)``: what the run spent of the secondary's and the primary's
    credits, and per message it moved; '' for a run from before they were counted."""
    if run.secondary_credits is None or run.primary_credits is None:
        return ""
    per = f" ({run.secondary_credits / moved:.1f}+{run.primary_credits / moved:.1f} a message)" if moved else ""
    return f"  credits {run.secondary_credits:,}+{run.primary_credits:,}{per}"


def status_verdict(report: StatusReport) -> Verdict:
    """One line, most urgent first: a run holding the lease now, messages waiting that nobody delivers,
    dead-letters, else drained. Messages the audit shows held for a destination restore.skip_destinations
    still names wait on purpose: alone, they leave the backlog drained (as a run that held them exits 0)."""
    at = report.at
    waiting, waiting_exact = _total(report.backlog)
    held = sum(report.held.values())
    waiting_text = f"{'' if waiting_exact else 'at most '}{waiting}"
    if held:
        waiting_text += f" ({held} held for restore.skip_destinations)"
    dead, dead_exact = _total(report.dead_letters)
    dead_text = ""
    if dead:
        reasons: Counter = Counter()
        for queue in report.dead_letters:
            reasons.update(queue.count.reasons)
        complete = all(queue.count.reasons_complete for queue in report.dead_letters)
        listed = ", ".join(f"{reason} {n}" for reason, n in _by_count(reasons))
        dead_text = (f"dead-letters: {'' if dead_exact else 'at most '}{dead} ("
                     + (listed if complete else f"reasons of the first {sum(reasons.values())}: {listed}") + ")")
    progress = report.last_progress
    progress_text = "never" if progress is None else f"{ago(at, progress)} ago"
    lease = report.lease
    if lease is not None and lease_live(lease, at, report.ended_run_id):
        line = f"lease held by {lease.holder} since {lease.acquired_at:%Y-%m-%d %H:%M:%S} UTC"
        if waiting:
            line += f"; {waiting_text} waiting, last progress {progress_text}"
        return Verdict(BacklogState.LEASE_HELD, line + (f"; {dead_text}" if dead_text else ""))
    if waiting > held:
        line = f"{waiting_text} waiting, last progress {progress_text}"
        return Verdict(BacklogState.WAITING, line + (f"; {dead_text}" if dead_text else ""))
    held_text = f"; {waiting} message(s) held for restore.skip_destinations" if waiting else ""
    if dead_text:
        return Verdict(BacklogState.DEAD_LETTERS, dead_text + held_text)
    removal = removed_by_decommission(report.runs)
    if removal is not None and not any(queue.count.exists for queue in report.backlog):
        return Verdict(BacklogState.DECOMMISSIONED, f"decommissioned: no backlog queue is left ({len(removal.removed_queues)} "
                                                    f"removed by run {removal.run_id} at {removal.ended_at:%Y-%m-%d %H:%M:%S} UTC)")
    return Verdict(BacklogState.DRAINED, "drained" + held_text)


def removed_by_decommission(runs: Iterable[RunRow]) -> RunRow | None:
    """The newest run that removed backlog queues (``--decommission --confirm``), or None."""
    return next((run for run in runs if run.mode == RunMode.DECOMMISSION and run.removed_queues), None)


# How far a broker's enqueue times may run ahead of the clock that stamps outcome times (the driver's):
# an audit row's outcome date is at least its message's enqueue date less this.
CLOCK_SKEW_ALLOWANCE = dt.timedelta(days=1)


def audit_read_floor(checkpoint: Mapping[str, CheckpointRow], queues: Iterable[str]) -> dt.date | None:
    """The first outcome date ``--status`` reads of the audit table (its partition column), or None: all.

    It reads the rows above the purge marks (``storage.audit_table.recorded_unsettled``): messages enqueued at
    or after the message each mark names, so recorded (outcome time) no earlier than that message's
    enqueue day, less the clocks' skew. The floor is the oldest of the marks: every queue in ``queues``
    and in the checkpoint table must have one that names an enqueue time (an older version's marks do
    not: then everything is read). Rows of a queue the checkpoint table does not name are read from the
    floor on too. Pure, so the days read are known before Spark plans anything."""
    queues = set(queues) | set(checkpoint)
    marks = [checkpoint[queue].purged_enqueued_ms if queue in checkpoint else None for queue in sorted(queues)]
    if not marks or any(mark is None for mark in marks):
        return None
    oldest = dt.datetime.fromtimestamp(min(marks) / 1000, dt.timezone.utc)
    return (oldest - CLOCK_SKEW_ALLOWANCE).date()


def lease_live(lease: Lease, at: dt.datetime, ended_run_id: str | None = None) -> bool:
    """Whether a run holds ``lease`` at ``at``: not expired, and its run not named as ended (``run.fence``)."""
    return lease.expires_at > at and lease.run_id != ended_run_id


def lease_text(lease: Lease | None, at: dt.datetime, ended_run_id: str | None = None) -> str:
    if lease is None:
        return "never taken"
    if lease.run_id == ended_run_id:
        return f"free (given back by run {lease.run_id} with its last commit)"
    if lease_live(lease, at):
        return (f"held by {lease.holder} since {lease.acquired_at:%Y-%m-%d %H:%M:%S} UTC, until "
                f"{lease.expires_at:%Y-%m-%d %H:%M:%S} UTC (extended while it runs)")
    if lease.expires_at == lease.renewed_at:  # a release expires it at once (run.lease.released)
        return f"free (released by run {lease.run_id} at {lease.expires_at:%Y-%m-%d %H:%M:%S} UTC)"
    return (f"free (run {lease.run_id}'s lease expired at {lease.expires_at:%Y-%m-%d %H:%M:%S} UTC without being "
            f"released: that run crashed or was killed)")


def ago(at: dt.datetime, then: dt.datetime) -> str:
    """``at - then`` for people: 42 s, 5 min, 3 h, 2 d."""
    seconds = max(0.0, (at - then).total_seconds())
    for unit, size, below in (("s", 1, 90), ("min", 60, 90 * 60), ("h", 3600, 48 * 3600)):
        if seconds < below:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / 86400:.0f} d"


def _total(queues: Iterable[QueueStatus]) -> tuple[int, bool]:
    queues = list(queues)
    return sum(q.count.messages for q in queues), all(q.count.exact for q in queues)


def _count_text(count: BrokerCount) -> str:
    if not count.exists:
        return "missing"
    return str(count.messages) if count.exact else f"<={count.messages}"


def _age_text(at: dt.datetime, count: BrokerCount) -> str:
    return "-" if count.oldest_enqueued is None else ago(at, count.oldest_enqueued)


def _by_count(reasons: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
