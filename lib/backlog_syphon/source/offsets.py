"""A backlog queue's offset, as the stream stores it, and the windows between two offsets: pure.

Offsets are ``{backlog queue name: {"incarnation": n, "next": next sequence number to read,
"seen_ms": newest enqueue time probed}}`` (``QueueOffset``; a bare number, as older versions wrote,
reads as the first incarnation). A window ``[start, end)`` of one queue is immutable once planned
(new messages always get higher sequence numbers), so a replayed batch peeks exactly the same
messages again.

Sequence numbers mean something only within one incarnation of a queue: a queue deleted and created
again numbers from 1 again. A head (the queue's first message) below the offset that entered the backlog
after every message probed so far cannot belong to the same incarnation (``QueueOffset.recreated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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
    def parse(cls, value) -> QueueOffset:
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


def position(value) -> int:
    """The next sequence number an offset value names (either format)."""
    return QueueOffset.parse(value).next


def normalise_offsets(offsets: Mapping[str, QueueOffset]) -> dict[str, dict]:
    """Offsets as Spark stores them, with a stable key order: Spark compares serialised offsets as strings."""
    return {queue: QueueOffset.parse(offsets[queue]).to_json() if not isinstance(offsets[queue], QueueOffset)
            else offsets[queue].to_json() for queue in sorted(offsets)}


def windows(start: Mapping[str, object], end: Mapping[str, object]) -> list[tuple[str, int, int]]:
    """``(queue, first, stop)`` of every queue with something between ``start`` and ``end``, by queue.
    A queue whose incarnation changed is read from its beginning; one whose end offset changed and
    carries ``reread_from`` (a look back) from there."""
    planned = []
    for queue, value in sorted(end.items()):
        stop, begin = QueueOffset.parse(value), QueueOffset.parse(start.get(queue, 0))
        if stop == begin:
            continue  # unmoved (a look back it carries belonged to the batch that ended there)
        first = begin.next if begin.incarnation == stop.incarnation else 0
        if stop.reread_from is not None and begin.incarnation == stop.incarnation:
            first = stop.reread_from  # a look back at what earlier runs left below the offset
        if stop.next > first:
            planned.append((queue, first, stop.next))
    return planned
