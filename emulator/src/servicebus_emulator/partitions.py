"""Partitioned entities: which partition a message goes to, and the numbers it gets there. No I/O.

A partitioned queue or topic is 16 partitions on Standard (``enable_partitioning``), or 1, 2 or 4 in a
partitioned Premium namespace (``partitions``); docs/emulator.md cites the sources. Each partition
numbers its own messages ``partition << 48 | n``, ``n`` from 1 without gaps.

Invariants:
- the partition of a message is decided by its SessionId, else its PartitionKey, else (duplicate
  detection on) its MessageId, hashed with a stable hash so that a key always lands in the same
  partition, run after run; a message with none of these goes to the next partition in turn (round
  robin), so that keyless traffic spreads evenly and a test sees the same spread every time;
- a batch goes to one partition whole (the refusals make sure its messages share their key);
- the top 16 bits of a sequence number are its partition, the rest its number within the partition;
- with the same seed and the same receives, the same receives come back empty (``ReceiveGaps``).
"""
from __future__ import annotations

import random
import zlib
from typing import Any, List, Optional

from . import codec
from .message import Content

PARTITION_SHIFT = 48
PARTITION_KEY = "x-opt-partition-key"


def partition_of(seq: int) -> int:
    return seq >> PARTITION_SHIFT


def partition_key(content: Content) -> Optional[str]:
    """The message's PartitionKey (its ``x-opt-partition-key`` annotation), or None."""
    for key, value in content.ann_entries:
        if codec.key_name(key) == PARTITION_KEY:
            return codec.as_text(codec.decode_value(value))
    return None


def routing_key(content: Content) -> Optional[str]:
    """What places the message in a partition, besides its MessageId: its SessionId, else its PartitionKey."""
    return content.session_id if content.session_id is not None else partition_key(content)


def dedupe_key(content: Content) -> Any:
    """What duplicate detection compares on a partitioned entity: the MessageId with the partition key."""
    return (content.message_id, routing_key(content))


def _stable_hash(value: Any) -> int:
    if isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    else:
        data = f"{type(value).__name__}:{value}".encode("utf-8", "replace")
    return zlib.crc32(data)


class ReceiveGaps:
    """Receives on a partitioned entity that come back empty while messages exist (``receive_empty_probability``),
    drawn from a seeded generator so that a run is repeatable."""

    def __init__(self, probability: float, seed: int):
        self.probability = probability
        self._draws = random.Random(seed)

    def answers_empty(self) -> bool:
        return self.probability > 0 and self._draws.random() < self.probability


class Partitioner:
    """Chooses the partition of each transfer to a partitioned queue or topic, and numbers its messages."""

    def __init__(self, count: int, deduplicating: bool):
        self.count = count
        self.deduplicating = deduplicating
        self.last: List[int] = [0] * count      # the last number each partition gave
        self._turn = 0

    def choose(self, content: Content) -> int:
        key: Any = routing_key(content)
        if key is None and self.deduplicating:
            key = content.message_id
        if key is None:
            partition = self._turn
            self._turn = (self._turn + 1) % self.count
            return partition
        return _stable_hash(key) % self.count

    def next(self, partition: int) -> int:
        self.last[partition] += 1
        return (partition << PARTITION_SHIFT) | self.last[partition]
