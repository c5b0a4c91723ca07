"""Window planning with single-message probes, budgets and idle back-off."""

import bisect

import pytest

from backlog_syphon.source.planning import (
    ALL_AVAILABLE_BUDGET,
    IdleBackoff,
    WindowPlanner,
    normalise_offsets,
    plan_windows,
    share_budget,
    tail_end,
    window_end,
    windows,
)


def probe_over(sequence_numbers):
    """A probe over a queue holding these sequence numbers, counting its calls."""
    ordered = sorted(sequence_numbers)
    calls = []

    def probe(x):
        calls.append(x)
        index = bisect.bisect_left(ordered, x)
        return ordered[index] if index < len(ordered) else None

    probe.calls = calls
    return probe


def test_empty_queue_keeps_the_offset():
    assert window_end(5, 100, probe_over([])) == 5


def test_more_than_budget_costs_two_probes():
    probe = probe_over(range(1, 1001))
    assert window_end(1, 100, probe) == 101
    assert len(probe.calls) == 2


def test_tail_inside_budget_is_found_exactly():
    probe = probe_over(range(10, 38))
    assert window_end(1, 1000, probe) == 38  # window starts at the first message, ends after the last
    assert len(probe.calls) <= 2 + 11  # binary search over the budget


def test_gaps_left_by_removed_messages():
    present = [3, 4, 9, 200, 201, 450]
    assert window_end(0, 1000, probe_over(present)) == 451
    assert window_end(5, 10, probe_over(present)) == 19  # window [9, 19) holds just 9
    assert window_end(451, 10, probe_over(present)) == 451


@pytest.mark.parametrize("messages", [[1], list(range(1, 5000)), [7, 70, 700, 7000, 70000]])
def test_tail_end_covers_everything(messages):
    assert tail_end(0, probe_over(messages)) == max(messages) + 1


def test_share_budget_gives_every_active_queue_a_share():
    assert share_budget(1000, ["a", "b", "c"]) == {"a": 334, "b": 333, "c": 333}  # never more than the budget
    assert share_budget(100, ["a", "b", "c"]) == {"a": 34, "b": 33, "c": 33}
    assert share_budget(2, ["a", "b", "c"]) == {"a": 1, "b": 1, "c": 1}
    assert share_budget(10, []) == {}


def test_idle_backoff_doubles_and_resets():
    backoff = IdleBackoff(min_seconds=1, max_seconds=8)
    assert backoff.due("q", now=0)
    pauses = []
    now = 0.0
    for _ in range(6):
        backoff.record("q", had_data=False, now=now)
        next_due = next(t for t in range(int(now), int(now) + 100) if backoff.due("q", now=t))
        pauses.append(next_due - now)
        now = next_due
    assert pauses == [1, 2, 4, 8, 8, 8]
    backoff.record("q", had_data=True, now=now)
    assert backoff.due("q", now=now)


def test_idle_backoff_costs_about_thirty_probes_an_hour():
    backoff = IdleBackoff(max_seconds=120)
    probes, now = 0, 0.0
    while now < 3600:
        if backoff.due("q", now):
            probes += 1
            backoff.record("q", had_data=False, now=now)
        now += 1
    assert 30 <= probes <= 40


def test_offsets_are_serialised_in_a_stable_order():
    assert list(normalise_offsets({"b": 2, "a": 1})) == ["a", "b"]



def test_plan_windows_shares_the_budget_over_due_queues_and_backs_off_idle_ones():
    probes = {"q0": probe_over(range(1, 101)), "q1": probe_over([5, 6, 7]), "q2": probe_over([])}
    backoff = IdleBackoff(min_seconds=1, max_seconds=8)
    plan = plan_windows({"q0": 1, "q1": 5}, ["q0", "q1", "q2"], 30, probes.__getitem__, backoff=backoff, now=0.0)
    assert plan.end == {"q0": 11, "q1": 8, "q2": 0}  # 10 each; q1 holds only 3; q2 is empty
    assert list(plan.end) == sorted(plan.end)  # stable key order: Spark compares offsets as text
    assert plan.tails == {"q0": 101, "q1": 8, "q2": 0}
    assert not backoff.due("q2", 0.5) and backoff.due("q0", 0.5)

    again = plan_windows(plan.end, ["q0", "q1", "q2"], 30, probes.__getitem__, backoff=backoff, now=0.5)
    assert again.end == {"q0": 26, "q1": 8, "q2": 0} and "q2" not in again.tails  # q2 not probed while backing off


def test_plan_windows_of_an_available_now_run_stop_at_the_target():
    probes = {"q0": probe_over(range(1, 101)), "q1": probe_over(range(1, 11))}
    plan = plan_windows({"q0": 1, "q1": 11}, ["q0", "q1"], 1000, probes.__getitem__, backoff=IdleBackoff(),
                        now=0.0, target={"q0": 51, "q1": 11})
    assert plan.end == {"q0": 51, "q1": 11}
    assert probes["q1"].calls == []  # already at its target: not looked at


# --- the stream reader's planner, over fake queues ----------------------------------------------

QUEUES = ["ns/x-servicebus-transfer/0", "ns/x-servicebus-transfer/1"]


def planner_over(contents: dict, **settings) -> WindowPlanner:
    probes = {queue: probe_over(sequence_numbers) for queue, sequence_numbers in contents.items()}
    settings = {"max_messages": 10, "available_now": False, "idle_probe_max_seconds": 900.0, **settings}
    return WindowPlanner(lambda queue: probes[queue], **settings)


def test_planner_starts_at_zero_and_plans_from_its_last_end_when_spark_gives_no_start():
    planner = planner_over({QUEUES[0]: range(1, 31), QUEUES[1]: range(1, 4)})
    assert planner.initial_offset(QUEUES) == {QUEUES[0]: 0, QUEUES[1]: 0}
    first = planner.latest_offset(None, QUEUES, 10, now=0.0)
    assert first == {QUEUES[0]: 6, QUEUES[1]: 4}  # the budget shared: 5 each, of which queue 1 holds 3
    assert planner.latest_offset(None, QUEUES, 10, now=1.0) == {QUEUES[0]: 11, QUEUES[1]: 4}
    assert planner.reported_latest() == {QUEUES[0]: 31, QUEUES[1]: 4}  # tails as last probed


def test_planner_plans_nothing_new_once_a_stop_is_requested():
    planner = planner_over({QUEUES[0]: range(1, 31), QUEUES[1]: []})
    start = {QUEUES[0]: 5, QUEUES[1]: 0}
    assert planner.latest_offset(start, QUEUES, 10, now=0.0, stopping=True) == start
    assert planner.reported_latest() is None  # nothing was probed


def test_planner_available_now_target_bounds_every_batch():
    planner = planner_over({QUEUES[0]: range(1, 26), QUEUES[1]: range(1, 6)}, available_now=True)
    assert planner.prepare_available_now(QUEUES) == {QUEUES[0]: 26, QUEUES[1]: 6}
    end = planner.latest_offset({QUEUES[0]: 0, QUEUES[1]: 0}, QUEUES, 1000, now=0.0)
    assert end == {QUEUES[0]: 26, QUEUES[1]: 6}
    assert planner.latest_offset(end, QUEUES, 1000, now=1.0) == end  # nothing beyond the target


def test_planner_budget_follows_sparks_read_limit():
    planner = planner_over({}, max_messages=500, available_now=True)
    assert planner.budget(max_rows=20) == 20
    assert planner.budget(all_available=True) == ALL_AVAILABLE_BUDGET
    assert planner.budget() == 500
    assert planner.budget(limits_supported=False) == ALL_AVAILABLE_BUDGET  # Spark 4.0/4.1: one batch
    assert planner_over({}, max_messages=500).budget(limits_supported=False) == 500


def test_windows_are_the_queues_that_moved():
    assert windows({"a": 3, "b": 7}, {"a": 9, "b": 7, "c": 2}) == [("a", 3, 9), ("c", 0, 2)]
