"""Sending politely: how fast one send task may send to the primary namespace. Pure: no I/O, the clock
is passed in as plain numbers (seconds), so every rule is tested in milliseconds.

A drained primary is not an idle one: after a failover it takes live traffic again while the syphon
drains, and a Standard namespace has about 1,000 credits a second (a send, receive or peek costs one,
a management call ten). Two controls keep the syphon from taking them all:

- **A cap** (``sink.max_messages_per_second``): a ``TokenBucket`` per send task, filled at the task's
  *share* of the cap. The driver sets the share when it plans a send round (``cap_share``): the cap
  divided by how many send tasks can run at once, so the shares of the tasks running at any moment
  sum to at most the cap.
- **Backing off when the primary says it is busy** (``ServerBusy``, quota exceeded, throttled: the
  ``SendFailureClass.THROTTLED`` failures): a ``RateController`` in the AIMD style. A throttling answer
  halves the task's rate (once per ``HOLD_SECONDS``: the answers to one burst are one signal); sends
  that go through raise it again by a fixed step per second of sending, so that it takes
  ``sink.throttle_recovery_seconds`` to climb from the floor back to the reference rate: the cap's share,
  or, with no cap, the rate the task was sending at when it was throttled, after which it is not
  limited any more. It never exceeds the cap.

``Pacer`` puts them together for one task: how many messages the next send may carry, how long to
wait before it, what happened (``PaceEvent``), and what the progress line shows (``model.PacingStats``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from backlog_syphon.model import PacingStats

# A throttling answer counts once per this long: the sends of one burst are refused together, and
# halving once per refused send would take the rate to the floor in one burst.
HOLD_SECONDS = 1.0
DECREASE_FACTOR = 0.5
MIN_RATE = 1.0  # messages per second: throttled or not, a task keeps making progress
# The bucket holds at most this long's worth of messages, so no window of time sees more than
# its length times the rate plus this much (over 5 s, 5 % above the cap at most).
BURST_SECONDS = 0.25
RATE_WINDOW_SECONDS = 2.0  # the measured send rate is over the last this long
# With no cap, the smallest rate a throttled task climbs back to before it stops limiting itself.
MIN_REFERENCE_RATE = 10.0


def cap_share(max_messages_per_second: float, concurrent_tasks: int) -> float | None:
    """One send task's share of the cap: the cap over the tasks that can run at once (None: no cap)."""
    if max_messages_per_second <= 0:
        return None
    return max_messages_per_second / max(1, concurrent_tasks)


class PaceSignal(StrEnum):
    """What a send told the pacer."""

    SENT = "sent"  # messages went through
    THROTTLED = "throttled"  # the primary refused with ServerBusy, quota exceeded or throttled


@dataclass(frozen=True)
class PaceEvent:
    signal: PaceSignal
    at: float  # seconds (the task's clock)
    messages: int = 0  # SENT: how many went


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

    def empty(self, now: float) -> None:
        """Spend what is saved: after a throttling answer, nothing goes out in a burst."""
        if self.rate is not None:
            self._refill(now)
            self.tokens = min(self.tokens, 0.0)


class RateController:
    """AIMD: halve on throttling (at most once per ``HOLD_SECONDS``), add ``step`` a second while sends go
    through (not within ``HOLD_SECONDS`` of the last throttling answer), never above the cap."""

    def __init__(self, cap: float | None, recovery_seconds: float):
        self.cap = cap
        self.recovery_seconds = recovery_seconds
        self.rate: float | None = cap  # None: not limited
        self.reference: float | None = cap  # what the rate climbs back to
        self.last_throttled: float | None = None
        self.last_sent: float | None = None

    @property
    def step(self) -> float:
        """Messages a second added per second of sending: from the floor to the reference in recovery_seconds."""
        return max(0.1, ((self.reference or MIN_REFERENCE_RATE) - MIN_RATE) / self.recovery_seconds)

    def throttled(self, now: float, measured_rate: float) -> bool:
        """A throttling answer; True when it lowered the rate (the first of a hold period)."""
        if self.last_throttled is not None and now - self.last_throttled < HOLD_SECONDS:
            return False
        self.last_throttled = now
        current = self.rate if self.rate is not None else max(measured_rate, MIN_REFERENCE_RATE)
        if self.cap is None:
            self.reference = max(current, MIN_REFERENCE_RATE, self.reference or 0.0)
        self.rate = max(MIN_RATE, current * DECREASE_FACTOR)
        return True

    def sent(self, now: float) -> None:
        """Sends went through: after the hold, climb by ``step`` per second of sending (a pause in the
        sends earns nothing beyond a second's step), up to the reference."""
        since, self.last_sent = self.last_sent, now
        if self.rate is None or self.reference is None or self.rate >= self.reference:
            return
        if self.last_throttled is not None and now - self.last_throttled < HOLD_SECONDS:
            return
        start = since if since is not None else now
        if self.last_throttled is not None:
            start = max(start, self.last_throttled + HOLD_SECONDS)
        self.rate = min(self.reference, self.rate + self.step * min(1.0, max(0.0, now - start)))
        if self.rate >= self.reference and self.cap is None:
            self.rate = None  # recovered: an uncapped task is not limited any more

    @property
    def slowed(self) -> bool:
        """Below what it would send at without throttling."""
        return self.rate is not None and (self.cap is None or self.rate < self.cap)


class Pacer:
    """One send task's pacing: the bucket at the controller's rate, and what happened, for the progress line."""

    def __init__(self, cap: float | None, recovery_seconds: float, now: float):
        self.controller = RateController(cap, recovery_seconds)
        self.bucket = TokenBucket(cap, now)
        self.recent: deque[tuple[float, int]] = deque()  # (when, messages) of the last RATE_WINDOW_SECONDS
        self.sent_total = 0
        self.first_send: float | None = None
        self.last_send: float | None = None
        self.throttled_count = 0
        self.slowed_seconds = 0.0
        self._slowed_since: float | None = None

    def largest_send(self) -> int | None:
        return self.bucket.largest_send()

    def wait(self, messages: int, now: float) -> float:
        """Seconds to wait before sending ``messages`` (at most ``largest_send()``)."""
        return self.bucket.wait(messages, now)

    def sending(self, messages: int, now: float) -> None:
        """``messages`` are about to be sent: their tokens are spent whether they go through or not."""
        self.bucket.take(messages, now)
        if self.first_send is None:
            self.first_send = now

    def observe(self, event: PaceEvent) -> None:
        if event.signal is PaceSignal.SENT:
            self._sent(event.messages, event.at)
        else:
            self._throttled(event.at)
        self._track_slowed(event.at)

    def measured_rate(self, now: float) -> float:
        while self.recent and self.recent[0][0] < now - RATE_WINDOW_SECONDS:
            self.recent.popleft()
        return sum(n for _, n in self.recent) / RATE_WINDOW_SECONDS

    def _sent(self, messages: int, now: float) -> None:
        if messages <= 0:
            return
        self.sent_total += messages
        self.last_send = now
        self.recent.append((now, messages))
        before = self.controller.rate
        self.controller.sent(now)
        if self.controller.rate != before:
            self.bucket.set_rate(self.controller.rate, now)

    def _throttled(self, now: float) -> None:
        self.throttled_count += 1
        if self.controller.throttled(now, self.measured_rate(now)):
            self.bucket.set_rate(self.controller.rate, now)
        self.bucket.empty(now)

    def _track_slowed(self, now: float) -> None:
        if self.controller.slowed and self._slowed_since is None and self.throttled_count:
            self._slowed_since = now
        elif not self.controller.slowed and self._slowed_since is not None:
            self.slowed_seconds += now - self._slowed_since
            self._slowed_since = None

    def stats(self, now: float) -> PacingStats:
        slowed = self.slowed_seconds + (now - self._slowed_since if self._slowed_since is not None else 0.0)
        return PacingStats(sent=self.sent_total, first_send_at=self.first_send, last_send_at=self.last_send,
                           throttled=self.throttled_count, slowed_seconds=round(slowed, 3),
                           rate_limit=self.controller.rate, cap=self.controller.cap, tasks=1)
