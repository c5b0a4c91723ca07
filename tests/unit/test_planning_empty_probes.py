"""The planner when probes come back empty while messages exist (Service Bus may answer a peek with no
messages): nothing planned is skipped, no available-now run ends early, no batch outgrows its budget, and
the common case costs no probe more. Fake backlogs answer chosen probes empty, or seeded ones."""

import bisect
import random

import pytest

from backlog_syphon.source.offsets import windows
from backlog_syphon.source.window_planner import WindowPlanner
from backlog_syphon.probing import ProbeCount, probe_one_at_a_time, run_searches
from backlog_syphon.source.window_search import UNKNOWN, search_window

from .test_planning import QUEUES10, Backlog, drain


class FlakyBacklog(Backlog):
    """A ``Backlog`` whose probes answer "nothing" although messages are there: the asks listed in ``empties``
    ((queue, n): that queue's n-th probe, from 0), or, seeded, at ``empty_rate``. A seeded false answer makes
    the planner's one assumption and no other: it is not repeated, neither by that queue's next probe nor
    by the next probe at that position (a second look is answered right; the design's "one second look")."""

    def __init__(self, sizes, *, empties=(), rng=None, empty_rate=0.0):
        super().__init__(sizes)
        self.empties, self.rng, self.empty_rate = set(empties), rng, empty_rate
        self.asked = {queue: 0 for queue in sizes}
        self.false_empties = 0
        self._last_empty: set[str] = set()
        self._missed: set[tuple[str, int]] = set()  # (queue, position) answered falsely once already

    def probe_at_once(self, asks):
        answers = super().probe_at_once(asks)
        for queue, at in asks.items():
            number = self.asked[queue]
            self.asked[queue] += 1
            seeded = (self.rng is not None and queue not in self._last_empty and (queue, at) not in self._missed
                      and self.rng.random() < self.empty_rate)
            if answers[queue] is not None and ((queue, number) in self.empties or seeded):
                self.false_empties += 1
                answers[queue] = None
                self._last_empty.add(queue)
                self._missed.add((queue, at))
            else:
                self._last_empty.discard(queue)
        return answers


def one_queue(present, empties=()):
    """A single queue's probe (the first message at or after x) that answers empty for its n-th asks in
    ``empties``; ``probe.calls`` lists what it was asked."""
    ordered = sorted(present)
    calls = []

    def probe(x):
        calls.append(x)
        index = bisect.bisect_left(ordered, x)
        if len(calls) - 1 in empties or index == len(ordered):
            return None
        return ordered[index], 1_000 + ordered[index]

    probe.calls = calls
    return probe


def run_one(search, probe):
    count = ProbeCount()
    return run_searches({"q": search}, probe_one_at_a_time(lambda _: probe), count)["q"], count.probes


def test_a_window_under_a_target_looks_twice_before_it_finds_nothing_left():
    messages = list(range(50, 300))
    end, probes = run_one(search_window(50, 100, UNKNOWN, bound=300),
                          one_queue(messages, empties={0}))
    assert (end.end, end.first, probes) == (150, 50, 2)  # the second look found 50: a window of the budget
    gone, probes = run_one(search_window(50, 100, UNKNOWN, bound=300), one_queue([]))
    assert (gone.end, gone.first, probes) == (300, None, 2)  # twice nothing: the target's messages are gone
    # without a target, one "nothing" stands (a window closed early is read on by the next batch)
    assert run_one(search_window(50, 100, UNKNOWN), one_queue(messages, empties={0}))[1] == 1


def test_a_queue_the_target_found_empty_is_confirmed_by_the_head_probe_and_read_when_it_was_wrong():
    backlog = FlakyBacklog({"q0": 500, "q1": 0}, empties={("q0", 0)})  # q0's first probe (at its offset) misses
    planner = WindowPlanner(backlog.probe_at_once, max_messages=200, available_now=True, idle_probe_max_seconds=900)
    planner.prepare_available_now()
    ends, end = [], None
    for batch in range(5):
        end = planner.latest_offset(end, ["q0", "q1"], 200, now=float(batch))
        ends.append(end["q0"].next)
    assert planner.target == {"q0": 501, "q1": 0}  # the head probe (the second look) found 1: searched again
    assert ends == [201, 401, 501, 501, 501]  # every message planned, in batches of the budget
    assert planner.reached_target(end)


def test_the_common_case_costs_no_probe_more():
    """A drained backlog's target is one probe per queue, confirmed by the heads the plan probes anyway; a
    backlog's target search looks once more at each end (one round, once per run)."""
    drained = Backlog({queue: 0 for queue in QUEUES10})
    planner = WindowPlanner(drained.probe_at_once, max_messages=1_000, available_now=True, idle_probe_max_seconds=900)
    planner.prepare_available_now()
    assert drain(planner, drained, QUEUES10, 1_000, batches=1) == [(20, 2)]  # the target, then the heads
    backlog = Backlog({queue: 3_000 for queue in QUEUES10})
    planner = WindowPlanner(backlog.probe_at_once, max_messages=10_000, available_now=True, idle_probe_max_seconds=900)
    planner.prepare_available_now()
    costs = drain(planner, backlog, QUEUES10, 10_000, batches=3)
    assert costs[0][1] <= 20 and all(probes <= 20 and rounds <= 2 for probes, rounds in costs[1:]), costs


def test_an_empty_head_below_the_target_is_looked_at_again_so_the_batch_keeps_its_budget():
    backlog = FlakyBacklog({"q0": 1_000})
    planner = WindowPlanner(backlog.probe_at_once, max_messages=100, available_now=True, idle_probe_max_seconds=900)
    planner.prepare_available_now()
    first = planner.latest_offset(None, ["q0"], 100, now=0.0)
    backlog.settle_below(first)
    backlog.empties.add(("q0", backlog.asked["q0"]))  # the next plan's head probe misses
    second = planner.latest_offset(first, ["q0"], 100, now=1.0)
    assert (first["q0"].next, second["q0"].next) == (101, 201)  # not the whole target at once


@pytest.mark.parametrize("seed", range(30))
def test_seeded_empty_answers_never_skip_a_message_end_a_run_early_or_outgrow_a_batch(seed):
    rng = random.Random(seed)
    sizes = {f"q{index}": rng.choice([0, 0, 1, 40, 700, 2_500]) for index in range(rng.randint(1, 6))}
    queues = sorted(sizes)
    backlog = FlakyBacklog(sizes, rng=rng, empty_rate=0.3)
    budget = rng.choice([50, 300, 1_000])
    planner = WindowPlanner(backlog.probe_at_once, max_messages=budget, available_now=True,
                            idle_probe_max_seconds=900)
    planner.prepare_available_now()
    planned = {queue: [] for queue in queues}
    start = None
    for batch in range(200):
        end = planner.latest_offset(start, queues, budget, now=float(batch))
        read = windows(start or planner.initial_offset(queues), end)
        assert sum(stop - max(first, 1) for _, first, stop in read) <= budget + len(queues), read
        for queue, first, stop in read:
            planned[queue] += [seq for seq in backlog.queues[queue] if first <= seq < stop]
        backlog.settle_below(end)  # what was planned is read, sent and purged
        if planner.reached_target(end):
            break
        start = end
    assert planner.reached_target(end), (planner.target, end)
    assert planned == {queue: list(range(1, size + 1)) for queue, size in sizes.items()}, backlog.false_empties
