"""Planning and reading a partitioned backlog queue lane by lane, over a fake that answers one partition per
peek (and, as reported, possibly one message per peek): every message once, in order per partition, no
window across partitions, a higher partition's answer never the end of a lower one."""

from __future__ import annotations

import pytest

from backlog_syphon.partitions import absolute, partition_of
from backlog_syphon.peek_pages import PagedRead
from backlog_syphon.source.offsets import (
    BatchOffsets,
    PartitionedOffset,
    QueueOffset,
    fold_lanes,
    lane_offsets,
    windows,
)
from backlog_syphon.source.partition_lanes import LaneProbes
from backlog_syphon.source.window_planner import WindowPlanner
from tests.unit.fake_partitioned_backlog import FakePartitionedQueue

Q = "ns/x-servicebus-transfer/0"


def at_once(queues: dict[str, FakePartitionedQueue]):
    def probe_at_once(asks):
        from backlog_syphon.partitions import split_lane_key
        return {key: queues[split_lane_key(key)[0]].probe(x) for key, x in asks.items()}
    return probe_at_once


def read(queue: FakePartitionedQueue, first: int, stop: int) -> list[int]:
    paged, got = PagedRead(first, stop - 1), []
    while (ask := paged.next_ask()) is not None:
        page = [seq for seq, _ in queue.peek(*ask)]
        got += page[:paged.on_page(page)]
    return got


def drain(planner: WindowPlanner, queues: dict[str, FakePartitionedQueue], *, batches: int = 200):
    """Plan and read batches until the available-now target is reached; the rows in the order one task per
    queue sends them, and every window planned."""
    start = planner.initial_offset(sorted(queues))
    planner.prepare_available_now()
    rows, planned = {queue: [] for queue in queues}, []
    for _ in range(batches):
        end = planner.latest_offset(start, sorted(queues), planner.budget(), now=0.0)
        for queue, first, stop in windows(start, end):
            planned.append((queue, first, stop))
            rows[queue] += read(queues[queue], first, stop)
        start = end
        if planner.reached_target(end):
            break
    return rows, planned, start


def sixteen_lanes(per_lane: int) -> dict[int, list[int]]:
    return {p: list(range(1, per_lane + 1)) for p in range(16)}


def check_once_in_order(rows: list[int], queue: FakePartitionedQueue) -> None:
    assert sorted(rows) == sorted(queue.all()) and len(rows) == len(set(rows))
    for p in range(16):  # in order per partition, and partition after partition within a batch's task
        lane = [seq for seq in rows if partition_of(seq) == p]
        assert lane == sorted(lane)


def test_offsets_per_partition_round_trip_and_old_offsets_stay_readable():
    offset = PartitionedOffset.of({0: QueueOffset(1, 7, 100), 3: QueueOffset(2, 5, 200, reread_from=2)})
    stored = offset.to_json()
    assert stored == {"partitions": {"0": {"incarnation": 1, "next": 7, "seen_ms": 100},
                                     "3": {"incarnation": 2, "next": absolute(3, 5), "seen_ms": 200,
                                           "reread_from": absolute(3, 2)}}}
    read = BatchOffsets.from_spark({Q: stored, "old": 41, "plain": {"incarnation": 2, "next": 9, "seen_ms": None}})
    assert read[Q] == offset
    assert lane_offsets(read[Q])[3] == QueueOffset(2, 5, 200, 2)
    assert read[Q].next == 12  # the lanes' local nexts, summed (what reports subtract)
    assert read["old"] == QueueOffset(next=41)  # a bare number, as the first versions wrote
    assert lane_offsets(read["plain"]) == {0: QueueOffset(2, 9)}


def test_windows_never_cross_partitions_and_a_plain_offset_is_lane_zero():
    start = {Q: QueueOffset(1, 5, 1)}  # read as a plain queue before
    end = fold_lanes({f"{Q}#0": QueueOffset(1, 9, 2), f"{Q}#4": QueueOffset(1, 3, 2)})
    assert windows(start, end) == [(Q, 5, 9), (Q, absolute(4, 0), absolute(4, 3))]


def test_a_probe_from_another_lane_is_nothing_in_this_lane_and_partition_bits_teach():
    queue = FakePartitionedQueue({2: [1, 2], 9: [1]})
    probes = LaneProbes(at_once({Q: queue}))
    answers = probes({f"{Q}#2": 2, f"{Q}#3": 0, f"{Q}#9": 0})
    assert answers == {f"{Q}#2": (2, queue.identity(absolute(2, 2))[1]), f"{Q}#3": None,
                       f"{Q}#9": (1, queue.identity(absolute(9, 1))[1])}
    assert probes({Q: 1}) == {Q: None} and probes.learned == {Q}


def test_an_available_now_run_delivers_every_partition_once_in_order_one_message_per_peek():
    queue = FakePartitionedQueue(sixteen_lanes(30), one_per_call=True)
    planner = WindowPlanner(at_once({Q: queue}), max_messages=100, available_now=True,
                            idle_probe_max_seconds=900.0, partitioned={Q})
    rows, planned, end = drain(planner, {Q: queue})
    check_once_in_order(rows[Q], queue)
    assert all(partition_of(first) == partition_of(stop - 1) for _, first, stop in planned)
    assert set(lane_offsets(end[Q])) == set(range(16))


def test_batches_stay_within_the_budget_across_partitions():
    queue = FakePartitionedQueue(sixteen_lanes(50))
    planner = WindowPlanner(at_once({Q: queue}), max_messages=64, available_now=True,
                            idle_probe_max_seconds=900.0, partitioned={Q})
    start = planner.initial_offset([Q])
    planner.prepare_available_now()
    for _ in range(5):
        end = planner.latest_offset(start, [Q], planner.budget(), now=0.0)
        assert 0 < sum(len(read(queue, first, stop)) for _, first, stop in windows(start, end)) <= 64
        start = end


def test_a_queue_not_known_partitioned_is_learnt_from_its_numbers_before_anything_is_skipped():
    queue = FakePartitionedQueue({0: list(range(1, 11)), 5: list(range(1, 21)), 15: [1, 2]})
    planner = WindowPlanner(at_once({Q: queue}), max_messages=1000, available_now=True,
                            idle_probe_max_seconds=900.0)
    rows, planned, _ = drain(planner, {Q: queue})
    assert Q in planner.partitioned
    check_once_in_order(rows[Q], queue)


def test_a_partitioned_queue_holding_one_partitions_messages_only():
    queue = FakePartitionedQueue({7: list(range(1, 41))}, one_per_call=True)
    planner = WindowPlanner(at_once({Q: queue}), max_messages=16, available_now=True,
                            idle_probe_max_seconds=900.0)
    rows, planned, end = drain(planner, {Q: queue})
    check_once_in_order(rows[Q], queue)
    assert set(lane_offsets(end[Q])) == {7}


def test_a_continuous_run_reads_messages_arriving_in_any_partition_later():
    queue = FakePartitionedQueue({1: [1, 2, 3]})
    planner = WindowPlanner(at_once({Q: queue}), max_messages=100, available_now=False,
                            idle_probe_max_seconds=0.0, partitioned={Q})
    start, got = planner.initial_offset([Q]), []
    for now, arrive in ((0.0, None), (10.0, {1: [1, 2, 3, 4], 12: [1, 2]}), (20.0, None)):
        if arrive:
            queue.lanes = arrive
        end = planner.latest_offset(start, [Q], planner.budget(), now=now)
        for _, first, stop in windows(start, end):
            got += read(queue, first, stop)
        start = end
    check_once_in_order(got, queue)


def test_a_queue_recreated_partitioned_is_a_new_incarnation_read_from_its_start():
    # Read as a plain queue up to 50, its newest message enqueued at 2,000,050; then deleted and created
    # again partitioned, its messages enqueued later.
    start = BatchOffsets.of({Q: QueueOffset(1, 51, 2_000_050)})
    queue = FakePartitionedQueue({0: [1, 2, 3], 3: [1, 2]}, base_ms=3_000_000)
    planner = WindowPlanner(at_once({Q: queue}), max_messages=100, available_now=False,
                            idle_probe_max_seconds=900.0, partitioned={Q})
    end = planner.latest_offset(start, [Q], planner.budget(), now=0.0)
    got = [seq for _, first, stop in windows(start, end) for seq in read(queue, first, stop)]
    check_once_in_order(got, queue)
    assert lane_offsets(end[Q])[0].incarnation == 2


def test_a_queue_with_offsets_per_partition_stays_partitioned_in_a_new_run_and_nothing_is_read_twice():
    queue = FakePartitionedQueue({0: [1, 2], 6: [1, 2, 3]})
    first = WindowPlanner(at_once({Q: queue}), max_messages=100, available_now=False,
                          idle_probe_max_seconds=900.0, partitioned={Q})
    end = first.latest_offset(first.initial_offset([Q]), [Q], 100, now=0.0)
    got = [seq for _, a, b in windows(first.initial_offset([Q]), end) for seq in read(queue, a, b)]
    queue.lanes[6].append(4)
    later = WindowPlanner(at_once({Q: queue}), max_messages=100, available_now=False,
                          idle_probe_max_seconds=900.0)  # a new run, the administration API silent
    again = later.latest_offset(end, [Q], 100, now=0.0)
    got += [seq for _, a, b in windows(end, again) for seq in read(queue, a, b)]
    check_once_in_order(got, queue)
    assert Q in later.partitioned


def test_the_reported_backlog_adds_up_a_partitioned_queues_lanes():
    queue = FakePartitionedQueue({2: list(range(1, 11)), 5: list(range(1, 6))})
    planner = WindowPlanner(at_once({Q: queue}), max_messages=4, available_now=False,
                            idle_probe_max_seconds=900.0, partitioned={Q})
    end = planner.latest_offset(planner.initial_offset([Q]), [Q], 4, now=0.0)
    reported = planner.reported_latest(now_ms=2_000_000)[Q]
    read_now = sum(len(read(queue, a, b)) for _, a, b in windows(planner.initial_offset([Q]), end))
    assert reported["remaining"] >= 15 - read_now > 0
    assert reported["next"] - end[Q].next == reported["remaining"]


@pytest.mark.parametrize("empty_every", [2, 7])
def test_empty_peeks_while_messages_exist_end_no_partition_early(empty_every):
    queue = FakePartitionedQueue(sixteen_lanes(25), one_per_call=True, empty_every=empty_every)
    planner = WindowPlanner(at_once({Q: queue}), max_messages=80, available_now=True,
                            idle_probe_max_seconds=900.0, partitioned={Q})
    rows, _, _ = drain(planner, {Q: queue})
    check_once_in_order(rows[Q], queue)


def test_an_answer_from_another_partition_is_asked_once_more_before_the_lane_counts_as_empty():
    queue = FakePartitionedQueue({2: [1, 2], 5: [1], 9: [1]})
    wrong = {f"{Q}#2"}  # the first answer for lane 2 comes from partition 9, as a partitioned peek may answer

    def probe_at_once(asks):
        answers = {}
        for key, x in asks.items():
            if key in wrong:
                wrong.discard(key)
                answers[key] = queue.probe(absolute(9, 0))
            else:
                answers[key] = queue.probe(x)
        return answers

    probes = LaneProbes(probe_at_once)
    assert probes({f"{Q}#2": 1, f"{Q}#3": 0}) == {f"{Q}#2": (1, queue.identity(absolute(2, 1))[1]), f"{Q}#3": None}
    assert (probes.extra.probes, probes.extra.rounds) == (2, 1)  # lane 2's and lane 3's second looks, at once
