"""Bookkeeping between the sink's steps, on per-queue aggregates: pure functions on plain values.

The driver never holds one record per message: each micro-batch's outcomes reach it as one
``QueueOutcomes`` per backlog queue (plus the rare dead-letters, whose reasons the purge needs).
The rules:
- a queue's checkpoint only moves forward, to the highest sequence number with an outcome, and a
  replayed batch whose checkpoint was already written adds no counts twice;
- what is recorded but not yet purged is tracked per queue (how many, through where, the
  dead-letter reasons), so the purge settles exactly that and nothing else;
- when a purge could not settle everything, the next one counts what is still there first.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from backlog_syphon.model import CheckpointRow, QueueOutcomes
from backlog_syphon.servicebus.purge_plan import PurgePlan

# The dead-letter reason for a recorded dead-letter without a code (the syphon always records one;
# a row written by hand might not): the broker needs some reason.
UNKNOWN_REASON_CODE = "undeliverable"


def merge_outcomes(*groups: Iterable[QueueOutcomes]) -> dict[str, QueueOutcomes]:
    """Aggregates of the same queues (for example new and replayed outcomes of one batch) added up."""
    merged: dict[str, QueueOutcomes] = {}
    for item in (item for group in groups for item in group):
        known = merged.get(item.backlog_queue)
        if known is None:
            merged[item.backlog_queue] = item
            continue
        oldest = [t for t in (known.oldest_enqueued, item.oldest_enqueued) if t is not None]
        merged[item.backlog_queue] = QueueOutcomes(
            item.backlog_queue, min(known.first, item.first), max(known.through, item.through),
            known.delivered + item.delivered, known.dead_lettered + item.dead_lettered, known.skipped + item.skipped,
            min(oldest, default=None))
    return merged


def advance_checkpoint(state: dict[str, CheckpointRow], batch: Iterable[QueueOutcomes], *, batch_id: int,
                       run_id: str, now: dt.datetime) -> dict[str, CheckpointRow]:
    """The checkpoint rows after a batch: marks move forward, counts add this batch's outcomes.

    A replayed batch whose checkpoint was already written (the row's ``last_batch_id`` is this
    batch or later) adds no counts twice.
    """
    new_state = dict(state)
    for outcomes in batch:
        queue = outcomes.backlog_queue
        row = new_state.get(queue) or CheckpointRow(queue, 0, 0, batch_id, run_id, now, 0, 0, 0)
        counted = queue in state and state[queue].last_batch_id >= batch_id
        new_state[queue] = dataclasses.replace(
            row, delivered_through=max(row.delivered_through, outcomes.through), last_batch_id=batch_id,
            last_run_id=run_id, updated_at=now,
            delivered_count=row.delivered_count + (0 if counted else outcomes.delivered),
            dead_lettered_count=row.dead_lettered_count + (0 if counted else outcomes.dead_lettered),
            skipped_count=row.skipped_count + (0 if counted else outcomes.skipped))
    return new_state


def mark_purged(state: dict[str, CheckpointRow], purged: dict[str, int], *, now: dt.datetime) -> dict[str, CheckpointRow]:
    """The checkpoint rows after purges settled each queue through the given sequence numbers."""
    return {queue: dataclasses.replace(row, purged_through=purged[queue], updated_at=now)
            if purged.get(queue, 0) > row.purged_through else row for queue, row in state.items()}


@dataclass(frozen=True)
class Unpurged:
    """What one queue has recorded above its purged-through mark, and so may still hold."""

    count: int = 0  # recorded outcomes above the mark (at most this many messages are still there)
    through: int = 0  # the highest of them
    dead_letters: dict[int, tuple[str, str]] = field(default_factory=dict)  # seq -> (reason code, reason)
    verify: bool = False  # some may be gone already: count what is there before receiving


def add_recorded(unpurged: dict[str, Unpurged], batch: Iterable[QueueOutcomes],
                 dead_letters: Iterable[tuple[str, int, str, str]] = (), *, verify: bool = False) -> dict[str, Unpurged]:
    """Add a batch's outcomes (and the dead-letters among them: queue, seq, reason code, reason)."""
    reasons: dict[str, dict[int, tuple[str, str]]] = defaultdict(dict)
    for queue, seq, reason_code, reason in dead_letters:
        reasons[queue][int(seq)] = (reason_code or UNKNOWN_REASON_CODE, reason or "")
    new = dict(unpurged)
    for outcomes in batch:
        known = new.get(outcomes.backlog_queue, Unpurged())
        new[outcomes.backlog_queue] = Unpurged(
            known.count + outcomes.count, max(known.through, outcomes.through),
            {**known.dead_letters, **reasons.get(outcomes.backlog_queue, {})}, known.verify or verify)
    return new


def purge_plans(unpurged: dict[str, Unpurged], checkpoint: dict[str, CheckpointRow]) -> dict[str, PurgePlan]:
    """Per queue with something recorded and not purged: what its purge settles."""
    plans = {}
    for queue, pending in sorted(unpurged.items()):
        if pending.count:
            first = checkpoint[queue].purged_through + 1 if queue in checkpoint else 1
            plans[queue] = PurgePlan(queue, first=first, through=pending.through, expected=pending.count,
                                     dead_letters=dict(pending.dead_letters), verify=pending.verify)
    return plans


def after_purge(unpurged: dict[str, Unpurged], settled: dict[str, int]) -> dict[str, Unpurged]:
    """What is left to purge once each queue is settled through ``settled[queue]``."""
    new = dict(unpurged)
    for queue, through in settled.items():
        pending = new.get(queue)
        if pending is None:
            continue
        if through >= pending.through:
            new[queue] = Unpurged()
        else:  # partly settled: how many are left is not known, so the next purge counts them first
            new[queue] = Unpurged(pending.count, pending.through,
                                  {seq: why for seq, why in pending.dead_letters.items() if seq > through}, True)
    return new
