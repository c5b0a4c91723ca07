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

from backlog_syphon.model import Outcome
from backlog_syphon.purge_plan import PurgePlan



def recorded_keys(recorded: Iterable[dict]) -> set[tuple[str, int]]:
    return {(row["backlog_queue"], int(row["sequence_number"])) for row in recorded}


def advance_checkpoint(state: dict[str, dict], outcomes: list[dict], *, batch_id: int, run_id: str,
                       now: dt.datetime) -> dict[str, dict]:
    """The checkpoint rows after a batch: marks move forward, counts add this batch's own outcomes.

    A replayed batch whose checkpoint was already written (the row's ``last_batch_id`` is this
    batch) adds no counts twice.
    """
    new_state = {queue: dict(row) for queue, row in state.items()}
    counted = {queue for queue, row in state.items() if int(row["last_batch_id"]) >= batch_id}
    for row in outcomes:
        queue = row["backlog_queue"]
        entry = new_state.setdefault(queue, {
            "backlog_queue": queue, "delivered_through": 0, "purged_through": 0, "last_batch_id": batch_id,
            "last_run_id": run_id, "updated_at": now, "delivered_count": 0, "dead_lettered_count": 0,
            "skipped_count": 0})
        entry.update(last_batch_id=batch_id, last_run_id=run_id, updated_at=now)
        entry["delivered_through"] = max(int(entry["delivered_through"]), int(row["sequence_number"]))
        if int(row["batch_id"]) == batch_id and queue not in counted:  # earlier batches counted their own
            key = {Outcome.DELIVERED: "delivered_count", Outcome.DEAD_LETTERED: "dead_lettered_count"}.get(row["outcome"],
                                                                                       "skipped_count")
            entry[key] += 1
    return new_state


def mark_purged(state: dict[str, dict], purged: dict[str, int], *, now: dt.datetime) -> dict[str, dict]:
    """The checkpoint rows after a purge settled each queue through the given sequence numbers."""
    new_state = {queue: dict(row) for queue, row in state.items()}
    for queue, through in purged.items():
        if queue in new_state and through > int(new_state[queue]["purged_through"]):
            new_state[queue].update(purged_through=through, updated_at=now)
    return new_state


def purge_plans(outcomes: list[dict], purged_through: dict[str, int], *, verify: bool = False
                ) -> dict[str, PurgePlan]:
    """Per queue, what its purge settles: every recorded outcome above the queue's purged-through mark."""
    by_queue: dict[str, list[dict]] = defaultdict(list)
    for row in outcomes:
        if int(row["sequence_number"]) > purged_through.get(row["backlog_queue"], 0):
            by_queue[row["backlog_queue"]].append(row)
    return {
        queue: PurgePlan(
            queue=queue, first=purged_through.get(queue, 0) + 1,
            through=max(int(row["sequence_number"]) for row in rows),
            expected=len({int(row["sequence_number"]) for row in rows}),
            dead_letters={int(row["sequence_number"]): (row["reason_code"] or "undeliverable", row["reason"] or "")
                          for row in rows if row["outcome"] == Outcome.DEAD_LETTERED},
            verify=verify)
        for queue, rows in sorted(by_queue.items())
    }


def summarise(outcomes: list[dict]) -> dict[str, dict[str, int]]:
    """Per destination: how many messages ended in each outcome."""
    summary: dict[str, dict[str, int]] = defaultdict(lambda: {outcome: 0 for outcome in Outcome})
    for row in outcomes:
        summary[row["destination"] or "(none)"][row["outcome"]] += 1
    return {destination: dict(counts) for destination, counts in sorted(summary.items())}
