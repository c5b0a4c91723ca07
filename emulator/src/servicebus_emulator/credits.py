"""A namespace's credits, as Basic and Standard namespaces throttle: 1,000 credits a second, given at the
start of each second; an operation spends its cost; once the credits of a second are spent, further
operations are throttled (answered ``com.microsoft:server-busy``) until the next second
(docs/emulator.md cites the sources). No I/O: the clock is passed in (seconds, monotonic).

What each operation costs (``CreditKind``): a send, a receive and a peek one credit per message; a
topic send one more per filter it evaluates; a management operation on an entity (the administration
API: read, list) ten. Settlements (complete, abandon, dead-letter, defer, on the link or through
``$management``) and lock renewals are not in the service's table, but the service team says every
operation can be throttled: here they cost one credit per lock token, an assumption.

Invariants:
- an operation is admitted while any credit of the current second is left, and spends its whole cost
  then, so one large operation (a peek of 250 messages) can take the balance below zero: the shortfall is
  taken from the next seconds' credits, so that over any few seconds the namespace spends at most its
  budget (credits left at the end of a second are not kept);
- an operation refused for throttling spends nothing;
- a budget of 0 is none: everything is admitted, and what is spent is still counted.
"""
from __future__ import annotations

import math
from collections import Counter
from enum import Enum
from typing import Any, Dict


class CreditKind(str, Enum):
    SEND = "send"
    FILTER = "filter"               # a topic send's filter evaluations
    RECEIVE = "receive"
    PEEK = "peek"
    SETTLE = "settle"               # complete, abandon, dead-letter, defer: on the link or update-disposition
    RENEW_LOCK = "renew_lock"
    MANAGEMENT = "management"       # the other $management requests (schedule, sessions, deferred messages)
    ADMINISTRATION = "administration"   # the administration API's reads of entities


class Credits:
    """One namespace's credit budget: ``admit`` before an operation, ``spend`` its cost once it is done."""

    def __init__(self, per_second: float):
        self.per_second = per_second
        self.balance = per_second
        self.second = None                   # the second the balance belongs to (floor of the clock)
        self.spent: Counter = Counter()      # CreditKind value -> credits spent
        self.throttled: Counter = Counter()  # CreditKind value -> operations refused

    @property
    def on(self) -> bool:
        return self.per_second > 0

    def _refill(self, now: float) -> None:
        second = math.floor(now)
        if self.second is None:
            self.second = second
        elif second > self.second:
            # each new second gives the budget again; a shortfall is paid back first, a surplus is not kept
            self.balance = min(self.per_second, self.balance + self.per_second * (second - self.second))
            self.second = second

    def admit(self, kind: CreditKind, now: float) -> bool:
        """Whether an operation of ``kind`` may run now (False: throttled, counted)."""
        if not self.on:
            return True
        self._refill(now)
        if self.balance > 0:
            return True
        self.throttled[kind.value] += 1
        return False

    def spend(self, kind: CreditKind, cost: int, now: float) -> None:
        if cost <= 0:
            return
        self.spent[kind.value] += cost
        if self.on:
            self._refill(now)
            self.balance -= cost

    def exhausted(self, now: float) -> bool:
        """Whether an operation would be throttled now."""
        if not self.on:
            return False
        self._refill(now)
        return self.balance <= 0

    def stats(self) -> Dict[str, Any]:
        return {"credits_per_second": self.per_second, "spent": dict(self.spent),
                "spent_total": sum(self.spent.values()), "throttled": dict(self.throttled),
                "throttled_total": sum(self.throttled.values())}
