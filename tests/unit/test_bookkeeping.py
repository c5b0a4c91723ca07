"""Bookkeeping between the sink's steps, on per-queue aggregates: checkpoints, what is left to purge."""

import datetime as dt

from backlog_syphon.sink.bookkeeping import (
    Unpurged,
    add_recorded,
    advance_checkpoint,
    after_purge,
    mark_purged,
    merge_outcomes,
    purge_plans,
)
from backlog_syphon.model import CheckpointRow, QueueOutcomes
from backlog_syphon.servicebus.purge_plan import PurgePlan

NOW = dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc)
EARLY = NOW - dt.timedelta(hours=1)


def outcomes(queue, first, through, delivered=0, dead=0, skipped=0, oldest=None):
    return QueueOutcomes(queue, first, through, delivered, dead, skipped, oldest)


def test_aggregates_of_one_queue_add_up():
    merged = merge_outcomes([outcomes("q0", 5, 9, delivered=4, oldest=NOW), outcomes("q1", 1, 1, dead=1)],
                            [outcomes("q0", 2, 4, skipped=2, oldest=EARLY)])
    assert merged == {"q0": outcomes("q0", 2, 9, delivered=4, skipped=2, oldest=EARLY),
                      "q1": outcomes("q1", 1, 1, dead=1)}
    assert merged["q0"].count == 6


def test_checkpoint_moves_forward_and_counts_this_batch_once():
    state = advance_checkpoint({}, [outcomes("q0", 1, 7, delivered=5, dead=1, skipped=1)], batch_id=3,
                               run_id="r", now=NOW)
    assert state == {"q0": CheckpointRow("q0", 7, 0, 3, "r", NOW, 5, 1, 1)}
    replayed = advance_checkpoint(state, [outcomes("q0", 1, 7, delivered=5, dead=1, skipped=1)], batch_id=3,
                                  run_id="r2", now=NOW)
    assert replayed["q0"].delivered_count == 5 and replayed["q0"].last_run_id == "r2"  # no double counts
    later = advance_checkpoint(replayed, [outcomes("q0", 8, 9, delivered=2)], batch_id=4, run_id="r2", now=NOW)
    assert (later["q0"].delivered_through, later["q0"].delivered_count) == (9, 7)
    assert advance_checkpoint(later, [outcomes("q0", 2, 3, delivered=1)], batch_id=5, run_id="r2",
                              now=NOW)["q0"].delivered_through == 9  # never moves back


def test_purge_marks_only_move_forward():
    state = {"q0": CheckpointRow("q0", 9, 0, 3, "r", EARLY, 9, 0, 0)}
    purged = mark_purged(state, {"q0": 9, "unknown": 4}, now=NOW)
    assert purged["q0"].purged_through == 9 and purged["q0"].updated_at == NOW and "unknown" not in purged
    assert mark_purged(purged, {"q0": 5}, now=NOW)["q0"].purged_through == 9


def test_what_is_recorded_is_planned_for_purging_and_forgotten_once_settled():
    checkpoint = {"q0": CheckpointRow("q0", 10, 4, 3, "r", NOW, 0, 0, 0)}
    unpurged = add_recorded({}, [outcomes("q0", 5, 10, delivered=5, dead=1), outcomes("q1", 1, 3, skipped=3)],
                            [("q0", 7, "missing_path", "no x-ms-path"), ("q0", 9, None, None)])
    assert purge_plans(unpurged, checkpoint) == {
        "q0": PurgePlan("q0", first=5, through=10, expected=6,
                        dead_letters={7: ("missing_path", "no x-ms-path"), 9: ("undeliverable", "")}),
        "q1": PurgePlan("q1", first=1, through=3, expected=3),
    }
    more = add_recorded(unpurged, [outcomes("q0", 11, 12, delivered=2)])
    assert more["q0"] == Unpurged(8, 12, {7: ("missing_path", "no x-ms-path"), 9: ("undeliverable", "")})

    settled = after_purge(more, {"q0": 12, "q1": 2})
    assert settled["q0"] == Unpurged()  # all of it
    assert settled["q1"] == Unpurged(3, 3, {}, verify=True)  # partly: count what is left next time
    assert purge_plans(settled, {"q1": CheckpointRow("q1", 3, 2, 3, "r", NOW, 0, 0, 3)}) == {
        "q1": PurgePlan("q1", first=3, through=3, expected=3, verify=True)}


def test_leftovers_of_an_earlier_run_are_verified_before_they_are_received():
    unpurged = add_recorded({}, [outcomes("q0", 3, 4, delivered=2)], verify=True)
    assert purge_plans(unpurged, {})["q0"].verify
