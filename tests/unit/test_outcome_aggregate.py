"""The aggregate of a batch's outcomes from the groups Spark makes of them (``sink.outcome_aggregate``, pure):
recorded spans, per-destination counts, unsent destinations, held spans."""

import pytest

from backlog_syphon.model import HeldSpan, Outcome, ReasonCode, RecordedSpan
from backlog_syphon.sink.micro_batch import BatchAggregate, Unsent
from backlog_syphon.sink.outcome_aggregate import NO_DESTINATION, combine_groups

T0 = 1_700_000_000_000
Q0, Q1 = "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"


def group(queue, island, destination, outcome, first, last, n, *, reason_code=None, reason=None,
          since=1_800_000_009_000,
          run_id="r1", batch_id=4):
    return {"run_id": run_id, "batch_id": batch_id, "backlog_queue": queue, "island": island,
            "destination": destination, "outcome": outcome, "reason_code": reason_code, "first": first, "last": last,
            "enqueued_from": T0 + 10 * first, "enqueued_to": T0 + 10 * last, "n": n, "reason": reason,
            "since": since}


def test_final_outcomes_make_one_span_per_island_and_unsent_ones_are_counted_per_destination():
    groups = [
        group(Q0, 0, "orders", "delivered", 1, 3, 2),
        group(Q0, 0, None, "dead_lettered", 2, 2, 1, reason_code="missing_path", reason="no x-ms-path"),
        group(Q0, 1, "payments", "unsent", 4, 4, 1, reason_code="destination_unavailable", reason="down",
              since=1_800_000_000_000),
        group(Q0, 1, "orders", "delivered", 5, 6, 2),
        group(Q0, 2, "payments", "unsent", 7, 7, 1, reason_code="destination_unavailable", reason="down",
              since=1_800_000_005_000),
        group(Q1, 0, "orders", "skipped_ping", 1, 1, 1, reason_code="ping", since=1_800_000_002_000),
    ]
    assert combine_groups(groups) == BatchAggregate(
        spans=(RecordedSpan(Q0, 1, 3, T0 + 10, T0 + 30, 3, 2, 1, 0, 4),
               RecordedSpan(Q0, 5, 6, T0 + 50, T0 + 60, 2, 2, 0, 0, 4),
               RecordedSpan(Q1, 1, 1, T0 + 10, T0 + 10, 1, 0, 0, 1, 4)),
        per_destination={("orders", Outcome.DELIVERED): 4, (NO_DESTINATION, Outcome.DEAD_LETTERED): 1,
                         ("payments", Outcome.UNSENT): 2, ("orders", Outcome.SKIPPED_PING): 1},
        unsent={"payments": Unsent(2, ReasonCode.DESTINATION_UNAVAILABLE, "down", 1_800_000_000.0)},
        first_outcome_ms=1_800_000_002_000)  # the earliest final outcome: an unsent row's time is not a send
    aggregate = combine_groups(groups)
    assert (aggregate.rows, aggregate.total(Outcome.DELIVERED), aggregate.total(Outcome.UNSENT)) == (8, 4, 2)
    assert aggregate.final_unavailable == aggregate.unsent


def test_attempts_of_other_runs_make_spans_of_their_own():
    groups = [group(Q0, 0, "orders", "delivered", 1, 2, 2, run_id="r1"),
              group(Q0, 0, "orders", "delivered", 3, 3, 1, run_id="r2")]
    assert [(s.first, s.last, s.count) for s in combine_groups(groups).spans] == [(1, 2, 2), (3, 3, 1)]


def test_a_round_deadline_is_not_a_final_unavailability():
    aggregate = combine_groups([group(Q0, 1, "orders", "unsent", 1, 3, 3, reason_code="round_deadline",
                                      reason="the send round ended", since=1_800_000_000_000)])
    assert aggregate.unsent == {"orders": Unsent(3, ReasonCode.ROUND_DEADLINE, "the send round ended",
                                                 1_800_000_000.0)}
    assert aggregate.final_unavailable == {} and aggregate.spans == ()


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_destination_unavailable_in_one_queues_task_is_unavailable_whatever_the_order_of_the_groups(order):
    # Spark collects the groups in no particular order: payments gave up in Q0's task (its outage wait is
    # over) while Q1's task reached the round's deadline first.
    groups = [group(Q0, 1, "payments", "unsent", 2, 2, 1, reason_code="destination_unavailable",
                    reason="destination 'payments' stayed unavailable for 60 s", since=1_800_000_000_000),
              group(Q1, 1, "payments", "unsent", 1, 1, 1, reason_code="round_deadline",
                    reason="the send round ended", since=1_800_000_001_000)]
    aggregate = combine_groups([groups[i] for i in order])
    assert aggregate.unsent["payments"].count == 2
    assert aggregate.unsent["payments"].since == 1_800_000_000.0
    assert aggregate.unsent["payments"].reason_code == ReasonCode.DESTINATION_UNAVAILABLE
    assert set(aggregate.final_unavailable) == {"payments"}


def test_held_messages_cut_the_spans_are_counted_and_located_but_are_neither_recorded_nor_unsent():
    """HELD (restore.skip_destinations) is not final: no span holds it (the purge never settles it), the
    batch neither fails nor sends it again, and its place in the queue goes to the purge as a HeldSpan."""
    groups = [
        group(Q0, 0, "orders", "delivered", 1, 1, 1),
        group(Q0, 1, "payments", "held", 2, 2, 1, reason_code="destination_skipped"),
        group(Q0, 1, "orders", "delivered", 3, 3, 1),
        group(Q0, 2, "payments", "held", 4, 6, 2, reason_code="destination_skipped"),
        group(Q0, 2, "orders", "delivered", 5, 5, 1),
    ]
    aggregate = combine_groups(groups)
    assert [(s.first, s.last, s.count) for s in aggregate.spans] == [(1, 1, 1), (3, 3, 1), (5, 5, 1)]
    assert aggregate.held == (HeldSpan(Q0, 2, 6, T0 + 20, T0 + 60, 3),)
    assert aggregate.unsent == {} and aggregate.final_unavailable == {}
    assert aggregate.total(Outcome.HELD) == 3 and aggregate.per_destination[("payments", Outcome.HELD)] == 3


def test_a_migration_counts_its_sessions_and_special_messages_and_what_stays_cuts_the_spans():
    """Per session-settled source (``session_key``), the recorded messages per session; the scheduled and deferred
    ones a receive does not bring (``special``); a message dead-lettered where that cannot be carried out, or expired
    in a dead-letter sub-queue, stays (``left_in_place``) and cuts the spans; an expired message elsewhere is
    recorded (the broker collects it)."""
    def state(g, message_state, session_key=None):
        return {**g, "message_state": message_state, "session_key": session_key}

    dlq = "orders/$DeadLetterQueue"
    aggregate = combine_groups([
        state(group("sessions", 0, "sessions", "delivered", 1, 3, 2), "active", "s-a"),
        state(group("sessions", 0, "sessions", "delivered", 2, 2, 1), "deferred", "s-b"),
        state(group("orders", 0, "orders", "delivered", 1, 1, 1), "scheduled"),
        state(group("orders", 0, "orders", "expired", 2, 2, 1, reason_code="expired_in_source"), "active"),
        state(group("orders", 1, "orders", "dead_lettered", 3, 3, 1, reason_code="destination_not_found"), "scheduled"),
        state(group(dlq, 0, "orders", "expired", 5, 5, 1, reason_code="expired_in_source"), "active"),
    ])
    assert aggregate.sessions == {"sessions": {"s-a": 2, "s-b": 1}}
    assert (aggregate.special, aggregate.left_in_place) == (2, 2)
    assert aggregate.spans == (RecordedSpan("orders", 1, 2, T0 + 10, T0 + 20, 2, 1, 0, 0, 4),
                               RecordedSpan("sessions", 1, 3, T0 + 10, T0 + 30, 3, 3, 0, 0, 4))


def test_a_covered_copy_is_recorded_in_its_span_and_settled_as_a_ping_is():
    aggregate = combine_groups([group("events/Subscriptions/eu", 0, "events", "covered", 1, 3, 3,
                                      reason_code="fanned_out")])
    assert aggregate.spans == (RecordedSpan("events/Subscriptions/eu", 1, 3, T0 + 10, T0 + 30, 3, 0, 0, 3, 4),)
    assert aggregate.per_destination == {("events", Outcome.COVERED): 3} and aggregate.left_in_place == 0
