"""The row shapes of the data path, and how to fill them: backlog rows (what the source produces, one
per backlog message) and outcome rows (what the sink's delivery produces, one per message: the audit
table's rows). Rows travel as Arrow record batches, built column by column.

The source and the restore rules agree on the backlog columns (``BACKLOG_ROW_SCHEMA``).
The decoded columns (``destination`` .. ``decode_problem_reason``) come from
:func:`legacy_fields_to_row_values`, so the rules see exactly what :mod:`legacy_properties` decided.

Invariants:
- A row exists for every backlog message, even one that cannot be decoded: it carries a decode
  problem instead of values, so it is dead-lettered with a reason rather than dropped or retried forever.
  A message is decodable only if the codec reads all of it (body included), so a message that could
  only be forwarded half right is dead-lettered instead.
- A data body is measured from its framing, never copied.
- Every backlog column is nullable, so a source that cannot fill one yields a null, not a failed batch.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Iterable, Mapping

import pyarrow as pa
from pyspark.sql.types import (
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

from backlog_syphon.restore.amqp.annotations import DEAD_LETTER_DESCRIPTION_PROPERTY, DEAD_LETTER_REASON_PROPERTY
from backlog_syphon.restore.amqp.message_decoding import decode_envelope
from backlog_syphon.restore.legacy_properties import LegacyFields, decode_legacy_properties, timedelta_to_ms
from backlog_syphon.model import OutcomeRecord, ReasonCode


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
])
BACKLOG_ROW_COLUMNS = tuple(BACKLOG_ROW_SCHEMA.fieldNames())

_FIELD_TYPES = {"str": StringType(), "int": LongType(), "Int32": IntegerType(), "datetime": TimestampType(),
                "dt.datetime": TimestampType(), "float": DoubleType(),
                "dict[str,int]": MapType(StringType(), LongType())}


def struct_of(record_type) -> StructType:
    """The Spark schema of a table row declared once, as a dataclass or a TypedDict (``model``): its
    fields in order, ``X | None`` nullable, ``Int32`` a 32-bit column, ``dict[str, int]`` a map."""
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


def legacy_fields_to_row_values(fields: LegacyFields) -> dict:
    """The decoded columns of a backlog row; the TTL in ms is rounded up so a positive TTL stays positive.

    Unlike the AMQP header, the column is not capped at the uint maximum: it is what the sender asked for.
    """
    return {
        "destination": fields.destination,
        "session_id": fields.session_id,
        "time_to_live_ms": None if fields.time_to_live is None else timedelta_to_ms(fields.time_to_live),
        "scheduled_enqueue_time": fields.scheduled_enqueue_time,
        "decode_problem_code": fields.problems[0].code if fields.problems else None,
        "decode_problem_reason": "; ".join(p.reason for p in fields.problems) if fields.problems else None,
    }


def backlog_row_values(
    backlog_queue: str,
    raw_message: bytes,
    *,
    sequence_number: int | None = None,
    enqueued_time: datetime | None = None,
) -> dict:
    """Every column of ``BACKLOG_ROW_SCHEMA`` for one raw backlog message.

    ``sequence_number`` and ``enqueued_time`` from the peek take precedence over the message's own
    broker annotations (they are the same on a freshly peeked message).
    """
    row = {
        "backlog_queue": backlog_queue,
        "sequence_number": sequence_number,
        "enqueued_time": enqueued_time,
        "raw_message": bytes(raw_message),
    }
    try:
        envelope = decode_envelope(row["raw_message"])
        content_type = envelope.properties.content_type
        row.update(
            sequence_number=sequence_number if sequence_number is not None else envelope.sequence_number,
            enqueued_time=enqueued_time if enqueued_time is not None else envelope.enqueued_time,
            message_id=message_id_text(envelope.properties.message_id),
            content_type=str(content_type) if content_type is not None else None,
            body_size=envelope.body_size,
            partition_key=envelope.partition_key,
        )
        row.update(legacy_fields_to_row_values(decode_legacy_properties(envelope.application_properties)))
        row.update(dead_letter_fields(envelope.application_properties))
    except Exception as error:  # noqa: BLE001 - one message's problem is that message's outcome
        # AmqpDecodeError, a broker annotation of the wrong type or range, or anything else this
        # message makes the decoding trip over: it is dead-lettered with the reason, never the batch.
        reason = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        return {
            **dict.fromkeys(BACKLOG_ROW_COLUMNS),
            **row,
            "body_size": len(raw_message),
            "decode_problem_code": ReasonCode.UNDECODABLE_MESSAGE,
            "decode_problem_reason": reason[:1024],
        }
    return {column: row[column] for column in BACKLOG_ROW_COLUMNS}


def dead_letter_fields(application_properties) -> dict:
    """The dead-letter reason and description a message carries (``DeadLetterReason`` and
    ``DeadLetterErrorDescription``, which Service Bus sets when it dead-letters a message); null when absent."""
    found = {}
    for column, name in (("dead_letter_reason", DEAD_LETTER_REASON_PROPERTY),
                         ("dead_letter_error_description", DEAD_LETTER_DESCRIPTION_PROPERTY)):
        value = application_properties.get(name) if hasattr(application_properties, "get") else None
        found[column] = None if value is None else str(value)[:1024]
    return found


def message_id_text(message_id) -> str | None:
    """A MessageId as text: strings as they are, uuids and numbers in their usual form, binary as hex."""
    if message_id is None:
        return None
    if isinstance(message_id, (bytes, bytearray)):
        return bytes(message_id).hex()
    if isinstance(message_id, int) and not isinstance(message_id, bool):
        return str(int(message_id))
    return str(message_id)  # str, Symbol, uuid.UUID
