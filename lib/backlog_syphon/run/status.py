"""``--status``: is the backlog drained, and if not, why not.

Reads the broker (what each backlog queue and dead-letter sub-queue holds now, and how old its first
message is: ``servicebus.counts``) and the state tables (checkpoint marks, the lease, the last runs, what
is recorded above the purge marks and so not known settled yet, and, where messages wait and
restore.skip_destinations is set, which of them are held on purpose),
and changes nothing: it takes no lease, writes no table (a table that does not exist yet reads as
empty, and is not created), settles and locks nothing. The broker is read in threads while the tables
are, so it takes about as long as the slower of the two. The verdict and the report's text are
``run.status_report``'s.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import SparkSession

from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import MigrationPlan, SourceKind
from backlog_syphon.restore.queue_names import backlog_queue_names
from backlog_syphon.sink.queue_marks import awaiting_settlement
from backlog_syphon.sink.spark_ports import read_recovery
from backlog_syphon.run.status_report import QueueStatus, StatusReport, audit_read_floor, removed_by_decommission
from backlog_syphon.storage import audit_table, checkpoint_table, lease_table, runs_table

RUNS_SHOWN = 5


def status(spark: SparkSession, config: SyphonConfig, *, now: dt.datetime | None = None) -> StatusReport:
    """The backlog's status now (``report.lines()`` to show it, ``report.verdict`` to act on it).
    ``PreflightError`` (exit code 2) when the secondary namespace cannot be read as configured."""
    from backlog_syphon.run.syphon import prepare_migration
    from backlog_syphon.servicebus.counts import count_backlog
    from backlog_syphon.servicebus.preflight import NoBacklogQueuesError, preflight
    from backlog_syphon.servicebus.throttling import pace_driver

    pace_driver(config)
    storage = config.storage
    at = now or dt.datetime.now(dt.timezone.utc)
    queues = backlog_queue_names(config.primary.namespace, config.backlog.queue_count)
    migration = prepare_migration(config)
    if migration.sources:  # per source entity, and the dead-letter sub-queues of the queues and subscriptions
        queues = [source.path for source in migration.sources if source.kind is not SourceKind.DEAD_LETTERS]

    def read_broker():
        if migration.sources:
            preflight(config, primary=False, migration=migration)
            return migration_counts(config, migration)
        try:
            preflight(config, primary=False)  # wrong credentials or endpoint: one line naming the setting
        except NoBacklogQueuesError as missing:
            # Removed by ``--decommission`` (the runs table says so: counted as missing), or a wrong setting.
            if not removed_by_decommission(runs.result()):
                raise missing
        return count_backlog(config.secondary, config.primary.namespace, queues)

    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="status") as pool:
        runs = pool.submit(runs_table.read_runs, spark, storage.resolved_runs_table, RUNS_SHOWN)
        broker = pool.submit(read_broker)
        marks = pool.submit(checkpoint_table.read_checkpoint, spark, storage.checkpoint_table)
        lease = pool.submit(lease_table.read_lease, spark, storage.resolved_lease_table)
        ended = pool.submit(checkpoint_table.ended_run, spark, storage.checkpoint_table)
        backlog, dead_letters, counted_by = broker.result()
        checkpoint = marks.result()
    held = {}
    # From the oldest purge mark's day on: a month of audit partitions costs what a day does.
    since = audit_read_floor(checkpoint, queues)
    if config.restore.skip_destinations and any(count.messages for count in backlog.values()):
        held = audit_table.held_by_destination(spark, storage.audit_table, checkpoint, config.restore.skip_destinations,
                                          since=since)
    # Counted as the dry run counts it, from what a run would begin with (``sink.spark_ports.read_recovery``).
    unsettled = awaiting_settlement(read_recovery(spark, storage, migration, since=since)[0].unsettled)
    return StatusReport(
        at=at, backlog=tuple(QueueStatus(queue, count, checkpoint.get(queue)) for queue, count in backlog.items()),
        dead_letters=tuple(QueueStatus(queue, count) for queue, count in dead_letters.items()),
        lease=lease.result(), runs=tuple(runs.result()), held=held, counted_by=counted_by,
        runs_table=storage.resolved_runs_table, ended_run_id=ended.result(), unsettled=unsettled,
        exported=config.backlog.exported_dead_letters, migration=bool(migration.sources))


def migration_counts(config: SyphonConfig, migration: MigrationPlan):
    """What a migration's sources hold: (each source but the dead-letter sub-queues -> its count, each dead-letter
    sub-queue of a selected queue or subscription -> its count, how they were counted)."""
    from backlog_syphon.migration.selection import dead_letter_sources_of
    from backlog_syphon.servicebus.counts import count_entities

    sources = [source for source in migration.sources if source.kind is not SourceKind.DEAD_LETTERS]
    dead_letters = sorted({source.path for source in dead_letter_sources_of(sources)}
                          | {source.path for source in migration.sources if source.kind is SourceKind.DEAD_LETTERS})
    counts = count_entities(config.secondary, [source.path for source in sources] + dead_letters,
                            browse_only=migration.browse_only)
    return ({source.path: counts[source.path] for source in sources}, {path: counts[path] for path in dead_letters},
            "peeks of each source entity: exact up to 100 messages; '<=N' is an upper bound")
