"""All Delta I/O of the syphon: its four tables, audit, checkpoint, lease and runs (and, beside them,
the stop marker a run leaves for a Connect server and the id in a streaming checkpoint, read through Spark).

- ``audit``: one row per backlog message and outcome, appended once per micro-batch with
  ``txnAppId``/``txnVersion`` so a replayed batch never appends twice. Partitioned by outcome date.
- ``checkpoint``: one row per backlog queue: delivered-through and purged-through sequence
  numbers, last batch, counts. Rewritten whole after each batch (it is tiny and the sink is its
  only writer), under the same transaction identifiers.
- ``lease``: the row saying which run may deliver from the backlog, until when (see ``run.lease``),
  written as a compare-and-set on its epoch (see ``write_lease``), so of two runs racing for it one wins.
- ``runs``: one row per run, appended once the run has ended (see ``append_run``).
Each is created by its first write, with a fixed schema, and is readable by any Delta reader; until
then reading it finds nothing recorded.

A table setting is a path (it contains '/' or a scheme) or a catalog table name.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StructField, StructType

from backlog_syphon.model import FINAL_OUTCOMES, CheckpointRow, Lease, Outcome, RunRow
from backlog_syphon.restore.queue_names import DEAD_LETTER_SUBQUEUE
from backlog_syphon.rows import OUTCOME_ROW_SCHEMA, arrow_schema, record_batch, struct_of
from backlog_syphon.storage import upkeep
from backlog_syphon.storage.commit_lock import commit_lock

# What the sink produces per message; the table adds the partition column ``outcome_date``.
AUDIT_ROW_SCHEMA = OUTCOME_ROW_SCHEMA
AUDIT_SCHEMA = StructType(AUDIT_ROW_SCHEMA.fields + [StructField("outcome_date", DateType(), False)])

logger = logging.getLogger(__name__)

CHECKPOINT_SCHEMA = struct_of(CheckpointRow)
# Columns a checkpoint table written by an older version lacks, with what they mean there.
_CHECKPOINT_DEFAULTS = {"incarnation": 1, "delivered_enqueued_ms": None, "purged_enqueued_ms": None,
                        "ended_run_id": None}
LEASE_SCHEMA = struct_of(Lease)
RUNS_SCHEMA = struct_of(RunRow)
# The checkpoint and lease tables are rewritten whole (a row per queue, one row) by a commit per batch
# and a few per run. Delta writes a checkpoint of a table's log every ``checkpointInterval`` commits
# (10 by default), five Spark jobs (seconds) in the commit that makes it. Their logs are small (an add
# and a remove per commit), so replaying 50 commits costs less than checkpointing every 10: a batch's
# write is a quarter quicker on average. Each holds one live file: nothing to compact, only the files
# it replaced to vacuum. Log and file retention (``storage.table_retention_days``): ``storage.upkeep``.
REWRITTEN_TABLE_PROPERTIES: upkeep.Properties = (("delta.checkpointInterval", "50"),)
# Delta collects min/max statistics of a table's first 32 columns for every file it writes, row by row:
# for the audit table that was half of each batch's append (1.5 s for 10,000 rows; 0.77 s with these).
# These are the columns the syphon's own reads filter on (a restart's unsettled rows by queue, sequence
# number and enqueue time; an attempt's rows by batch; a re-drive's by outcome); the partition column
# prunes by day. The audit table is appended to once per batch and read by filters: Delta's checkpoint
# interval (10, stated), and auto compaction so that its files do not grow with the batches.
AUDIT_TABLE_PROPERTIES: upkeep.Properties = (("delta.dataSkippingStatsColumns",
                                              "batch_id,backlog_queue,sequence_number,enqueued_time,outcome"),
                                             ("delta.checkpointInterval", "10")) + upkeep.AUTO_COMPACT
# The runs table gains a row (a file) per run.
RUNS_TABLE_PROPERTIES: upkeep.Properties = upkeep.AUTO_COMPACT


def with_retention(properties: upkeep.Properties, retention_days: int) -> upkeep.Properties:
    """A table's properties with the state tables' log and file window of ``retention_days``."""
    return properties + upkeep.retention_properties(retention_days)


def _is_path(table: str) -> bool:
    return "/" in table or ":" in table


def read_table(spark: SparkSession, table: str) -> DataFrame:
    return spark.read.format("delta").load(table) if _is_path(table) else spark.read.table(table)


def existing_table(spark: SparkSession, table: str) -> DataFrame | None:
    """The table, resolved (its schema known), or None where it does not exist: one round trip."""
    from pyspark.errors import AnalysisException

    try:
        frame = read_table(spark, table)
        frame.schema  # noqa: B018 - resolving the table is the check (lazy over Spark Connect)
    except AnalysisException:
        return None
    return frame


def table_exists(spark: SparkSession, table: str) -> bool:
    return existing_table(spark, table) is not None


def sql_name(table: str) -> str:
    """How SQL names a table setting: a path or a catalog name."""
    return f"delta.`{table}`" if _is_path(table) else table


def _ddl(field: StructField, *, constraints: bool = True) -> str:
    null = "" if field.nullable or not constraints else " NOT NULL"
    return f"`{field.name}` {field.dataType.simpleString().upper()}{null}"


def create_table(spark: SparkSession, table: str, schema: StructType, partition_by: tuple[str, ...] = (),
                 properties: tuple[tuple[str, str], ...] = ()) -> bool:
    """Create ``table`` with exactly ``schema`` unless it exists, so its schema never depends on how its
    first writer spelled its types (a Spark Connect write declares strings with a collation, which
    other Delta readers refuse). Two runs creating it at once: one creates it, the other finds it.
    A table an older version made gets the columns it lacks (nullable: its rows predate them), and not
    the ``properties`` it lacks: those wait for the lease (``set_missing_properties``).
    True when this call created it (empty), False when it existed or another run created it."""
    existing = existing_table(spark, table)
    if existing is not None:
        missing = [f for f in schema.fields if f.name not in existing.schema.fieldNames()]
        if missing:
            spark.sql(f"ALTER TABLE {sql_name(table)} ADD COLUMNS "
                      f"({', '.join(_ddl(f, constraints=False) for f in missing)})")
        return False
    columns = ", ".join(_ddl(f) for f in schema.fields)
    clauses = f" PARTITIONED BY ({', '.join(partition_by)})" if partition_by else ""
    settings = ", ".join(f"'{key}' = '{value}'" for key, value in properties)
    if settings:
        clauses += f" TBLPROPERTIES ({settings})"
    try:
        # Not "IF NOT EXISTS": whether this call created the table must be known (see create_tables).
        with commit_lock(spark, table):
            spark.sql(f"CREATE TABLE {sql_name(table)} ({columns}) USING DELTA{clauses}")
    except Exception as exc:
        if is_commit_conflict(exc) or _created_meanwhile(spark, table, exc):
            return False
        raise
    return True


def set_missing_properties(spark: SparkSession, table: str, properties: tuple[tuple[str, str], ...]) -> None:
    """Give a table an older version created the ``properties`` it lacks or holds otherwise (one commit,
    once: a start that finds them all as wanted commits nothing). Two runs doing so at once: one commit
    wins, the other finds it done next time.

    A property change is a metadata commit, and Delta fails every concurrent append with it
    (``MetadataChangedException``): a run makes it only once it holds the lease of its state tables
    (``set_upkeep_properties``), when no other run appends to them."""
    if not properties:
        return
    try:
        missing = upkeep.properties_to_set(upkeep.table_properties(spark, sql_name(table)), properties)
        if missing:
            with commit_lock(spark, table):
                upkeep.set_properties(spark, sql_name(table), missing)
            logger.info("set %s on %s", ", ".join(f"{key}={value}" for key, value in missing.items()), table)
    except Exception as exc:  # noqa: BLE001 - only speed and upkeep are at stake
        if not is_commit_conflict(exc):
            logger.warning("could not set %s on %s (%s); its upkeep stays as it was", ", ".join(dict(properties)),
                           table, type(exc).__name__)


def _created_meanwhile(spark: SparkSession, table: str, exc: BaseException) -> bool:
    """Whether another run created ``table`` while this one tried to. Its location can already hold
    files, or already count as a table, before its first commit is readable ("non-empty location",
    "already exists"): then that commit is waited for."""
    condition = getattr(exc, "getCondition", lambda: None)() or ""
    creating = condition in _CREATED_MEANWHILE_CONDITIONS or "ALREADY_EXISTS" in condition
    attempts = _CREATION_WAIT_POLLS if creating else 1
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.5)
        if table_exists(spark, table):
            return True
    return False


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
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="create-table") as pool:
        created = {table: pool.submit(create_table, spark, table, schema, partition_by,
                                      with_retention(properties, retention_days))
                   for table, schema, partition_by, properties in (
                       (audit_table, AUDIT_SCHEMA, ("outcome_date",), AUDIT_TABLE_PROPERTIES),
                       (checkpoint_table, CHECKPOINT_SCHEMA, (), REWRITTEN_TABLE_PROPERTIES),
                       (lease_table, LEASE_SCHEMA, (), REWRITTEN_TABLE_PROPERTIES))}
        return {table for table, future in created.items() if future.result()}


def set_upkeep_properties(spark: SparkSession, audit_table: str, checkpoint_table: str, lease_table: str, *,
                          retention_days: int = upkeep.DEFAULT_RETENTION_DAYS) -> None:
    """Give the three tables the upkeep properties (with a window of ``retention_days``) that an older version,
    or another setting, did not (``set_missing_properties``), at once: a start that finds them set pays one
    round trip, not three."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="table-upkeep") as pool:
        list(pool.map(lambda table, properties: set_missing_properties(spark, table,
                                                                       with_retention(properties, retention_days)),
                      (audit_table, checkpoint_table, lease_table),
                      (AUDIT_TABLE_PROPERTIES, REWRITTEN_TABLE_PROPERTIES, REWRITTEN_TABLE_PROPERTIES)))


def read_checkpoint(spark: SparkSession, checkpoint_table: str) -> dict[str, CheckpointRow]:
    """The checkpoint rows by queue; none before the table's first write. A table an older version
    wrote (without incarnations and enqueue times) reads as the first incarnation."""
    table = existing_table(spark, checkpoint_table)
    if table is None:
        return {}
    rows = {}
    for row in table.collect():
        values = {**_CHECKPOINT_DEFAULTS, **row.asDict()}
        values = {name: values[name] for name in CHECKPOINT_SCHEMA.fieldNames()}
        rows[row["backlog_queue"]] = CheckpointRow(**{**values, "updated_at": _utc(values["updated_at"])})
    return rows


def ended_run(spark: SparkSession, checkpoint_table: str) -> str | None:
    """The run whose clean end last rewrote the checkpoint table (``CheckpointRow.ended_run_id``), or None
    (a run goes on, or crashed, or the table is older or empty)."""
    table = existing_table(spark, checkpoint_table)
    if table is None or "ended_run_id" not in table.columns:
        return None
    row = table.select("ended_run_id").limit(1).first()
    return None if row is None else row["ended_run_id"]


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
    audit = existing_table(spark, audit_table)
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
    audit = existing_table(spark, audit_table)
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
    audit = existing_table(spark, audit_table)
    if audit is None:
        return None
    return (audit.where((F.col("outcome") == Outcome.DEAD_LETTERED)
                        & F.lower(F.col("backlog_queue")).endswith("/" + DEAD_LETTER_SUBQUEUE.lower()))
            .select("backlog_queue", "sequence_number", F.unix_millis("enqueued_time").alias("enqueued_ms")))


def append_audit(audit_table: str, outcomes: DataFrame, app_id: str, version: int) -> None:
    """Append a batch's outcome rows (written by the executors); the same ``version`` twice appends once.

    Unsent rows are appended too: they tell a restart where a recorded span ends.
    """
    frame = outcomes.withColumn("outcome_date", F.to_date("outcome_time"))
    writer = (frame.write.format("delta").mode("append").partitionBy("outcome_date")
              .option("txnAppId", app_id).option("txnVersion", version))
    if _is_path(audit_table):
        writer.save(audit_table)
    else:
        writer.saveAsTable(audit_table)


def write_checkpoint(spark: SparkSession, checkpoint_table: str, rows: list[CheckpointRow], *,
                     app_id: str | None = None, version: int | None = None) -> None:
    """Replace the checkpoint table's rows (one per queue) with the sink's current state.

    The table is tiny and the sink is its only writer, so an overwrite is both simpler and several
    times faster than a MERGE. With ``app_id``/``version`` a repeated write is skipped.
    """
    frame = local_frame(spark, sorted(rows, key=lambda row: row.backlog_queue), CHECKPOINT_SCHEMA)
    writer = frame.write.format("delta").mode("overwrite")
    if app_id is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", version)
    if _is_path(checkpoint_table):
        writer.save(checkpoint_table)
    else:
        writer.saveAsTable(checkpoint_table)


def local_frame(spark: SparkSession, records: list, schema: StructType) -> DataFrame:
    """A few records (dataclasses with ``schema``'s fields) as a DataFrame, handed to Spark as Arrow.

    Not as a list of tuples: classic pyspark has a Python worker re-pickle such a list in the tasks that
    read it, and the first one of a session starts a Python daemon (about a second of CPU)."""
    arrow = arrow_schema(schema)
    batch = record_batch([{name: getattr(record, name) for name in schema.fieldNames()} for record in records], arrow)
    return spark.createDataFrame(pa.Table.from_batches([batch], arrow), schema)


def write_marker(spark: SparkSession, path: str) -> None:
    """Leave a marker at ``path`` (a one-line text dataset), written through Spark so that a Connect
    server sees it on its own file system."""
    spark.createDataFrame([("stop",)], "marker string").coalesce(1).write.mode("overwrite").text(path)


def marker_exists(spark: SparkSession, path: str) -> bool:
    try:
        return spark.read.text(path).limit(1).count() > 0
    except Exception:  # noqa: BLE001 - no marker (the path does not exist)
        return False


def streaming_query_id(spark: SparkSession, checkpoint_location: str) -> str | None:
    """The id Spark keeps in a streaming checkpoint's ``metadata`` file (it changes when the checkpoint
    is deleted and created again); None when it cannot be read. Read through Spark, so it works for
    any file system the query uses, over Spark Connect too."""
    import json

    metadata = checkpoint_location.rstrip("/") + "/metadata"
    local = metadata.removeprefix("file:") if ":" not in metadata.removeprefix("file:") else None
    try:
        if local is not None and os.path.exists(local):  # a local folder: no Spark job for one line
            with open(local, encoding="utf-8") as handle:
                return json.loads(handle.readline())["id"]
        line = spark.read.text(metadata).first()
        return json.loads(line[0])["id"] if line is not None else None
    except Exception:  # noqa: BLE001 - no checkpoint yet, or unreadable: the caller falls back
        return None


# --- the lease ----------------------------------------------------------------------------------

def read_lease(spark: SparkSession, lease_table: str) -> Lease | None:
    """The lease row (a lease table serves one backlog); None before the first lease was taken."""
    table = existing_table(spark, lease_table)
    if table is None:
        return None
    rows = table.collect()
    if not rows:
        return None
    values = {"process_identity": None, **rows[0].asDict()}
    return Lease(**{name: _utc(values[name]) if name.endswith("_at") else values[name]
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
    frame = local_frame(spark, [lease], LEASE_SCHEMA)
    # The table holds the lease of the one backlog its state tables serve: the row replaces it whole.
    writer = (frame.write.format("delta").mode("overwrite")
              .option("txnAppId", f"backlog-syphon-lease:{lease.lease_key}").option("txnVersion", lease.epoch))
    try:
        with commit_lock(spark, lease_table):
            if _is_path(lease_table):
                writer.save(lease_table)
            else:
                writer.saveAsTable(lease_table)
    except Exception as exc:
        # Lost the race: to a commit of the same epoch, or to a run that created the table first
        # (which surfaces as a protocol change, or as a table that already exists).
        if is_commit_conflict(exc) or table_exists(spark, lease_table):
            logger.info("lease write of epoch %d not done (%s)", lease.epoch, type(exc).__name__)
            return False
        raise
    if not confirm:
        return True
    written = read_lease(spark, lease_table)
    return written is not None and (written.epoch, written.run_id) == (lease.epoch, lease.run_id)


# --- the runs table, and what the status command reads -------------------------------------------

def append_run(spark: SparkSession, runs_table: str, row: RunRow, *,
               retention_days: int = upkeep.DEFAULT_RETENTION_DAYS) -> None:
    """Append a run's row, creating the table first where it does not exist (a table an older version
    made gets the columns and the properties it lacks; its log and file window: ``retention_days``). Runs append blindly, so two never conflict, except
    with the one property change an upgrade makes (the runs table is no one lease's): such an append is
    made again. On a local path the commits take turns (``commit_lock``)."""
    properties = with_retention(RUNS_TABLE_PROPERTIES, retention_days)
    if not create_table(spark, runs_table, RUNS_SCHEMA, properties=properties):
        set_missing_properties(spark, runs_table, properties)
    writer = local_frame(spark, [row], RUNS_SCHEMA).write.format("delta").mode("append")

    def append() -> None:
        with commit_lock(spark, runs_table):
            if _is_path(runs_table):
                writer.save(runs_table)
            else:
                writer.saveAsTable(runs_table)

    upkeep.retried(append, is_commit_conflict, f"the runs table's append to {runs_table}")


def read_runs(spark: SparkSession, runs_table: str, limit: int) -> list[RunRow]:
    """The last ``limit`` runs, newest first; none before the table's first write."""
    table = existing_table(spark, runs_table)
    if table is None:
        return []
    rows = table.orderBy(F.desc("ended_at")).limit(limit).collect()
    # A table an older version made lacks the newest columns until a run appends to it: they read as null.
    return [RunRow(**{name: _utc(values[name]) if name.endswith("_at") else values.get(name)
                      for name in RUNS_SCHEMA.fieldNames()}) for values in (row.asDict() for row in rows)]


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


_CREATION_WAIT_POLLS = 40  # half a second apart: a first commit on slow storage
_CREATED_MEANWHILE_CONDITIONS = ("DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION", "TABLE_OR_VIEW_ALREADY_EXISTS")
_CONFLICT_CONDITIONS = ("DELTA_CONCURRENT_", "DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED")


def _delta_exception_classes() -> tuple[type[BaseException], ...]:
    # delta-spark's Python package is optional: a cluster given Delta by --packages has only its
    # JARs, and then Delta's errors arrive as Spark's generic ones, with their condition.
    try:
        from delta import exceptions
    except ImportError:
        return ()
    return tuple(getattr(exceptions, name) for name in exceptions.__all__)


# Importing delta.exceptions also makes a classic session raise Delta's classes instead of Py4J errors.
_delta_exception_classes()


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether a write lost an optimistic-concurrency race to another commit.

    A classic session raises Delta's own exception classes (siblings, not one family); Spark
    Connect raises its generic ones, which carry Delta's error condition instead.
    """
    if isinstance(exc, _delta_exception_classes()):
        return True
    condition = getattr(exc, "getCondition", lambda: None)() or ""
    return condition.startswith(_CONFLICT_CONDITIONS)


def _utc(value: dt.datetime) -> dt.datetime:
    # Spark hands timestamps to Python as naive local times; astimezone reads them as such.
    return value.astimezone(dt.timezone.utc)
