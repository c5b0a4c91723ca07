"""How much settling fits inside a lock: the purge's timing, from the lock and the measured round trips.
Pure: numbers in, numbers out. ``servicebus.purge`` measures; ``purge.progress.PurgeProgress`` sizes its pages with it.

A received message's lock starts when the broker sends it, and a settle request (one bulk completion, one
bulk dead-lettering per distinct reason) counts only if it reaches the broker before that lock ends. A
request reaches the broker at most a round trip after it leaves here, and a page is settled by requests
one after the other, from the moment it arrived. So, for a page whose first lock ends at ``E``:
- a request may leave only before ``E - margin``: one round trip, and a safety share of the lock
  (``SAFETY_SHARE_OF_LOCK``) for what the measurements did not see (a slower request, the difference
  between the broker's clock, which ``E`` is in, and this host's);
- a page holds no more messages than the requests that fit between its arrival and that deadline can
  settle (``requests_per_page``; ``page_size`` turns requests into messages);
- messages *passed over* (``purge.plan``'s docstring) stay locked while the round goes on, and must be
  released before their own locks end: the next page is asked for only while its receive, its requests
  and then the releases fit before the first of those locks ends less the margin
  (``receive_wait_while_passing``).

Invariants:
- No fixed seconds: every figure follows the lock and the round trip, so a lock of 5 seconds (the
  service's minimum) at a round trip of 300 ms settles, and a lock of 5 minutes wastes nothing.
- The estimates err on the long side: the round trip and the receive's duration are the slowest of the
  last few measured (``RECENT``), the lock the shortest seen. Before any request is measured, the receive
  call's own duration (which holds a round trip) stands in for a round trip (the purge times a peek first:
  ``requests_measured``).
- A page that came back short is completed by further receives only while its requests, one after the other,
  still leave before its deadline (``receive_wait_for_rest``).
- Where not even one request fits, ``requests_per_page`` is 0: the caller settles nothing (a request would
  come too late and only raise delivery counts), says which setting to change, and ``forget``s the round
  trips measured, so a slow moment does not keep every later round from trying.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

SAFETY_SHARE_OF_LOCK = 0.1  # of a lock, kept free before it ends (0.5 s of 5 s, 6 s of the default 60 s)
RECENT = 8  # measurements an estimate looks back over


@dataclass
class SettleTiming:
    """What one backlog queue's purge measured: its locks as seen from here, its receives and its requests.
    Kept across purge rounds (``sink.purge_runner``), so every round sizes its first page from the last."""

    lock_seconds: float | None = None  # from a receive call's start to its page's first lock end, shortest seen
    _receives: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    _requests: deque = field(default_factory=lambda: deque(maxlen=RECENT))

    def observed_page(self, receive_seconds: float, lock_seconds: float | None) -> None:
        """A receive call took ``receive_seconds`` and brought messages whose first lock ended ``lock_seconds``
        after the call started (None: the broker did not say)."""
        self._receives.append(max(0.0, receive_seconds))
        if lock_seconds is not None:
            self.lock_seconds = lock_seconds if self.lock_seconds is None else min(self.lock_seconds, lock_seconds)

    def observed_request(self, seconds: float) -> None:
        """A settle request was answered ``seconds`` after it left."""
        self._requests.append(max(0.0, seconds))

    @property
    def requests_measured(self) -> bool:
        """Whether a request's round trip was measured (else ``round_trip`` is a receive call's duration, which
        holds whatever the broker waited before it answered)."""
        return bool(self._requests)

    def forget(self) -> None:
        """Drop the round trips and receives measured (not the lock): a round that could settle nothing with
        them starts the next one afresh, rather than every later round trusting a slow moment."""
        self._receives.clear()
        self._requests.clear()

    @property
    def receive_seconds(self) -> float | None:
        return max(self._receives) if self._receives else None

    @property
    def round_trip(self) -> float | None:
        """The slowest recent request; before any, the slowest recent receive call (which holds a round trip)."""
        if self._requests:
            return max(self._requests)
        return self.receive_seconds

    def margin(self, lock_seconds: float | None = None) -> float:
        """How long before a lock ends the last request for it may leave: a round trip and a safety share."""
        lock = lock_seconds if lock_seconds is not None else (self.lock_seconds or 0.0)
        return (self.round_trip or 0.0) + SAFETY_SHARE_OF_LOCK * lock

    def deadline(self, first_lock_end: float) -> float:
        """When the last request for a page whose first lock ends at ``first_lock_end`` may leave (same clock)."""
        return first_lock_end - self.margin()

    def requests_per_page(self) -> int | None:
        """Requests, one after the other, that fit between a page's arrival and its deadline; None before a
        page was seen (nothing is known: the first page is a full one, and the deadline still holds)."""
        round_trip = self.round_trip
        if self.lock_seconds is None or not round_trip:
            return None
        room = self.lock_seconds - self.margin() - (self.receive_seconds or 0.0)
        return 0 if room < 0 else int(room / round_trip) + 1

    def receive_wait_for_rest(self, lock_left: float, requests: int) -> float | None:
        """How long a receive for the rest of a page that came back short may wait, the page's first lock ending
        ``lock_left`` seconds from now and its settling needing ``requests`` requests, one after the other, the first
        as soon as that receive returns, the last before the deadline; None: no time, settle what came."""
        round_trip = self.round_trip or 0.0
        wait = lock_left - self.margin() - (requests - 1) * round_trip
        return wait if wait >= max(round_trip, 0.2) else None

    def receive_wait_while_passing(self, lock_left: float, requests: int) -> float | None:
        """How long the next receive may wait while messages passed over stay locked for ``lock_left`` more
        seconds, the next page needing ``requests`` requests and then the releases; None: no time for another
        page (the round ends and releases them)."""
        round_trip = self.round_trip or 0.0
        wait = lock_left - self.margin() - requests * round_trip
        # A receive needs its round trip; the SDK then waits a moment for more (its 0.2 s pull).
        return wait if wait >= max(round_trip, 0.2) else None


def page_size(requests: int | None, *, max_page: int, remaining: int, dead_letters: int, reasons: int) -> int:
    """Messages the next page may hold so that settling it needs at most ``requests`` requests: one bulk
    completion, and one per distinct dead-letter reason among its messages.

    ``remaining``: recorded messages still to settle, of which ``dead_letters`` are to be dead-lettered with
    ``reasons`` distinct reasons. When every reason fits, a full page; otherwise as many messages as hold,
    at their share of what is left, the dead-letters the requests can settle (at least one message)."""
    if requests is None:
        return max_page
    if requests < 1:
        return 0
    if dead_letters <= 0 or reasons + 1 <= requests:
        return max_page
    share = dead_letters / max(remaining, dead_letters)
    return max(1, min(max_page, int((requests - 1) / share)))
