"""Each backlog queue's marks between the sink's steps (``sink.queue_marks``): checkpoints, incarnations, what is
left to purge."""

import dataclasses
import datetime as dt

import pytest

from backlog_syphon.model import CheckpointRow, DeadLetterOrder, HeldSpan, RecordedSpan
from backlog_syphon.purge.plan import PurgePlan, PurgeResult
from backlog_syphon.sink.queue_marks import (
    Unpurged,
    add_recorded,
    advance_checkpoint,
    after_purge,
    awaiting_settlement,
    by_queue,
    mark_purged,
    purge_plans,
    renumbered,
)

NOW = dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc)
EARLY = NOW - dt.timedelta(hours=1)
T0 = 1_700_000_000_000  # message n of the first incarnation entered the backlog at T0 + n (ms)
LATER = T0 + 3_600_000  # a recreated queue's messages enter an hour later: message n at LATER + n


def span(queue, first, last, delivered=0, dead=0, skipped=0, *, at=T0, batch_id=None):
    """Messages first..last of ``queue`` (enqueued at ``at`` + sequence number) with recorded outcomes."""
    return RecordedSpan(queue, first, last, at + first, at + last, delivered + dead + skipped, delivered, dead,
                        skipped, batch_id)


def checkpoint(queue, delivered_through, purged_through=0, *, incarnation=1, at=T0, purged_at=None, counts=(0, 0, 0),
               updated_at=NOW):
    return CheckpointRow(queue, incarnation, delivered_through, at + delivered_through if delivered_through else None,
                         purged_through, purged_at, 3, "r", updated_at, *counts)


def result(settled=(), remaining=(), completed=0):
    return PurgeResult(completed, 0, 0, tuple(remaining), tuple(settled))


def test_spans_are_grouped_by_queue_in_order():
    a, b, c = span("q0", 1, 2, 2), span("q1", 1, 1, 1), span("q0", 5, 6, 2)
    assert by_queue([a, b, c]) == {"q0": [a, c], "q1": [b]}


# --- the checkpoint -------------------------------------------------------------------------------

def test_checkpoint_moves_forward_and_counts_this_batch_once():
    state = advance_checkpoint({}, [span("q0", 1, 7, delivered=5, dead=1, skipped=1)], batch_id=3, run_id="r",
                               now=NOW)
    assert state == {"q0": CheckpointRow("q0", 1, 7, T0 + 7, 0, None, 3, "r", NOW, 5, 1, 1)}
    later = advance_checkpoint(state, [span("q0", 8, 9, delivered=2)], batch_id=4, run_id="r2", now=NOW)
    assert (later["q0"].delivered_through, later["q0"].delivered_enqueued_ms, later["q0"].delivered_count) == (
        9, T0 + 9, 7)
    assert (later["q0"].last_batch_id, later["q0"].last_run_id) == (4, "r2")


def test_checkpoint_never_moves_back_when_a_replay_records_what_was_left_unsent():
    state = {"q0": checkpoint("q0", 9, counts=(7, 0, 0))}
    replay = advance_checkpoint(state, [span("q0", 2, 3, delivered=2)], batch_id=5, run_id="r2", now=NOW)
    row = replay["q0"]
    assert (row.incarnation, row.delivered_through, row.delivered_enqueued_ms) == (1, 9, T0 + 9)
    assert row.delivered_count == 9  # the new outcomes are counted


def test_checkpoint_of_several_spans_of_one_batch_names_the_newest_message():
    state = advance_checkpoint({}, [span("q0", 6, 8, delivered=3), span("q0", 1, 4, delivered=4),
                                    span("q1", 1, 1, skipped=1)], batch_id=1, run_id="r", now=NOW)
    assert (state["q0"].delivered_through, state["q0"].delivered_enqueued_ms, state["q0"].delivered_count) == (
        8, T0 + 8, 7)
    assert (state["q1"].delivered_through, state["q1"].skipped_count) == (1, 1)


def test_a_span_at_or_below_the_mark_enqueued_after_it_means_the_queue_was_recreated():
    state = {"q0": checkpoint("q0", 150, 100, purged_at=T0 + 100, counts=(150, 0, 0))}
    recreated = span("q0", 1, 20, delivered=20, at=LATER)
    assert renumbered(state["q0"], [recreated])
    row = advance_checkpoint(state, [recreated], batch_id=9, run_id="r", now=NOW)["q0"]
    assert row == CheckpointRow("q0", incarnation=2, delivered_through=20, delivered_enqueued_ms=LATER + 20,
                                purged_through=0, purged_enqueued_ms=T0 + 100, last_batch_id=9, last_run_id="r",
                                updated_at=NOW, delivered_count=170, dead_lettered_count=0, skipped_count=0)


def test_the_incarnation_goes_up_exactly_at_the_mark_too():
    row = checkpoint("q0", 150)
    assert renumbered(row, [span("q0", 150, 151, at=LATER)])  # first == delivered_through, enqueued later
    assert advance_checkpoint({"q0": row}, [span("q0", 150, 151, 2, at=LATER)], batch_id=9, run_id="r",
                              now=NOW)["q0"].incarnation == 2


def test_no_new_incarnation_for_older_messages_below_the_mark_or_newer_ones_above_it():
    row = checkpoint("q0", 150)
    assert not renumbered(row, [span("q0", 120, 130)])  # below the mark, enqueued before it: left unsent earlier
    assert not renumbered(row, [span("q0", 151, 160)])  # above the mark: the same queue going on
    assert not renumbered(row, [span("q0", 150, 150)])  # the very message the mark names
    assert not renumbered(checkpoint("q0", 0), [span("q0", 1, 5, at=LATER)])  # nothing delivered yet
    assert advance_checkpoint({"q0": row}, [span("q0", 120, 130, 11)], batch_id=9, run_id="r",
                              now=NOW)["q0"].incarnation == 1


# --- what is left to purge ------------------------------------------------------------------------

def test_what_is_recorded_is_planned_for_purging_and_forgotten_once_settled():
    a, b = span("q0", 5, 10, delivered=5, dead=1), span("q1", 1, 3, skipped=3)
    missing_path = DeadLetterOrder("q0", 7, T0 + 7, "missing_path", "no x-ms-path")
    unpurged = add_recorded({}, [a, b], [missing_path])
    assert purge_plans(unpurged) == {
        "q0": PurgePlan("q0", (a,), 6, {(7, T0 + 7): ("missing_path", "no x-ms-path")}),
        "q1": PurgePlan("q1", (b,), 3),
    }
    c = span("q0", 11, 12, delivered=2)
    more = add_recorded(unpurged, [c])
    assert more["q0"] == Unpurged((a, c), (missing_path,))
    assert more["q0"].count == 8

    left_of_b = dataclasses.replace(b, first=3)
    settled = after_purge(more, {"q0": result(settled=[a, c]), "q1": result(remaining=[left_of_b])})
    assert settled["q0"] == Unpurged()  # all of it
    assert settled["q1"] == Unpurged((left_of_b,), (), verify=True)  # partly: count what is left next time
    assert purge_plans(settled) == {"q1": PurgePlan("q1", (left_of_b,), 3, {}, verify=True)}


def test_leftovers_of_an_earlier_run_are_verified_before_they_are_received():
    unpurged = add_recorded({}, [span("q0", 3, 4, delivered=2)], verify=True)
    assert purge_plans(unpurged)["q0"].verify
    assert purge_plans({"q0": Unpurged()}) == {}  # nothing recorded: nothing planned


def test_after_purge_keeps_spans_added_after_the_plan():
    a = span("q0", 1, 5, delivered=5)
    plan = purge_plans(add_recorded({}, [a]))["q0"]
    b = span("q0", 6, 9, delivered=4)  # recorded while the purge of ``plan`` ran
    dead = DeadLetterOrder("q0", 8, T0 + 8, "missing_path", "no x-ms-path")
    unpurged = add_recorded(add_recorded({}, [a]), [b], [dead])
    left = after_purge(unpurged, {"q0": result(settled=plan.spans, completed=5)})
    assert left == {"q0": Unpurged((b,), (dead,), verify=False)}


def test_after_purge_keeps_a_later_span_and_whats_left_of_a_planned_one():
    a, b = span("q0", 1, 5, delivered=5), span("q0", 6, 9, delivered=4)
    dead_a = DeadLetterOrder("q0", 2, T0 + 2, "ping", "")
    dead_gone = DeadLetterOrder("q0", 1, T0 + 1, "ping", "")
    unpurged = add_recorded({}, [a, b], [dead_gone, dead_a])
    left_of_a = dataclasses.replace(a, first=2)
    left = after_purge(unpurged, {"q0": result(remaining=[left_of_a]), "q9": result(settled=[span("q9", 1, 1)])})
    assert left["q0"] == Unpurged((b, left_of_a), (dead_a,), verify=True)  # 1 is settled: its order goes
    assert "q9" not in left  # a queue nobody knows of stays unknown


def test_a_throttled_round_that_settled_nothing_leaves_the_plan_as_it_was_and_one_that_did_counts_again():
    a, b = span("q0", 1, 5, delivered=5), span("q0", 6, 9, delivered=4)
    unpurged = add_recorded({}, [a, b])
    nothing = PurgeResult(0, 0, 0, (a, b), (), throttled=True)  # the round's first receive was refused
    assert after_purge(unpurged, {"q0": nothing}) == {"q0": Unpurged((a, b), (), verify=False)}
    some = PurgeResult(5, 0, 0, (b,), (a,), throttled=True)  # a settled whole, b perhaps in part
    assert after_purge(unpurged, {"q0": some}) == {"q0": Unpurged((b,), (), verify=True)}


# --- the purge mark -------------------------------------------------------------------------------

def test_purge_marks_only_move_forward():
    a, b = span("q0", 1, 4, 4), span("q0", 5, 9, 5)
    state = {"q0": checkpoint("q0", 9, updated_at=EARLY)}
    purged = mark_purged(state, {"q0": result(settled=[b]), "unknown": result(settled=[span("unknown", 1, 4)])},
                         {}, now=NOW)
    assert (purged["q0"].purged_through, purged["q0"].purged_enqueued_ms, purged["q0"].updated_at) == (
        9, T0 + 9, NOW)
    assert "unknown" not in purged
    assert mark_purged(purged, {"q0": result(settled=[a])}, {}, now=NOW)["q0"].purged_through == 9  # never back
    assert mark_purged(purged, {"q0": result(settled=[b])}, {}, now=EARLY) == purged  # the same mark: unchanged


def test_purge_mark_never_passes_a_message_still_to_settle():
    a, b, c = span("q0", 1, 4, 4), span("q0", 5, 9, 5), span("q0", 10, 12, 3)
    state = {"q0": checkpoint("q0", 12)}
    # b is still there (its purge stopped at 7), a and c are settled: a restart must still look at 5 on.
    left = {"q0": Unpurged((dataclasses.replace(b, first=7),))}
    marked = mark_purged(state, {"q0": result(settled=[a, c], remaining=[dataclasses.replace(b, first=7)])}, left,
                         now=NOW)
    assert (marked["q0"].purged_through, marked["q0"].purged_enqueued_ms) == (4, T0 + 4)
    # once b is settled too, the mark moves to b's last message (c's settlement was an earlier result's)
    done = mark_purged(marked, {"q0": result(settled=[b])}, {}, now=NOW)
    assert (done["q0"].purged_through, done["q0"].purged_enqueued_ms) == (9, T0 + 9)


def test_purge_mark_stays_when_every_settled_span_entered_after_an_unsettled_one():
    a, b = span("q0", 1, 4, 4), span("q0", 5, 9, 5)
    state = {"q0": checkpoint("q0", 9, 0)}
    marked = mark_purged(state, {"q0": result(settled=[b])}, {"q0": Unpurged((a,))}, now=NOW)
    assert marked == state
    assert mark_purged(state, {"q0": result(remaining=[a])}, {"q0": Unpurged((a,))}, now=NOW) == state


def test_purge_mark_of_a_recreated_queue_follows_enqueue_times_not_sequence_numbers():
    old = span("q0", 140, 150, 11)
    new = span("q0", 1, 20, 20, at=LATER)
    state = {"q0": checkpoint("q0", 20, incarnation=2, at=LATER, purged_at=T0 + 139)}
    marked = mark_purged(state, {"q0": result(settled=[old, new])}, {}, now=NOW)
    assert (marked["q0"].purged_through, marked["q0"].purged_enqueued_ms) == (20, LATER + 20)


@pytest.mark.parametrize("old_first, old_last", [(140, 150)])  # (1, 10): the shown number still names the old incarnation (closing note)
def test_purge_mark_of_a_recreated_queue_names_no_message_of_the_old_incarnation(old_first, old_last):
    # The old queue's last span is found settled only after the checkpoint moved to incarnation 2 (1..20
    # of the new queue recorded, still to settle): every message enqueued up to the old span's last is
    # settled, but no message of incarnation 2 is, so its purged_through stays 0 (it counts in this
    # incarnation only), whether the old queue had numbered further than the new one or not.
    old = span("q0", old_first, old_last, old_last - old_first + 1)
    new = span("q0", 1, 20, 20, at=LATER)
    state = {"q0": checkpoint("q0", 20, incarnation=2, at=LATER, purged_at=T0)}
    marked = mark_purged(state, {"q0": result(settled=[old])}, {"q0": Unpurged((new,))}, now=NOW)
    assert marked["q0"].purged_enqueued_ms == T0 + old_last
    assert (marked["q0"].incarnation, marked["q0"].delivered_through, marked["q0"].purged_through) == (2, 20, 0)


def test_where_messages_were_held_is_kept_for_the_run_and_given_to_every_purge_of_the_queue():
    """Held messages stay in the backlog: a purge that settles everything recorded must still know to pass
    them over the next time (later batches record more behind them)."""
    q = "q0"
    held_a = HeldSpan(q, 2, 2, T0 + 2, T0 + 2, 1)
    held_b = HeldSpan(q, 9, 9, T0 + 9, T0 + 9, 1)
    first = span(q, 1, 3, delivered=2)
    unpurged = add_recorded({}, [first], held=[held_a])
    assert purge_plans(unpurged)[q].held == held_a
    settled = after_purge(unpurged, {q: PurgeResult(2, 0, 0, (), (first,))})
    assert settled[q].spans == () and settled[q].held == held_a
    assert purge_plans(settled) == {}  # nothing to settle: no purge for the held alone
    later = span(q, 8, 10, delivered=2)
    unpurged = add_recorded(settled, [later], held=[held_b])
    assert purge_plans(unpurged)[q].held == HeldSpan(q, 2, 9, T0 + 2, T0 + 9, 2)


def test_the_purge_mark_never_passes_a_message_held_for_a_skipped_destination():
    """So the next run still finds the held rows above the mark (``spark_ports.read_recovery``) and reads
    that queue again; settled spans before the held message still move the mark up to it."""
    q = "q0"
    before, after = span(q, 1, 3, delivered=3), span(q, 6, 9, delivered=4)
    checkpoint = {q: CheckpointRow(q, 1, 9, T0 + 9, 0, None, 0, "r", EARLY, 7, 0, 0)}
    left = add_recorded({}, [], held=[HeldSpan(q, 4, 5, T0 + 4, T0 + 5, 2)])
    marked = mark_purged(checkpoint, {q: PurgeResult(7, 0, 0, (), (before, after))}, left, now=NOW)
    assert (marked[q].purged_through, marked[q].purged_enqueued_ms) == (3, T0 + 3)
    free = mark_purged(checkpoint, {q: PurgeResult(7, 0, 0, (), (before, after))}, {}, now=NOW)
    assert (free[q].purged_through, free[q].purged_enqueued_ms) == (9, T0 + 9)


def test_the_purge_plans_of_queues_called_partitioned_expect_interleaved_receives_and_so_do_their_dead_letters():
    q, other = "ns/x-servicebus-transfer/3", "ns/x-servicebus-transfer/4"
    dead = f"{q}/$DeadLetterQueue"
    unpurged = add_recorded({}, [RecordedSpan(name, 1, 2, T0 + 1, T0 + 2, 2) for name in (q, other, dead)])
    plans = purge_plans(unpurged, frozenset({q.lower()}))
    assert {name: plan.partitioned for name, plan in plans.items()} == {q: True, other: False, dead: True}
    assert not any(plan.partitioned for plan in purge_plans(unpurged).values())  # nothing known: the numbers tell


def test_a_migrations_settle_orders_and_session_counts_go_to_the_purge_and_what_a_round_took_off_is_forgotten():
    """Recorded scheduled and deferred messages (``SettleOrder``) are not what a receive expects; a session-enabled
    source's purge asks each session for its count, less what each round took off (counts recorded meanwhile stay)."""
    from backlog_syphon.model import SettleKind, SettleOrder

    recorded = span("sessions", 1, 6, 6)
    deferred = SettleOrder("sessions", 2, T0 + 2, SettleKind.RECEIVE_DEFERRED, "s-a")
    pending = add_recorded({}, [recorded], orders=[deferred], sessions={"sessions": {"s-a": 4, "s-b": 2}})
    pending = add_recorded(pending, [span("sessions", 7, 7, 1)], sessions={"sessions": {"s-b": 1}})
    (plan,) = purge_plans(pending, session_entities=frozenset({"sessions"})).values()
    assert (plan.expected, plan.special, plan.sessions) == (6, {(2, T0 + 2): deferred}, {"s-a": 4, "s-b": 3})
    assert purge_plans(pending)["sessions"].sessions is None  # not a session-settled source
    left = after_purge(pending, {"sessions": PurgeResult(2, 0, 0, (dataclasses.replace(recorded, first=5),), (),
                                                         sessions_settled={"s-a": 4, "s-b": 1})})
    assert (left["sessions"].sessions, left["sessions"].orders) == ({"s-b": 2}, ())  # 2 is past the span's rest


def test_the_purge_plans_carry_their_queues_lock_where_the_administration_api_said_and_dead_letters_their_queues():
    q, other = "ns/x-servicebus-transfer/3", "ns/x-servicebus-transfer/4"
    dead = f"{q}/$DeadLetterQueue"
    unpurged = add_recorded({}, [RecordedSpan(name, 1, 2, T0 + 1, T0 + 2, 2) for name in (q, other, dead)])
    plans = purge_plans(unpurged, lock_seconds={q.lower(): 30.0})
    assert {name: plan.lock_seconds for name, plan in plans.items()} == {q: 30.0, other: None, dead: 30.0}


def test_what_waits_to_be_settled_is_what_the_recovered_spans_hold_per_queue():
    spans = [RecordedSpan("q1", 1, 5, T0 + 1, T0 + 5, 5), RecordedSpan("q0", 2, 3, T0 + 2, T0 + 3, 2),
             RecordedSpan("q1", 9, 9, T0 + 9, T0 + 9, 1)]
    assert awaiting_settlement(spans) == {"q0": 2, "q1": 6}
    assert awaiting_settlement([]) == {}
