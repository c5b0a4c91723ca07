"""Waiting out the locks an earlier receiver left on recorded messages: pure timing, numbers in and out.
``purge.progress.PurgeProgress`` decides when a round waits; ``servicebus.purge`` peeks, receives and sleeps.

When a receive link is lost without a clean close (its process killed, its connection dropped), the service
keeps the messages it held locked until their locks end (docs/emulator.md). So after a run was killed while
its purge held a page, the next run's purge finds those recorded messages in the queue (a peek shows them)
but cannot receive them: a receive skips them, comes back empty, or brings later messages instead. Ending
the round there would leave them to a later run, and after a migration no later run may come. Each such
lock was taken before this round began and ends at most one lock duration after it was taken, so the round
waits for them: at most the queue's lock duration and a round trip from the moment it missed them, and
gives up only after that (someone alive holds them then).

The lock duration is the queue's own where the administration API said (``PurgePlan.lock_seconds``), else
the shortest lock this run's receives saw (``SettleTiming.lock_seconds``), else the service's longest
(``MAX_LOCK_SECONDS``): any lock has ended by then.

Invariants:
- the wait is bounded: it ends ``lock + round trip`` after the first miss, whatever the receives bring;
- a receive waits by itself (a long poll, answered as soon as a message is available); only when receives
  bring other messages at once (unrecorded ones, released and available again at once) does the round pause
  between them, a tenth of the lock, so it never receives and releases them in a tight loop.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LOCK_SECONDS = 300.0  # the service's longest lock (5 minutes): every lock has ended by then
POLL_SHARE_OF_LOCK = 0.1  # the pause between receives that bring only other messages, as a share of the lock
MIN_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class LockWait:
    """A round waiting for ``locked`` recorded messages that are in the queue but locked elsewhere."""

    locked: int  # recorded messages still there that no receive brought
    lock_seconds: float  # the lock waited out
    lock_known: bool  # the queue's (administration API) or one seen; else the service's longest
    bound_seconds: float  # the longest the round waits: the lock and a round trip
    until: float  # epoch seconds: when the wait ends

    @classmethod
    def start(cls, now: float, locked: int, *, queue_lock: float | None, seen_lock: float | None,
              round_trip: float | None) -> LockWait:
        lock = queue_lock if queue_lock else seen_lock
        bound = (lock or MAX_LOCK_SECONDS) + (round_trip or 0.0)
        return cls(locked, lock or MAX_LOCK_SECONDS, bool(lock), bound, now + bound)

    def over(self, now: float) -> bool:
        return now >= self.until

    def receive_wait(self, now: float) -> float:
        """How long the next receive may wait for a message: until the wait ends."""
        return max(0.0, self.until - now)

    def pause(self, now: float) -> float:
        """How long to pause before the next receive when the last one brought only other messages."""
        return min(self.receive_wait(now), max(MIN_POLL_SECONDS, POLL_SHARE_OF_LOCK * self.lock_seconds))
