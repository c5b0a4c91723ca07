"""The lease table: the row saying which run may deliver from the backlog, until when (see ``run.lease``),
written as a compare-and-set on its epoch (``write_lease``), so of two runs racing for it one wins."""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from backlog_syphon.model import Lease
from backlog_syphon.rows import struct_of
from backlog_syphon.storage import delta
from backlog_syphon.storage.commit_lock import commit_lock

logger = logging.getLogger(__name__)

LEASE_SCHEMA = struct_of(Lease)


def read_lease(spark: SparkSession, lease_table: str) -> Lease | None:
    """The lease row (a lease table serves one backlog); None before the first lease was taken."""
    table = delta.existing_table(spark, lease_table)
    if table is None:
        return None
    rows = table.collect()
    if not rows:
        return None
    values = {"process_identity": None, **rows[0].asDict()}
    return Lease(**{name: delta.as_utc(values[name]) if name.endswith("_at") else values[name]
                    for name in LEASE_SCHEMA.fieldNames()})


def write_lease(spark: SparkSession, lease_table: str, lease: Lease, *, confirm: bool = True) -> bool:
    """Write ``lease`` over the row of epoch ``lease.epoch - 1`` (none for epoch 1); True if it was written.

    The first write creates the lease table (two runs creating it at once: one commit wins).
    ``confirm=False`` skips reading the row back (and says True): for a release, which may fail
    harmlessly.

    A compare-and-set: the row is replaced with Delta transaction version ``lease.epoch`` under an
    application id of its own. Delta skips a write whose version is not above the last one recorded
    for that id, and fails one that races with another of the same id, so of two runs writing the
    same epoch exactly one succeeds, and a run that read a stale row cannot replace a newer one. The
    row read back says which. (A plain overwrite costs a fraction of a MERGE; the lease table serves
    one backlog, whose state tables it sits next to, so the row replaces the table's content.)
    """
    frame = delta.local_frame(spark, [lease], LEASE_SCHEMA)
    # The table holds the lease of the one backlog its state tables serve: the row replaces it whole.
    writer = (frame.write.format("delta").mode("overwrite")
              .option("txnAppId", f"backlog-syphon-lease:{lease.lease_key}").option("txnVersion", lease.epoch))
    try:
        with commit_lock(spark, lease_table):
            delta.save(writer, lease_table)
    except Exception as exc:
        # Lost the race: to a commit of the same epoch, or to a run that created the table first
        # (which surfaces as a protocol change, or as a table that already exists).
        if delta.is_commit_conflict(exc) or delta.table_exists(spark, lease_table):
            logger.info("lease write of epoch %d not done (%s)", lease.epoch, type(exc).__name__)
            return False
        raise
    if not confirm:
        return True
    written = read_lease(spark, lease_table)
    return written is not None and (written.epoch, written.run_id) == (lease.epoch, lease.run_id)
