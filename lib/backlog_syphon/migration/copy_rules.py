"""Decide, per migration row, where it goes and whether it is delivered as it was, held, expired or
dead-lettered: pure ``DataFrame -> DataFrame`` transforms built from column expressions only (the migration
mode's counterpart of ``restore.rules``, with the same output columns). The current time is passed in.

Every row gets exactly one action, checked in this order:
1. ``dead_letter`` with the decode problem: the codec cannot read the message;
2. ``hold`` (``scheduled_soon``): a scheduled message due within ``migration.scheduled_margin_seconds``: moving
   and cancelling it would race its activation (it comes back under a new sequence number), so it is left to
   become active and is read again then; ``hold`` (``in_transit``): a topic's own log holds its scheduled
   messages, and active ones only on their way to its subscriptions, where they are read;
3. ``expire`` (``expired_in_source``): not scheduled, and its enqueue time plus its time to live has passed (the
   broker still shows it to a peek, but collects it at the next receive: it is not sent);
4. ``cover`` (``fanned_out``): a subscription's message whose lead subscription sends its copy to the topic
   (``Route.covered_by``), which gives this subscription the message again. Before the dead-letter rules: only the
   lead's copy is judged and, if it cannot be delivered, dead-lettered (in the lead's dead-letter sub-queue, the
   one place a re-drive of the group reads), so no subscription's dead-letter sub-queue gets a copy of it twice;
5. ``dead_letter`` (``message_too_large``): larger than ``sink.max_message_size_bytes``;
6. ``dead_letter`` (``session_id_not_partition_key``, ``session_required``): what the destination would refuse
   (``restore.destination_fit``), as the backlog mode judges it;
7. ``deliver``.

``destination`` is the row's route (``migration.routes``, by source path, case-insensitively); the TTL column
(``restored_time_to_live_ms``) is what is left at classification, for the audit: the send task computes it again
when it builds the copy, so the copy's absolute expiry is the original's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Iterable, Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from backlog_syphon.model import Action, DestinationShape, MessageState, ReasonCode, Route
from backlog_syphon.restore.destination_fit import KEY_MISMATCH_REASON, WHAT_TO_DO, requires_session

NOW_COLUMN = "_classified_at_ms"
SESSION_REQUIRED_REASON = ("destination '{destination}' requires sessions and the message has no SessionId, so Service "
                           "Bus would refuse it: route its source to an entity without sessions "
                           "(migration.destination_map), " + WHAT_TO_DO)


class CopyClassifier:
    """The copy rules' column expressions, built once per run and applied to each batch with its time (like
    ``restore.rules.Classifier``, whose output columns it produces)."""

    def __init__(self, columns: Iterable[str], *, routes: Mapping[str, Route], max_message_size_bytes: int | None,
                 scheduled_margin_seconds: float, destination_shapes: Mapping[str, DestinationShape] | None = None,
                 topics: Iterable[str] = ()):
        self.staging = {"destination": route_column(routes), "original_destination": F.lit(None).cast("string")}
        sessions_required = sorted(name for name in (destination_shapes or {})
                                   if requires_session(destination_shapes, name))
        covered = {route.source.lower(): route.covered_by for route in routes.values() if route.covered_by}
        self.projection = _classification(list(columns), F.col(NOW_COLUMN), max_message_size_bytes,
                                          int(scheduled_margin_seconds * 1000), sessions_required,
                                          sorted(topic.lower() for topic in topics), covered)

    def __call__(self, df: DataFrame, *, now: datetime) -> DataFrame:
        if now.tzinfo is None:
            raise ValueError("now must be a timezone-aware datetime (for example datetime.now(timezone.utc))")
        now_ms = int(now.timestamp() * 1000)
        staged = df.withColumns({NOW_COLUMN: F.lit(now_ms).cast("long"), **self.staging})
        return staged.select(*self.projection)


def route_column(routes: Mapping[str, Route]) -> Column:
    """Each row's destination: its source's route (matched case-insensitively), null for a source without one."""
    source = F.lower(F.col("backlog_queue"))
    column = None
    for key, route in sorted(routes.items()):
        condition = source == key.lower()
        column = F.when(condition, F.lit(route.destination)) if column is None else column.when(
            condition, F.lit(route.destination))
    return (column if column is not None else F.lit(None)).cast("string")


def expires_at_ms() -> Column:
    """The absolute expiry (ms since the epoch) of an active or deferred message with a time to live; null where
    it has none, and for a scheduled message, whose clock starts when it becomes active."""
    scheduled = F.coalesce(F.col("message_state") == MessageState.SCHEDULED, F.lit(False))
    return F.when(~scheduled, F.unix_millis(F.col("enqueued_time")) + F.col("time_to_live_ms")).cast("long")


def _classification(columns: list[str], now_ms: Column, max_message_size_bytes: int | None, margin_ms: int,
                    sessions_required: list[str], topics: list[str], covered: Mapping[str, str]) -> list[Column]:
    expiry = expires_at_ms()
    remaining = expiry - now_ms
    scheduled = F.coalesce(F.col("message_state") == MessageState.SCHEDULED, F.lit(False))
    due_in = F.unix_millis(F.col("scheduled_enqueue_time")) - now_ms
    soon = scheduled & F.coalesce(due_in < F.lit(margin_ms), F.lit(True))
    in_transit = (~scheduled & F.lower(F.col("backlog_queue")).isin(topics)) if topics else F.lit(False)
    expired = F.coalesce(remaining <= 0, F.lit(False))
    too_large = (F.coalesce(F.col("body_size") > max_message_size_bytes, F.lit(False))
                 if max_message_size_bytes is not None else F.lit(False))
    session_id, partition_key = F.col("session_id"), F.col("partition_key")
    keys_differ = F.coalesce(session_id != partition_key, F.lit(False))
    session_missing = (session_id.isNull() & F.lower(F.col("destination")).isin(sessions_required)
                       if sessions_required else F.lit(False))
    source = F.lower(F.col("backlog_queue"))
    is_covered = source.isin(sorted(covered)) if covered else F.lit(False)
    lead = first_match([(source == path, F.lit(lead)) for path, lead in sorted(covered.items())],
                       F.lit(None)) if covered else F.lit(None)
    rules = [  # (condition, action, reason_code, reason), in precedence order
        (F.col("decode_problem_code").isNotNull(), Action.DEAD_LETTER, F.col("decode_problem_code"),
         F.col("decode_problem_reason")),
        (soon, Action.HOLD, F.lit(ReasonCode.SCHEDULED_SOON),
         F.format_string(f"scheduled for %s, within migration.scheduled_margin_seconds ({margin_ms / 1000:g} s): left "
                         f"to become active and be read again then", F.col("scheduled_enqueue_time").cast("string"))),
        (in_transit, Action.HOLD, F.lit(ReasonCode.IN_TRANSIT),
         F.lit("an active message in the topic's own log is on its way to its subscriptions, where it is read")),
        (expired, Action.EXPIRE, F.lit(ReasonCode.EXPIRED_IN_SOURCE),
         F.format_string("expired in the source: time to live %d ms from its enqueue time, %d ms ago",
                         F.col("time_to_live_ms"), -remaining)),
        (is_covered, Action.COVER, F.lit(ReasonCode.FANNED_OUT),
         F.format_string("sent to the topic %s once, from %s, whose copy the topic gives this subscription again",
                         F.col("destination"), lead)),
        (too_large, Action.DEAD_LETTER, F.lit(ReasonCode.MESSAGE_TOO_LARGE),
         F.format_string(f"body of %d bytes exceeds the limit of {max_message_size_bytes} bytes", F.col("body_size"))),
        (keys_differ, Action.DEAD_LETTER, F.lit(ReasonCode.SESSION_ID_NOT_PARTITION_KEY),
         F.format_string(KEY_MISMATCH_REASON.format(session_id="%s", partition_key="%s"), session_id, partition_key)),
        (session_missing, Action.DEAD_LETTER, F.lit(ReasonCode.SESSION_REQUIRED),
         F.format_string(SESSION_REQUIRED_REASON.format(destination="%s"), F.col("destination"))),
    ]
    action = first_match([(condition, F.lit(act)) for condition, act, _, _ in rules], F.lit(Action.DELIVER))
    reason_code = first_match([(condition, code) for condition, _, code, _ in rules], F.lit(None))
    reason = first_match([(condition, text) for condition, _, _, text in rules], F.lit(None))
    return [
        *[F.col(column) for column in columns if column not in ("original_destination", NOW_COLUMN)],
        action.alias("action"),
        reason_code.cast("string").alias("reason_code"),
        reason.cast("string").alias("reason"),
        F.when(action == Action.DELIVER, F.when(scheduled, F.col("time_to_live_ms")).otherwise(remaining))
        .cast("long").alias("restored_time_to_live_ms"),
        F.col("original_destination"),
    ]


def first_match(cases: list[tuple[Column, Column]], otherwise: Column) -> Column:
    expression = None
    for condition, value in cases:
        expression = F.when(condition, value) if expression is None else expression.when(condition, value)
    return expression.otherwise(otherwise)
