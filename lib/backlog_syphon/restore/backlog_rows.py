"""How a backlog row is filled from one raw backlog message (``rows.BACKLOG_ROW_SCHEMA``): the decoded
columns (``destination`` .. ``decode_problem_reason``) come from :func:`legacy_fields_to_row_values`, so
the rules see exactly what :mod:`legacy_properties` decided.

Invariants:
- A row exists for every backlog message, even one that cannot be decoded: it carries a decode
  problem instead of values, so it is dead-lettered with a reason rather than dropped or retried forever.
  A message is decodable only if the codec reads all of it (body included), so a message that could
  only be forwarded half right is dead-lettered instead.
- A data body is measured from its framing, never copied.
- One decode pass per message (:func:`peeked_message`): the broker's identity of the message and its row
  come from the same decoded envelope; only a message the codec cannot read is looked at a second time,
  for its identity alone (``sections.broker_identity``, which reads the annotations without the rest).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from backlog_syphon.model import MessageState, ReasonCode
from backlog_syphon.restore.amqp.annotations import (
    DEAD_LETTER_DESCRIPTION_PROPERTY,
    DEAD_LETTER_REASON_PROPERTY,
    ENQUEUED_TIME_ANNOTATION,
    MESSAGE_STATE_ANNOTATION,
    SEQUENCE_NUMBER_ANNOTATION,
)
from backlog_syphon.restore.amqp.decoding import AmqpDecodeError
from backlog_syphon.restore.amqp.message_decoding import decode_envelope
from backlog_syphon.restore.amqp.sections import broker_identity
from backlog_syphon.restore.amqp.values import ms_to_datetime
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


class PeekedMessage(NamedTuple):
    """A peeked backlog message, decoded once: where the broker put it (``sequence_number``, ``enqueued_ms``:
    its ``x-opt-sequence-number`` and ``x-opt-enqueued-time``, None when absent) and its backlog row."""

    sequence_number: int | None
    enqueued_ms: int | None
    row: dict


def peeked_message(backlog_queue: str, raw_message: bytes, *, copy: bool = False) -> PeekedMessage:
    """A peeked message's identity and row from one decode pass. AmqpDecodeError only when the broker's own
    annotations cannot be read (a message nothing can place: the caller stops there); any other problem of
    the message is its row's decode problem. ``copy``: the migration mode's row (``backlog_row_values``)."""
    raw = bytes(raw_message)
    try:
        envelope = decode_envelope(raw)
    except Exception as error:  # noqa: BLE001 - the row says why; the identity may still be readable without the rest
        sequence_number, enqueued_ms = broker_identity(raw)
        return PeekedMessage(sequence_number, enqueued_ms, _undecodable_row(
            backlog_queue, raw, error, sequence_number=sequence_number, enqueued_time=_time_or_none(enqueued_ms)))
    sequence_number, enqueued_ms = _identity(envelope.message_annotations)
    return PeekedMessage(sequence_number, enqueued_ms, _row_of(
        backlog_queue, raw, envelope, sequence_number=sequence_number, enqueued_time=_time_or_none(enqueued_ms),
        copy=copy))


def _identity(annotations: dict) -> tuple[int | None, int | None]:
    """What ``sections.broker_identity`` reads, from decoded annotations (the same checks, the same errors)."""
    found = []
    for name in (SEQUENCE_NUMBER_ANNOTATION, ENQUEUED_TIME_ANNOTATION):
        value = annotations.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise AmqpDecodeError(f"{name} is not an integer", 0)
        found.append(None if value is None else int(value))
    return found[0], found[1]


def _time_or_none(ms: int | None) -> datetime | None:
    """An enqueue time in ms as a datetime; None when absent or beyond what a datetime holds (the row's own
    decoding then names the problem)."""
    try:
        return None if ms is None else ms_to_datetime(ms)
    except (OverflowError, ValueError):
        return None


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
    raw = bytes(raw_message)
    try:
        envelope = decode_envelope(raw)
    except Exception as error:  # noqa: BLE001 - one message's problem is that message's outcome
        return _undecodable_row(backlog_queue, raw, error, sequence_number=sequence_number,
                                enqueued_time=enqueued_time)
    return _row_of(backlog_queue, raw, envelope, sequence_number=sequence_number, enqueued_time=enqueued_time,
                   copy=copy)


def _row_of(backlog_queue: str, raw: bytes, envelope, *, sequence_number: int | None,
            enqueued_time: datetime | None, copy: bool = False) -> dict:
    """The row of a message whose envelope decoded; a problem of its fields makes it undecodable still."""
    row = {"backlog_queue": backlog_queue, "sequence_number": sequence_number, "enqueued_time": enqueued_time,
           "raw_message": raw}
    try:
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
        return _undecodable_row(backlog_queue, raw, error, sequence_number=sequence_number,
                                enqueued_time=enqueued_time, known=row)
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


def _undecodable_row(backlog_queue: str, raw: bytes, error: Exception, *, sequence_number: int | None,
                     enqueued_time: datetime | None, known: dict | None = None) -> dict:
    """The row of a message the codec cannot read, or whose broker annotations or legacy fields trip the
    decoding over: it is dead-lettered with the reason, never the batch."""
    reason = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
    return {
        **dict.fromkeys(BACKLOG_ROW_COLUMNS),
        "backlog_queue": backlog_queue,
        "sequence_number": sequence_number,
        "enqueued_time": enqueued_time,
        "raw_message": raw,
        **(known or {}),
        "body_size": len(raw),
        "decode_problem_code": ReasonCode.UNDECODABLE_MESSAGE,
        "decode_problem_reason": reason[:1024],
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
