"""Bookkeeping between the sink's steps: checkpoints, purge plans, summaries."""

import datetime as dt

from backlog_syphon.delivery_plan import advance_checkpoint, mark_purged, purge_plans, recorded_keys, summarise
from backlog_syphon.purge_plan import PurgePlan

NOW = dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc)


def outcome(queue, seq, outcome="delivered", batch_id=3, destination="orders", reason_code=None, reason=None):
    return {"backlog_queue": queue, "sequence_number": seq, "outcome": outcome, "batch_id": batch_id,
            "destination": destination, "reason_code": reason_code, "reason": reason}


def test_checkpoint_moves_to_highest_outcome_and_counts_this_batch_only():
    rows = [outcome("q0", 5), outcome("q0", 7, "dead_lettered"), outcome("q0", 6, "skipped_ping"),
            outcome("q1", 2), outcome("q0", 3, batch_id=2)]  # recorded by an earlier batch
    state = advance_checkpoint({}, rows, batch_id=3, run_id="r", now=NOW)
    assert sorted(state) == ["q0", "q1"]
    q0 = state["q0"]
    assert (q0["delivered_through"], q0["delivered_count"], q0["dead_lettered_count"], q0["skipped_count"]) == (7, 1, 1, 1)
    assert q0["last_batch_id"] == 3 and q0["last_run_id"] == "r" and q0["updated_at"] == NOW
    assert q0["purged_through"] == 0 and state["q1"]["delivered_through"] == 2


def test_checkpoint_never_moves_back_and_a_replay_counts_once():
    state = advance_checkpoint({}, [outcome("q0", 9)], batch_id=3, run_id="r", now=NOW)
    replayed = advance_checkpoint(state, [outcome("q0", 9), outcome("q0", 4)], batch_id=3, run_id="r2", now=NOW)
    assert replayed["q0"]["delivered_through"] == 9 and replayed["q0"]["delivered_count"] == 1
    later = advance_checkpoint(replayed, [outcome("q0", 12, batch_id=4)], batch_id=4, run_id="r2", now=NOW)
    assert later["q0"]["delivered_count"] == 2 and later["q0"]["delivered_through"] == 12
    assert state["q0"]["delivered_count"] == 1  # inputs are not modified


def test_mark_purged_only_moves_forward():
    state = advance_checkpoint({}, [outcome("q0", 9)], batch_id=3, run_id="r", now=NOW)
    purged = mark_purged(state, {"q0": 9, "unknown": 4}, now=NOW)
    assert purged["q0"]["purged_through"] == 9 and "unknown" not in purged
    assert mark_purged(purged, {"q0": 5}, now=NOW)["q0"]["purged_through"] == 9


def test_purge_plan_completes_delivered_and_skipped_and_dead_letters_the_rest():
    plans = purge_plans([outcome("q0", 1), outcome("q0", 2, "skipped_ping"),
                         outcome("q0", 3, "dead_lettered", reason_code="missing_path", reason="no x-ms-path"),
                         outcome("q0", 3, "dead_lettered", reason_code="missing_path", reason="no x-ms-path"),
                         outcome("q1", 9, "dead_lettered"), outcome("q1", 4)],  # q1 is purged through 4
                        {"q0": 0, "q1": 4}, verify=True)
    assert plans == {
        "q0": PurgePlan("q0", first=1, through=3, expected=3,
                        dead_letters={3: ("missing_path", "no x-ms-path")}, verify=True),
        "q1": PurgePlan("q1", first=5, through=9, expected=1, dead_letters={9: ("undeliverable", "")},
                        verify=True),
    }


def test_recorded_keys_and_summary():
    rows = [outcome("q0", 1), outcome("q0", 2, destination="payments"),
            outcome("q1", 3, "dead_lettered", destination=None)]
    assert recorded_keys(rows) == {("q0", 1), ("q0", 2), ("q1", 3)}
    assert summarise(rows) == {
        "(none)": {"delivered": 0, "dead_lettered": 1, "skipped_ping": 0},
        "orders": {"delivered": 1, "dead_lettered": 0, "skipped_ping": 0},
        "payments": {"delivered": 1, "dead_lettered": 0, "skipped_ping": 0},
    }
