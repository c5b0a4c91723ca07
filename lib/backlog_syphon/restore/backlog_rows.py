"""How a backlog row is filled from one raw backlog message (``rows.BACKLOG_ROW_SCHEMA``): the decoded
columns (``destination`` .. ``decode_problem_reason``) come from :func:`legacy_fields_to_row_values`, so
the rules see exactly what :mod:`legacy_properties` decided.

Invariants:
- A row exists for every backlog message, even one that cannot be decoded: it carries a decode
  problem instead of values, so it is dead-lettered with a reason rather than dropped or retried forever.
  A message is decodable only if the codec reads all of it (body included), so a message that could
  only be forwarded half right is dead-lettered instead.
- A data body is measured from its framing, never copied.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from backlog_syphon.model import MessageState, ReasonCode
from backlog_syphon.restore.amqp.annotations import (
    DEAD_LETTER_DESCRIPTION_PROPERTY,
    DEAD_LETTER_REASON_PROPERTY,
    MESSAGE_STATE_ANNOTATION,
)
from backlog_syphon.restore.amqp.message_decoding import decode_envelope
from backlog_syphon.restore.legacy_properties import LegacyFields, decode_legacy_properties, timedelta_to_ms
from backlog_syphon.rows import BACKLOG_ROW_COLUMNS


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
    copy: bool = False,
) -> dict:
    """Every column of ``BACKLOG_ROW_SCHEMA`` for one raw backlog message.

    ``sequence_number`` and ``enqueued_time`` from the peek take precedence over the message's own
    broker annotations (they are the same on a freshly peeked message). ``copy``: the migration mode's row of
    a message sent as it was (``copy_fields``), not restored from legacy properties.
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
        if copy:
            row.update(copy_fields(envelope))
        else:
            row.update(legacy_fields_to_row_values(decode_legacy_properties(envelope.application_properties)))
        row.update(dead_letter_fields(envelope.application_properties))
        row["backlog_expires_time"] = expires_time(row["enqueued_time"], envelope.header.ttl_ms)
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
    return {column: row.get(column) for column in BACKLOG_ROW_COLUMNS}


def copy_fields(envelope) -> dict:
    """The decoded columns of a message the migration mode sends as it was: its own SessionId (group-id), time to
    live (the header's, counted from its enqueue time) and scheduled enqueue time, and its state; no destination
    (the source's route gives it)."""
    ttl = envelope.header.ttl_ms
    state = envelope.message_annotations.get(MESSAGE_STATE_ANNOTATION)
    return {
        "destination": None,
        "session_id": envelope.properties.group_id,
        "time_to_live_ms": None if not ttl else int(ttl),
        "scheduled_enqueue_time": envelope.scheduled_enqueue_time,
        "decode_problem_code": None,
        "decode_problem_reason": None,
        "message_state": MessageState.from_annotation(state if isinstance(state, int) else None).value,
    }


def expires_time(enqueued_time: datetime | None, ttl_ms: int | None) -> datetime | None:
    """When a backlog copy expires in its queue: its enqueue time plus its own time to live (the AMQP header's);
    None without either (a queue's default time to live, which the syphon does not read, may end it sooner)."""
    if enqueued_time is None or not ttl_ms:
        return None
    try:
        return enqueued_time + timedelta(milliseconds=int(ttl_ms))
    except OverflowError:  # past the year 9999: never
        return None


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
