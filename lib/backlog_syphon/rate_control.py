"""How fast something may go, and how that changes when the service says it is busy: a token bucket, and an
AIMD rate controller. Pure: the clock is passed in as plain numbers (seconds). The send tasks pace their
messages with them (``sink.pacing``), and every process paces its operations on a namespace's credits with
them (``credits``); the units are theirs (messages, credits).
"""

from __future__ import annotations

import math

# A throttling answer counts once per this long: the sends of one burst are refused together, and
# halving once per refused send would take the rate to the floor in one burst.
HOLD_SECONDS = 1.0
DECREASE_FACTOR = 0.5
MIN_RATE = 1.0  # messages per second: throttled or not, a task keeps making progress
# The bucket holds at most this long's worth of messages, so no window of time sees more than
# its length times the rate plus this much (over 5 s, 5 % above the cap at most).
BURST_SECONDS = 0.25
# With no cap, the smallest rate a throttled task climbs back to before it stops limiting itself.
MIN_REFERENCE_RATE = 10.0


class TokenBucket:
    """``rate`` tokens a second, holding at most ``BURST_SECONDS`` of them (at least one); a message
    costs one. ``rate`` None: unlimited."""

    def __init__(self, rate: float | None, now: float):
        self.rate = rate
        self.tokens = self.capacity
        self.updated = now

    @property
    def capacity(self) -> float:
        return math.inf if self.rate is None else max(1.0, self.rate * BURST_SECONDS)

    def _refill(self, now: float) -> None:
        if self.rate is not None and now > self.updated:
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def set_rate(self, rate: float | None, now: float) -> None:
        self._refill(now)
        self.rate = rate
        self.tokens = min(self.tokens, self.capacity)

    def largest_send(self) -> int | None:
        """The most messages one send may carry (None: any number)."""
        return None if self.rate is None else max(1, int(self.capacity))

    def wait(self, messages: int, now: float) -> float:
        """Seconds until ``messages`` tokens are there (0: now)."""
        if self.rate is None:
            return 0.0
        self._refill(now)
        missing = min(messages, self.capacity) - self.tokens
        return 0.0 if missing <= 1e-9 else missing / self.rate

    def take(self, messages: int, now: float) -> None:
        if self.rate is not None:
            self._refill(now)
            self.tokens -= messages

    def give_back(self, messages: int, now: float) -> None:
        """Tokens taken for something that did not happen (or cost less than was taken)."""
        if self.rate is not None:
            self._refill(now)
            self.tokens = min(self.capacity, self.tokens + messages)

    def empty(self, now: float) -> None:
        """Spend what is saved: after a throttling answer, nothing goes out in a burst."""
        if self.rate is not None:
            self._refill(now)
            self.tokens = min(self.tokens, 0.0)


class RateController:
    """AIMD: halve (``decrease``) on throttling (at most once per ``HOLD_SECONDS``), add ``step`` a second while sends go
    through (not within ``HOLD_SECONDS`` of the last throttling answer), never above the cap nor below
    ``floor``."""

    def __init__(self, cap: float | None, recovery_seconds: float, *, floor: float = MIN_RATE,
                 pauses_earn: bool = False, decrease: float = DECREASE_FACTOR):
        self.cap = cap
        self.decrease = decrease  # the rate is multiplied by this on a throttling answer
        # Whether a pause between sends earns its whole length of climb: where the pauses are the pacing's
        # own (operations of many credits each, spaced by the bucket), not a sender waiting on something else.
        self.pauses_earn = pauses_earn
        self.recovery_seconds = recovery_seconds
        self.floor = floor
        self.rate: float | None = cap  # None: not limited
        self.reference: float | None = cap  # what the rate climbs back to
        self.last_throttled: float | None = None
        self.last_sent: float | None = None

    @property
    def step(self) -> float:
        """Messages a second added per second of sending: from the floor to the reference in recovery_seconds."""
        return max(0.1, ((self.reference or MIN_REFERENCE_RATE) - self.floor) / self.recovery_seconds)

    def throttled(self, now: float, measured_rate: float) -> bool:
        """A throttling answer; True when it lowered the rate (the first of a hold period)."""
        if self.last_throttled is not None and now - self.last_throttled < HOLD_SECONDS:
            return False
        self.last_throttled = now
        current = self.rate if self.rate is not None else max(measured_rate, MIN_REFERENCE_RATE, self.floor)
        if self.cap is None:
            self.reference = max(current, MIN_REFERENCE_RATE, self.reference or 0.0)
        self.rate = max(self.floor, current * self.decrease)
        return True

    def sent(self, now: float) -> None:
        """Sends went through: after the hold, climb by ``step`` per second of sending (a pause in the
        sends earns nothing beyond a second's step, unless ``pauses_earn``), up to the reference."""
        since, self.last_sent = self.last_sent, now
        if self.rate is None or self.reference is None:
            return
        if self.last_throttled is not None and now - self.last_throttled < HOLD_SECONDS:
            return
        if self.rate >= self.reference:
            # Already back at the reference: an uncapped controller is not limited any more. (A throttling
            # answer at a rate as low as the floor leaves the rate at its reference, with nothing left to climb:
            # without this it stayed limited to the floor for good.)
            if self.cap is None:
                self.rate = None
            return
        start = since if since is not None else now
        if self.last_throttled is not None:
            start = max(start, self.last_throttled + HOLD_SECONDS)
        elapsed = max(0.0, now - start)
        self.rate = min(self.reference, self.rate + self.step * (elapsed if self.pauses_earn else min(1.0, elapsed)))
        if self.rate >= self.reference and self.cap is None:
            self.rate = None  # recovered: an uncapped task is not limited any more

    @property
    def slowed(self) -> bool:
        """Below what it would send at without throttling."""
        return self.rate is not None and (self.cap is None or self.rate < self.cap)
