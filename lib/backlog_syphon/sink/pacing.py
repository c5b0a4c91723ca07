"""Sending politely: how fast one send task may send to the primary namespace. Pure: no I/O, the clock
is passed in as plain numbers (seconds), so every rule is tested in milliseconds.

A drained primary is not an idle one: after a failover it takes live traffic again while the syphon
drains, and a Standard namespace has about 1,000 credits a second (a send, receive or peek costs one,
a management call ten). Two controls keep the syphon from taking them all:

- **A cap** (``sink.max_messages_per_second``, and ``primary.max_credits_per_second``: ``send_cap``): a
  ``TokenBucket`` per send task, filled at the task's
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

``TokenBucket`` and ``RateController`` are ``rate_control``'s (every process's credit pacing uses them too).
``Pacer`` puts them together for one task: how many messages the next send may carry, how long to
wait before it, what happened (``PaceEvent``), and what the progress line shows (``model.PacingStats``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import PacingStats
from backlog_syphon.rate_control import RateController, TokenBucket

RATE_WINDOW_SECONDS = 2.0  # the measured send rate is over the last this long


def send_cap(config: SyphonConfig) -> float:
    """Messages a second the sends may carry over all tasks (0: no cap): ``sink.max_messages_per_second``, and
    no more than ``primary.max_credits_per_second`` (a message sent costs the primary one credit; a topic's
    filters one more each, which the syphon does not see: leave room for them)."""
    caps = [cap for cap in (config.sink.max_messages_per_second, config.primary.max_credits_per_second) if cap > 0]
    return min(caps) if caps else 0.0


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
