"""A partitioned queue's sequence numbers: partition bits, lanes, lane keys."""

from backlog_syphon.partitions import (
    LANES,
    absolute,
    is_partitioned_number,
    lane_end,
    lane_key,
    lane_start,
    lanes_of,
    local_of,
    partition_of,
    split_lane_key,
)


def test_a_number_splits_into_partition_and_local_and_back():
    seq = (5 << 48) | 1234
    assert (partition_of(seq), local_of(seq)) == (5, 1234)
    assert absolute(5, 1234) == seq
    assert partition_of(10696049115006452) == 38  # the service's own example: partition 38, number 1524
    assert local_of(10696049115006452) == 1524


def test_plain_numbers_are_lane_zero():
    assert partition_of(1) == 0 and local_of(99) == 99 and not is_partitioned_number(99)
    assert is_partitioned_number(1 << 48)


def test_lanes_do_not_overlap_and_cover_sixteen_partitions():
    assert LANES == 16
    for p in range(LANES - 1):
        assert lane_start(p) < lane_end(p) == lane_start(p + 1)
    assert partition_of(lane_end(3) - 1) == 3 and partition_of(lane_start(3)) == 3


def test_a_local_number_past_the_lane_is_clamped_inside_it():
    assert partition_of(absolute(2, 1 << 50)) == 2
    assert absolute(2, -5) == lane_start(2)


def test_lane_keys_round_trip_and_queue_names_are_not_lanes():
    assert split_lane_key(lane_key("backlog-a", 7)) == ("backlog-a", 7)
    assert split_lane_key("backlog-a") == ("backlog-a", None)
    assert split_lane_key("backlog-a/$DeadLetterQueue") == ("backlog-a/$DeadLetterQueue", None)
    assert split_lane_key(lane_key("q/$DeadLetterQueue", 0)) == ("q/$DeadLetterQueue", 0)


def test_lanes_of_keeps_order_within_each_partition():
    seqs = [(1 << 48) | 2, 3, (1 << 48) | 1, 4]
    assert lanes_of(seqs) == {1: [(1 << 48) | 2, (1 << 48) | 1], 0: [3, 4]}


def test_a_partitioned_sequence_number_reads_as_its_partition_and_place_and_a_plain_one_as_it_is():
    from backlog_syphon.partitions import sequence_label

    assert sequence_label(7 << 48 | 2) == "p7:2"
    assert sequence_label(15 << 48 | 1) == "p15:1"
    assert sequence_label(422) == "422"  # partition 0's numbers cannot tell: shown as they are
