"""Settling received messages the same way in as few requests as possible, within their locks: one request
for all, split in halves where a lock was lost. Pure: the requests are ``servicebus.purge``'s."""

from __future__ import annotations

class BulkSettlement:
    """Settling received messages the same way (completing them, or dead-lettering them with one reason) in
    as few requests as possible, within their locks.

    All of them in one request first. A request refused because a lock was lost (one of its messages
    was settled already, or its lock ran out) is split in two and each half tried again, down to single
    messages, whose refusal is final: their lock is lost, and the next round receives them again. Any
    other failure ends it (the link is broken; the locks end by themselves). No request goes out once
    ``deadline`` (epoch seconds: ``settle_timing.SettleTiming.deadline``) has passed: what is left is
    released by the caller and received again. So a failed request costs about log2(n) requests more,
    never n round trips.
    """

    def __init__(self, items, deadline: float):
        self._pending: list[tuple] = [tuple(items)] if items else []
        self.deadline = deadline
        self.completed: list = []
        self.lost: list = []  # refused one by one: their lock is lost
        self.left: list = []  # not tried: the deadline passed, the link broke, or every lock seemed gone
        # Refusals in a row a few lost locks explain (each costs one path down the halves); past that,
        # every lock seems gone (the link that took them lost them all): no use splitting further.
        self._refusals_allowed = 2 * max(1, len(self._pending[0]) if self._pending else 1).bit_length()
        self._refusals = 0
        self.all_lost = False

    def next_request(self, now: float) -> tuple | None:
        """The next items to complete in one request, or None when done."""
        if self._pending and now >= self.deadline:
            self.stop()
        return self._pending[-1] if self._pending else None

    def succeeded(self, request: tuple) -> None:
        self._pending.remove(request)
        self.completed.extend(request)
        self._refusals = 0

    def lock_lost(self, request: tuple) -> None:
        self._pending.remove(request)
        self._refusals += 1
        if len(request) == 1:
            self.lost.extend(request)
        else:  # the second half is tried first: the last pushed is the next asked for
            half = len(request) // 2
            self._pending += [request[half:], request[:half]]
        if self._refusals > self._refusals_allowed:
            self.all_lost = True
            self.stop()

    def stop(self) -> None:
        """Send nothing more (the link broke, or the locks are about to end)."""
        for request in self._pending:
            self.left.extend(request)
        self._pending.clear()

    @property
    def unsettled(self) -> list:
        return self.lost + self.left
