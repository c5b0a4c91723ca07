"""Window planning with single-message probes, budgets, idle back-off, recreated and missing queues."""

import bisect
import logging

import pytest

from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.probing import ProbeCount, probe_one_at_a_time, run_searches
from backlog_syphon.source.offsets import BatchOffsets, QueueOffset, windows
from backlog_syphon.source.planning import IdleBackoff, plan_windows, share_budget, split_budget
from backlog_syphon.source.window_planner import ALL_AVAILABLE_BUDGET, WindowPlanner
from backlog_syphon.source.window_search import UNKNOWN, search_window

def probe_over(sequence_numbers, enqueued_ms=lambda seq: 10 * seq):
    """A probe over a queue holding these sequence numbers (message n entered at ``enqueued_ms(n)``),
    counting its calls. Accepts (sequence number, enqueue time) pairs as well."""
    identities = sorted(item if isinstance(item, tuple) else (item, enqueued_ms(item)) for item in sequence_numbers)
    ordered = [seq for seq, _ in identities]
    calls = []

    def probe(x):
        calls.append(x)
        index = bisect.bisect_left(ordered, x)
        return identities[index] if index < len(identities) else None

    probe.calls = calls
    return probe


def missing_probe(x):
    raise BacklogQueueMissingError("no such queue")


def at_once(probes):
    """The planner's ``ProbeAtOnce`` over single-queue probes (a dict of them, or a function of the queue)."""
    return probe_one_at_a_time(probes.__getitem__ if isinstance(probes, dict) else probes)


def offset(next_, incarnation=1, seen_ms=None, reread_from=None):
    return QueueOffset(incarnation, next_, seen_ms, reread_from)


def starting_at(**nexts):
    """Offsets by queue that start at these sequence numbers."""
    return {queue: offset(next_) for queue, next_ in nexts.items()}


def nexts(offsets):
    """Each queue's next sequence number."""
    return {queue: value.next for queue, value in offsets.items()}


def window_end(start, grant, probe, first=UNKNOWN, **hints):
    """One window search over one probe: (its end, the probes it made)."""
    count = ProbeCount()
    found = run_searches({"q": search_window(start, grant, first, **hints)}, at_once({"q": probe}), count)["q"]
    return found.end, count.probes


def test_empty_queue_keeps_the_offset():
    assert window_end(5, 100, probe_over([]))[0] == 5


def test_more_than_budget_costs_two_probes_and_one_when_the_first_message_is_known():
    assert window_end(1, 100, probe_over(range(1, 1001))) == (101, 2)
    assert window_end(1, 100, probe_over(range(1, 1001)), first=(1, 10)) == (101, 1)


def test_tail_inside_budget_is_found_exactly():
    end, probes = window_end(1, 1000, probe_over(range(10, 38)))
    assert end == 38  # window starts at the first message, ends after the last
    assert probes <= 2 + 11  # halving over the budget


def test_a_window_that_reaches_the_tail_last_seen_costs_one_probe_more():
    assert window_end(1, 1000, probe_over(range(10, 38)), tail_hint=38) == (38, 2)
    # the queue grew past the tail last seen, within the window: found by halving from there
    assert window_end(1, 1000, probe_over(range(10, 60)), tail_hint=38)[0] == 60
    # ... and past the window: the window is full
    assert window_end(1, 20, probe_over(range(10, 60)), tail_hint=25) == (30, 3)


def test_an_available_now_target_closes_a_window_without_a_probe():
    assert window_end(1, 100, probe_over(range(1, 1001)), first=(1, 10), bound=51) == (51, 0)
    assert window_end(1, 10, probe_over(range(1, 1001)), first=(1, 10), bound=51) == (11, 0)


def test_gaps_left_by_removed_messages():
    present = [3, 4, 9, 200, 201, 450]
    assert window_end(0, 1000, probe_over(present))[0] == 451
    assert window_end(5, 10, probe_over(present))[0] == 19  # window [9, 19) holds just 9
    assert window_end(451, 10, probe_over(present))[0] == 451


def test_split_budget_gives_no_queue_more_than_it_holds_and_the_rest_to_the_others():
    assert split_budget(100, {"a": 10, "b": None, "c": None}) == {"a": 10, "b": 45, "c": 45}
    assert split_budget(100, {"a": 10, "b": 20, "c": 5}) == {"a": 10, "b": 20, "c": 5}
    assert split_budget(100, {"a": 0, "b": None}) == {"b": 100}
    assert split_budget(10, {"a": 80, "b": 1, "c": 1}) == {"a": 8, "b": 1, "c": 1}


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
    spark = BatchOffsets.of({"b": offset(2), "a": QueueOffset(3, 7, 70)}).to_spark()
    assert list(spark) == ["a", "b"]
    assert spark == {"a": {"incarnation": 3, "next": 7, "seen_ms": 70},
                     "b": {"incarnation": 1, "next": 2, "seen_ms": None}}


def test_offsets_of_older_versions_read_as_the_first_incarnation():
    read = BatchOffsets.from_spark({"a": 151, "b": "151", "c": {"incarnation": 2, "next": 20, "seen_ms": 5_000},
                                    "d": {"next": 4}})
    assert read == {"a": QueueOffset(incarnation=1, next=151, seen_ms=None), "b": QueueOffset(1, 151, None),
                    "c": QueueOffset(2, 20, 5_000), "d": QueueOffset(1, 4, None)}
    assert QueueOffset(2, 20, 5_000).to_json() == {"incarnation": 2, "next": 20, "seen_ms": 5_000}


@pytest.mark.parametrize("head, recreated", [
    ((1, 5_000), True),  # numbered from the start again, enqueued after everything seen
    ((120, 900), False),  # an older message still there (left unsent, say): the same queue
    ((151, 5_000), False),  # at the offset: the same queue going on
    ((1, 1_000), False),  # enqueued no later than what was seen
    ((1, None), False),
    (None, False),  # empty
])
def test_a_queue_is_recreated_when_its_head_is_below_the_offset_and_newer_than_all_seen(head, recreated):
    assert QueueOffset(1, 151, 1_000).recreated(head) is recreated
    assert QueueOffset(1, 151, None).recreated(head) is False  # nothing seen yet: no evidence



def test_plan_windows_shares_the_budget_over_due_queues_and_backs_off_idle_ones():
    probes = {"q0": probe_over(range(1, 101)), "q1": probe_over([5, 6, 7]), "q2": probe_over([])}
    backoff = IdleBackoff(min_seconds=1, max_seconds=8)
    plan = plan_windows(starting_at(q0=1, q1=5), ["q0", "q1", "q2"], 30, at_once(probes), backoff=backoff, now=0.0)
    # 10 each; q1 holds only 3 and q2 nothing: the 17 they leave go to q0, which filled its share
    assert nexts(plan.end) == {"q0": 28, "q1": 8, "q2": 0}
    assert plan.end["q2"] == offset(0)
    assert plan.tails == {"q0": 101, "q1": 8, "q2": 0}
    assert plan.restarted == ()
    assert not backoff.due("q2", 0.5) and backoff.due("q0", 0.5)

    again = plan_windows(plan.end, ["q0", "q1", "q2"], 30, at_once(probes), backoff=backoff, now=0.5)
    assert nexts(again.end) == {"q0": 58, "q1": 8, "q2": 0} and "q2" not in again.tails  # q2 backs off


def test_plan_windows_of_an_available_now_run_stop_at_the_target():
    probes = {"q0": probe_over(range(1, 101)), "q1": probe_over(range(1, 11))}
    plan = plan_windows(starting_at(q0=1, q1=11), ["q0", "q1"], 1000, at_once(probes), backoff=IdleBackoff(),
                        now=0.0, target={"q0": 51, "q1": 11})
    assert nexts(plan.end) == {"q0": 51, "q1": 11}
    # already at its target: looked at only to see whether it was recreated (its head), with no share of the budget
    assert probes["q1"].calls == [1]


# --- the stream reader's planner, over fake queues ----------------------------------------------

QUEUES = ["ns/x-servicebus-transfer/0", "ns/x-servicebus-transfer/1"]


def planner_over(contents: dict, **settings) -> WindowPlanner:
    probes = {queue: probe_over(sequence_numbers) for queue, sequence_numbers in contents.items()}
    settings = {"max_messages": 10, "available_now": False, "idle_probe_max_seconds": 900.0, **settings}
    return WindowPlanner(at_once(probes), **settings)


def test_planner_starts_at_zero_and_plans_from_its_last_end_when_spark_gives_no_start():
    planner = planner_over({QUEUES[0]: range(1, 31), QUEUES[1]: range(1, 4)})
    assert planner.initial_offset(QUEUES) == {QUEUES[0]: offset(0), QUEUES[1]: offset(0)}
    first = planner.latest_offset(None, QUEUES, 10, now=0.0)
    # the budget shared: 5 each, of which queue 1 holds 3, and the 2 it leaves go to queue 0; the newest
    # enqueue time probed is remembered (for queue 0 its tail's, 30, found past the window for the reports)
    assert first == {QUEUES[0]: offset(8, seen_ms=300), QUEUES[1]: offset(4, seen_ms=30)}
    # queue 1 has nothing more: its share goes to queue 0
    assert nexts(planner.latest_offset(None, QUEUES, 10, now=1.0)) == {QUEUES[0]: 18, QUEUES[1]: 4}
    # tails as last probed, what is left behind the planned end, and the oldest message's age (its head's)
    assert planner.reported_latest(now_ms=10_010) == {
        QUEUES[0]: {"next": 31, "remaining": 13, "oldest_age_seconds": 10.0},
        QUEUES[1]: {"next": 4, "remaining": 0, "oldest_age_seconds": 10.0},
        "(last plan)": {"probes": planner.last_count.probes, "rounds": planner.last_count.rounds}}
    assert 0 < planner.last_count.rounds <= planner.last_count.probes <= 2 * 3


def test_planner_plans_nothing_new_once_a_stop_is_requested():
    planner = planner_over({QUEUES[0]: range(1, 31), QUEUES[1]: []})
    start = BatchOffsets.of({QUEUES[0]: offset(5), QUEUES[1]: offset(0)})
    assert planner.latest_offset(start, QUEUES, 10, now=0.0, stopping=True) == {QUEUES[0]: offset(5),
                                                                                QUEUES[1]: offset(0)}
    assert planner.reported_latest(now_ms=0) is None  # nothing was probed


def test_planner_available_now_target_bounds_every_batch():
    planner = planner_over({QUEUES[0]: range(1, 26), QUEUES[1]: range(1, 6)}, available_now=True)
    assert planner.fix_target({}, QUEUES, ProbeCount()) == {QUEUES[0]: 26, QUEUES[1]: 6}
    end = planner.latest_offset(BatchOffsets.of({QUEUES[0]: offset(0), QUEUES[1]: offset(0)}), QUEUES, 1000, now=0.0)
    assert nexts(end) == {QUEUES[0]: 26, QUEUES[1]: 6}
    assert planner.latest_offset(end, QUEUES, 1000, now=1.0) == end  # nothing beyond the target


def test_planner_budget_follows_sparks_read_limit():
    planner = planner_over({}, max_messages=500, available_now=True)
    assert planner.budget(max_rows=20) == 20
    assert planner.budget(all_available=True) == ALL_AVAILABLE_BUDGET
    assert planner.budget() == 500
    assert planner.budget(limits_supported=False) == ALL_AVAILABLE_BUDGET  # Spark 4.0/4.1: one batch
    assert planner_over({}, max_messages=500).budget(limits_supported=False) == 500


def test_windows_are_the_queues_that_moved():
    assert windows(starting_at(a=3, b=7), starting_at(a=9, b=7, c=2)) == [("a", 3, 9), ("c", 0, 2)]
    assert windows({"a": offset(3, seen_ms=30)}, {"a": offset(9, seen_ms=90), "b": offset(0)}) == [("a", 3, 9)]


def test_windows_of_a_queue_in_a_new_incarnation_start_at_its_beginning():
    start = {"a": offset(151, 1, 1_000), "b": offset(40, 1, 400)}
    end = {"a": offset(20, 2, 5_200), "b": offset(45, 1, 450)}
    assert windows(start, end) == [("a", 0, 20), ("b", 40, 45)]
    old = BatchOffsets.from_spark({"a": 151})  # an old offset: incarnation 1
    assert windows(old, {"a": offset(20, 2, 5_200)}) == [("a", 0, 20)]
    assert windows(start, {"a": offset(0, 2)}) == []  # recreated but still empty


# --- recreated and missing queues -------------------------------------------------------------------

def test_a_recreated_queue_is_read_from_its_start_in_a_new_incarnation(caplog):
    # Read up to 150 (newest seen enqueued at 1000); the queue was deleted and created again since.
    recreated = probe_over([(1, 5_000), (2, 5_010), (3, 5_020)])
    with caplog.at_level(logging.WARNING, logger="backlog_syphon.source.window_planner"):
        plan = plan_windows({"q0": offset(151, 1, 1_000)}, ["q0"], 100, at_once({"q0": recreated}),
                            backoff=IdleBackoff(), now=0.0)
    assert plan.restarted == ("q0",)
    assert plan.end == {"q0": offset(4, 2, 5_020)}
    assert plan.tails == {"q0": 4}
    assert windows({"q0": offset(151, 1, 1_000)}, plan.end) == [("q0", 0, 4)]
    assert "backlog=q0 was recreated" in caplog.text and "incarnation 2" in caplog.text


def test_an_older_message_still_at_the_head_is_not_a_recreation():
    # 120 was left unsent (it is still there), enqueued before the newest message seen: the same queue.
    same = probe_over([(120, 900), (151, 1_510), (152, 1_520)])
    plan = plan_windows({"q0": offset(151, 1, 1_000)}, ["q0"], 100, at_once({"q0": same}),
                        backoff=IdleBackoff(), now=0.0)
    assert plan.restarted == ()
    assert plan.end == {"q0": offset(153, 1, 1_520)}
    assert windows({"q0": offset(151, 1, 1_000)}, plan.end) == [("q0", 151, 153)]


def test_the_planner_drains_a_queue_recreated_during_an_available_now_run():
    queues = {"q0": probe_over(range(1, 11))}
    planner = WindowPlanner(at_once(lambda queue: queues[queue]), max_messages=100, available_now=True,
                            idle_probe_max_seconds=900.0)
    assert planner.fix_target({}, ["q0"], ProbeCount()) == {"q0": 11}
    end = planner.latest_offset(None, ["q0"], 100, now=0.0)
    assert end == {"q0": offset(11, 1, 100)}
    queues["q0"] = probe_over([(1, 5_000), (2, 5_010)])  # deleted and created again, with two messages
    again = planner.latest_offset(end, ["q0"], 100, now=1.0)
    assert again == {"q0": offset(3, 2, 5_010)}
    assert planner.target == {"q0": 3}
    assert planner.latest_offset(again, ["q0"], 100, now=2.0) == again  # and nothing beyond it


def test_a_missing_queue_is_skipped_and_warned_about_once_while_the_others_are_planned(caplog):
    probes = {"q0": probe_over(range(1, 21)), "gone": missing_probe}
    missing = set()
    backoff = IdleBackoff(min_seconds=1, max_seconds=1)
    with caplog.at_level(logging.WARNING, logger="backlog_syphon.source.window_planner"):
        first = plan_windows(starting_at(gone=5), ["q0", "gone"], 10, at_once(probes), backoff=backoff, now=0.0,
                             missing=missing)
        second = plan_windows(first.end, ["q0", "gone"], 10, at_once(probes), backoff=backoff, now=10.0,
                              missing=missing)
    # the missing queue's share goes to q0
    assert nexts(first.end) == {"gone": 5, "q0": 11} and nexts(second.end) == {"gone": 5, "q0": 21}
    assert "gone" not in first.tails and "gone" not in second.tails
    assert missing == {"gone"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["backlog=gone does not exist: skipped (the other backlog queues drain); it is read as soon "
                        "as it exists"]

    probes["gone"] = probe_over([5, 6])  # created at last
    third = plan_windows(second.end, ["q0", "gone"], 10, at_once(probes), backoff=backoff, now=20.0,
                         missing=missing)
    assert nexts(third.end) == {"gone": 7, "q0": 21} and missing == set()


def test_the_planner_skips_a_missing_queue_in_an_available_now_run(caplog):
    probes = {QUEUES[0]: probe_over(range(1, 6)), QUEUES[1]: missing_probe}
    planner = WindowPlanner(at_once(probes), max_messages=10, available_now=True, idle_probe_max_seconds=900.0)
    with caplog.at_level(logging.WARNING, logger="backlog_syphon.source.window_planner"):
        assert planner.fix_target({}, QUEUES, ProbeCount()) == {QUEUES[0]: 6, QUEUES[1]: 0}
        end = planner.latest_offset(None, QUEUES, 10, now=0.0)
    assert nexts(end) == {QUEUES[0]: 6, QUEUES[1]: 0}
    assert planner.missing == {QUEUES[1]}
    assert sum("does not exist" in r.getMessage() for r in caplog.records) == 1


def test_a_played_available_now_run_knows_when_its_target_is_reached():

    tails = {"q0": 5, "q1": 3}

    def probe_for(queue):
        return lambda seq: (max(1, seq), 1000 + seq) if max(1, seq) <= tails[queue] else None

    planner = WindowPlanner(at_once(probe_for), max_messages=4, available_now=True, idle_probe_max_seconds=900)
    assert not planner.reached_target({})  # no target yet
    assert planner.fix_target({}, ["q0", "q1"], ProbeCount()) == {"q0": 6, "q1": 4}
    ends = [planner.latest_offset(None, ["q0", "q1"], 4, now=0.0)]
    while not planner.reached_target(ends[-1]):
        ends.append(planner.latest_offset(ends[-1], ["q0", "q1"], 4, now=0.0))
        assert len(ends) < 10
    def messages(start, end, queue):  # messages are at 1..tail
        return len(range(max(1, start.get(queue, offset(0)).next), min(end[queue].next, tails[queue] + 1)))

    sizes = [sum(messages(start, end, q) for q in end) for start, end in zip([{}] + ends, ends)]
    assert max(sizes) <= 4 and sum(sizes) == 5 + 3


def test_an_offset_moves_only_with_its_window_so_a_queue_at_its_target_plans_no_batch():

    # An available-now run that reached its target (4) while newer messages arrived behind it.
    start = {"q0": offset(4, 1, 1003)}
    probes = {"q0": lambda seq: (max(2, seq), 1000 + max(2, seq)) if seq <= 9 else None}
    plan = plan_windows(start, ["q0"], 10, at_once(probes), backoff=IdleBackoff(), now=0.0, target={"q0": 4})
    assert plan.end == start  # the same offset: Spark plans no (empty) batch


def test_an_available_now_batch_shares_its_budget_only_among_queues_with_something_left():

    tails = {f"q{i}": (50 if i < 3 else 0) for i in range(10)}

    def probe_for(queue):
        return lambda seq: (max(1, seq), 1000 + max(1, seq)) if max(1, seq) <= tails[queue] else None

    target = {queue: tail + 1 if tail else 0 for queue, tail in tails.items()}
    plan = plan_windows({}, sorted(tails), 100, at_once(probe_for), backoff=IdleBackoff(), now=0.0, target=target)
    read = {queue: value.next for queue, value in plan.end.items() if value.next}
    assert read == {"q0": 35, "q1": 34, "q2": 34}  # shares of 34, 33, 33 from the first message (1)


def test_after_a_replay_without_a_start_the_next_batch_starts_where_the_replayed_one_ended():
    # Spark 4.0/4.1 after a restart: the batch left planned is replayed (partitions only), then the next
    # latest offset is asked for without a start. The replayed batch read q0 whole (1..3) and its purge
    # empties q0 before that question: planned from the heads again, q0 would go back to 0 and an
    # available-now run whose target saw q0 full would never reach it.
    contents = {"q0": [1, 2, 3], "q1": [1, 2, 3, 4, 5, 6, 7, 8]}

    def probe_for(queue):
        return lambda seq: next(((s, 10 * s) for s in contents[queue] if s >= seq), None)

    planner = WindowPlanner(at_once(probe_for), max_messages=4, available_now=True, idle_probe_max_seconds=900)
    replayed = BatchOffsets.of({"q0": offset(4, seen_ms=30), "q1": offset(2, seen_ms=10)})
    planner.resume(replayed)
    assert planner.fix_target(replayed, ["q0", "q1"], ProbeCount()) == {"q0": 4, "q1": 9}
    contents["q0"], contents["q1"] = [], contents["q1"][1:]  # the replayed batch's purge
    ends = [planner.latest_offset(None, ["q0", "q1"], 4, now=0.0)]
    assert ends[0]["q0"].next == 4 and ends[0]["q1"].next == 6
    while not planner.reached_target(ends[-1]):
        ends.append(planner.latest_offset(None, ["q0", "q1"], 4, now=1.0))
        assert len(ends) < 5, ends
    assert ends[-1]["q1"].next == 9


def test_a_backlog_left_in_one_queue_still_moves_a_whole_budget_per_batch():
    # 15 per batch over 10 queues of which one holds messages: without redistribution 1 or 2 a batch
    queues = [f"q{index}" for index in range(10)]
    probes = {queue: probe_over([]) for queue in queues}
    probes["q9"] = probe_over(range(1, 101))
    plan = plan_windows({}, queues, 15, at_once(probes), backoff=IdleBackoff(), now=0.0)
    assert nexts(plan.end)["q9"] == 16 and sum(nexts(plan.end).values()) == 16  # 1..15: the whole budget
    assert plan.tails["q9"] == 101
    # two queues: what one leaves goes to the other, within the budget and the available-now target
    probes = {"a": probe_over(range(1, 4)), "b": probe_over(range(1, 101))}
    plan = plan_windows(starting_at(a=1, b=1), ["a", "b"], 20, at_once(probes), backoff=IdleBackoff(), now=0.0,
                        target={"a": 4, "b": 15})
    assert nexts(plan.end) == {"a": 4, "b": 15}


def test_the_last_few_of_a_budget_go_to_the_first_hungry_queues_so_a_batch_takes_all_of_it():
    # 10 over three queues: shares 4, 3, 3; "a" holds 3, and the 1 it leaves goes to "b" alone
    probes = {"a": probe_over(range(1, 4)), "b": probe_over(range(1, 101)), "c": probe_over(range(1, 101))}
    plan = plan_windows(starting_at(a=1, b=1, c=1), ["a", "b", "c"], 10, at_once(probes), backoff=IdleBackoff(),
                        now=0.0)
    assert nexts(plan.end) == {"a": 4, "b": 5, "c": 4} and sum(n - 1 for n in nexts(plan.end).values()) == 10


def test_a_run_looks_back_once_at_what_earlier_runs_left_below_each_offset():
    """Messages 3 and 7 were held for a skipped destination (the rest of 1..20 was settled); the offset is
    past them. The run's first plan of the queue reads from 3 (``reread_from``), later plans do not."""
    queue = probe_over([3, 7, 21, 22])
    planner = WindowPlanner(at_once(lambda q: queue), max_messages=100, available_now=False, idle_probe_max_seconds=900.0,
                            look_back=["q0"])
    start = BatchOffsets.of({"q0": offset(21, 1, 200)})
    first = planner.latest_offset(start, ["q0"], 100, now=0.0)
    assert first == {"q0": offset(23, 1, 220, reread_from=3)}
    assert windows(start, first) == [("q0", 3, 23)]  # from the offset log: a replay reads the same window
    queue_later = planner.latest_offset(first, ["q0"], 100, now=1000.0)
    assert queue_later == first  # once per run (a continuous run's later holds wait), and no empty batch
    assert windows(first, queue_later) == []


def test_a_look_back_is_bounded_by_the_budget_and_the_offset_then_moves_on_from_there():
    queue = probe_over(range(1, 51))  # 1..50 still there (say 1..30 held or not yet settled), offset at 31
    plan = plan_windows({"q0": offset(31, 1, 310)}, ["q0"], 10, at_once({"q0": queue}), backoff=IdleBackoff(),
                        now=0.0, look_back={"q0"})
    assert plan.end == {"q0": offset(11, 1, 500, reread_from=1)}
    assert windows({"q0": offset(31, 1, 310)}, plan.end) == [("q0", 1, 11)]
    assert plan.looked == ("q0",)


def test_no_look_back_where_nothing_lies_below_the_offset_or_the_queue_was_recreated():
    level = probe_over([31, 32])
    plan = plan_windows({"q0": offset(31, 1, 310)}, ["q0"], 10, at_once({"q0": level}), backoff=IdleBackoff(),
                        now=0.0, look_back={"q0"})
    assert plan.end == {"q0": offset(33, 1, 320)}
    recreated = probe_over([(1, 5_000)])
    plan = plan_windows({"q0": offset(31, 1, 310)}, ["q0"], 10, at_once({"q0": recreated}),
                        backoff=IdleBackoff(), now=0.0, look_back={"q0"})
    assert plan.restarted == ("q0",) and plan.end["q0"].reread_from is None


def test_an_offset_with_a_look_back_that_moves_no_further_stays_as_it_is_and_reads_nothing_again():
    """Spark sees no change, so it plans no (empty) batch; with another queue moving, no window for this one."""
    queue = probe_over([3])
    start = {"q0": offset(23, 1, 220, reread_from=3), "q1": offset(5, 1, 50)}
    plan = plan_windows(start, ["q0", "q1"], 10, at_once({"q0": queue, "q1": probe_over([5, 6])}),
                        backoff=IdleBackoff(), now=0.0)
    assert plan.end == {"q0": offset(23, 1, 220, reread_from=3), "q1": offset(7, 1, 60)}
    assert windows(start, plan.end) == [("q1", 5, 7)]
    moved = probe_over([3, 23])
    alone = {"q0": start["q0"]}
    plan = plan_windows(alone, ["q0"], 10, at_once({"q0": moved}), backoff=IdleBackoff(), now=0.0)
    assert plan.end == {"q0": offset(24, 1, 230)}  # moved on: the old look back is dropped
    assert windows(alone, plan.end) == [("q0", 23, 24)]


def test_a_planner_looks_back_only_at_the_queues_it_is_told_held_messages():
    """Elsewhere a message below the offset is recorded and only not yet settled: re-reading it is waste."""
    probes = {"q0": probe_over([3, 21]), "q1": probe_over([2, 21])}
    planner = WindowPlanner(at_once(probes), max_messages=100, available_now=False, idle_probe_max_seconds=900.0,
                            look_back=["q0"])
    start = BatchOffsets.of({"q0": offset(21, 1, 200), "q1": offset(21, 1, 200)})
    end = planner.latest_offset(start, ["q0", "q1"], 100, now=0.0)
    assert end["q0"].reread_from == 3 and end["q1"].reread_from is None


# --- round trips: a constant number per queue and batch, the queues probed at once -------------------

class Backlog:
    """Queues of messages (sequence numbers from 1, each enqueued at a time of its own) that a test settles,
    appends to and recreates; ``probe_at_once`` answers as the source's does and keeps each round's asks."""

    def __init__(self, sizes: dict[str, int]):
        self.queues = {queue: list(range(1, size + 1)) for queue, size in sizes.items()}
        self.enqueued = {queue: (lambda seq: 1_000 + seq) for queue in sizes}
        self.rounds: list[dict[str, int]] = []

    def probe_at_once(self, asks):
        self.rounds.append(dict(asks))
        answers = {}
        for queue, seq in asks.items():
            present = self.queues[queue]
            index = bisect.bisect_left(present, max(1, seq))
            answers[queue] = (present[index], self.enqueued[queue](present[index])) if index < len(present) else None
        return answers

    def settle_below(self, end: dict) -> None:
        """The purge of what was planned (one batch behind, as in a run)."""
        for queue, value in end.items():
            present = self.queues[queue]
            del present[:bisect.bisect_left(present, value.next)]

    def append(self, queue: str, count: int) -> None:
        present = self.queues[queue]
        last = present[-1] if present else 0
        present.extend(range(last + 1, last + count + 1))

    def recreate(self, queue: str, count: int, enqueued_from: int) -> None:
        self.queues[queue] = list(range(1, count + 1))
        self.enqueued[queue] = lambda seq: enqueued_from + seq


def drain(planner: WindowPlanner, backlog: Backlog, queues: list[str], budget: int, *, batches: int,
          continuous_appends: int = 0) -> list[tuple[int, int]]:
    """Plan ``batches`` batches, the purge of each settling the one before; (probes, rounds) per plan."""
    costs, end, previous = [], None, None
    for batch in range(batches):
        backlog.rounds.clear()
        end = planner.latest_offset(end, queues, budget, now=float(batch))
        costs.append((sum(len(r) for r in backlog.rounds), len(backlog.rounds)))
        if previous is not None:
            backlog.settle_below(previous)
        previous = end
        for queue in queues:
            if continuous_appends:
                backlog.append(queue, continuous_appends)
    return costs


QUEUES10 = [f"q{index}" for index in range(10)]


def test_an_available_now_run_plans_each_batch_in_two_rounds_of_at_most_one_probe_per_queue():
    backlog = Backlog({queue: 3_000 for queue in QUEUES10})
    planner = WindowPlanner(backlog.probe_at_once, max_messages=10_000, available_now=True,
                            idle_probe_max_seconds=900.0)
    planner.prepare_available_now()
    costs = drain(planner, backlog, QUEUES10, 10_000, batches=3)
    # the first plan also fixes the target: every queue's tail searched at once (a gallop, then halving)
    target_probes, target_rounds = costs[0]
    assert target_rounds <= 20 and target_probes == 10 * target_rounds
    # then per batch: the heads, and where a window starts while the purge has not caught up
    assert all(probes <= 20 and rounds <= 2 for probes, rounds in costs[1:]), costs
    assert all(len(round_) == 10 for round_ in backlog.rounds)  # every round asks every queue at once


def test_a_continuous_drain_costs_two_probes_per_queue_and_batch_and_a_tail_refresh_twice_a_minute():
    backlog = Backlog({queue: 20_000 for queue in QUEUES10})
    planner = WindowPlanner(backlog.probe_at_once, max_messages=1_000, available_now=False,
                            idle_probe_max_seconds=900.0)
    costs = drain(planner, backlog, QUEUES10, 1_000, batches=60)  # a batch a second (the planner's clock)
    steady = costs[1:]
    assert sum(1 for probes, _ in steady if probes > 20) == 59 // 30, costs  # the refreshes, every 30 s
    assert max(probes for probes, _ in steady) <= 10 * 15 and max(rounds for _, rounds in steady) <= 15, costs
    assert min(probes for probes, _ in steady) == 20


def test_a_continuous_run_that_follows_a_growing_tail_costs_no_more_with_every_batch():
    backlog = Backlog({queue: 2_000 for queue in QUEUES10})
    planner = WindowPlanner(backlog.probe_at_once, max_messages=1_000, available_now=False,
                            idle_probe_max_seconds=900.0)
    costs = drain(planner, backlog, QUEUES10, 1_000, batches=80, continuous_appends=20)
    caught_up = costs[30:]  # the backlog is drained; each window reaches a tail 20 messages further on
    assert max(probes for probes, _ in caught_up) <= 10 * 10, costs  # about log2 of the growth per queue
    assert max(rounds for _, rounds in caught_up) <= 10, costs
    assert max(probes for probes, _ in caught_up[-20:]) <= max(probes for probes, _ in caught_up[:20]), costs


def test_the_hints_never_decide_a_recreated_queue_is_still_found_and_a_grown_tail_still_read():
    backlog = Backlog({"q0": 50, "q1": 50})
    planner = WindowPlanner(backlog.probe_at_once, max_messages=40, available_now=False, idle_probe_max_seconds=900.0)
    first = planner.latest_offset(None, ["q0", "q1"], 40, now=0.0)
    assert nexts(first) == {"q0": 21, "q1": 21}
    backlog.settle_below(first)
    backlog.recreate("q0", 2, enqueued_from=8_999)  # deleted and created again
    backlog.append("q1", 100)  # grew past the tail the plan saw (51)
    second = planner.latest_offset(first, ["q0", "q1"], 40, now=1.0)
    assert second["q0"] == offset(3, 2, 9_001)  # a new incarnation, read from its start
    assert nexts(second)["q1"] == 59  # 21..58: the budget's 38 that q0 left
    assert planner.reported_latest(now_ms=10_000)["q1"]["next"] == 151
