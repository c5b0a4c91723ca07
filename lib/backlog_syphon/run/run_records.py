"""What a run did: counted by the sink in this process (``SinkRecords``), or read from the audit table
where the sink runs elsewhere (``AuditRecords``, Spark Connect, and what a failed run recorded), and the
summary printed at its end (``RunSummary``). Both the wiring (``run.syphon``) and the runs table's row
(``run.runs``) read them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark.sql import SparkSession

from backlog_syphon.model import STAYING_OUTCOMES, CreditUsage, EarlierBatches, Outcome
from backlog_syphon.restore.queue_names import is_dead_letter_queue_name
from backlog_syphon.run import reports
from backlog_syphon.run.progress import BatchStats, ProgressPoint
from backlog_syphon.sink.foreach_batch import DeliverySink
from backlog_syphon.storage import delta
from backlog_syphon.timeline import Timeline

# The run summary's columns per destination: the reported outcomes (``model.REPORTED_OUTCOMES``) and their headings.
SUMMARY_COLUMNS = ((Outcome.DELIVERED, "delivered"), (Outcome.DEAD_LETTERED, "dead-lettered"),
                   (Outcome.SKIPPED_PING, "skipped"), (Outcome.EXPIRED, "expired"), (Outcome.COVERED, "covered"),
                   (Outcome.HELD, "held"), (Outcome.NOT_SELECTED, "not selected"))


def _width(heading: str) -> int:
    return max(8, len(heading) + 1)


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    per_destination: dict[str, dict[str, int]]  # destination -> outcome (an Outcome's value) -> count
    remaining: dict[str, int]  # backlog queue -> messages still there
    progress: tuple[ProgressPoint, ...] = ()  # one point per recent micro-batch, as the listener saw it
    earlier: EarlierBatches = EarlierBatches()  # the older batches a long run's listener let go of, folded
    timeline: Timeline | None = None  # when the run reached each step (printed with --verbose)
    # A re-drive: ``remaining`` counts the dead-letter sub-queues, where what it left stays by design.
    redrive: bool = False
    stopped: bool = False  # it stopped on request (a signal, a timeout) at a batch boundary
    # A migration run: ``remaining`` counts its sources, where dead-lettered (or expired) messages a source cannot
    # dead-letter stay by design (``left_in_place`` of them, as this run recorded).
    migration: bool = False
    left_in_place: int = 0
    credits: CreditUsage | None = None  # what the run spent of each namespace's credits

    @property
    def held(self) -> dict[str, int]:
        """Per destination, the messages this run left in the backlog because ``restore.skip_destinations``
        names it (``Outcome.HELD``)."""
        return self._counts(Outcome.HELD)

    @property
    def stayed(self) -> dict[str, int]:
        """Per destination, the messages this run left where they are on purpose (``Outcome.stays``: held,
        or not selected by a re-drive)."""
        return {destination: sum(counts.get(outcome, 0) for outcome in STAYING_OUTCOMES)
                for destination, counts in self.per_destination.items()
                if any(counts.get(outcome, 0) for outcome in STAYING_OUTCOMES)}

    def _counts(self, outcome: Outcome) -> dict[str, int]:
        return {destination: counts.get(outcome, 0) for destination, counts in self.per_destination.items()
                if counts.get(outcome, 0)}

    @property
    def drained(self) -> bool:
        """Nothing is left but what this run left on purpose: a skip is what the operator asked for, so a
        scheduled run that honours it has drained (exit code 0), not fallen short. A re-drive leaves by
        design what it did not select or still cannot deliver (dead-lettered again, where it was), which
        ``remaining`` counts too: it has drained once it ends (the audit says what it left). So does a migration's
        dead-letter sub-queue source: what it holds at the end is what was dead-lettered (by this run too, into a
        sub-queue it had read) or left there with its outcome; its other sources count as the backlog queues do."""
        if self.redrive:
            return True
        waiting = sum(n for source, n in self.remaining.items()
                      if not (self.migration and is_dead_letter_queue_name(source)))
        return waiting <= sum(self.stayed.values()) + self.left_in_place

    def lines(self) -> list[str]:
        out = [f"run {self.run_id}"]
        # NOT_SELECTED only happens in a re-drive, HELD only under restore.skip_destinations: a run
        # without them keeps the summary it always had.
        held = self.held
        shown_when_any = {outcome for outcome in (Outcome.EXPIRED, Outcome.COVERED) if self._counts(outcome)}
        columns = [(outcome, heading) for outcome, heading in SUMMARY_COLUMNS
                   if (outcome != Outcome.NOT_SELECTED or self.redrive) and (outcome != Outcome.HELD or held)
                   and (outcome not in (Outcome.EXPIRED, Outcome.COVERED) or outcome in shown_when_any)]
        out.append(f"  {'destination':<32}" + "".join(f" {heading:>{_width(heading)}}" for _, heading in columns))
        for destination, counts in self.per_destination.items():
            out.append(f"  {destination:<32}" + "".join(f" {counts.get(outcome, 0):>{_width(heading)}}"
                                                        for outcome, heading in columns))
        if not self.per_destination:
            out.append("  (nothing moved)")
        heading = "dead-letter queue" if self.redrive else "source" if self.migration else "backlog queue"
        out.append(f"  {heading:<40} {'remaining':>10}")
        for queue, count in self.remaining.items():
            out.append(f"  {queue:<40} {count:>10}")
        if held and self.migration:
            out.append(f"  left in the sources for now: {sum(held.values())} message(s) (scheduled soon, or in a "
                       f"topic on their way to its subscriptions); the next run reads them again")
        elif held:
            out.append(f"  left in the backlog for restore.skip_destinations: {sum(held.values())} message(s) "
                       f"({', '.join(f'{d} {n}' for d, n in held.items())}); a run without the skip delivers them")
        if self.left_in_place:
            out.append(f"  left in place with their outcome: {self.left_in_place} message(s) (dead-lettered or expired "
                       f"in a dead-letter sub-queue, or scheduled: see the audit)")
        if self.credits is not None:
            out.append(f"  {self.credits.line()}")
        return out


class SinkRecords:
    """What the run did, as the sink counted it: a classic session runs ``foreachBatch`` in this process."""

    def __init__(self, sink: DeliverySink):
        self.sink = sink

    def batch_stats(self, batch_id: int) -> BatchStats | None:
        return self.sink.batch_stats.pop(batch_id, None)

    def per_destination(self) -> dict[str, dict[str, int]]:
        return dict(sorted(self.sink.per_destination.items()))


class AuditRecords:
    """What the run did, read from the audit table: under Spark Connect ``foreachBatch`` runs in a
    process of the server's, so nothing the sink object counts comes back to the client.

    A replayed batch shows what this run recorded for it (a replay's rows are those of the
    attempt that recorded them first, under that run's id).
    """

    def __init__(self, spark: SparkSession, audit_table: str, run_id: str):
        self.spark, self.audit_table, self.run_id = spark, audit_table, run_id

    def batch_stats(self, batch_id: int) -> BatchStats | None:
        audit = delta.existing_table(self.spark, self.audit_table)
        if audit is None:
            return None
        row = reports.batch_totals(audit, self.run_id, batch_id).first()
        if row is None or not row["rows"]:
            return None
        oldest = row["oldest_enqueued"]
        return BatchStats(row[Outcome.DELIVERED], row[Outcome.DEAD_LETTERED], row[Outcome.SKIPPED_PING], 0,
                          (row["last_outcome"] - row["first_outcome"]).total_seconds(),
                          None if oldest is None else oldest.astimezone(dt.timezone.utc), held=row[Outcome.HELD])

    def per_destination(self) -> dict[str, dict[str, int]]:
        audit = delta.existing_table(self.spark, self.audit_table)
        if audit is None:
            return {}
        rows = reports.audit_summary(audit, self.run_id).collect()
        return {row["destination"]: {outcome.value: row[outcome] for outcome in Outcome} for row in rows}
