"""The audit table: one row per backlog message and outcome, appended once per micro-batch with
``txnAppId``/``txnVersion`` so a replayed batch never appends twice. Partitioned by outcome date. Created
by ``storage.state_tables``; until then reading it finds nothing recorded."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StructField, StructType

from backlog_syphon.model import FINAL_OUTCOMES, CheckpointRow, Outcome
from backlog_syphon.restore.queue_names import DEAD_LETTER_SUBQUEUE
from backlog_syphon.rows import OUTCOME_ROW_SCHEMA
from backlog_syphon.storage import delta, upkeep

# What the sink produces per message; the table adds the partition column ``outcome_date``.
AUDIT_ROW_SCHEMA = OUTCOME_ROW_SCHEMA
AUDIT_SCHEMA = StructType(AUDIT_ROW_SCHEMA.fields + [StructField("outcome_date", DateType(), False)])
# Delta collects min/max statistics of a table's first 32 columns for every file it writes, row by row:
# for the audit table that was half of each batch's append (1.5 s for 10,000 rows; 0.77 s with these).
# These are the columns the syphon's own reads filter on (a restart's unsettled rows by queue, sequence
# number and enqueue time; an attempt's rows by batch; a re-drive's by outcome); the partition column
# prunes by day. The audit table is appended to once per batch and read by filters: Delta's checkpoint
# interval (10, stated), and auto compaction so that its files do not grow with the batches.
AUDIT_TABLE_PROPERTIES: upkeep.Properties = (("delta.dataSkippingStatsColumns",
                                              "batch_id,backlog_queue,sequence_number,enqueued_time,outcome"),
                                             ("delta.checkpointInterval", "10")) + upkeep.AUTO_COMPACT


def append_audit(audit_table: str, outcomes: DataFrame, app_id: str, version: int) -> None:
    """Append a batch's outcome rows (written by the executors); the same ``version`` twice appends once.

    Unsent rows are appended too: they tell a restart where a recorded span ends.
    """
    frame = outcomes.withColumn("outcome_date", F.to_date("outcome_time"))
    writer = (frame.write.format("delta").mode("append").partitionBy("outcome_date")
              .option("txnAppId", app_id).option("txnVersion", version))
    delta.save(writer, audit_table)


def recorded_unsettled(spark: SparkSession, audit_table: str, checkpoint: dict[str, CheckpointRow],
                       since: dt.date | None = None) -> DataFrame | None:
    """Audit rows of messages that have an outcome but may still be in the backlog.

    That is every row above its queue's purge mark: enqueued after the message the mark names (a
    mark from an older version has no enqueue time: then above its sequence number), and every row
    of a queue without a checkpoint row. After a crash these are the messages a replayed batch must
    not send again and that its purge must still settle. The audit's files carry min/max statistics
    of both columns, so Delta skips the files of long-settled batches; ``since`` (an outcome date) prunes
    whole days (``run.status_report.audit_read_floor``). None before the table's first write.
    """
    audit = delta.existing_table(spark, audit_table)
    if audit is None:
        return None
    above = ~F.col("backlog_queue").isin(list(checkpoint)) if checkpoint else F.lit(True)
    for queue, row in checkpoint.items():
        if row.purged_enqueued_ms is not None:  # above the message the mark names, in (enqueue time, sequence) order
            enqueued = F.unix_millis("enqueued_time")
            mark = (enqueued > F.lit(row.purged_enqueued_ms)) | (
                (enqueued == F.lit(row.purged_enqueued_ms)) & (F.col("sequence_number") > F.lit(row.purged_through)))
        else:
            mark = F.col("sequence_number") > F.lit(row.purged_through)
        above = above | ((F.col("backlog_queue") == queue) & F.coalesce(mark, F.lit(True)))
    if since is not None:
        above = (F.col("outcome_date") >= F.lit(since)) & above
    return audit.where(above)


def recorded_sequence_numbers(spark: SparkSession, audit_table: str, sources: list[str]) -> dict[str, frozenset[int]]:
    """{source (lower case): the sequence numbers the audit holds a final outcome for} over ``sources`` (the
    migration mode's fan-out check, ``migration.fan_out``): a few entities' numbers, collected; {} before the
    audit's first write."""
    audit = delta.existing_table(spark, audit_table)
    if audit is None or not sources:
        return {}
    rows = (audit.where(F.lower(F.col("backlog_queue")).isin([source.lower() for source in sources])
                        & F.col("outcome").isin([outcome.value for outcome in FINAL_OUTCOMES]))
            .select(F.lower(F.col("backlog_queue")).alias("source"), "sequence_number").distinct().collect())
    found: dict[str, set[int]] = {}
    for row in rows:
        found.setdefault(row["source"], set()).add(row["sequence_number"])
    return {source: frozenset(numbers) for source, numbers in found.items()}


def redriven_dead_letters(spark: SparkSession, audit_table: str) -> DataFrame | None:
    """Identities (queue, sequence number, enqueue time in ms) of the messages a re-drive dead-lettered
    again: audit rows of a dead-letter sub-queue with the outcome ``dead_lettered``. Such a message is
    still in that sub-queue, and the next re-drive leaves it there unless asked to retry it
    (``restore.redrive``). A DataFrame, joined by the batch, never collected; None before the audit exists."""
    audit = delta.existing_table(spark, audit_table)
    if audit is None:
        return None
    return (audit.where((F.col("outcome") == Outcome.DEAD_LETTERED)
                        & F.lower(F.col("backlog_queue")).endswith("/" + DEAD_LETTER_SUBQUEUE.lower()))
            .select("backlog_queue", "sequence_number", F.unix_millis("enqueued_time").alias("enqueued_ms")))


def held_by_destination(spark: SparkSession, audit_table: str, checkpoint: dict[str, CheckpointRow],
                        destinations: tuple[str, ...], since: dt.date | None = None) -> dict[str, int]:
    """Per destination among ``destinations`` (names as sent, compared case-insensitively), the messages
    whose latest outcome is ``held``: left in the backlog on purpose, and not sent since. Only rows above
    the purge marks are read (``recorded_unsettled``, from the outcome date ``since``): the marks never
    pass a held message."""
    rows = recorded_unsettled(spark, audit_table, checkpoint, since) if destinations else None
    if rows is None:
        return {}
    latest = (rows.groupBy("backlog_queue", "sequence_number", "enqueued_time")
              .agg(F.max_by("outcome", "outcome_time").alias("outcome"),
                   F.max_by("destination", "outcome_time").alias("destination")))
    held = latest.where((F.col("outcome") == Outcome.HELD)
                        & F.lower("destination").isin([name.lower() for name in destinations]))
    return {row["destination"]: row["count"] for row in held.groupBy("destination").count().collect()}
