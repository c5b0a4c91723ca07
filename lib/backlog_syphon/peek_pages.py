"""Reading a range of sequence numbers with peeks that may come back short or empty. Pure: the caller
peeks, this decides what to ask next and what a page means.

Service Bus gives no minimum for a peek: "there's no guarantee of a minimum batch size", at most 250
messages a call, as many as the network streams in time; and it can answer with no messages while some
exist (status 204, or ``com.microsoft:message-not-found``). So:
- a short page is never the end: the next page asks from after its last message;
- an empty page where the range may hold more is looked at once more before it is taken as the end: a
  single-message peek at the same position (``PagedRead.next_ask``). A message that second look finds is
  read as a page of its own, and the reading goes on from it.

One second look is enough: an empty answer while messages exist is a transient fault of the service (the
service team calls it a bug, unlike a short page), so two requests in a row that both miss is treated as
the end; and it is cheap, because the common case never meets it: a range read to a known end stops at
that end without an empty page, and one read to the queue's end met an empty page before this too (it now
costs one single-message peek more, only when the first answer was empty).

A read of one partition's range of a partitioned queue (``lane``) has a second way to miss: a peek on a
partitioned entity "returns the oldest message in one of the partitions whose message broker responded
first", and nothing says it answers from the partition holding the number asked while that one still has
messages there. So an answer from another partition is a miss too, not the end, and a lane gets more
looks (``LANE_LOOKS``): such answers are no transient fault but the service's way, and a lane ended early
would be read short (a window's rest never sent) or taken as settled (a purge mark passing what is there).

Invariants:
- Every message of the range that both looks would see is taken exactly once, in order; nothing past
  ``last`` is taken; a page that goes past ``last`` (in a lane: within the lane's partition) ends the read.
- Progress: each answer either takes at least one message (the position moves on) or ends the read, or is
  the first look at an empty page (the second follows). A read never asks forever.
"""

from __future__ import annotations

from dataclasses import dataclass

from backlog_syphon.partitions import partition_of

PEEK_PAGE_SIZE = 250  # the most one peek returns (the service's limit, and the syphon's page)
LOOKS = 2  # answers in a row that miss (empty) before a read takes it as the end
# In a lane, where an answer from another partition misses too. A lane's window lies where its probes found
# messages, so such answers are the service answering from elsewhere, not the lane's end; ended early, the
# window's rest would be taken as read and never sent. Three looks ended a read early about once in a
# thousand reads where a tenth of the answers came from elsewhere (seen in the partitioned backlog's test).
LANE_LOOKS = 8


@dataclass
class PagedRead:
    """Where a read of ``[first, last]`` stands: ``next_ask`` -> peek -> ``on_page`` -> ... until ``done``."""

    first: int
    last: int
    page_size: int = PEEK_PAGE_SIZE
    position: int = -1  # the next sequence number to ask from (``first`` at the start)
    misses: int = 0  # answers in a row that took nothing where the range may hold more
    done: bool = False
    lane: bool = False  # one partition's range of a partitioned queue: answers from others miss

    @property
    def confirming(self) -> bool:
        """The last answer missed: the next ask is a look again."""
        return self.misses > 0

    def __post_init__(self):
        if self.position < 0:
            self.position = self.first
        self.done = self.done or self.position > self.last

    def next_ask(self) -> tuple[int, int] | None:
        """``(from sequence number, how many)`` to peek next, or None when the read is over."""
        if self.done:
            return None
        if self.confirming:
            return self.position, 1
        return self.position, max(1, min(self.page_size, self.last - self.position + 1))

    def on_page(self, sequence_numbers: list[int]) -> int:
        """The sequence numbers a peek from ``position`` returned, in order: how many of them, from the first,
        lie in the range (the caller takes those)."""
        if not sequence_numbers or (self.lane and partition_of(sequence_numbers[0]) != partition_of(self.position)):
            self.misses += 1
            self.done = self.misses >= (LANE_LOOKS if self.lane else LOOKS)
            return 0
        self.misses = 0
        taken = 0
        for seq in sequence_numbers:
            if seq > self.last:
                self.done = True  # the page went past the range
                break
            taken += 1
            self.position = max(self.position, seq + 1)
        self.done = self.done or self.position > self.last
        return taken
