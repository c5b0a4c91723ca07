"""Bookkeeping between the sink's steps: checkpoints, purge plans, summaries."""

import datetime as dt

from backlog_syphon.delivery_plan import checkpoint_updates, purge_plans, recorded_keys, summarise

NOW = dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc)


def outcome(queue, seq, outcome="delivered", batch_id=3, destination="orders", reason_code=None, reason=None):
    return {"backlog_queue": queue, "sequence_number": seq, "outcome": outcome, "batch_id": batch_id,
            "destination": destination, "reason_code": reason_code, "reason": reason}


def test_checkpoint_moves_to_highest_outcome_and_counts_this_batch_only():
    rows = [outcome("q0", 5), outcome("q0", 7, "dead_lettered"), outcome("q0", 6, "skipped_ping"),
            outcome("q1", 2), outcome("q0", 3, batch_id=2)]  # recorded by an earlier batch
    updates = checkpoint_updates(rows, batch_id=3, run_id="r", now=NOW)
    assert [u["backlog_queue"] for u in updates] == ["q0", "q1"]
    q0 = updates[0]
    assert (q0["delivered_through"], q0["delivered_count"], q0["dead_lettered_count"], q0["skipped_count"]) == (7, 1, 1, 1)
    assert q0["last_batch_id"] == 3 and q0["last_run_id"] == "r" and q0["updated_at"] == NOW
    assert updates[1]["delivered_through"] == 2


def test_purge_plan_completes_delivered_and_skipped_and_dead_letters_the_rest():
    plans = purge_plans([outcome("q0", 1), outcome("q0", 2, "skipped_ping"),
                         outcome("q0", 3, "dead_lettered", reason_code="missing_path", reason="no x-ms-path"),
                         outcome("q1", 9, "dead_lettered")])
    assert plans == {"q0": {1: None, 2: None, 3: ("missing_path", "no x-ms-path")},
                     "q1": {9: ("undeliverable", "")}}


def test_recorded_keys_and_summary():
    rows = [outcome("q0", 1), outcome("q0", 2, destination="payments"),
            outcome("q1", 3, "dead_lettered", destination=None)]
    assert recorded_keys(rows) == {("q0", 1), ("q0", 2), ("q1", 3)}
    assert summarise(rows) == {
        "(none)": {"delivered": 0, "dead_lettered": 1, "skipped_ping": 0},
        "orders": {"delivered": 1, "dead_lettered": 0, "skipped_ping": 0},
        "payments": {"delivered": 1, "dead_lettered": 0, "skipped_ping": 0},
    }
