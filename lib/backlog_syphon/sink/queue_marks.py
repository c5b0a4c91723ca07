"""Each backlog queue's marks between the sink's steps: its recorded, not yet settled spans, and its
checkpoint row's delivered-through and purge marks. Pure functions on plain values.

The driver never holds one record per message: a micro-batch's outcomes reach it as
``RecordedSpan``s (normally one per backlog queue) plus the rare dead-letters, whose reasons the
purge needs. The rules:
- what is recorded but not yet settled is kept per queue as spans, so the purge settles exactly
  those messages (by identity) and a replay drops exactly those rows;
- a queue's checkpoint moves forward within an incarnation; a batch that records a message at or
  below the delivered-through mark but enqueued after it found the queue recreated: the
  incarnation goes up and the marks start again;
- the purge mark names one settled message (sequence number and enqueue time): every recorded
  message enqueued at or before it is settled, so a restart looks only above it;
- when a purge could not settle everything, what is left is counted again (peeked) next time;
- where messages were held for skipped destinations is kept per queue for the whole run (one
  merged ``HeldSpan``): they stay in the backlog, so every purge of that queue meets them again
  and must pass over them rather than stop; and the purge mark never passes them, so the next run
  finds their audit rows above it and reads those queues again;
- the migration mode's recorded messages that a receive does not bring (scheduled, deferred) are kept as
  ``SettleOrder``s beside the spans that hold them, and a source settled session by session keeps its
  recorded messages' count per session (an upper bound once a purge left some behind).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from backlog_syphon.model import CheckpointRow, DeadLetterOrder, HeldSpan, RecordedSpan, SettleOrder
from backlog_syphon.partitions import partition_of
from backlog_syphon.restore.queue_names import is_dead_letter_queue_name, owning_queue
from backlog_syphon.purge.plan import PurgePlan, PurgeResult


@dataclass(frozen=True)
class Unpurged:
    """What one queue has recorded and not yet settled."""

    spans: tuple[RecordedSpan, ...] = ()
    dead_letters: tuple[DeadLetterOrder, ...] = ()
    verify: bool = False  # some may be gone already: count what is there before receiving
    held: HeldSpan | None = None  # where messages for skipped destinations were left (the purge passes them)
    orders: tuple[SettleOrder, ...] = ()  # recorded scheduled and deferred messages (settled by their own means)
    sessions: dict[str, int] = field(default_factory=dict)  # session -> recorded messages (session-settled sources)

    @property
    def count(self) -> int:
        return sum(span.count for span in self.spans)


def by_queue(spans: Iterable[RecordedSpan]) -> dict[str, list[RecordedSpan]]:
    grouped: dict[str, list[RecordedSpan]] = defaultdict(list)
    for span in spans:
        grouped[span.backlog_queue].append(span)
    return dict(grouped)


def awaiting_settlement(spans: Iterable[RecordedSpan]) -> dict[str, int]:
    """Per backlog queue, the recorded messages that may still be in it, waiting to be settled: what the
    recorded, unsettled spans a run begins with hold (``sink.spark_ports.read_recovery``: the audit rows above
    the purge marks, as ``storage.audit_table.recorded_unsettled`` selects them, with final outcomes). An upper
    bound (some may be settled already, unrecorded); the next run settles them first and sends none again.
    The dry run shows it; a status that counts them should count them so."""
    counts: dict[str, int] = {}
    for span in spans:
        counts[span.backlog_queue] = counts.get(span.backlog_queue, 0) + span.count
    return dict(sorted(counts.items()))


def add_recorded(unpurged: dict[str, Unpurged], spans: Iterable[RecordedSpan],
                 dead_letters: Iterable[DeadLetterOrder] = (), *, verify: bool = False,
                 held: Iterable[HeldSpan] = (), orders: Iterable[SettleOrder] = (),
                 sessions: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Unpurged]:
    """Add recorded spans (and the dead-letters, settle orders and per-session counts among them) to what is
    left to settle, and where messages were held for skipped destinations."""
    letters, settle = defaultdict(list), defaultdict(list)
    for order in dead_letters:
        letters[order.backlog_queue].append(order)
    for order in orders:
        settle[order.backlog_queue].append(order)
    new = dict(unpurged)
    for queue, queue_spans in by_queue(spans).items():
        known = new.get(queue, Unpurged())
        counts = dict(known.sessions)
        for session, n in (sessions or {}).get(queue, {}).items():
            counts[session] = counts.get(session, 0) + n
        new[queue] = Unpurged(known.spans + tuple(queue_spans), known.dead_letters + tuple(letters.get(queue, ())),
                              known.verify or verify, known.held, known.orders + tuple(settle.get(queue, ())), counts)
    for span in held:
        known = new.get(span.backlog_queue, Unpurged())
        new[span.backlog_queue] = dataclasses.replace(known, held=span.merged(known.held))
    return new


def purge_plans(unpurged: dict[str, Unpurged], partitioned: frozenset[str] = frozenset(),
                lock_seconds: Mapping[str, float] | None = None,
                session_entities: frozenset[str] = frozenset()) -> dict[str, PurgePlan]:
    """Per queue with something recorded and not settled: what its purge settles (a re-drive's dead-letter
    sub-queue in passing mode: past the messages the re-drive leaves there). ``partitioned``: the lower-case
    names of the queues the administration API calls partitioned (a dead-letter sub-queue is as its queue):
    their receives interleave partitions even where every recorded number is partition 0's.
    ``lock_seconds``: each queue's lock duration where the administration API said, by lower-case name.
    ``session_entities``: the lower-case names of the sources settled session by session (the migration mode)."""
    locks = lock_seconds or {}
    return {queue: PurgePlan(queue, pending.spans, pending.count - len(pending.orders),
                             {(order.sequence_number, order.enqueued_ms): (order.reason_code, order.reason)
                              for order in pending.dead_letters}, pending.verify, pending.held,
                             passing=is_dead_letter_queue_name(queue),
                             partitioned=owning_queue(queue).lower() in partitioned,
                             lock_seconds=locks.get(owning_queue(queue).lower()),
                             special={order.identity: order for order in pending.orders},
                             sessions=dict(pending.sessions) if queue.lower() in session_entities else None)
            for queue, pending in sorted(unpurged.items()) if pending.spans}


def after_purge(unpurged: dict[str, Unpurged], results: dict[str, PurgeResult]) -> dict[str, Unpurged]:
    """What is left to settle once purges ended with ``results`` (spans settled, spans still there).

    Spans recorded while a purge ran (added after its plan was made) are kept as they are.
    """
    new = dict(unpurged)
    for queue, result in results.items():
        pending = new.get(queue)
        if pending is None:
            continue
        untouched = tuple(span for span in pending.spans if not _was_planned(span, result))
        spans = untouched + result.remaining

        def still_held(orders):
            return tuple(order for order in orders if any(span.holds(order.sequence_number, order.enqueued_ms)
                                                          for span in spans))

        # What each session has left: its count less what the round took off (counts recorded meanwhile stay).
        settled = result.sessions_settled or {}
        sessions = {session: n - settled.get(session, 0) for session, n in pending.sessions.items()
                    if n - settled.get(session, 0) > 0}
        # What is left is counted before the next receive (``PurgePlan.verify``), unless the round was
        # throttled before it settled anything: then what is left is what was planned, counts and all.
        unchanged = result.throttled and not (result.completed or result.dead_lettered)
        new[queue] = Unpurged(spans, still_held(pending.dead_letters),
                              pending.verify or (bool(result.remaining) and not unchanged), pending.held,
                              still_held(pending.orders), sessions) if spans else Unpurged(held=pending.held)
    return new


def _was_planned(span: RecordedSpan, result: PurgeResult) -> bool:
    """Whether ``span`` was part of the purge that produced ``result`` (a span left over only moved its first)."""
    same = dataclasses.replace(span, first=0)
    return any(dataclasses.replace(done, first=0) == same for done in result.settled + result.remaining)


def advance_checkpoint(state: dict[str, CheckpointRow], spans: Iterable[RecordedSpan], *, batch_id: int,
                       run_id: str, now: dt.datetime) -> dict[str, CheckpointRow]:
    """The checkpoint rows after a batch recorded ``spans`` (its new outcomes, not those of an earlier attempt)."""
    new_state = dict(state)
    for queue, queue_spans in by_queue(spans).items():
        row = new_state.get(queue) or CheckpointRow(queue, 1, 0, None, 0, None, batch_id, run_id, now, 0, 0, 0)
        if renumbered(row, queue_spans):
            row = dataclasses.replace(row, incarnation=row.incarnation + 1, delivered_through=0,
                                      delivered_enqueued_ms=None, purged_through=0)
        newest = max(queue_spans, key=lambda span: (span.enqueued_to_ms, span.last))
        moves = row.delivered_enqueued_ms is None or newest.enqueued_to_ms >= row.delivered_enqueued_ms
        new_state[queue] = dataclasses.replace(
            row,
            delivered_through=max(row.delivered_through, newest.last) if moves else row.delivered_through,
            delivered_enqueued_ms=newest.enqueued_to_ms if moves else row.delivered_enqueued_ms,
            last_batch_id=batch_id, last_run_id=run_id, updated_at=now,
            delivered_count=row.delivered_count + sum(span.delivered for span in queue_spans),
            dead_lettered_count=row.dead_lettered_count + sum(span.dead_lettered for span in queue_spans),
            skipped_count=row.skipped_count + sum(span.skipped for span in queue_spans))
    return new_state


def renumbered(row: CheckpointRow, spans: Iterable[RecordedSpan]) -> bool:
    """Whether ``spans`` show the queue numbering from the start again: a message at or below the
    delivered-through mark that entered the backlog after the message that mark names."""
    if row.delivered_enqueued_ms is None:
        return False
    # A partitioned queue numbers each partition on its own: a lower partition's messages lie below the mark
    # and are newer without any recreation, so only the mark's own partition can show one.
    lane = partition_of(row.delivered_through)
    return any(span.first <= row.delivered_through and span.enqueued_from_ms > row.delivered_enqueued_ms
               and partition_of(span.first) == lane for span in spans)


def mark_purged(state: dict[str, CheckpointRow], results: dict[str, PurgeResult], left: dict[str, Unpurged], *,
                now: dt.datetime) -> dict[str, CheckpointRow]:
    """The checkpoint rows after purges: each queue's mark moves to the newest settled span's last message,
    as long as nothing still to settle entered the backlog before it (so a restart, which looks only
    above the mark, still sees everything unsettled)."""
    new_state = dict(state)
    for queue, result in results.items():
        row = new_state.get(queue)
        if row is None or not result.settled:
            continue
        # Messages compare by (enqueue time, sequence number): several can share a millisecond. Messages held
        # for skipped destinations stay too: the mark never passes them, so the next run finds their audit
        # rows above it and knows to read that queue again (``sink.spark_ports.read_recovery``).
        pending = left.get(queue, Unpurged())
        unsettled_from = min([(span.enqueued_from_ms, span.first) for span in pending.spans]
                             + ([(pending.held.enqueued_from_ms, pending.held.first)] if pending.held else []),
                             default=None)
        candidates = [span for span in result.settled
                      if unsettled_from is None or (span.enqueued_to_ms, span.last) < unsettled_from]
        if not candidates:
            continue
        newest = max(candidates, key=lambda span: (span.enqueued_to_ms, span.last))
        if row.purged_enqueued_ms is not None and (newest.enqueued_to_ms, newest.last) <= (row.purged_enqueued_ms,
                                                                                           row.purged_through):
            continue
        # The sequence number is shown for the queue's current incarnation only (an older one's span
        # lies above the delivered-through mark); the enqueue-time floor holds across incarnations.
        through = newest.last if newest.last <= row.delivered_through else row.purged_through
        new_state[queue] = dataclasses.replace(row, purged_through=through,
                                               purged_enqueued_ms=newest.enqueued_to_ms, updated_at=now)
    return new_state
