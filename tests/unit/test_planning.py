"""Window planning with single-message probes, budgets and idle back-off."""

import bisect

import pytest

from backlog_syphon.source.planning import (
    IdleBackoff,
    normalise_offsets,
    plan_windows,
    share_budget,
    tail_end,
    window_end,
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
