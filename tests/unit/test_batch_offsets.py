"""A batch's offsets at the Spark boundary: Spark's JSON typed once (``BatchOffsets.from_spark``) and written
back once (``to_spark``), in the very form checkpoints already hold."""

import json

import pytest

from backlog_syphon.partitions import absolute, lane_key
from backlog_syphon.source.offsets import BatchOffsets, PartitionedOffset, QueueOffset, expand_lanes, fold_lanes
from backlog_syphon.source.window_planner import WindowPlanner

# Offsets as checkpoints of earlier versions hold them, byte for byte (Spark writes ``json.dumps`` of what
# the source returns, and compares offsets as that text).
PLAIN_CHECKPOINT = (
    '{"ns/backlog/0": {"incarnation": 1, "next": 23, "seen_ms": 1765000000000, "reread_from": 3}, '
    '"ns/backlog/1": {"incarnation": 2, "next": 151, "seen_ms": 1765000000123}, '
    '"ns/backlog/2": {"incarnation": 1, "next": 0, "seen_ms": null}}')
PARTITIONED_CHECKPOINT = (
    '{"ns/backlog/p": {"partitions": {"0": {"incarnation": 1, "next": 7, "seen_ms": null}, '
    '"3": {"incarnation": 2, "next": 844424930131973, "seen_ms": 1765000000200, "reread_from": 844424930131970}, '
    '"11": {"incarnation": 1, "next": 3096224743817220, "seen_ms": 1765000000456}}}}')


@pytest.mark.parametrize("checkpointed", [PLAIN_CHECKPOINT, PARTITIONED_CHECKPOINT])
def test_a_checkpointed_offset_round_trips_byte_identical(checkpointed):
    assert json.dumps(BatchOffsets.from_spark(json.loads(checkpointed)).to_spark()) == checkpointed


def test_a_checkpoint_reads_as_typed_offsets():
    plain = BatchOffsets.from_spark(json.loads(PLAIN_CHECKPOINT))
    assert plain == {"ns/backlog/0": QueueOffset(1, 23, 1765000000000, reread_from=3),
                     "ns/backlog/1": QueueOffset(2, 151, 1765000000123),
                     "ns/backlog/2": QueueOffset()}
    partitioned = BatchOffsets.from_spark(json.loads(PARTITIONED_CHECKPOINT))["ns/backlog/p"]
    assert partitioned == PartitionedOffset.of({0: QueueOffset(1, 7), 3: QueueOffset(2, 5, 1765000000200, 2),
                                                11: QueueOffset(1, 4, 1765000000456)})  # lanes in local numbers
    assert partitioned.to_json()["partitions"]["3"]["next"] == absolute(3, 5)


def test_a_bare_number_of_the_first_versions_reads_as_incarnation_one_and_is_written_in_todays_form():
    read = BatchOffsets.from_spark({"q": 151})
    assert read == {"q": QueueOffset(1, 151)}
    assert json.dumps(read.to_spark()) == '{"q": {"incarnation": 1, "next": 151, "seen_ms": null}}'


def test_batch_offsets_are_a_read_only_mapping_by_queue_written_in_a_stable_order():
    offsets = BatchOffsets.of({"b": QueueOffset(next=2), "a": QueueOffset(3, 7, 70)})
    assert list(offsets) == ["a", "b"] and len(offsets) == 2 and offsets["a"] == QueueOffset(3, 7, 70)
    assert offsets == BatchOffsets.of({"a": QueueOffset(3, 7, 70), "b": QueueOffset(next=2)})
    assert list(offsets.to_spark()) == ["a", "b"]
    with pytest.raises(TypeError):
        offsets["c"] = QueueOffset()  # type: ignore[index]


def test_lanes_expand_and_fold_back_as_typed_offsets():
    offsets = BatchOffsets.of({"p": PartitionedOffset.of({3: QueueOffset(1, 5)}), "q": QueueOffset(next=9)})
    keyed = expand_lanes(offsets, {"p"})
    assert keyed[lane_key("p", 3)] == QueueOffset(1, 5) and keyed[lane_key("p", 0)] == QueueOffset()
    assert keyed["q"] == QueueOffset(next=9) and len(keyed) == 17
    assert fold_lanes(keyed) == offsets and isinstance(fold_lanes(keyed), BatchOffsets)


def test_the_planner_takes_and_returns_typed_offsets():
    planner = WindowPlanner(lambda asks: {queue: None for queue in asks}, max_messages=10, available_now=False,
                            idle_probe_max_seconds=900.0)
    start = planner.initial_offset(["q"])
    assert isinstance(start, BatchOffsets) and start == {"q": QueueOffset()}
    end = planner.latest_offset(start, ["q"], 10, now=0.0)
    assert isinstance(end, BatchOffsets) and end == start  # an empty queue: no move, so Spark plans no batch
