"""Duplicate detection: a queue's or topic's MessageIds seen within its window. No I/O.

Invariants:
- a key is remembered from the first time it is seen until the window has passed, then forgotten
  (oldest first); a duplicate does not renew it;
- the key is the MessageId with its type (``1`` and ``"1"`` differ), and on a partitioned entity the
  partition key too (``partitions.routing_key``), as the service compares them; a message without a
  MessageId is never a duplicate.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional


class Deduper:
    """MessageId duplicate detection within a time window (0 = off); on a partitioned entity the key is
    the MessageId with the partition key (``partition_key``: ``partitions.routing_key``)."""

    def __init__(self, window_seconds: float):
        self.window_ms = int(window_seconds * 1000)
        self.seen: "OrderedDict[Any, int]" = OrderedDict()

    def is_duplicate(self, message_id, now: int, *, partitioned: bool = False,
                     partition_key: Optional[str] = None) -> bool:
        if not self.window_ms or message_id is None:
            return False
        while self.seen:
            key, t = next(iter(self.seen.items()))
            if t > now - self.window_ms:
                break
            self.seen.popitem(last=False)
        key = (type(message_id).__name__, message_id)
        if partitioned:
            key += (partition_key,)
        if key in self.seen:
            return True
        self.seen[key] = now
        return False
