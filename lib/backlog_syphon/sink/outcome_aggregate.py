"""A micro-batch's outcomes aggregated, from the groups one Spark job makes of them: pure functions on
plain values (``sink.spark_ports.aggregate_outcomes`` runs the job).

What the driver works from (``sink.micro_batch.BatchAggregate``), never one row per message:
- recorded spans: runs of final outcomes of one queue, batch and attempt, in sequence order, cut
  wherever a message stays where it is (``cuts_span``), so a span holds only what the purge may settle;
- per-destination counts of every outcome, and the destinations a round left unsent (a final reason
  wins over the round's deadline);
- where messages were held for skipped destinations (``HeldSpan``, per queue);
- the batch's pacing over its rounds (``pacing_after_round``).
"""

from __future__ import annotations

import dataclasses

from backlog_syphon.model import HeldSpan, MessageState, Outcome, PacingStats, ReasonCode, RecordedSpan
from backlog_syphon.restore.queue_names import is_dead_letter_queue_name
from backlog_syphon.sink.micro_batch import BatchAggregate, Unsent

NO_DESTINATION = "(no destination)"


# Final outcomes whose message may stay where it is: dead-lettered where that cannot be carried out, expired where
# the broker collects nothing (``cuts_span``).
STAYING_WHERE_THEY_ARE = (Outcome.DEAD_LETTERED, Outcome.EXPIRED)


def cuts_span(outcome: Outcome, backlog_queue: str, message_state: str | None = None) -> bool:
    """Whether a message with this outcome stays where it is, untouched by the purge, so that no recorded
    span may hold it: every non-final outcome (left unsent, or on purpose: held or not selected,
    ``Outcome.stays``), one dead-lettered or expired in a dead-letter sub-queue (which cannot dead-letter again,
    and expires nothing), and a scheduled message dead-lettered by the migration mode (no receive brings it, and
    cancelling it would lose it). ``sink.spark_ports.aggregate_outcomes`` says the same in Spark."""
    return not outcome.is_final or (outcome in STAYING_WHERE_THEY_ARE and (
        is_dead_letter_queue_name(backlog_queue) or message_state == MessageState.SCHEDULED))


def combine_groups(groups: list[dict]) -> BatchAggregate:
    """The aggregate from group rows (run, batch, queue, island, destination, outcome, reason code, message
    state, session key) with their sequence and enqueue ranges and counts. A group's ``session_key`` is its
    session in a source settled session by session (else null): what the spans hold is counted per session,
    so the purge asks each session for exactly its own."""
    spans: dict[tuple, dict] = {}
    sessions: dict[str, dict[str, int]] = {}
    special = 0  # recorded messages a receive does not bring (scheduled, deferred): settled by their own means
    left_in_place = 0  # final outcomes whose message stays where it is (dead-lettered where it cannot be)
    per_destination: dict[tuple[str, Outcome], int] = {}
    unsent: dict[str, Unsent] = {}
    held: dict[tuple, HeldSpan] = {}  # (run, batch, queue) -> where its held messages lie
    first_outcome_ms = None
    for group in groups:
        outcome = Outcome(group["outcome"])
        destination = group["destination"] or NO_DESTINATION
        per_destination[(destination, outcome)] = per_destination.get((destination, outcome), 0) + group["n"]
        if outcome == Outcome.HELD:
            key = (group["run_id"], group["batch_id"], group["backlog_queue"])
            found = HeldSpan(group["backlog_queue"], group["first"], group["last"], group["enqueued_from"] or 0,
                             group["enqueued_to"] or 0, group["n"])
            held[key] = found.merged(held.get(key))
            continue
        if outcome == Outcome.UNSENT:
            known = unsent.get(destination)
            since = (group["since"] or 0) / 1000
            code, reason = ReasonCode(group["reason_code"]), group["reason"] or ""
            if known is not None and code == ReasonCode.ROUND_DEADLINE:  # a final reason wins over the deadline
                code, reason = known.reason_code, known.reason
            unsent[destination] = Unsent(group["n"] + (known.count if known else 0), code, reason,
                                         min(since, known.since) if known else since)
            continue
        state = group.get("message_state")
        if cuts_span(outcome, group["backlog_queue"], state):
            left_in_place += group["n"] if outcome.is_final else 0
            continue  # stays in its queue: counted, never settled
        if state in (MessageState.SCHEDULED, MessageState.DEFERRED) and outcome != Outcome.EXPIRED:
            special += group["n"]
        if group.get("session_key") is not None:
            per_session = sessions.setdefault(group["backlog_queue"], {})
            per_session[group["session_key"]] = per_session.get(group["session_key"], 0) + group["n"]
        first_outcome_ms = _min(first_outcome_ms, group["since"])
        key = (group["run_id"], group["batch_id"], group["backlog_queue"], group["island"])
        span = spans.setdefault(key, {"first": group["first"], "last": group["last"],
                                      "from": group["enqueued_from"], "to": group["enqueued_to"],
                                      Outcome.DELIVERED: 0, Outcome.DEAD_LETTERED: 0, Outcome.SKIPPED_PING: 0,
                                      Outcome.EXPIRED: 0, Outcome.COVERED: 0})
        span["first"], span["last"] = min(span["first"], group["first"]), max(span["last"], group["last"])
        span["from"] = _min(span["from"], group["enqueued_from"])
        span["to"] = _max(span["to"], group["enqueued_to"])
        span[outcome] += group["n"]
    recorded = tuple(
        RecordedSpan(queue, s["first"], s["last"], s["from"] if s["from"] is not None else 0,
                     s["to"] if s["to"] is not None else 0,
                     s[Outcome.DELIVERED] + s[Outcome.DEAD_LETTERED] + s[Outcome.SKIPPED_PING] + s[Outcome.EXPIRED]
                     + s[Outcome.COVERED],
                     # a covered copy is settled as a ping is: completed, never sent
                     s[Outcome.DELIVERED], s[Outcome.DEAD_LETTERED], s[Outcome.SKIPPED_PING] + s[Outcome.COVERED],
                     batch_id)
        for (_, batch_id, queue, _), s in sorted(spans.items(), key=lambda item: (item[0][2], item[1]["first"])))
    return BatchAggregate(recorded, per_destination, unsent,
                          tuple(span for _, span in sorted(held.items(), key=lambda item: (item[0][2], item[1].first))),
                          first_outcome_ms, sessions, special, left_in_place)


def _min(a, b):
    return b if a is None else a if b is None else min(a, b)


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


def pacing_after_round(before: PacingStats | None, this_round: PacingStats) -> PacingStats:
    """A batch's pacing over its rounds: counts and times added up; the rate limit and the cap are the
    last round's (rounds run one after the other, their tasks do not add up)."""
    if before is None:
        return this_round
    merged = before.merge(this_round)
    return dataclasses.replace(merged, rate_limit=this_round.rate_limit, cap=this_round.cap,
                               slowed_seconds=before.slowed_seconds + this_round.slowed_seconds)
