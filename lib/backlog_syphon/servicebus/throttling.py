"""Operating on a namespace within its credits: each process paces its reads and settlements on a namespace
with one ``credits.CreditPacer`` (its share of ``<namespace>.max_credits_per_second``, AIMD on server-busy),
rides out busy answers, and gives up only past ``sink.outage_wait_seconds``.

A Standard namespace out of credits answers ``com.microsoft:server-busy`` to everything (the administration
API: HTTP 503): peeks, receives, settlements as much as sends. For a drain that is the normal state, not an
outage, so a busy answer is a signal to slow down, never a failed read, batch or run: ``paced`` waits for
the pacer, runs the operation, counts its credits, and on a busy answer lowers the rate and asks again after
a pause, until the namespace has been busy for longer than the outage bound (``NamespaceThrottledError``: one
line naming the namespace, what this process spent there, and what to change). The SDK's own retries of busy
answers are off for the links this paces (``sdk_internals.busy_answers_raise``): the pacer sees every one.

One pacer per namespace and process, shared by its threads (the purge's queues, the probes, a partitioned
queue's lanes): ``pace`` sets its terms where the process knows them (the driver at a run's start, the
source's planner, a window's read with the window's share); a process that never set them paces without a
budget. Shares across processes are fixed fractions of the budget (``credits.SHARES``): each process's
bucket holds its own, so together they stay within it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, TypeVar

from azure.core.exceptions import HttpResponseError
from azure.servicebus.exceptions import ServiceBusServerBusyError

from backlog_syphon.config import NamespaceConfig, PrimaryConfig, SyphonConfig
from backlog_syphon.credits import SHARES, CreditPacer, CreditTerms
from backlog_syphon.errors import SyphonError
from backlog_syphon.model import CreditKind, NamespaceRole

logger = logging.getLogger(__name__)

T = TypeVar("T")

_LOCK = threading.Lock()
_PACERS: dict[str, CreditPacer] = {}  # by the namespace's endpoint


class NamespaceThrottledError(SyphonError):
    """A namespace answered every operation busy for longer than ``sink.outage_wait_seconds``: it is too small
    for this load (its credits) or shared with clients that take them all."""


def role_of(namespace: NamespaceConfig) -> NamespaceRole:
    return NamespaceRole.PRIMARY if isinstance(namespace, PrimaryConfig) else NamespaceRole.SECONDARY


def pace(namespace: NamespaceConfig, terms: CreditTerms, *, clock: Callable[[], float] = time.monotonic) -> CreditPacer:
    """This process's pacer for ``namespace``, under ``terms`` from now on."""
    with _LOCK:
        pacer = _PACERS.get(namespace.endpoint)
        if pacer is None:
            pacer = _PACERS[namespace.endpoint] = CreditPacer(terms, clock())
        else:
            pacer.retune(terms, clock())
        return pacer


def pace_driver(config: SyphonConfig) -> None:
    """The driver's terms: its share of the secondary's budget (the purge, the pre-flight, the counts); on the
    primary it only reads the administration API now and then (its sends are the executors', capped by
    ``sink.pacing.send_cap``), which it paces on busy answers only."""
    sink = config.sink
    pace(config.secondary, CreditTerms(SHARES.of(config.secondary.max_credits_per_second, SHARES.driver),
                                       sink.outage_wait_seconds, sink.throttle_recovery_seconds))
    pace(config.primary, CreditTerms(None, sink.outage_wait_seconds, sink.throttle_recovery_seconds))


def pacer_of(namespace: NamespaceConfig, *, clock: Callable[[], float] = time.monotonic) -> CreditPacer:
    """This process's pacer for ``namespace`` (without a budget, if nothing set its terms yet)."""
    with _LOCK:
        pacer = _PACERS.get(namespace.endpoint)
        if pacer is None:
            pacer = _PACERS[namespace.endpoint] = CreditPacer(CreditTerms(), clock())
        return pacer


def spent(namespace: NamespaceConfig) -> dict[CreditKind, int]:
    """What this process spent on ``namespace``, per kind of operation."""
    with _LOCK:
        pacer = _PACERS.get(namespace.endpoint)
        return dict(pacer.spent) if pacer is not None else {}


def is_busy(exc: BaseException) -> bool:
    """Whether the namespace answered busy: ``com.microsoft:server-busy``, or the administration API's 503."""
    return isinstance(exc, ServiceBusServerBusyError) or (
        isinstance(exc, HttpResponseError) and getattr(exc, "status_code", None) == 503)


def count(namespace: NamespaceConfig, kind: CreditKind, credits: int) -> None:
    """Credits spent by an operation that is not paced (it cannot wait, or it is best effort)."""
    pacer = pacer_of(namespace)
    with _LOCK:
        pacer.count(kind, credits)


def pause_of(namespace: NamespaceConfig, *, clock: Callable[[], float] = time.monotonic) -> float:
    """Seconds until an operation the namespace just throttled is asked again (the pacer's current pause)."""
    pacer = pacer_of(namespace, clock=clock)
    with _LOCK:
        return pacer.retry_after(clock())


def await_credits(namespace: NamespaceConfig, *, reserve: int = 0, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait until this process's share of the namespace's credits allows an operation, and take ``reserve``
    credits for it (what it may cost at most: see ``CreditPacer.reserve``). Called by the caller before an
    operation it times (the purge's receive), so that its time is the service's, not the pacing's."""
    pacer = pacer_of(namespace, clock=clock)
    while True:
        with _LOCK:
            now = clock()
            wait = pacer.wait(now)
            if wait <= 0:
                pacer.reserve(reserve, now)
                return
        sleep(wait)


def paced(namespace: NamespaceConfig, kind: CreditKind, operation: Callable[[], T], *,
          cost: Callable[[T], int] = lambda result: 1, retry: bool = True, wait: bool = True, reserve: int = 0,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> T:
    """``operation()`` within this process's share of the namespace's credits, its ``cost(result)`` counted.
    ``reserve``: what it may cost at most (a page), taken before it goes and settled against its cost after.
    A busy answer lowers the rate and, with ``retry``, is asked again after a pause (else it is raised, for
    the caller to end what it does); past the outage bound it raises ``NamespaceThrottledError``. Without
    ``wait`` the operation goes at once (``reserve``: what the caller's ``await_credits`` took for it) and
    what it costs beyond is paid by the next one's wait: a settlement whose locks are running out, after the
    receive that waited for both."""
    pacer = pacer_of(namespace, clock=clock)
    while True:
        if wait:
            await_credits(namespace, reserve=reserve, clock=clock, sleep=sleep)
        try:
            result = operation()
        except Exception as exc:  # noqa: BLE001 - only busy answers are this function's; the rest is raised
            with _LOCK:
                pacer.unreserve(reserve, clock())
            if not wait:
                reserve = 0  # the caller's reservation is given back; a retry reserves nothing
            if not is_busy(exc):
                raise
            with _LOCK:
                now = clock()
                delay = pacer.throttled(now)
                busy_for, given_up = pacer.busy_for(now), pacer.given_up(now)
            if given_up:
                raise NamespaceThrottledError(throttled_line(namespace, pacer, busy_for)) from None
            if not retry:
                raise
            logger.info("the %s namespace is throttling (%s busy for %.1f s): %s asked again in %.1f s at %s "
                        "credits a second", role_of(namespace), namespace.endpoint, busy_for, kind, delay,
                        "no limit" if pacer.controller.rate is None else f"{pacer.controller.rate:.0f}")
            sleep(delay)
            continue
        with _LOCK:
            pacer.spend(kind, cost(result), clock(), reserved=reserve)
        return result


ADMINISTRATION_CREDITS = 10  # an administration read (a queue, or a page of 100 of a list) costs ten
LIST_PAGE = 100  # entities per page of the administration API's lists


def administration(namespace: NamespaceConfig, read: Callable[[], T], *, requests: Callable[[T], int] = lambda _: 1) -> T:
    """A best-effort administration read (the caller falls back on any failure): ten credits per request it
    made (``requests(result)``); a 503 is a busy answer that lowers the rate, then raised to the caller."""
    return paced(namespace, CreditKind.ADMINISTRATION, read, retry=False,
                 cost=lambda result: ADMINISTRATION_CREDITS * max(1, requests(result)))


def list_pages(items) -> int:
    """The requests a listing of ``items`` took (a page of 100 each)."""
    return -(-len(items) // LIST_PAGE)


def throttled_line(namespace: NamespaceConfig, pacer: CreditPacer, busy_for: float) -> str:
    """One line: which namespace, for how long, what this process spent there, and what to change."""
    role = role_of(namespace)
    budget = namespace.max_credits_per_second
    return (f"the {role} namespace {namespace.endpoint} answered every request busy (com.microsoft:server-busy: "
            f"its credits are spent) for {busy_for:.0f} s, longer than sink.outage_wait_seconds "
            f"({pacer.terms.outage_seconds:g} s); this process spent {pacer.total} credits there. Set "
            f"{role}.max_credits_per_second ({f'now {budget:g}' if budget else 'not set'}) to what the namespace's "
            f"other clients leave of its 1,000 a second, or move it to Premium, which has no credit budget")
