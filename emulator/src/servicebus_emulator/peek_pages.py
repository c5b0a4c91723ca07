"""How much one ``com.microsoft:peek-message`` answer holds, as a real namespace answers.

The service returns at most 250 messages per peek and "no guarantee of a minimum": how many depends
"most significantly" on how fast the network streams them. The emulator stands in for that with a
byte budget per answer and, when a test asks for them, empty answers while messages exist, drawn from
a seeded generator so that a run is repeatable. No I/O.

Invariants:
- an answer is the first messages at or after the requested sequence number, in order: only its end
  is cut, never a message in the middle;
- an answer that holds any message holds at least one, however large (else it could never be peeked);
- with the same seed and the same peeks, the same answers come back empty (and, on a partitioned entity
  with ``peek_other_partition_probability``, from the same other partitions);
- an answer from another partition is from a later one that holds messages, from its first message: never
  a number below the one asked.
"""
from __future__ import annotations

import random
from typing import Iterable, List

from .limits import MAX_PEEK_MESSAGES
from .partitions import PARTITION_SHIFT, partition_of


class PeekPager:
    def __init__(self, settings):
        self.page_bytes = settings.peek_page_bytes
        self.empty_probability = settings.peek_empty_page_probability
        self.elsewhere_probability = settings.peek_other_partition_probability
        self._draws = random.Random(settings.peek_seed)

    @staticmethod
    def message_count(asked: int) -> int:
        """How many messages to look for: what was asked, within 1..250."""
        return max(1, min(asked, MAX_PEEK_MESSAGES))

    def answers_empty(self) -> bool:
        """Whether this answer, though messages were found, comes back empty (status 204)."""
        return self.empty_probability > 0 and self._draws.random() < self.empty_probability

    def elsewhere(self, entity, start: int) -> int:
        """Where a peek from ``start`` on a partitioned entity is answered from: ``start``, or, with
        ``peek_other_partition_probability``, the first number of a later partition that holds messages,
        drawn at random (the partition "whose message broker responded first")."""
        if self.elsewhere_probability <= 0 or self._draws.random() >= self.elsewhere_probability:
            return start
        later = [p for p in range(partition_of(start) + 1, entity.partitions) if entity.holds_partition(p)]
        return self._draws.choice(later) << PARTITION_SHIFT if later else start

    def fit(self, encoded: Iterable[bytes]) -> List[bytes]:
        """The leading encoded messages that fit the byte budget (at least the first one)."""
        page, total = [], 0
        for message in encoded:
            total += len(message)
            if page and total > self.page_bytes:
                break
            page.append(message)
        return page
