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

Invariants:
- Every message of the range that both looks would see is taken exactly once, in order; nothing past
  ``last`` is taken; a page that goes past ``last`` ends the read.
- Progress: each answer either takes at least one message (the position moves on) or ends the read, or is
  the first look at an empty page (the second follows). A read never asks forever.
"""

from __future__ import annotations

from dataclasses import dataclass

PEEK_PAGE_SIZE = 250  # the most one peek returns (the service's limit, and the syphon's page)


@dataclass
class PagedRead:
    """Where a read of ``[first, last]`` stands: ``next_ask`` -> peek -> ``on_page`` -> ... until ``done``."""

    first: int
    last: int
    page_size: int = PEEK_PAGE_SIZE
    position: int = -1  # the next sequence number to ask from (``first`` at the start)
    confirming: bool = False  # the last page was empty: the next ask is the second look
    done: bool = False

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
        if not sequence_numbers:
            self.done, self.confirming = self.confirming, not self.confirming
            return 0
        self.confirming = False
        taken = 0
        for seq in sequence_numbers:
            if seq > self.last:
                self.done = True  # the page went past the range
                break
            taken += 1
            self.position = max(self.position, seq + 1)
        self.done = self.done or self.position > self.last
        return taken
