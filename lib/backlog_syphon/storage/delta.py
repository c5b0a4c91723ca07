"""What every table of the syphon shares: reading a table setting (a path, with '/' or a scheme, or a catalog
table name), creating a table with exactly its declared schema, giving it the properties it lacks, a few
driver-side records as a DataFrame, and telling a lost commit race from a failure."""

from __future__ import annotations

import datetime as dt
import logging
import time

import pyarrow as pa
from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
from pyspark.sql.types import StructField, StructType

from backlog_syphon.rows import arrow_schema, record_batch
from backlog_syphon.storage import upkeep
from backlog_syphon.storage.commit_lock import commit_lock

logger = logging.getLogger(__name__)


def is_path(table: str) -> bool:
    return "/" in table or ":" in table


def read_table(spark: SparkSession, table: str) -> DataFrame:
    return spark.read.format("delta").load(table) if is_path(table) else spark.read.table(table)


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
    return f"delta.`{table}`" if is_path(table) else table


def save(writer: DataFrameWriter, table: str) -> None:
    """Run ``writer`` (a Delta write) into the table setting ``table``."""
    if is_path(table):
        writer.save(table)
    else:
        writer.saveAsTable(table)


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
        # Not "IF NOT EXISTS": whether this call created the table must be known
        # (``storage.state_tables.create_tables``).
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
    (``storage.state_tables.set_upkeep_properties``), when no other run appends to them."""
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


def local_frame(spark: SparkSession, records: list, schema: StructType) -> DataFrame:
    """A few records (dataclasses with ``schema``'s fields) as a DataFrame, handed to Spark as Arrow.

    Not as a list of tuples: classic pyspark has a Python worker re-pickle such a list in the tasks that
    read it, and the first one of a session starts a Python daemon (about a second of CPU)."""
    arrow = arrow_schema(schema)
    batch = record_batch([{name: getattr(record, name) for name in schema.fieldNames()} for record in records], arrow)
    return spark.createDataFrame(pa.Table.from_batches([batch], arrow), schema)


def as_utc(value: dt.datetime) -> dt.datetime:
    """A timestamp read from a table, in UTC."""
    # Spark hands timestamps to Python as naive local times; astimezone reads them as such.
    return value.astimezone(dt.timezone.utc)


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
