"""The state tables' upkeep through Delta's own means: their table properties (compaction, log and file
retention, checkpoints), and ``OPTIMIZE`` and ``VACUUM`` for the maintenance command (``run.maintain``).

What grows with a long life, and what bounds it (docs/running/table-upkeep.md):
- the audit table gains a data file per batch: auto compaction (``delta.autoOptimize.autoCompact``) rewrites
  a day's small files into one once ``spark.databricks.delta.autoCompact.minNumFiles`` (50) of them gather
  in the partition the batch wrote; ``OPTIMIZE`` compacts what a closed day kept;
- every commit adds log entries (its JSON and its checksum file): ``delta.logRetentionDuration`` says how
  long they stay; Delta drops older ones when it writes a log checkpoint (every ``delta.checkpointInterval``
  commits), a day at a time. Each commit lists the whole ``_delta_log`` folder on a file system without a
  listing from a start key (local, HDFS, ADLS and GCS with open-source Delta), so the folder's size is a
  cost every batch pays: the window is ``storage.table_retention_days`` (1 day by default), and the folder
  holds up to a day more than that;
- files a compaction or an overwrite replaced stay on storage until ``VACUUM`` removes those older than
  ``delta.deletedFileRetentionDuration`` (the same window: Delta refuses a log window shorter than it);
- the checkpoint and lease tables are overwritten whole per batch (one live file each): nothing to compact,
  only replaced files to vacuum; the runs table gains a row per run: auto compaction too.

The audit append stays idempotent: an auto compaction is a commit of its own made after the append's
commit (a post-commit hook), and Delta keeps every transaction identifier (``txnAppId``/``txnVersion``)
across compactions, log clean-ups and checkpoints (``delta.setTransactionRetentionDuration`` is left unset:
set, it would forget them, and a replayed batch could append twice).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, TypeVar

from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

# The state tables' time-travel window (``storage.table_retention_days``): their log and the files their
# compactions and rewrites replaced. A day: the audit's rows are its record whatever the window, and a
# shorter log is a cheaper listing at every batch (design.md, "Over a long life").
DEFAULT_RETENTION_DAYS = 1

Properties = tuple[tuple[str, str], ...]
AUTO_COMPACT: Properties = (("delta.autoOptimize.autoCompact", "true"),)


def retention_properties(days: int) -> Properties:
    """The log and deleted-file retention of ``days`` days: one window, as time travel needs both and Delta
    refuses a log retention shorter than the deleted-file retention."""
    window = f"interval {int(days)} days"
    return (("delta.logRetentionDuration", window), ("delta.deletedFileRetentionDuration", window))


def with_retention(properties: Properties, retention_days: int) -> Properties:
    """A table's properties with the state tables' log and file window of ``retention_days``."""
    return properties + retention_properties(retention_days)


# What Delta keeps of replaced files where a table does not say (its own default).
DELTA_DEFAULT_FILE_RETENTION = "interval 1 week"

# Attempts of an OPTIMIZE or VACUUM that lost a race to another commit (a syphon's append, its own
# auto compaction), and the pause between them.
MAINTENANCE_ATTEMPTS = 5
MAINTENANCE_RETRY_SECONDS = 2.0

T = TypeVar("T")


def properties_to_set(current: Mapping[str, str], wanted: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The properties among ``wanted`` that ``current`` lacks or holds with another value (pure): an
    existing table gets one ``ALTER TABLE`` for these, and none when this is empty."""
    return {key: value for key, value in wanted if current.get(key) != value}


def table_properties(spark: SparkSession, sql_name: str) -> dict[str, str]:
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES {sql_name}").collect()}


def set_properties(spark: SparkSession, sql_name: str, properties: Mapping[str, str]) -> None:
    settings = ", ".join(f"'{key}' = '{value}'" for key, value in properties.items())
    spark.sql(f"ALTER TABLE {sql_name} SET TBLPROPERTIES ({settings})")


def optimize(spark: SparkSession, sql_name: str) -> tuple[int, int]:
    """Compact the table's small files (bin-packing, per partition); (files removed, files added)."""
    row = spark.sql(f"OPTIMIZE {sql_name}").first()
    metrics = row["metrics"] if row is not None else None
    return (0, 0) if metrics is None else (metrics["numFilesRemoved"], metrics["numFilesAdded"])


def vacuum(spark: SparkSession, sql_name: str) -> None:
    """Delete the files no version of the table's window reads (never a file the table holds now): the window
    is the table's own ``delta.deletedFileRetentionDuration``, as the syphon last set it under its lease. A
    table an older version left with a longer window keeps it until a run sets the configured one (a property
    change fails a racing append, so maintenance, which holds no lease, never makes one)."""
    spark.sql(f"VACUUM {sql_name}").collect()


def retried(action: Callable[[], T], is_conflict: Callable[[BaseException], bool], what: str, *,
            attempts: int = MAINTENANCE_ATTEMPTS, pause: float = MAINTENANCE_RETRY_SECONDS,
            sleep: Callable[[float], None] = time.sleep) -> T:
    """``action()``, run again (up to ``attempts`` times) when it lost an optimistic-concurrency race: an
    OPTIMIZE whose files a concurrent compaction rewrote first, a commit behind a syphon's. Anything
    else, or the last conflict, is raised."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if attempt == attempts or not is_conflict(exc):
                raise
            logger.info("%s lost a race to another commit (%s); attempt %d of %d in %.0f s", what,
                        type(exc).__name__, attempt + 1, attempts, pause)
            sleep(pause)
    raise AssertionError("unreachable")
