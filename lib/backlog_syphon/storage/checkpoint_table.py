"""The checkpoint table: one row per backlog queue: delivered-through and purged-through sequence numbers,
last batch, counts. Rewritten whole after each batch (it is tiny and the sink is its only writer), under
the batch's transaction identifiers. Created by ``storage.state_tables``; until then reading it finds
nothing recorded."""

from __future__ import annotations

from pyspark.sql import SparkSession

from backlog_syphon.model import CheckpointRow
from backlog_syphon.rows import struct_of
from backlog_syphon.storage import delta

CHECKPOINT_SCHEMA = struct_of(CheckpointRow)
# Columns a checkpoint table written by an older version lacks, with what they mean there.
_CHECKPOINT_DEFAULTS = {"incarnation": 1, "delivered_enqueued_ms": None, "purged_enqueued_ms": None,
                        "ended_run_id": None}


def read_checkpoint(spark: SparkSession, checkpoint_table: str) -> dict[str, CheckpointRow]:
    """The checkpoint rows by queue; none before the table's first write. A table an older version
    wrote (without incarnations and enqueue times) reads as the first incarnation."""
    table = delta.existing_table(spark, checkpoint_table)
    if table is None:
        return {}
    rows = {}
    for row in table.collect():
        values = {**_CHECKPOINT_DEFAULTS, **row.asDict()}
        values = {name: values[name] for name in CHECKPOINT_SCHEMA.fieldNames()}
        rows[row["backlog_queue"]] = CheckpointRow(**{**values, "updated_at": delta.as_utc(values["updated_at"])})
    return rows


def ended_run(spark: SparkSession, checkpoint_table: str) -> str | None:
    """The run whose clean end last rewrote the checkpoint table (``CheckpointRow.ended_run_id``), or None
    (a run goes on, or crashed, or the table is older or empty)."""
    table = delta.existing_table(spark, checkpoint_table)
    if table is None or "ended_run_id" not in table.columns:
        return None
    row = table.select("ended_run_id").limit(1).first()
    return None if row is None else row["ended_run_id"]


def write_checkpoint(spark: SparkSession, checkpoint_table: str, rows: list[CheckpointRow], *,
                     app_id: str | None = None, version: int | None = None) -> None:
    """Replace the checkpoint table's rows (one per queue) with the sink's current state.

    The table is tiny and the sink is its only writer, so an overwrite is both simpler and several
    times faster than a MERGE. With ``app_id``/``version`` a repeated write is skipped.
    """
    frame = delta.local_frame(spark, sorted(rows, key=lambda row: row.backlog_queue), CHECKPOINT_SCHEMA)
    writer = frame.write.format("delta").mode("overwrite")
    if app_id is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", version)
    delta.save(writer, checkpoint_table)
