"""A backlog queue's offset, as the stream stores it, and the windows between two offsets: pure.

Offsets are ``{backlog queue name: {"incarnation": n, "next": next sequence number to read,
"seen_ms": newest enqueue time probed}}`` (``QueueOffset``; a bare number, as older versions wrote,
reads as the first incarnation). A window ``[start, end)`` of one queue is immutable once planned
(new messages always get higher sequence numbers), so a replayed batch peeks exactly the same
messages again.

Sequence numbers mean something only within one incarnation of a queue: a queue deleted and created
again numbers from 1 again. A head (the queue's first message) below the offset that entered the backlog
after every message probed so far cannot belong to the same incarnation (``QueueOffset.recreated``).

A partitioned queue numbers each partition on its own (``partitions``), so its offset is one
``QueueOffset`` per partition lane (``PartitionedOffset``): ``{"partitions": {"3": {"incarnation": n,
"next": 3 << 48 | k, "seen_ms": ...}}}``, the next sequence number of each lane that was ever read (a lane
not named starts from its beginning). Each lane has its own incarnation, found the same way from the
lane's head. Inside the planner a lane's numbers are local (the low 48 bits), so a lane is planned like
a queue of its own; the stored offset holds whole sequence numbers. A queue that was read as
non-partitioned and turns out partitioned (recreated so by an operator, or partition 0 was the only one
seen) keeps its offset as lane 0's: lane 0's numbers are the plain queue's numbers, so a recreation shows
there as always (its head below the offset, enqueued after everything seen) and the other lanes, never
read before, start from their beginning. Nothing is skipped, nothing read twice.

Spark hands offsets over as JSON values and compares the JSON it gets back as text. They are parsed once, at
the source's Spark-facing methods (``BatchOffsets.from_spark``), and written back once (``to_spark``, in the
form every earlier version wrote, so old checkpoints load and compare equal): everything behind those methods
(the planner, its lanes, the windows) takes and returns typed offsets only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping

from backlog_syphon.partitions import LANES, absolute, lane_key, local_of, split_lane_key
from backlog_syphon.probing import Identity


@dataclass(frozen=True)
class QueueOffset:
    """Where a queue's reading stands: its incarnation, the next sequence number, and the newest
    enqueue time seen in this incarnation (what a recreated queue's messages come after)."""

    incarnation: int = 1
    next: int = 0
    seen_ms: int | None = None
    # In a batch's end offset only: that batch's window of this queue starts here, below the start
    # offset (a run looking back at what earlier runs left in the queue). Part of the offset, so a
    # replayed batch reads the same window.
    reread_from: int | None = None

    @classmethod
    def from_json(cls, value) -> QueueOffset:
        """A non-partitioned queue's offset as Spark stored it: a mapping, or a bare number (older versions)."""
        if isinstance(value, Mapping):
            return cls(int(value.get("incarnation", 1)), int(value.get("next", 0)),
                       None if value.get("seen_ms") is None else int(value["seen_ms"]),
                       None if value.get("reread_from") is None else int(value["reread_from"]))
        return cls(next=int(value))  # an offset written by an older version

    def to_json(self) -> dict:
        out = {"incarnation": self.incarnation, "next": self.next, "seen_ms": self.seen_ms}
        if self.reread_from is not None:  # only then: offsets without it keep the form older versions wrote
            out["reread_from"] = self.reread_from
        return out

    def left_behind(self, head: Identity | None) -> bool:
        """Whether ``head``, the queue's first message now, lies below this offset in the same incarnation:
        something earlier batches read is still there (held for a skipped destination, or not yet settled)."""
        return head is not None and head[0] < self.next and not self.recreated(head)

    def recreated(self, head: Identity | None) -> bool:
        """Whether ``head``, the queue's first message now, shows the queue was created again."""
        if head is None or self.seen_ms is None or head[1] is None:
            return False
        return head[0] < self.next and head[1] > self.seen_ms


@dataclass(frozen=True)
class PartitionedOffset:
    """Where a partitioned queue's reading stands: one ``QueueOffset`` per partition lane, in the lane's local
    numbers (a lane not named has read nothing: ``QueueOffset()``)."""

    lanes: tuple[tuple[int, QueueOffset], ...] = ()  # (partition, its offset), by partition

    @classmethod
    def of(cls, lanes: Mapping[int, QueueOffset]) -> PartitionedOffset:
        return cls(tuple(sorted(lanes.items())))

    @classmethod
    def from_json(cls, value: Mapping) -> PartitionedOffset:
        """A partitioned queue's offset as Spark stored it (``{"partitions": {...}}``, whole sequence numbers)."""
        lanes = {}
        for name, lane in value["partitions"].items():
            partition, offset = int(name), QueueOffset.from_json(lane)
            lanes[partition] = QueueOffset(offset.incarnation, local_of(offset.next),
                                           offset.seen_ms,
                                           None if offset.reread_from is None else local_of(offset.reread_from))
        return cls.of(lanes)

    def lane(self, partition: int) -> QueueOffset:
        return dict(self.lanes).get(partition, QueueOffset())

    def to_json(self) -> dict:
        out = {}
        for partition, offset in self.lanes:
            lane = QueueOffset(offset.incarnation, absolute(partition, offset.next), offset.seen_ms,
                               None if offset.reread_from is None else absolute(partition, offset.reread_from))
            out[str(partition)] = lane.to_json()
        return {"partitions": out}

    @property
    def next(self) -> int:
        """Messages' worth of numbers read, over every lane (a position for reports: what is left behind a
        tail is the difference of two such sums)."""
        return sum(offset.next for _, offset in self.lanes)


Offset = QueueOffset | PartitionedOffset


@dataclass(frozen=True, eq=False)
class BatchOffsets(Mapping[str, Offset]):
    """A batch's offset (its start or its end): each backlog queue's ``QueueOffset`` or ``PartitionedOffset``,
    by queue. Read-only; equal to any mapping with the same items."""

    by_queue: tuple[tuple[str, Offset], ...] = ()  # (queue, its offset), by queue
    _index: dict[str, Offset] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", dict(self.by_queue))

    @classmethod
    def of(cls, offsets: Mapping[str, Offset]) -> BatchOffsets:
        return cls(tuple(sorted(offsets.items(), key=lambda item: item[0])))

    @classmethod
    def from_spark(cls, value: Mapping[str, object]) -> BatchOffsets:
        """The offset Spark passes in (parsed JSON, any format this source ever wrote), typed."""
        return cls.of({queue: _offset_from_json(stored) for queue, stored in value.items()})

    def to_spark(self) -> dict[str, dict]:
        """The offset as Spark stores it: keys in a stable order, since Spark compares offsets as text."""
        return {queue: offset.to_json() for queue, offset in self.by_queue}

    def __getitem__(self, queue: str) -> Offset:
        return self._index[queue]

    def __iter__(self) -> Iterator[str]:
        return (queue for queue, _ in self.by_queue)

    def __len__(self) -> int:
        return len(self.by_queue)


def _offset_from_json(value) -> Offset:
    """One queue's offset as Spark stored it: per partition lane, or one (either older format)."""
    if isinstance(value, Mapping) and "partitions" in value:
        return PartitionedOffset.from_json(value)
    return QueueOffset.from_json(value)


def lane_offsets(offset: Offset) -> dict[int, QueueOffset]:
    """A queue's offset per lane: a non-partitioned queue's offset is lane 0's (its numbers are lane 0's)."""
    return dict(offset.lanes) if isinstance(offset, PartitionedOffset) else {0: offset}


def expand_lanes(offsets: Mapping[str, Offset], partitioned: set[str] | frozenset[str]) -> dict[str, Offset]:
    """Offsets by planner key: a partitioned queue's (named in ``partitioned``) as one key per lane
    (``partitions.lane_key``), all 16 (a lane never read starts from its beginning; a non-partitioned offset
    is lane 0's); any other queue's as it is."""
    expanded: dict[str, Offset] = {}
    for queue, offset in offsets.items():
        if queue in partitioned:
            lanes = lane_offsets(offset)
            for partition in range(LANES):
                expanded[lane_key(queue, partition)] = lanes.get(partition, QueueOffset())
        else:
            expanded[queue] = offset
    return expanded


def fold_lanes(offsets: Mapping[str, Offset]) -> BatchOffsets:
    """Planner keys' offsets back by queue (``expand_lanes`` reversed): a queue's lanes as one
    ``PartitionedOffset`` (kept even when no lane has read anything yet, so the queue stays partitioned for
    the next run), lanes that never moved left out."""
    folded: dict[str, Offset] = {}
    lanes: dict[str, dict[int, QueueOffset]] = {}
    for key, offset in offsets.items():
        queue, partition = split_lane_key(key)
        if partition is None:
            folded[queue] = offset
        else:
            lanes.setdefault(queue, {})
            if offset != QueueOffset():
                lanes[queue][partition] = offset
    for queue, by_lane in lanes.items():
        folded[queue] = PartitionedOffset.of(by_lane)
    return BatchOffsets.of(folded)


def windows(start: Mapping[str, Offset], end: Mapping[str, Offset]) -> list[tuple[str, int, int]]:
    """``(queue, first, stop)`` of every queue with something between ``start`` and ``end``, by queue, and a
    partitioned queue's lanes by partition (whole sequence numbers: a window never crosses lanes).
    A queue (lane) whose incarnation changed is read from its beginning; one whose end offset changed and
    carries ``reread_from`` (a look back) from there. A queue read as non-partitioned before is lane 0."""
    planned = []
    for queue, offset in sorted(end.items()):
        ends, begins = lane_offsets(offset), lane_offsets(start.get(queue, QueueOffset()))
        whole = isinstance(offset, PartitionedOffset)
        for partition, stop in sorted(ends.items()):
            window = _lane_window(begins.get(partition, QueueOffset()), stop)
            if window is not None:
                first, after = window
                planned.append((queue, absolute(partition, first) if whole else first,
                                absolute(partition, after) if whole else after))
    return planned


def _lane_window(begin: QueueOffset, stop: QueueOffset) -> tuple[int, int] | None:
    if stop == begin:
        return None  # unmoved (a look back it carries belonged to the batch that ended there)
    first = begin.next if begin.incarnation == stop.incarnation else 0
    if stop.reread_from is not None and begin.incarnation == stop.incarnation:
        first = stop.reread_from  # a look back at what earlier runs left below the offset
    return (first, stop.next) if stop.next > first else None
