"""All Delta I/O of the syphon: the audit table and the checkpoint table.

- ``audit``: one row per backlog message and outcome, appended once per micro-batch with
  ``txnAppId``/``txnVersion`` so a replayed batch never appends twice. Partitioned by outcome date.
- ``checkpoint``: one row per backlog queue: delivered-through and purged-through sequence
  numbers, last batch, counts. Rewritten whole after each batch (it is tiny and the sink is its
  only writer), under the same transaction identifiers.
- ``lease``: one row per backlog: which run may deliver from it, until when (see ``lease``). Taken and
  extended with MERGE, an optimistic-concurrency commit, so of two runs racing for it one wins.
All are created on first use with fixed schemas, and readable by any Delta reader. Lease statements
are plain SQL, which works the same through a classic session and Spark Connect.

A table setting is a path (it contains '/' or a scheme) or a catalog table name.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (DateType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from backlog_syphon.lease import Lease

# What the sink produces per message; the table adds the partition column ``outcome_date``.
AUDIT_ROW_SCHEMA = StructType([
    StructField("run_id", StringType(), False),
    StructField("batch_id", LongType(), False),
    StructField("backlog_queue", StringType(), False),
    StructField("sequence_number", LongType(), False),
    StructField("message_id", StringType(), True),
    StructField("destination", StringType(), True),
    StructField("session_id", StringType(), True),
    StructField("outcome", StringType(), False),  # delivered | dead_lettered | skipped_ping
    StructField("reason_code", StringType(), True),
    StructField("reason", StringType(), True),
    StructField("body_size", IntegerType(), True),
    StructField("enqueued_time", TimestampType(), True),  # when it entered the backlog
    StructField("scheduled_enqueue_time", TimestampType(), True),
    StructField("time_to_live_ms", LongType(), True),  # TTL given to the re-sent message
    StructField("outcome_time", TimestampType(), False),  # delivered (or dead-letter decided) at
    StructField("attempts", IntegerType(), False),
])
AUDIT_SCHEMA = StructType(AUDIT_ROW_SCHEMA.fields + [StructField("outcome_date", DateType(), False)])

CHECKPOINT_SCHEMA = StructType([
    StructField("backlog_queue", StringType(), False),
    StructField("delivered_through", LongType(), False),  # every message <= this has an outcome
    StructField("purged_through", LongType(), False),  # ... and has been removed from the backlog
    StructField("last_batch_id", LongType(), False),
    StructField("last_run_id", StringType(), False),
    StructField("updated_at", TimestampType(), False),
    StructField("delivered_count", LongType(), False),
    StructField("dead_lettered_count", LongType(), False),
    StructField("skipped_count", LongType(), False),
])


LEASE_SCHEMA = StructType([
    StructField("lease_key", StringType(), False),  # the backlog: "<secondary host>/<primary namespace>"
    StructField("run_id", StringType(), False),  # the holding run
    StructField("host", StringType(), False),  # where the holder runs
    StructField("pid", LongType(), False),  # and its process (a dead one on this host is taken over)
    StructField("acquired_at", TimestampType(), False),
    StructField("renewed_at", TimestampType(), False),
    StructField("expires_at", TimestampType(), False),
])


def _is_path(table: str) -> bool:
    return "/" in table or ":" in table


def _sql_name(table: str) -> str:
    return "delta.`" + table.replace("`", "``") + "`" if _is_path(table) else table


def read_table(spark: SparkSession, table: str) -> DataFrame:
    return spark.read.format("delta").load(table) if _is_path(table) else spark.read.table(table)


def ensure_tables(spark: SparkSession, audit_table: str, checkpoint_table: str, lease_table: str | None = None) -> None:
    """Create the tables when missing (idempotent; safe when two runs race on first use)."""
    _ensure(spark, audit_table, AUDIT_SCHEMA, partition_by=["outcome_date"])
    _ensure(spark, checkpoint_table, CHECKPOINT_SCHEMA, partition_by=[])
    if lease_table is not None:
        _ensure(spark, lease_table, LEASE_SCHEMA, partition_by=[])


def _ensure(spark: SparkSession, table: str, schema: StructType, partition_by: list[str]) -> None:
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark)
    builder = builder.location(table) if _is_path(table) else builder.tableName(table)
    builder.addColumns(schema).partitionedBy(*partition_by).execute()


def read_checkpoint(spark: SparkSession, checkpoint_table: str) -> dict[str, dict]:
    return {row["backlog_queue"]: row.asDict() for row in read_table(spark, checkpoint_table).collect()}


def recorded_outcomes(spark: SparkSession, audit_table: str, purged_through: dict[str, int]) -> list[dict]:
    """Audit rows of messages that have an outcome but may still be in the backlog.

    That is every row above its queue's purged-through mark: after a crash these are the
    messages a replayed batch must not send again, and that its purge must still settle.
    """
    if not purged_through:
        return []
    condition = None
    for queue, through in purged_through.items():
        clause = (F.col("backlog_queue") == queue) & (F.col("sequence_number") > F.lit(through))
        condition = clause if condition is None else condition | clause
    return [row.asDict() for row in read_table(spark, audit_table).where(condition).collect()]


def append_audit(spark: SparkSession, audit_table: str, rows: Iterable[tuple], app_id: str, batch_id: int) -> None:
    """Append one batch's audit rows; a replay of the same batch id appends nothing."""
    frame = spark.createDataFrame(list(rows), AUDIT_ROW_SCHEMA).withColumn("outcome_date", F.to_date("outcome_time"))
    writer = frame.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", batch_id)
    if _is_path(audit_table):
        writer.save(audit_table)
    else:
        writer.saveAsTable(audit_table)


def write_checkpoint(spark: SparkSession, checkpoint_table: str, rows: list[dict], *, app_id: str | None = None,
                     batch_id: int | None = None) -> None:
    """Replace the checkpoint table's rows (one per queue) with the sink's current state.

    The table is tiny and the sink is its only writer, so an overwrite is both simpler and several
    times faster than a MERGE. With ``app_id``/``batch_id`` a replayed batch writes nothing.
    """
    frame = spark.createDataFrame(sorted(rows, key=lambda row: row["backlog_queue"]), CHECKPOINT_SCHEMA)
    writer = frame.write.format("delta").mode("overwrite")
    if app_id is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", batch_id)
    if _is_path(checkpoint_table):
        writer.save(checkpoint_table)
    else:
        writer.saveAsTable(checkpoint_table)


# --- the lease ----------------------------------------------------------------------------------

def read_lease(spark: SparkSession, lease_table: str, lease_key: str) -> Lease | None:
    rows = read_table(spark, lease_table).where(F.col("lease_key") == lease_key).collect()
    if not rows:
        return None
    row = rows[0]
    return Lease(row["lease_key"], row["run_id"], row["host"], int(row["pid"]), _utc(row["acquired_at"]),
                 _utc(row["renewed_at"]), _utc(row["expires_at"]))


def write_lease_if_free(spark: SparkSession, lease_table: str, lease: Lease, *,
                        takeover_from: str | None = None) -> bool:
    """Write ``lease`` if its row is free for ``lease.run_id``; True if written.

    Free: no row, the row is this run's, it expired, or it is still held by ``takeover_from`` (a run
    known to be gone). One MERGE: the check and the write are one optimistic-concurrency commit, so
    when two runs race, one commit wins and the other finds the row taken or fails with a conflict.
    """
    view = f"syphon_lease_{uuid.uuid4().hex}"  # the statement's source row; unique per call and thread
    columns = LEASE_SCHEMA.fieldNames()
    source = spark.createDataFrame([tuple(getattr(lease, name) for name in columns)], LEASE_SCHEMA)
    source.withColumn("takeover_from", F.lit(takeover_from).cast("string")).createOrReplaceTempView(view)
    try:
        metrics = spark.sql(f"""
            MERGE INTO {_sql_name(lease_table)} AS t USING {view} AS s
            ON t.lease_key = s.lease_key
            WHEN MATCHED AND (t.run_id = s.run_id OR t.expires_at <= s.renewed_at OR t.run_id <=> s.takeover_from)
                THEN UPDATE SET {", ".join(f"{name} = s.{name}" for name in columns)}
            WHEN NOT MATCHED THEN INSERT ({", ".join(columns)}) VALUES ({", ".join(f"s.{name}" for name in columns)})
            """).collect()
    except commit_conflicts():
        return False
    finally:
        spark.catalog.dropTempView(view)
    return bool(metrics) and int(metrics[0]["num_affected_rows"]) == 1


def commit_conflicts() -> tuple[type[BaseException], ...]:
    """Delta's commit-conflict exceptions (siblings, not one family: each is listed)."""
    from delta import exceptions

    return tuple(getattr(exceptions, name) for name in exceptions.__all__)


def _utc(value: dt.datetime) -> dt.datetime:
    # Spark hands timestamps to Python as naive local times; astimezone reads them as such.
    return value.astimezone(dt.timezone.utc)
