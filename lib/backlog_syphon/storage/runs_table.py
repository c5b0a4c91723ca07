"""The runs table: one row per run, appended once the run has ended (``append_run``), read by the status
command (``read_runs``). Created by its first append."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from backlog_syphon.model import RunRow
from backlog_syphon.rows import struct_of
from backlog_syphon.storage import delta, upkeep
from backlog_syphon.storage.commit_lock import commit_lock

RUNS_SCHEMA = struct_of(RunRow)
# The runs table gains a row (a file) per run.
RUNS_TABLE_PROPERTIES: upkeep.Properties = upkeep.AUTO_COMPACT


def append_run(spark: SparkSession, runs_table: str, row: RunRow, *,
               retention_days: int = upkeep.DEFAULT_RETENTION_DAYS) -> None:
    """Append a run's row, creating the table first where it does not exist (a table an older version
    made gets the columns and the properties it lacks; its log and file window: ``retention_days``). Runs append blindly, so two never conflict, except
    with the one property change an upgrade makes (the runs table is no one lease's): such an append is
    made again. On a local path the commits take turns (``commit_lock``)."""
    properties = upkeep.with_retention(RUNS_TABLE_PROPERTIES, retention_days)
    if not delta.create_table(spark, runs_table, RUNS_SCHEMA, properties=properties):
        delta.set_missing_properties(spark, runs_table, properties)
    writer = delta.local_frame(spark, [row], RUNS_SCHEMA).write.format("delta").mode("append")

    def append() -> None:
        with commit_lock(spark, runs_table):
            delta.save(writer, runs_table)

    upkeep.retried(append, delta.is_commit_conflict, f"the runs table's append to {runs_table}")


def read_runs(spark: SparkSession, runs_table: str, limit: int) -> list[RunRow]:
    """The last ``limit`` runs, newest first; none before the table's first write."""
    table = delta.existing_table(spark, runs_table)
    if table is None:
        return []
    rows = table.orderBy(F.desc("ended_at")).limit(limit).collect()
    # A table an older version made lacks the newest columns until a run appends to it: they read as null.
    return [RunRow(**{name: delta.as_utc(values[name]) if name.endswith("_at") else values.get(name)
                      for name in RUNS_SCHEMA.fieldNames()}) for values in (row.asDict() for row in rows)]
