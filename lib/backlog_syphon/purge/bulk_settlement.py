"""Settling received messages the same way in as few requests as possible, within their locks: one request
per partition, split in halves where a lock was lost. Pure: the requests are ``servicebus.purge``'s."""

from __future__ import annotations

from typing import Callable, Collection


class BulkSettlement:
    """Settling received messages the same way (completing them, or dead-lettering them with one reason) in
    as few requests as possible, within their locks.

    One request per partition first (``partition``: an item's partition; a partitioned entity refuses a
    request whose lock tokens span partitions). A request refused because a lock was lost (one of its
    messages was settled already, or its lock ran out) answers one status for the whole request, and the
    service does not say whether it settled the live tokens: some namespaces do (``partial``), some settle
    none (``atomic``). So a refused request of several messages is looked at (``needs_look``: the caller peeks
    which of them are still there, ``lock_lost(present=...)``): those gone were settled by it, and then what
    is still there has lost its lock; where none went, it is split in two and each half tried again, down to
    single messages, whose refusal is final: their lock is lost, and the next round receives them again.
    Either way nothing settled is sent again (a settled message's token is dead too, and would only be
    refused), and nothing live is taken for settled. Once a look found nothing gone (an atomic namespace),
    halving alone is right and no more looks are asked for. Any other failure ends it (the link is
    broken; the locks end by themselves). No request goes out once ``deadline`` (epoch seconds:
    ``settle_timing.SettleTiming.deadline``) has passed: what is left is released by the caller and
    received again. So a failed request costs a look, or about log2(n) requests more, never n round trips.
    """

    def __init__(self, items, deadline: float, *, partition: Callable[[object], int] = lambda item: 0):
        groups: dict[int, list] = {}
        for item in items:
            groups.setdefault(partition(item), []).append(item)
        # the last pushed is the next asked for: the lowest partition first
        self._pending: list[tuple] = [tuple(groups[key]) for key in sorted(groups, reverse=True)]
        self.deadline = deadline
        self.completed: list = []
        self.lost: list = []  # refused one by one, or still there after a refusal that settled others
        self.left: list = []  # not tried: the deadline passed, the link broke, or every lock seemed gone
        # Refusals in a row a few lost locks explain (each costs one path down the halves); past that,
        # every lock seems gone (the link that took them lost them all): no use splitting further.
        largest = max((len(request) for request in self._pending), default=1)
        self._refusals_allowed = 2 * max(1, largest).bit_length()
        self._refusals = 0
        self.all_lost = False
        self.looks = True  # whether a refused request is looked at (until a look shows an atomic namespace)

    def next_request(self, now: float) -> tuple | None:
        """The next items to settle in one request, or None when done."""
        if self._pending and now >= self.deadline:
            self.stop()
        return self._pending[-1] if self._pending else None

    def succeeded(self, request: tuple) -> None:
        self._pending.remove(request)
        self.completed.extend(request)
        self._refusals = 0

    def needs_look(self, request: tuple) -> bool:
        """Whether the caller should peek which of a refused ``request``'s items are still there."""
        return self.looks and len(request) > 1

    def lock_lost(self, request: tuple, *, present: Collection | None = None) -> None:
        """``request`` was refused for a lost lock; ``present``: which of its items are still there, as peeked
        after the refusal (None: not looked)."""
        self._pending.remove(request)
        self._refusals += 1
        if present is not None and len(request) > 1:
            gone = [item for item in request if item not in present]
            if gone:  # it settled its live tokens: what is still there is what lost its lock
                self.completed.extend(gone)
                self.lost.extend(item for item in request if item in present)
                self._refusals = 0
                return
            self.looks = False  # nothing of it went: halving finds the lost ones
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
