"""The row shapes of the data path, and their Arrow form: backlog rows (what the source produces, one per
backlog message) and outcome rows (what the sink's delivery produces, one per message: the audit table's
rows). Rows travel as Arrow record batches, built column by column. How a backlog row is filled from a
message is ``restore.backlog_rows``'s.

Invariant: every backlog column is nullable, so a source that cannot fill one yields a null, not a failed
batch.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Iterable, Mapping

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from backlog_syphon.model import OutcomeRecord


BACKLOG_ROW_SCHEMA = StructType([
    StructField("backlog_queue", StringType(), True),
    StructField("sequence_number", LongType(), True),
    StructField("enqueued_time", TimestampType(), True),  # enqueue time in the backlog queue
    StructField("message_id", StringType(), True),
    StructField("content_type", StringType(), True),
    StructField("body_size", IntegerType(), True),
    StructField("raw_message", BinaryType(), True),
    StructField("destination", StringType(), True),  # decoded x-ms-path; null when missing or invalid
    StructField("session_id", StringType(), True),
    StructField("partition_key", StringType(), True),  # x-opt-partition-key, kept on the restored message
    StructField("time_to_live_ms", LongType(), True),  # null: no TTL (the destination's default applies)
    StructField("scheduled_enqueue_time", TimestampType(), True),
    StructField("decode_problem_code", StringType(), True),  # the first problem's code
    StructField("decode_problem_reason", StringType(), True),  # every problem's reason, joined with "; "
    # A message read from a dead-letter sub-queue (a re-drive): why it was dead-lettered, as the broker
    # keeps it in the application properties; null elsewhere.
    StructField("dead_letter_reason", StringType(), True),
    StructField("dead_letter_error_description", StringType(), True),
    # The migration mode's rows (``restore.backlog_rows.copy_row_values``): the message's state as the peek
    # showed it (a ``model.MessageState``); null in a backlog row.
    StructField("message_state", StringType(), True),
    # When the backlog copy itself expires in its backlog queue (its enqueue time plus its own time to live
    # there); null: it does not. The broker shows an expired message to a peek until a receive collects it.
    StructField("backlog_expires_time", TimestampType(), True),
])
BACKLOG_ROW_COLUMNS = tuple(BACKLOG_ROW_SCHEMA.fieldNames())

_FIELD_TYPES = {"str": StringType(), "int": LongType(), "Int32": IntegerType(), "datetime": TimestampType(),
                "dt.datetime": TimestampType(), "float": DoubleType(),
                "dict[str,int]": MapType(StringType(), LongType()), "list[str]": ArrayType(StringType())}


def struct_of(record_type) -> StructType:
    """The Spark schema of a table row declared once, as a dataclass or a TypedDict (``model``): its
    fields in order, ``X | None`` nullable, ``Int32`` a 32-bit column, ``dict[str, int]`` a map,
    ``list[str]`` an array."""
    if dataclasses.is_dataclass(record_type):
        annotations = [(f.name, f.type) for f in dataclasses.fields(record_type)]
    else:
        annotations = list(record_type.__annotations__.items())
    fields = []
    for name, annotation in annotations:
        text = str(getattr(annotation, "__forward_arg__", annotation)).replace(" ", "")
        fields.append(StructField(name, _FIELD_TYPES[text.removesuffix("|None")], text.endswith("|None")))
    return StructType(fields)


# One per backlog message and outcome: what the delivery step yields and the audit table stores
# (which adds the partition column ``outcome_date``), declared once as ``model.OutcomeRecord``.
OUTCOME_ROW_SCHEMA = struct_of(OutcomeRecord)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for rows of ``schema`` (timestamps in UTC microseconds), by pyspark's
    own conversion (its keyword for the time zone changed in 4.2)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:  # pyspark 4.0/4.1: UTC is the default
        return to_arrow_schema(schema)


BACKLOG_ROW_ARROW_SCHEMA = arrow_schema(BACKLOG_ROW_SCHEMA)
OUTCOME_ROW_ARROW_SCHEMA = arrow_schema(OUTCOME_ROW_SCHEMA)


def record_batch(rows: Iterable[Mapping], schema: pa.Schema) -> pa.RecordBatch:
    """Rows (mappings with the schema's names) as one Arrow record batch, built column by column."""
    rows = list(rows)
    return pa.RecordBatch.from_arrays([_column([row[f.name] for row in rows], f.type) for f in schema],
                                      schema=schema)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _column(values: list, arrow_type: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(arrow_type):
        # As microseconds since the epoch: converting datetimes one by one makes pyarrow load pandas.
        micros = [None if value is None else (value - _EPOCH) // _MICROSECOND for value in values]
        return pa.array(micros, type=pa.int64()).cast(arrow_type)
    return pa.array(values, type=arrow_type)
