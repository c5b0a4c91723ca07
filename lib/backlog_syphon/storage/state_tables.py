"""The three state tables of a backlog, audit, checkpoint and lease, created at a run's start with their
declared schemas and upkeep, and given the upkeep properties they lack once the run holds their lease."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import SparkSession

from backlog_syphon.storage import delta, upkeep
from backlog_syphon.storage.audit_table import AUDIT_SCHEMA, AUDIT_TABLE_PROPERTIES
from backlog_syphon.storage.checkpoint_table import CHECKPOINT_SCHEMA
from backlog_syphon.storage.lease_table import LEASE_SCHEMA

# The checkpoint and lease tables are rewritten whole (a row per queue, one row) by a commit per batch
# and a few per run. Delta writes a checkpoint of a table's log every ``checkpointInterval`` commits
# (10 by default), five Spark jobs (seconds) in the commit that makes it. Their logs are small (an add
# and a remove per commit), so replaying 50 commits costs less than checkpointing every 10: a batch's
# write is a quarter quicker on average. Each holds one live file: nothing to compact, only the files
# it replaced to vacuum. Log and file retention (``storage.table_retention_days``): ``storage.upkeep``.
REWRITTEN_TABLE_PROPERTIES: upkeep.Properties = (("delta.checkpointInterval", "50"),)


def create_tables(spark: SparkSession, audit_table: str, checkpoint_table: str, lease_table: str, *,
                  retention_days: int = upkeep.DEFAULT_RETENTION_DAYS) -> set[str]:
    """Create the three tables with their declared schemas and upkeep (a log and file window of
    ``retention_days``), where they do not exist yet (at once: each is a few round trips to storage and none
    depends on another); return those this call created.

    A run that created the audit and the checkpoint table, and then takes the lease as its first
    holder (epoch 1), knows that nothing was ever recorded in them: every record is written under
    the lease of its state tables, so a record made since the creation would have left a holder
    before this one. Its first batch reads nothing back (``run.run_start.StartGates.state_is_new``).
    """
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="create-table") as pool:
        created = {table: pool.submit(delta.create_table, spark, table, schema, partition_by,
                                      upkeep.with_retention(properties, retention_days))
                   for table, schema, partition_by, properties in (
                       (audit_table, AUDIT_SCHEMA, ("outcome_date",), AUDIT_TABLE_PROPERTIES),
                       (checkpoint_table, CHECKPOINT_SCHEMA, (), REWRITTEN_TABLE_PROPERTIES),
                       (lease_table, LEASE_SCHEMA, (), REWRITTEN_TABLE_PROPERTIES))}
        return {table for table, future in created.items() if future.result()}


def set_upkeep_properties(spark: SparkSession, audit_table: str, checkpoint_table: str, lease_table: str, *,
                          retention_days: int = upkeep.DEFAULT_RETENTION_DAYS) -> None:
    """Give the three tables the upkeep properties (with a window of ``retention_days``) that an older version,
    or another setting, did not (``delta.set_missing_properties``), at once: a start that finds them set pays one
    round trip, not three."""
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="table-upkeep") as pool:
        list(pool.map(lambda table, properties: delta.set_missing_properties(
                          spark, table, upkeep.with_retention(properties, retention_days)),
                      (audit_table, checkpoint_table, lease_table),
                      (AUDIT_TABLE_PROPERTIES, REWRITTEN_TABLE_PROPERTIES, REWRITTEN_TABLE_PROPERTIES)))
