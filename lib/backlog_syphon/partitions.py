"""A partitioned queue's sequence numbers, as Service Bus numbers them: pure.

A partitioned entity numbers each partition on its own: "the topmost 16 bits reflect the partition
identifier", and the rest is a gap-free, increasing number relative to the partition. So its sequence
numbers are ``partition << 48 | n``: a dense run per partition, far apart. A Standard entity has 16
partitions; a Premium namespace 1, 2 or 4 (all of them below 16, so 16 lanes cover every case).

The syphon reads such a queue *lane by lane*: a lane is one partition's numbers, ``[lane_start(p),
lane_end(p))``. Inside a lane the planner and the readers use the *local* number ``n`` (the low 48 bits),
so one lane is searched exactly like a non-partitioned queue; a peek answered from another lane means
"nothing in this lane at or after it".

Invariants: ``absolute(partition_of(x), local_of(x)) == x`` for every sequence number; lanes never overlap;
a non-partitioned queue's numbers all lie in lane 0 (so lane 0's local numbers are its own numbers).
"""

from __future__ import annotations

PARTITION_SHIFT = 48
LOCAL_MASK = (1 << PARTITION_SHIFT) - 1
LANES = 16  # Standard's 16 partitions; Premium's 1, 2 or 4 lie among them
LANE_SEPARATOR = "#"  # never in a Service Bus entity name: a lane's key is ``<queue>#<partition>``


def partition_of(sequence_number: int) -> int:
    """The partition a sequence number belongs to (0 for a non-partitioned queue's)."""
    return sequence_number >> PARTITION_SHIFT


def local_of(sequence_number: int) -> int:
    """The number within its partition (the low 48 bits)."""
    return sequence_number & LOCAL_MASK


def absolute(partition: int, local: int) -> int:
    """The sequence number of ``local`` in ``partition``; a local number past the lane's end is clamped to its
    last number (a search galloping past it asks there, and finds nothing in the lane)."""
    return (partition << PARTITION_SHIFT) | min(max(0, local), LOCAL_MASK)


def lane_start(partition: int) -> int:
    return partition << PARTITION_SHIFT


def lane_end(partition: int) -> int:
    """The first sequence number past the lane (exclusive)."""
    return (partition + 1) << PARTITION_SHIFT


def is_partitioned_number(sequence_number: int) -> bool:
    """Whether a sequence number carries partition bits: its queue is partitioned (lane 0's numbers cannot
    tell: a partitioned queue holding partition 0's messages only looks like a plain one)."""
    return partition_of(sequence_number) != 0


def sequence_label(sequence_number: int) -> str:
    """A sequence number as an operator reads it: ``p7:2`` for partition 7's second message, a plain
    queue's number as it is (``7 << 48 | 2`` printed whole says nothing)."""
    if not is_partitioned_number(sequence_number):
        return str(sequence_number)
    return f"p{partition_of(sequence_number)}:{local_of(sequence_number)}"


def lane_key(queue: str, partition: int) -> str:
    """The planner's key of one lane of ``queue``."""
    return f"{queue}{LANE_SEPARATOR}{partition}"


def split_lane_key(key: str) -> tuple[str, int | None]:
    """``(queue, partition)`` of a lane key; ``(key, None)`` for a queue's own key."""
    queue, separator, partition = key.rpartition(LANE_SEPARATOR)
    if not separator or not partition.isdigit():
        return key, None
    return queue, int(partition)


def lanes_of(sequence_numbers) -> dict[int, list[int]]:
    """Sequence numbers by partition, each lane's in the order given."""
    lanes: dict[int, list[int]] = {}
    for seq in sequence_numbers:
        lanes.setdefault(partition_of(seq), []).append(seq)
    return lanes
