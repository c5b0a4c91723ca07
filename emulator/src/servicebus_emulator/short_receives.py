"""Receives that bring a part of what they asked for, as a real namespace's do even with thousands of
messages waiting ("by design": azure-service-bus-dotnet#441; docs/emulator.md). No I/O.

A receive is one grant of link credit (a ``receive_messages`` call). With ``short_receive_probability``
above 0, that share of the receives asking for more than one message get a part of it, drawn evenly from
1 to one less than asked; the rest of the credit stays open, unanswered, until the client's next grant.

Invariants:
- a receive that gets anything gets at least one message, and never more than it asked for;
- with the same seed and the same receives, the same receives come back short, with the same parts.
"""
from __future__ import annotations

import random
from typing import Optional


class ShortReceives:
    def __init__(self, probability: float, seed: int):
        self.probability = probability
        self._draws = random.Random(seed)

    def allowance(self, asked: int) -> Optional[int]:
        """How many messages a receive asking for ``asked`` may get (None: all of them)."""
        if asked < 2 or self.probability <= 0 or self._draws.random() >= self.probability:
            return None
        return self._draws.randint(1, asked - 1)
