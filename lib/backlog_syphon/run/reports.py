"""Reading the audit table afterwards: what moved, per run, destination and outcome, and when.

Pure transforms of the audit DataFrame (read it with ``storage.delta.read_table``), plus a text
chart for terminals and plain notebooks (Databricks' ``display`` draws its own).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backlog_syphon.model import Outcome


def audit_summary(audit: DataFrame, run_id: str | None = None) -> DataFrame:
    """One row per run and destination: a count per outcome, bytes delivered, first and last outcome."""
    if run_id is not None:
        audit = audit.where(F.col("run_id") == run_id)
    counts = [F.sum(F.when(F.col("outcome") == outcome, 1).otherwise(0)).cast("long").alias(outcome)
              for outcome in Outcome]
    return (audit.withColumn("destination", F.coalesce("destination", F.lit("(no destination)")))
            .groupBy("run_id", "destination")
            .agg(*counts,
                 F.sum(F.when(F.col("outcome") == Outcome.DELIVERED, F.col("body_size")).otherwise(0))
                 .cast("long").alias("delivered_bytes"),
                 F.min("outcome_time").alias("first_outcome"),
                 F.max("outcome_time").alias("last_outcome"))
            .orderBy("run_id", "destination"))


def batch_totals(audit: DataFrame, run_id: str, batch_id: int) -> DataFrame:
    """One row: what one run recorded for one micro-batch (a count per outcome, when its outcomes were
    decided, the oldest backlog enqueue time among its messages)."""
    rows = audit.where((F.col("run_id") == run_id) & (F.col("batch_id") == batch_id))
    counts = [F.sum(F.when(F.col("outcome") == outcome, 1).otherwise(0)).cast("long").alias(outcome)
              for outcome in Outcome]
    return rows.agg(F.count(F.lit(1)).alias("rows"), *counts, F.min("outcome_time").alias("first_outcome"),
                    F.max("outcome_time").alias("last_outcome"), F.min("enqueued_time").alias("oldest_enqueued"))


def dead_letter_reasons(audit: DataFrame, run_id: str | None = None) -> DataFrame:
    """How many messages each reason code dead-lettered (or skipped), per destination."""
    if run_id is not None:
        audit = audit.where(F.col("run_id") == run_id)
    return (audit.where(F.col("outcome") != Outcome.DELIVERED)
            .groupBy("destination", "outcome", "reason_code").count()
            .orderBy(F.desc("count"), "destination", "reason_code"))


def moved_over_time(audit: DataFrame, run_id: str | None = None, bucket: str = "1 minute") -> DataFrame:
    """Messages with an outcome per time bucket (``bucket`` is a Spark interval, e.g. '10 seconds')."""
    if run_id is not None:
        audit = audit.where(F.col("run_id") == run_id)
    return (audit.groupBy(F.window("outcome_time", bucket).start.alias("bucket_start"))
            .agg(F.count(F.lit(1)).alias("moved"),
                 F.sum(F.when(F.col("outcome") == Outcome.DELIVERED, 1).otherwise(0)).cast("long").alias("delivered"))
            .orderBy("bucket_start"))


def text_chart(points: list[tuple[str, int]], width: int = 40) -> list[str]:
    """A horizontal bar per (label, value), scaled to ``width`` characters."""
    if not points:
        return ["(no data)"]
    peak = max(value for _, value in points) or 1
    label_width = max(len(label) for label, _ in points)
    return [f"{label:<{label_width}} {'#' * max(1 if value else 0, round(width * value / peak)):<{width}} {value}"
            for label, value in points]
