"""Bookkeeping between the steps of a micro-batch: pure functions on plain values.

Outcome rows follow ``delta_tables.AUDIT_ROW_SCHEMA`` (as dicts here). The rules:
- a message with a recorded outcome is never sent again (replay skips it);
- a queue's checkpoint only moves forward, to the highest sequence number with an outcome;
- the purge completes delivered and skipped messages, dead-letters rejected ones with their
  reason, and touches nothing else.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Iterable

DELIVERED = "delivered"
DEAD_LETTERED = "dead_lettered"
SKIPPED_PING = "skipped_ping"
OUTCOMES = (DELIVERED, DEAD_LETTERED, SKIPPED_PING)


def recorded_keys(recorded: Iterable[dict]) -> set[tuple[str, int]]:
    return {(row["backlog_queue"], int(row["sequence_number"])) for row in recorded}


def checkpoint_updates(outcomes: list[dict], *, batch_id: int, run_id: str, now: dt.datetime) -> list[dict]:
    """Per-queue checkpoint rows for a batch's outcomes (counts are this batch's own)."""
    per_queue: dict[str, dict] = {}
    for row in outcomes:
        queue = row["backlog_queue"]
        entry = per_queue.setdefault(queue, {
            "backlog_queue": queue, "delivered_through": -1, "purged_through": 0, "last_batch_id": batch_id,
            "last_run_id": run_id, "updated_at": now, "delivered_count": 0, "dead_lettered_count": 0,
            "skipped_count": 0})
        entry["delivered_through"] = max(entry["delivered_through"], int(row["sequence_number"]))
        if int(row["batch_id"]) == batch_id:  # rows recorded by an earlier batch were counted then
            key = {DELIVERED: "delivered_count", DEAD_LETTERED: "dead_lettered_count"}.get(row["outcome"],
                                                                                       "skipped_count")
            entry[key] += 1
    return [per_queue[queue] for queue in sorted(per_queue)]


def purge_plans(outcomes: list[dict]) -> dict[str, dict[int, tuple[str, str] | None]]:
    """Per queue: sequence number -> None (complete) or (reason code, reason) (dead-letter)."""
    plans: dict[str, dict[int, tuple[str, str] | None]] = defaultdict(dict)
    for row in outcomes:
        action = None
        if row["outcome"] == DEAD_LETTERED:
            action = (row["reason_code"] or "undeliverable", row["reason"] or "")
        plans[row["backlog_queue"]][int(row["sequence_number"])] = action
    return dict(plans)


def summarise(outcomes: list[dict]) -> dict[str, dict[str, int]]:
    """Per destination: how many messages ended in each outcome."""
    summary: dict[str, dict[str, int]] = defaultdict(lambda: {outcome: 0 for outcome in OUTCOMES})
    for row in outcomes:
        summary[row["destination"] or "(none)"][row["outcome"]] += 1
    return {destination: dict(counts) for destination, counts in sorted(summary.items())}
