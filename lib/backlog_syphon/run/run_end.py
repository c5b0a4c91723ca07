"""How a run ended, decided on plain values: the exit code and closing line of a run, and its row in the
runs table. Pure: no Spark, no Service Bus, no tables (``run.runs`` writes the row, the command line
exits with the code).

The exit codes are one family (``errors.EXIT_*``), shared with the status command
(``run.status_report``), so a script, a cron job or a job task can act on either command: 0 done or
drained, 1 a batch failed, 2 a setting is wrong, 3 a run holds the lease, 4 messages wait in the backlog.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from backlog_syphon.config import AVAILABLE_NOW
from backlog_syphon.errors import BATCH_FAILED_MARK, EXIT_BATCH_FAILED, EXIT_NOT_DRAINED, EXIT_OK, SyphonError
from backlog_syphon.model import BatchStats, CreditUsage, EarlierBatches, JobIds, NamespaceRole, Outcome, RunMode, RunRow

STOPPED_LINE = "stopped on request at a batch boundary; the next run resumes from the tables"


@dataclass(frozen=True)
class RunEnd:
    """How a run ended: what the command line exits with, and its closing line."""

    exit_code: int
    line: str


def closing_line(exc: BaseException) -> str:
    """The one line that ends a failed run. A batch failure says its batch, step and cause, and that
    nothing was lost; Spark Connect hands the client only its text, where the sink's line is found."""
    text = str(exc)
    at = text.rfind(BATCH_FAILED_MARK)
    if at >= 0:
        line = text[at + len(BATCH_FAILED_MARK):].strip().splitlines()[0]
        return (f"{line}. Nothing was lost: the next run resumes safely from the audit and checkpoint tables")
    if isinstance(exc, SyphonError):
        return text
    first = (text.strip().splitlines() or [""])[0][:300]
    return f"the run failed: {type(exc).__name__}" + (f": {first}" if first else "")


def failure_end(exc: BaseException) -> RunEnd:
    """A run that raised: the syphon's own errors carry their exit code; anything else (Spark's
    streaming exception around a batch failure under Spark Connect) is a failed batch."""
    return RunEnd(exc.exit_code if isinstance(exc, SyphonError) else EXIT_BATCH_FAILED, closing_line(exc))


def run_end(trigger: str, *, drained: bool, stopped: bool, remaining: Mapping[str, int], held: int,
            redrive: bool, migration: bool = False) -> RunEnd:
    """A run that ran through. A stop on request (a signal, ``--timeout``) is done at a batch boundary;
    an available-now run that left messages other than the ones it held on purpose has not drained."""
    left = sum(remaining.values())
    if stopped:
        return RunEnd(EXIT_OK, STOPPED_LINE)
    if trigger == AVAILABLE_NOW and not drained:
        where = "the sources" if migration else "the backlog"
        return RunEnd(EXIT_NOT_DRAINED, f"{left} message(s) remain in {where} (see 'remaining'): run again, "
                                        f"or look at why")
    if redrive:
        return RunEnd(EXIT_OK, f"re-drive done; {left} message(s) stay in the dead-letter queues")
    if held and migration:
        return RunEnd(EXIT_OK, f"drained; {held} message(s) left in the sources to read once they are active")
    if held:
        return RunEnd(EXIT_OK, f"drained; {held} message(s) left in the backlog for restore.skip_destinations")
    return RunEnd(EXIT_OK, "drained")


def run_row(*, run_id: str, source: str, trigger: str, job: JobIds, started_at: dt.datetime,
            ended_at: dt.datetime, end: RunEnd, per_destination: Mapping[str, Mapping[str, int]],
            remaining: Mapping[str, int] | None, batches: Iterable[BatchStats | None],
            earlier: EarlierBatches = EarlierBatches(), mode: RunMode = RunMode.SYPHON,
            credits: CreditUsage | None = None) -> RunRow:
    """The run's row in the runs table: what it recorded per outcome, what it left, how it was throttled,
    what it spent of each namespace's credits. ``earlier``: the batches a long run's progress history no
    longer holds (``run.progress``); ``mode``: which mode ran (a migration run also counts what it found
    expired)."""
    counts: Counter = Counter()
    for by_outcome in per_destination.values():
        counts.update({outcome: count or 0 for outcome, count in by_outcome.items()})
    stats = [batch for batch in batches if batch is not None]
    paced = [batch.pacing for batch in stats if batch.pacing is not None]
    any_stats, any_paced = stats or earlier.batches, paced or earlier.paced
    throttled = (earlier.slowed_seconds + sum(pacing.slowed_seconds for pacing in paced)
                 if any_paced or not any_stats else None)
    return RunRow(
        run_id=run_id, source=source, trigger=trigger, job_id=job.job_id, job_run_id=job.job_run_id,
        started_at=started_at, ended_at=ended_at, exit_code=end.exit_code, closing_line=end.line,
        delivered=counts[Outcome.DELIVERED], dead_lettered=counts[Outcome.DEAD_LETTERED],
        skipped=counts[Outcome.SKIPPED_PING] + counts[Outcome.COVERED], held=counts[Outcome.HELD], not_selected=counts[Outcome.NOT_SELECTED],
        remaining=None if remaining is None else dict(remaining),
        remaining_total=None if remaining is None else sum(remaining.values()),
        batches=earlier.batches + len(stats), throttled_seconds=throttled, mode=mode.value,
        expired=counts[Outcome.EXPIRED] if mode is RunMode.MIGRATION else None,
        secondary_credits=None if credits is None else credits.total(NamespaceRole.SECONDARY),
        primary_credits=None if credits is None else credits.total(NamespaceRole.PRIMARY),
        credits_by_kind=None if credits is None else credits.by_kind)
