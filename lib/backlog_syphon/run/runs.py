"""The runs table's row of a run: appended once the run has ended, whether it drained, left messages or
failed, so that a dashboard and the alerts can say how each run went without anyone watching.

Off the critical path by design: the row is written after the run gave its lease back (the next run
need not wait for it), it adds no commit to a run's start (the lease row already says which run is
delivering, since when), and a failure to write it is one warning, never the run's exit code. A run
refused before it starts (a wrong setting found by the command line's pre-flight, exit code 2) writes
none: it never had a session; the job's failure notification reports it.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Callable

from pyspark.sql import SparkSession

from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import CreditUsage, EarlierBatches, JobIds, RunMode
from backlog_syphon.run.run_records import AuditRecords, RunSummary
from backlog_syphon.run.run_end import RunEnd, failure_end, run_end, run_row
from backlog_syphon.storage import runs_table

logger = logging.getLogger(__name__)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def summary_end(summary: RunSummary, trigger: str) -> RunEnd:
    """How a run that ran through ended: exit code and closing line."""
    return run_end(trigger, drained=summary.drained, stopped=summary.stopped, remaining=summary.remaining,
                   held=sum(summary.held.values()), redrive=summary.redrive, migration=summary.migration)


class RunRecorder:
    """Appends one run's row to ``storage.runs_table`` when it ends (``ended`` or ``failed``)."""

    def __init__(self, spark: SparkSession, config: SyphonConfig, run_id: str, *, job: JobIds | None = None,
                 clock: Callable[[], dt.datetime] = utc_now):
        self.spark, self.config, self.run_id = spark, config, run_id
        self.job = job or JobIds()
        self.clock = clock
        self.started_at = clock()
        self.run = None  # the started run (``run.syphon.SyphonRun``), once its query started

    def watching(self, on_start: Callable | None) -> Callable:
        """An ``on_start`` callback for ``run_syphon`` that keeps the started run (what a failed run
        recorded is read from it), then calls ``on_start``."""
        def started(run) -> None:
            self.run = run
            if on_start is not None:
                on_start(run)
        return started

    def ended(self, summary: RunSummary) -> None:
        """The run ran through."""
        self._append(summary_end(summary, self.config.run.trigger), summary.per_destination, summary.remaining,
                     [point.stats for point in summary.progress], summary.earlier, summary.credits)

    def failed(self, exc: BaseException) -> None:
        """The run raised ``exc``. What it recorded is read from the audit table (a failed batch records
        what it delivered before it fails, which the sink's own counts leave out); what it left is not
        counted (the status command does)."""
        end = failure_end(exc)
        per_destination, batches, earlier, credits = {}, [], EarlierBatches(), None
        if self.run is not None:  # its query started: it may have recorded something
            batches, earlier = [point.stats for point in self.run.listener.points], self.run.listener.earlier
            try:
                audit = AuditRecords(self.spark, self.config.storage.audit_table, self.run_id)
                per_destination = audit.per_destination()
            except Exception as read_failure:  # noqa: BLE001 - the row is still worth writing without them
                logger.warning("run_id=%s: what the failed run recorded is not in its runs-table row (%s)",
                               self.run_id, type(read_failure).__name__)
            credits = self.run.credit_usage(self.config, per_destination)
        self._append(end, per_destination, None, batches, earlier, credits)

    def _append(self, end: RunEnd, per_destination, remaining, batches, earlier: EarlierBatches,
                credits: CreditUsage | None) -> None:
        row = run_row(run_id=self.run_id, source=self.config.run.source, trigger=self.config.run.trigger,
                      job=self.job, started_at=self.started_at, ended_at=self.clock(), end=end,
                      per_destination=per_destination, remaining=remaining, batches=batches, earlier=earlier,
                      mode=RunMode.MIGRATION if self.config.migrating else RunMode.SYPHON, credits=credits)
        table = self.config.storage.resolved_runs_table
        try:
            runs_table.append_run(self.spark, table, row, retention_days=self.config.storage.table_retention_days)
        except Exception as exc:  # noqa: BLE001 - the run's outcome stands; only its record is missing
            logger.warning("run_id=%s not recorded in the runs table %s (%s); the run's exit code stands",
                           self.run_id, table, type(exc).__name__)
