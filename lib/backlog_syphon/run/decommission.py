"""``--decommission``: once a migration is over, remove the backlog queues that are drained.

A dry run by default: it reads what ``--status`` reads (the broker's counts, the audit's unsettled records,
the lease) and says, queue by queue, what it would remove and why, or what holds a queue. With ``--confirm``
it takes the backlog's lease (so no run drains meanwhile; a run holding it ends the command with exit code 3),
reads everything again under it, removes the drained queues through the administration API
(``servicebus.removal``), refuses the others naming what holds them, gives the lease back and appends its row
to the runs table (mode ``decommission``, the queues it removed, what the refused ones hold).

Both need Manage on the secondary namespace (Azure AD: *Azure Service Bus Data Owner*): the administration API
is asked for the queues first, and a refusal ends the command before anything is read or removed, with one
line naming the role (exit code 2). The decisions are ``run.decommission_plan``'s.
"""

from __future__ import annotations

import datetime as dt
import logging

from pyspark.sql import SparkSession

from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import JobIds, RunMode, RunRow, RunSource
from backlog_syphon.run.decommission_plan import DecommissionReport
from backlog_syphon.run.fence import LeaseKeeper, utc_now
from backlog_syphon.run.status import status
from backlog_syphon.run.syphon import lease_key
from backlog_syphon.servicebus.removal import delete_queue, require_manage
from backlog_syphon.storage import runs_table

logger = logging.getLogger(__name__)


def decommission(spark: SparkSession, config: SyphonConfig, *, confirm: bool, run_id: str,
                 job: JobIds | None = None) -> DecommissionReport:
    """The dry run's report, or (``confirm``) what was removed. ``ManageRefusedError`` (exit code 2) without
    Manage; ``LeaseHeldError`` (3) when ``confirm`` finds a run holding the lease."""
    if not require_manage(config.secondary, config.primary.namespace):
        # Every backlog queue is gone (a decommission ran): nothing to read, nothing to remove. (The status's
        # pre-flight would take a namespace without them for a wrong primary.namespace.)
        return DecommissionReport(utc_now(), (), confirmed=confirm)
    if not confirm:
        report = status(spark, config)
        return DecommissionReport(report.at, report.removal, confirmed=False, lease_holder=report.lease_holder)
    started = utc_now()
    storage = config.storage
    keeper = LeaseKeeper(lease_table=storage.resolved_lease_table, lease_key=lease_key(config), run_id=run_id,
                         lease_seconds=config.run.lease_seconds, checkpoint_table=storage.checkpoint_table)
    keeper.acquire(spark, wait=False)
    keeper.start_heartbeat(spark)
    try:
        report = status(spark, config)  # read again under the lease: no run moves anything meanwhile
        removed = tuple(removal.queue for removal in report.removal
                        if removal.removable and delete_queue(config.secondary, removal.queue))
    finally:
        keeper.release(spark)
    result = DecommissionReport(report.at, report.removal, confirmed=True, removed=removed)
    _record(spark, config, run_id, job or JobIds(), started, result)
    return result


def _record(spark: SparkSession, config: SyphonConfig, run_id: str, job: JobIds, started_at: dt.datetime,
            result: DecommissionReport) -> None:
    """The decommission's row in the runs table: what a backlog's last command did, where its runs are."""
    remaining = result.remaining
    row = RunRow(run_id=run_id, source=RunSource.BACKLOG.value, trigger=RunMode.DECOMMISSION.value,
                 job_id=job.job_id, job_run_id=job.job_run_id, started_at=started_at, ended_at=utc_now(),
                 exit_code=result.exit_code, closing_line=result.closing_line, delivered=0, dead_lettered=0,
                 skipped=0, held=0, not_selected=0, remaining=remaining, remaining_total=sum(remaining.values()),
                 batches=0, throttled_seconds=None, mode=RunMode.DECOMMISSION.value,
                 removed_queues=list(result.removed))
    table = config.storage.resolved_runs_table
    try:
        runs_table.append_run(spark, table, row, retention_days=config.storage.table_retention_days)
    except Exception as exc:  # noqa: BLE001 - what was removed stands; only its record is missing
        logger.warning("decommission %s not recorded in the runs table %s (%s); removed: %s", run_id, table,
                       type(exc).__name__, ", ".join(result.removed) or "nothing")
