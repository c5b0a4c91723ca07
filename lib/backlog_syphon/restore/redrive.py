"""Which dead-lettered messages a re-drive sends again: pure transforms over classified rows, built from
Spark column expressions only (like ``restore.rules``).

A re-drive reads the backlog queues' dead-letter sub-queues through the same source and restore rules
as a backlog run. Before anything is sent, every row the re-drive must not touch gets the action
``LEAVE`` (outcome ``NOT_SELECTED``, never final): it is not sent, not settled, and its row cuts the
recorded spans, so the purge cannot complete it by accident. A row is left when:
- the ``redrive`` filters do not select it (``FILTERED_OUT``): by the syphon's reason code or the
  broker's dead-letter reason (both are the message's ``DeadLetterReason``), by destination, by the
  time it entered the backlog;
- an earlier re-drive dead-lettered it again, i.e. it is still undeliverable, and
  ``redrive.retry_dead_lettered`` is off (``REDRIVEN_BEFORE``). Those identities come from the audit
  (``storage.audit_table.redriven_dead_letters``), as a small DataFrame joined here, never collected.

Selected rows keep what the restore rules decided: delivered, or dead-lettered with the rules' reason
(which, in a dead-letter sub-queue, means left there and audited, since a dead-letter queue cannot
dead-letter again).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from backlog_syphon.config import RedriveConfig
from backlog_syphon.model import Action, ReasonCode

IDENTITY_COLUMNS = ("backlog_queue", "sequence_number", "enqueued_ms")  # of ``redriven_before`` frames


def matches_filters(redrive: RedriveConfig) -> Column:
    """True where the row's message passes every ``redrive`` filter that is set (no filter: every row)."""
    selected = F.lit(True)
    reasons = list(redrive.reason_codes) + list(redrive.dead_letter_reasons)
    if reasons:
        selected = selected & F.col("dead_letter_reason").isin(reasons)
    if redrive.destinations:
        selected = selected & F.col("destination").isin(list(redrive.destinations))
    after, before = redrive.enqueued_window
    if after is not None:
        selected = selected & (F.col("enqueued_time") >= F.lit(after))
    if before is not None:
        selected = selected & (F.col("enqueued_time") < F.lit(before))
    return F.coalesce(selected, F.lit(False))  # a null (no reason, no destination) does not match


def select_for_redrive(classified: DataFrame, redrive: RedriveConfig,
                       redriven_before: DataFrame | None = None) -> DataFrame:
    """``classified`` rows (``restore.rules.classify_messages``) with ``action`` LEAVE, and why, where the
    re-drive must leave the message alone. ``redriven_before``: identities (``IDENTITY_COLUMNS``) an
    earlier re-drive dead-lettered again; ignored with ``redrive.retry_dead_lettered``."""
    filtered_out = ~matches_filters(redrive)
    tried = F.lit(False)
    if redriven_before is not None and not redrive.retry_dead_lettered:
        marked = (redriven_before.select(*IDENTITY_COLUMNS).distinct()
                  .withColumn("_redriven_before", F.lit(True)))
        classified = (classified.withColumn("enqueued_ms", F.unix_millis("enqueued_time"))
                      .join(F.broadcast(marked), list(IDENTITY_COLUMNS), "left").drop("enqueued_ms"))
        tried = F.coalesce(F.col("_redriven_before"), F.lit(False))
    action = (F.when(filtered_out, F.lit(Action.LEAVE)).when(tried, F.lit(Action.LEAVE))
              .otherwise(F.col("action")))
    reason_code = (F.when(filtered_out, F.lit(ReasonCode.FILTERED_OUT)).when(tried, F.lit(ReasonCode.REDRIVEN_BEFORE))
                   .otherwise(F.col("reason_code")))
    reason = (F.when(filtered_out, F.lit("not selected by the redrive filters; left in the dead-letter queue"))
              .when(tried, F.lit("an earlier re-drive dead-lettered it again; left in the dead-letter queue "
                                 "(redrive.retry_dead_lettered: true sends it again)"))
              .otherwise(F.col("reason")))
    left = F.col("action") == Action.LEAVE
    result = classified.withColumns({"action": action, "reason_code": reason_code.cast("string"),
                                     "reason": reason.cast("string")})
    result = result.withColumn("restored_time_to_live_ms",
                               F.when(~left, F.col("restored_time_to_live_ms")).cast("long"))
    return result.drop("_redriven_before") if "_redriven_before" in result.columns else result
