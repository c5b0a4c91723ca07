"""``--maintain``: compact and vacuum the state tables (audit, checkpoint, lease, runs), Delta's own way.

For each table that exists: ``OPTIMIZE`` where the syphon appends (the audit and runs tables: the audit's
closed days keep the small files auto compaction had not yet gathered; ``storage.upkeep``), then ``VACUUM``
keeping the table's own time-travel window (its ``delta.deletedFileRetentionDuration``, which a run sets to
``storage.table_retention_days`` under its lease). The audit is the record of what moved: neither removes a
row. OPTIMIZE rewrites files without changing data; VACUUM deletes only files that no version of the window
reads, never one the table holds now, and Delta's safety check stays on.

It takes no lease, and runs safely while a syphon appends: an OPTIMIZE commit changes no data, so a
blind append never conflicts with it (Delta's optimistic concurrency lets both commit); where it loses a
race (a syphon's auto compaction rewrote the same files first) it is retried (``storage.upkeep.retried``).
The checkpoint and lease tables are not compacted: the syphon overwrites each whole at every write, which
leaves nothing for a compaction to gain, and an overwrite reads the files it replaces, so one racing an
OPTIMIZE of them would fail (a failed checkpoint write fails its batch). VACUUM commits nothing a writer
conflicts with. Taking the lease would stop deliveries while the tables are tidied: the one thing the
lease guards (one run delivering) is never at stake here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pyspark.sql import SparkSession

from backlog_syphon.config import SyphonConfig
from backlog_syphon.errors import describe
from backlog_syphon.storage import delta, upkeep

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableUpkeep:
    """What maintenance did to one table."""

    table: str
    exists: bool
    window: str = ""  # what VACUUM kept: the table's delta.deletedFileRetentionDuration
    files_removed: int = 0  # by OPTIMIZE (small files compacted)
    files_added: int = 0
    compacted: bool = True  # False: a table the syphon rewrites whole (checkpoint, lease), only vacuumed
    seconds: float = 0.0
    error: str | None = None  # one line: why this table was not maintained

    def line(self) -> str:
        if not self.exists:
            return f"  {self.table}: does not exist yet (nothing to do)"
        if self.error is not None:
            return f"  {self.table}: FAILED: {self.error}"
        compacted = (f"compacted {self.files_removed} file(s) into {self.files_added}" if self.compacted
                     else "rewritten whole by the syphon, not compacted")
        return f"  {self.table}: {compacted}, vacuumed files past its window ({self.window}) ({self.seconds:.1f} s)"


@dataclass(frozen=True)
class MaintenanceReport:
    tables: tuple[TableUpkeep, ...]

    @property
    def failed(self) -> bool:
        return any(table.error is not None for table in self.tables)

    def lines(self) -> list[str]:
        verdict = ("maintenance failed for some tables: run it again (a syphon may go on meanwhile)"
                   if self.failed else "maintenance done")
        return ["state tables (OPTIMIZE where the syphon appends, then VACUUM):",
                *(table.line() for table in self.tables), verdict]


def state_tables(config: SyphonConfig) -> tuple[tuple[str, bool], ...]:
    """Each state table, and whether maintenance compacts it: those the syphon appends to (module docstring)."""
    storage = config.storage
    return ((storage.audit_table, True), (storage.checkpoint_table, False), (storage.resolved_lease_table, False),
            (storage.resolved_runs_table, True))


def maintain_table(spark: SparkSession, table: str, *, compact: bool = True) -> TableUpkeep:
    """OPTIMIZE (unless not ``compact``) then VACUUM one table, each retried on a concurrent-modification
    conflict."""
    if not delta.table_exists(spark, table):
        return TableUpkeep(table, exists=False)
    name = delta.sql_name(table)
    started = time.monotonic()
    window = ""
    try:
        window = upkeep.table_properties(spark, name).get("delta.deletedFileRetentionDuration",
                                                          upkeep.DELTA_DEFAULT_FILE_RETENTION)
        removed, added = upkeep.retried(lambda: upkeep.optimize(spark, name), delta.is_commit_conflict,
                                        f"OPTIMIZE {table}") if compact else (0, 0)
        upkeep.retried(lambda: upkeep.vacuum(spark, name), delta.is_commit_conflict, f"VACUUM {table}")
    except Exception as exc:  # noqa: BLE001 - one table's failure is reported, the others are still maintained
        logger.debug("maintenance of %s failed", table, exc_info=True)
        return TableUpkeep(table, exists=True, window=window, compacted=compact, seconds=time.monotonic() - started,
                           error=describe(exc))
    return TableUpkeep(table, exists=True, window=window, files_removed=removed, files_added=added, compacted=compact,
                       seconds=time.monotonic() - started)


def maintain(spark: SparkSession, config: SyphonConfig) -> MaintenanceReport:
    """Maintain every state table of ``config`` in turn (one after the other: each is a few Spark jobs)."""
    return MaintenanceReport(tuple(maintain_table(spark, table, compact=compact)
                                   for table, compact in state_tables(config)))
