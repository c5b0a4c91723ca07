"""A fake partitioned backlog queue for the unit tests: peeks answer as the brief's broker model does."""

from __future__ import annotations

from backlog_syphon.partitions import absolute, partition_of


class FakePartitionedQueue:
    """Messages by partition (local numbers, in order; enqueue time = ``base_ms`` + local number).

    A peek from ``x`` answers from one partition per call: the one holding ``x`` when it has a message at or
    after ``x``, else the first non-empty partition after it, from that partition's start.
    ``one_per_call``: at most one message a peek (as reported for partitioned entities)."""

    def __init__(self, lanes: dict[int, list[int]], *, one_per_call: bool = False, base_ms: int = 1_000_000,
                 empty_every: int = 0):
        self.lanes = {p: sorted(ns) for p, ns in lanes.items()}
        self.one_per_call = one_per_call
        self.base_ms = base_ms
        # Every n-th peek of a partition comes back empty although messages exist (0: never): a transient fault,
        # so the next one (the second look) is answered right, as the design assumes of the service.
        self.empty_every = empty_every
        self.peeks = 0
        self._partition_peeks: dict[int, int] = {}

    def identity(self, seq: int) -> tuple[int, int]:
        return seq, self.base_ms + partition_of(seq) * 10_000_000 + (seq & ((1 << 48) - 1))

    def all(self) -> list[int]:
        return [absolute(p, n) for p in sorted(self.lanes) for n in self.lanes[p]]

    def peek(self, x: int, count: int) -> list[tuple[int, int]]:
        self.peeks += 1
        asked = self._partition_peeks[partition_of(x)] = self._partition_peeks.get(partition_of(x), 0) + 1
        if self.empty_every and asked % self.empty_every == 0:
            return []
        count = 1 if self.one_per_call else count
        for p in sorted(self.lanes):
            if p < partition_of(x):
                continue
            found = [absolute(p, n) for n in self.lanes[p] if absolute(p, n) >= x]
            if found:
                return [self.identity(seq) for seq in found[:count]]
        return []

    def probe(self, x: int):
        page = self.peek(max(1, x), 1)
        return page[0] if page else None

    def remove(self, seqs) -> None:
        gone = set(seqs)
        self.lanes = {p: [n for n in ns if absolute(p, n) not in gone] for p, ns in self.lanes.items()}
