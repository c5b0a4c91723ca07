"""Spending a namespace's credits politely: how fast one process may operate on a namespace, what it does
when the namespace says it is busy, and when it gives up. Pure: the clock is passed in (seconds).

A Basic or Standard namespace has 1,000 credits a second, shared by every client: a peek, a receive and a
send cost one per message, an administration read ten, and every operation may be throttled once they are
spent (``com.microsoft:server-busy``, the SDK's ``ServiceBusServerBusyError``): peeks, receives and
settlements as much as sends. On a namespace other applications share, their traffic spends the same
credits. So every process that operates on a namespace paces itself with a ``CreditPacer``:

- **a budget** (``<namespace>.max_credits_per_second``, 0: none): each process paces its operations with a
  token bucket at its *share* of it (``CreditShares``), so that the shares of all processes sum to at most
  the budget: the driver (the purge, the pre-flight, the counts), the source's planner (its probes), and the
  executors' window reads, a share split among the batch's windows read at once;
- **AIMD on server-busy** (``rate_control.RateController``): a throttled answer lowers the process's rate by
  a quarter (from its share, or, without a budget, from the rate it was spending at) and its operation is
  asked again after a pause (``retry_after``); operations that go through raise the rate again over
  ``sink.throttle_recovery_seconds``; without a budget the process then stops limiting itself;
- **an end**: a namespace that throttled every operation for longer than ``sink.outage_wait_seconds``
  is not a busy moment but a namespace too small for its load: the pacer says so (``given_up``), and the
  caller ends with one line naming the namespace, what this process spent there and what to change.

It also counts what the process spent, per kind of operation (``model.CreditKind``): the run's summary,
the runs table and ``--status`` show what a drain costs.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from backlog_syphon.model import CreditKind
from backlog_syphon.rate_control import RateController, TokenBucket

# Without a budget, a throttled process never goes below this many credits a second: a page of a peek costs
# up to 250, and it has to go some time.
FLOOR_CREDITS_PER_SECOND = 10.0
RATE_WINDOW_SECONDS = 2.0  # the measured spending is over the last this long
# A busy answer lowers the rate by a quarter, not a half as a send task's does: a refused operation spends no
# credits, so going a little over costs a pause, while every halving leaves a quarter of the budget unspent
# on average (AIMD's saw-tooth between half the budget and all of it averages 75 %, this one 88 %).
DECREASE_FACTOR = 0.75
# A throttled operation is asked again after this long, doubling while the answers stay busy (the service
# asks for 2 seconds; .NET clients wait 10), up to MAX_RETRY_SECONDS. The answers of one moment (the
# threads that were all refused in the same second) wait for the same retry: only an answer that comes
# after the pause has ended doubles it.
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 8.0
SHORTEST_PAUSE_SECONDS = 0.1


@dataclass(frozen=True)
class CreditShares:
    """How a namespace's budget is shared among the processes that spend it, by what each spends per moved
    message: a window read peeks it once (1 credit), the purge receives it and settles it (2 credits), and
    the planner probes a few times per queue and batch (about 0.1 credit a moved message in batches of
    1,000). Their shares sum to the whole budget; the drain can move at most min(driver / 2, reads) of it
    a second, 95 % of the budget's third (its credits per message allow a third)."""

    driver: float = 0.63
    planner: float = 0.05
    reads: float = 0.32

    def of(self, budget: float, share: float, parts: int = 1) -> float | None:
        """A process's credits a second: its ``share`` of ``budget`` among ``parts`` processes alike
        (None: no budget)."""
        return None if budget <= 0 else budget * share / max(1, parts)


SHARES = CreditShares()


@dataclass(frozen=True)
class CreditTerms:
    """How one process paces its operations on one namespace."""

    credits_per_second: float | None = None  # its share of the budget (None: none, AIMD on server-busy only)
    outage_seconds: float = 600.0  # throttled for longer than this: give up (sink.outage_wait_seconds)
    recovery_seconds: float = 30.0  # from the floor back to the share (sink.throttle_recovery_seconds)


class CreditPacer:
    """One process's pacing of its operations on one namespace (see the module docstring)."""

    def __init__(self, terms: CreditTerms, now: float):
        self.terms = terms
        # The pauses between operations are the bucket's own (a page of 250 credits spaces the next one), so
        # they count towards the climb back after a busy answer.
        self.controller = RateController(terms.credits_per_second, terms.recovery_seconds,
                                         floor=FLOOR_CREDITS_PER_SECOND, pauses_earn=True, decrease=DECREASE_FACTOR)
        self.bucket = TokenBucket(terms.credits_per_second, now)
        self.spent: Counter = Counter()  # CreditKind -> credits spent by this process
        self.recent: deque[tuple[float, int]] = deque()  # (when, credits) of the last RATE_WINDOW_SECONDS
        self.throttled_count = 0
        self.busy_since: float | None = None  # the first busy answer of the current run of them
        self.busy_answers = 0  # pauses in a row that ended in another busy answer
        self.retry_at: float | None = None  # when the current pause ends

    def retune(self, terms: CreditTerms, now: float) -> None:
        """New terms (another share of the budget): the rate starts from the new share, what was learned
        about throttling stays."""
        if terms == self.terms:
            return
        self.terms = terms
        self.controller.cap = self.controller.reference = terms.credits_per_second
        self.controller.recovery_seconds = terms.recovery_seconds
        if self.controller.last_throttled is None or terms.credits_per_second is None:
            self.controller.rate = terms.credits_per_second
        elif self.controller.rate is not None:
            self.controller.rate = min(self.controller.rate, terms.credits_per_second)
        else:
            self.controller.rate = terms.credits_per_second
        self.bucket.set_rate(self.controller.rate, now)

    def wait(self, now: float) -> float:
        """Seconds before the next operation may go (0: now). An operation's cost is known only once it is
        done (a peek's page), so it goes as soon as the bucket is not in debt, and its cost is taken after."""
        return self.bucket.wait(1, now)

    def reserve(self, credits: int, now: float) -> None:
        """Take what an operation about to go may cost at most (its page), so that the threads that found the
        bucket not in debt at the same moment do not all go: the next one waits for this one's credits."""
        if credits > 0:
            self.bucket.take(credits, now)

    def unreserve(self, credits: int, now: float) -> None:
        """What was reserved for an operation that did not happen (refused, failed)."""
        if credits > 0:
            self.bucket.give_back(credits, now)

    def spend(self, kind: CreditKind, credits: int, now: float, *, reserved: int = 0) -> None:
        """An operation went through and cost ``credits`` (``reserved`` of them were taken before it)."""
        self.busy_since, self.busy_answers, self.retry_at = None, 0, None
        if credits > reserved:
            self.bucket.take(credits - reserved, now)
        elif reserved > credits:
            self.bucket.give_back(reserved - credits, now)
        if credits <= 0:
            return
        self.spent[kind] += credits
        self.recent.append((now, credits))
        before = self.controller.rate
        self.controller.sent(now)
        if self.controller.rate != before:
            self.bucket.set_rate(self.controller.rate, now)

    def count(self, kind: CreditKind, credits: int) -> None:
        """Credits spent without pacing (an operation that cannot wait: a release, a best-effort read)."""
        if credits > 0:
            self.spent[kind] += credits

    def throttled(self, now: float) -> float:
        """The namespace answered server-busy: lower the rate (at most once a hold period) and return how
        long to wait before asking again."""
        self.throttled_count += 1
        if self.busy_since is None:
            self.busy_since = now
        if self.retry_at is None or now >= self.retry_at - SHORTEST_PAUSE_SECONDS:  # not within the last pause
            self.busy_answers += 1
            self.retry_at = now + min(MAX_RETRY_SECONDS, FIRST_RETRY_SECONDS * 2 ** (self.busy_answers - 1))
        if self.controller.throttled(now, self.measured_rate(now)):
            self.bucket.set_rate(self.controller.rate, now)
        self.bucket.empty(now)
        return self.retry_after(now)

    def retry_after(self, now: float) -> float:
        """Seconds until a throttled operation is asked again: the end of the current pause."""
        if self.retry_at is None:
            return FIRST_RETRY_SECONDS
        return max(SHORTEST_PAUSE_SECONDS, self.retry_at - now)

    def given_up(self, now: float) -> bool:
        """Whether the namespace has answered busy to everything for longer than the outage bound."""
        return self.busy_since is not None and now - self.busy_since > self.terms.outage_seconds

    def busy_for(self, now: float) -> float:
        return 0.0 if self.busy_since is None else now - self.busy_since

    def measured_rate(self, now: float) -> float:
        while self.recent and self.recent[0][0] < now - RATE_WINDOW_SECONDS:
            self.recent.popleft()
        return sum(credits for _, credits in self.recent) / RATE_WINDOW_SECONDS

    @property
    def total(self) -> int:
        return sum(self.spent.values())
