"""Decide, per backlog row, where it goes (``destination_map``), and whether to deliver, dead-letter,
skip or hold it, and with which time to live.

Pure ``DataFrame -> DataFrame`` transforms over rows shaped like ``BACKLOG_ROW_SCHEMA``, built from
Spark column expressions only (no Python UDFs). The current time is passed in, never read here.

Invariants:
- Every row gets exactly one action and, unless it is delivered, a stable ``reason_code`` and a
  human ``reason``: nothing is silently dropped.
- Precedence: ping, then a skipped destination (held, whatever else is wrong with the message: it is
  left untouched), then a backlog copy that expired in its queue (the broker collects it, whatever it
  holds), then decode problems, then expiry in the backlog, then size, then whether the
  destination can take the message as it is (``destination_fit``: a SessionId that differs from the
  PartitionKey, no SessionId for a queue that requires sessions).
- Renaming comes first and once: ``destination`` becomes the new name (matched case-insensitively,
  never mapped again) and ``original_destination`` keeps the name x-ms-path gave; skips are matched
  against the destination as sent.
- Reasons are built from decoded fields and numbers only (decode reasons never quote unsafe text,
  see :func:`backlog_syphon.restore.legacy_properties.quote`), so they carry no secrets.
"""

from __future__ import annotations

from datetime import datetime
from typing import Iterable, Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from backlog_syphon.restore.destination_fit import KEY_MISMATCH_REASON, SESSION_REQUIRED_REASON, requires_session
from backlog_syphon.restore.amqp.values import datetime_to_ms
from backlog_syphon.restore.legacy_properties import PING_CONTENT_TYPE
from backlog_syphon.model import Action, DestinationShape, ReasonCode, TtlPolicy


DEFAULT_TTL_POLICY = TtlPolicy.REMAINING


CLASSIFICATION_COLUMNS = ("action", "reason_code", "reason", "restored_time_to_live_ms", "original_destination")


def classify_messages(
    df: DataFrame,
    *,
    now: datetime,
    ttl_policy: str | TtlPolicy = DEFAULT_TTL_POLICY,
    max_message_size_bytes: int | None = None,
    destination_map: Mapping[str, str] | None = None,
    skip_destinations: Iterable[str] = (),
    destination_shapes: Mapping[str, DestinationShape] | None = None,
) -> DataFrame:
    """Add ``action``, ``reason_code``, ``reason``, ``restored_time_to_live_ms`` and ``original_destination``
    to backlog rows, with ``destination`` renamed by ``destination_map``.

    ``destination_map``: ``{old name: new name}``, old names matched case-insensitively, applied once
    (``config`` refuses chains); ``skip_destinations``: destinations as sent (after the map), matched
    case-insensitively, whose messages are held (``Action.HOLD``) rather than sent.

    ``restored_time_to_live_ms`` is the TTL to send with, set only for rows to deliver (null there
    means no TTL). Under ``remaining`` the TTL clock starts at the later of the backlog enqueue time
    and the scheduled enqueue time, as it would have on the destination; a row without an enqueue
    time is treated as not having waited.
    """
    return Classifier(df.columns, ttl_policy=ttl_policy, max_message_size_bytes=max_message_size_bytes,
                      destination_map=destination_map, skip_destinations=skip_destinations,
                      destination_shapes=destination_shapes)(df, now=now)


NOW_COLUMN = "_classified_at_ms"  # the batch's time, as a column: the rules are built once, not per batch


class Classifier:
    """``classify_messages`` with its column expressions built once (about 900 calls into the JVM, a fifth
    of a second), then applied to each batch's rows with that batch's time: a run builds one."""

    def __init__(self, columns: Iterable[str], *, ttl_policy: str | TtlPolicy = DEFAULT_TTL_POLICY,
                 max_message_size_bytes: int | None = None, destination_map: Mapping[str, str] | None = None,
                 skip_destinations: Iterable[str] = (), destination_shapes: Mapping[str, DestinationShape] | None = None):
        policy = TtlPolicy.parse(ttl_policy)
        if max_message_size_bytes is not None and (
            isinstance(max_message_size_bytes, bool) or not isinstance(max_message_size_bytes, int)
            or max_message_size_bytes <= 0
        ):
            raise ValueError(f"max_message_size_bytes must be a positive int or None, got {max_message_size_bytes!r}")
        self.renamed = renamed_destinations(destination_map or {})
        sessions_required = sorted(name for name in (destination_shapes or {})
                                   if requires_session(destination_shapes, name))
        self.projection = _classification(list(columns), F.col(NOW_COLUMN), policy, max_message_size_bytes,
                                          skip_destinations, sessions_required)

    def __call__(self, df: DataFrame, *, now: datetime) -> DataFrame:
        if now.tzinfo is None:
            raise ValueError("now must be a timezone-aware datetime (for example datetime.now(timezone.utc))")
        staged = df.withColumns({NOW_COLUMN: F.lit(datetime_to_ms(now)).cast("long"), **self.renamed})
        return staged.select(*self.projection)


def _classification(columns: list[str], now_ms: Column, policy: TtlPolicy, max_message_size_bytes: int | None,
                    skip_destinations: Iterable[str], sessions_required: list[str]) -> list[Column]:
    ttl_ms = F.col("time_to_live_ms")
    waited_ms = _waited_ms(now_ms)
    if policy is TtlPolicy.RESTART:
        restored_ttl_ms = ttl_ms
        expired = F.lit(False)
    else:
        restored_ttl_ms = ttl_ms - waited_ms
        expired = F.coalesce(ttl_ms - waited_ms <= 0, F.lit(False))

    is_ping = F.coalesce(F.col("content_type") == PING_CONTENT_TYPE, F.lit(False))
    copy_expired = F.coalesce(F.unix_millis(F.col("backlog_expires_time")) <= now_ms, F.lit(False))
    skipped = sorted({name.lower() for name in skip_destinations})
    is_held = (F.coalesce(F.lower(F.col("destination")).isin(skipped), F.lit(False)) if skipped
               else F.lit(False))
    # A null destination without a problem code is a source bug; dead-letter it rather than guess.
    undecoded = F.col("decode_problem_code").isNotNull() | F.col("destination").isNull()
    too_large = (
        F.coalesce(F.col("body_size") > max_message_size_bytes, F.lit(False))
        if max_message_size_bytes is not None
        else F.lit(False)
    )

    session_id, partition_key = F.col("session_id"), F.col("partition_key")
    keys_differ = F.coalesce(session_id != partition_key, F.lit(False))  # both set (null otherwise), and different
    session_missing = (session_id.isNull() & F.lower(F.col("destination")).isin(sessions_required) if sessions_required
                       else F.lit(False))

    rules = [  # (condition, action, reason_code, reason), in precedence order
        (is_ping, Action.SKIP, F.lit(ReasonCode.PING),
         F.lit(f"ping message (content type {PING_CONTENT_TYPE}); pings are never delivered")),
        (is_held, Action.HOLD, F.lit(ReasonCode.DESTINATION_SKIPPED),
         F.format_string("destination '%s' is in restore.skip_destinations: left in the backlog for a later run",
                         F.col("destination"))),
        (copy_expired, Action.EXPIRE, F.lit(ReasonCode.BACKLOG_COPY_EXPIRED),
         F.format_string("the backlog copy expired in its queue at %s UTC (its own time to live there): Service Bus "
                         "shows it to a peek until a receive collects it, and no receiver would get it; not sent",
                         F.date_format(F.col("backlog_expires_time"), "yyyy-MM-dd HH:mm:ss"))),
        (undecoded, Action.DEAD_LETTER,
         F.coalesce(F.col("decode_problem_code"), F.lit(ReasonCode.MISSING_PATH)),
         F.coalesce(F.col("decode_problem_reason"), F.lit("no destination was decoded from x-ms-path"))),
        (expired, Action.DEAD_LETTER, F.lit(ReasonCode.EXPIRED_IN_BACKLOG),
         F.format_string("expired in the backlog: time to live %d ms, waited %d ms", ttl_ms, waited_ms)),
        (too_large, Action.DEAD_LETTER, F.lit(ReasonCode.MESSAGE_TOO_LARGE),
         F.format_string(f"body of %d bytes exceeds the limit of {max_message_size_bytes} bytes",
                         F.col("body_size"))),
        (keys_differ, Action.DEAD_LETTER, F.lit(ReasonCode.SESSION_ID_NOT_PARTITION_KEY),
         F.format_string(KEY_MISMATCH_REASON.format(session_id="%s", partition_key="%s"), session_id, partition_key)),
        (session_missing, Action.DEAD_LETTER, F.lit(ReasonCode.SESSION_REQUIRED),
         F.format_string(SESSION_REQUIRED_REASON.format(destination="%s"), F.col("destination"))),
    ]
    action = _first_match([(condition, F.lit(act)) for condition, act, _, _ in rules], F.lit(Action.DELIVER))
    reason_code = _first_match([(condition, code) for condition, _, code, _ in rules], F.lit(None))
    reason = _first_match([(condition, text) for condition, _, _, text in rules], F.lit(None))

    return [
        *[F.col(column) for column in columns if column not in ("original_destination", NOW_COLUMN)],
        action.alias("action"),
        reason_code.cast("string").alias("reason_code"),
        reason.cast("string").alias("reason"),
        F.when(action == Action.DELIVER, restored_ttl_ms).cast("long").alias("restored_time_to_live_ms"),
        F.col("original_destination"),
    ]


def renamed_destinations(destination_map: Mapping[str, str]) -> dict[str, Column]:
    """``destination`` renamed by ``destination_map`` (old names matched case-insensitively, once), and
    ``original_destination``: the name x-ms-path gave where the map renamed it, else null."""
    destination = F.col("destination")
    if not destination_map:
        return {"original_destination": F.lit(None).cast("string")}
    lowered = F.lower(destination)
    renamed = None
    for old, new in sorted(destination_map.items()):
        condition = lowered == old.lower()
        renamed = F.when(condition, F.lit(new)) if renamed is None else renamed.when(condition, F.lit(new))
    # Both columns come from the same decoded name, in one projection: a renamed name is never looked up again.
    return {"destination": F.coalesce(renamed, destination),
            "original_destination": F.when(renamed.isNotNull(), destination).cast("string")}


def expired_by(now: datetime) -> Column:
    """True where the message's time to live ran out by ``now`` (whatever the TTL policy does about it)."""
    return F.coalesce(F.col("time_to_live_ms") - _waited_ms(F.lit(datetime_to_ms(now))) <= 0, F.lit(False))


def _waited_ms(now_ms: Column) -> Column:
    """Milliseconds since the TTL clock started, never negative (a future schedule has not started it)."""
    clock_start = F.greatest(F.col("enqueued_time"), F.col("scheduled_enqueue_time"))  # greatest skips nulls
    zero = F.lit(0).cast("long")
    return F.coalesce(F.greatest(zero, now_ms - F.unix_millis(clock_start)), zero)


def _first_match(cases: list[tuple[Column, Column]], otherwise: Column) -> Column:
    expression = None
    for condition, value in cases:
        expression = F.when(condition, value) if expression is None else expression.when(condition, value)
    return expression.otherwise(otherwise)
