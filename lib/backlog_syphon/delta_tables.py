"""All Delta I/O of the syphon: the audit table and the checkpoint table.

- ``audit``: one row per backlog message and outcome, appended once per micro-batch with
  ``txnAppId``/``txnVersion`` so a replayed batch never appends twice. Partitioned by outcome date.
- ``checkpoint``: one row per backlog queue: delivered-through and purged-through sequence
  numbers, last batch, counts. Updated by MERGE under the same transaction identifiers.
Both are created on first use with fixed schemas, and readable by any Delta reader.

A table setting is a path (it contains '/' or a scheme) or a catalog table name.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (DateType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

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


def table_ref(table: str) -> str:
    """SQL reference for a path or a catalog table name."""
    if "/" in table or ":" in table:
        return "delta.`" + table.replace("`", "``") + "`"
    return table


def read_table(spark: SparkSession, table: str) -> DataFrame:
    return spark.read.format("delta").load(table) if "/" in table or ":" in table else spark.read.table(table)


def ensure_tables(spark: SparkSession, audit_table: str, checkpoint_table: str) -> None:
    """Create both tables when missing (idempotent; safe when two runs race on first use)."""
    _ensure(spark, audit_table, AUDIT_SCHEMA, partition_by=["outcome_date"])
    _ensure(spark, checkpoint_table, CHECKPOINT_SCHEMA, partition_by=[])


def _ensure(spark: SparkSession, table: str, schema: StructType, partition_by: list[str]) -> None:
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark)
    builder = builder.location(table) if "/" in table or ":" in table else builder.tableName(table)
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


@contextmanager
def _delta_txn(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """MERGE has no write options: Delta reads the transaction identifiers from the session."""
    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(version))
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


def append_audit(spark: SparkSession, audit_table: str, rows: Iterable[tuple], app_id: str, batch_id: int) -> None:
    """Append one batch's audit rows; a replay of the same batch id appends nothing."""
    frame = spark.createDataFrame(list(rows), AUDIT_ROW_SCHEMA).withColumn("outcome_date", F.to_date("outcome_time"))
    writer = frame.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", batch_id)
    if "/" in audit_table or ":" in audit_table:
        writer.save(audit_table)
    else:
        writer.saveAsTable(audit_table)


def merge_checkpoint(spark: SparkSession, checkpoint_table: str, updates: list[dict], app_id: str,
                     batch_id: int) -> None:
    """Advance per-queue marks and add counts; skipped by Delta when this batch was merged already."""
    if not updates:
        return
    source = spark.createDataFrame(updates, CHECKPOINT_SCHEMA)
    view = f"syphon_checkpoint_updates_{batch_id}"
    source.createOrReplaceTempView(view)
    try:
        with _delta_txn(spark, app_id, batch_id):
            spark.sql(f"""
                MERGE INTO {table_ref(checkpoint_table)} t USING {view} s ON t.backlog_queue = s.backlog_queue
                WHEN MATCHED THEN UPDATE SET
                  delivered_through = greatest(t.delivered_through, s.delivered_through),
                  purged_through = greatest(t.purged_through, s.purged_through),
                  last_batch_id = s.last_batch_id, last_run_id = s.last_run_id, updated_at = s.updated_at,
                  delivered_count = t.delivered_count + s.delivered_count,
                  dead_lettered_count = t.dead_lettered_count + s.dead_lettered_count,
                  skipped_count = t.skipped_count + s.skipped_count
                WHEN NOT MATCHED THEN INSERT *
            """)
    finally:
        spark.catalog.dropTempView(view)


def advance_purged_through(spark: SparkSession, checkpoint_table: str, purged: dict[str, int]) -> None:
    """Record how far each queue has been purged; idempotent (marks only move forward)."""
    if not purged:
        return
    rows = ", ".join(f"('{q.replace(chr(39), chr(39) * 2)}', {int(s)})" for q, s in purged.items())
    spark.sql(f"""
        MERGE INTO {table_ref(checkpoint_table)} t
        USING (SELECT * FROM VALUES {rows} AS v(backlog_queue, purged_through)) s
        ON t.backlog_queue = s.backlog_queue
        WHEN MATCHED AND s.purged_through > t.purged_through THEN UPDATE SET purged_through = s.purged_through
    """)
