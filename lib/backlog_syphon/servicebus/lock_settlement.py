"""Settling received messages within their locks: a page's lock end, its latest deliveries, and a settlement of
many lock tokens in bulk requests (``purge.bulk_settlement`` splits what the service refuses), paced by the
secondary's credits; what is left when the locks run out is given back. I/O: the receivers are the caller's."""

from __future__ import annotations

import datetime as dt
import logging
import time

from azure.servicebus.exceptions import MessageLockLostError, ServiceBusError, ServiceBusServerBusyError

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.model import CreditKind
from backlog_syphon.partitions import partition_of
from backlog_syphon.servicebus.clients import namespace_of
from backlog_syphon.servicebus.peek import peek_identities
from backlog_syphon.purge.bulk_settlement import BulkSettlement
from backlog_syphon.purge.progress import latest_of_each
from backlog_syphon.servicebus.sdk_internals import complete_by_lock_tokens, dead_letter_by_lock_tokens, release_message
from backlog_syphon.purge.settle_timing import SettleTiming
from backlog_syphon.servicebus.throttling import pause_of, paced

logger = logging.getLogger(__name__)

UNKNOWN_LOCK_SECONDS = 60.0  # the service's default lock, for a page whose messages carry no locked-until
DESCRIPTION_LIMIT = 1024  # characters of a reason kept as the DeadLetterErrorDescription


def give_back(receiver, messages: list) -> None:
    """Release received messages this round could not settle in time (a no-op for a lock already gone)."""
    for message in messages:
        try:
            release_message(receiver, message)
        except Exception:  # noqa: BLE001 - its lock is gone already, or the link: nothing to give back
            logger.debug("releasing an unsettled message failed", exc_info=True)


def latest_deliveries(receiver, queue: str, page: list) -> list:
    """``page`` with each message once, its latest delivery (``purge.progress.latest_of_each``); the earlier
    ones are given back (a no-op for a lock already gone)."""
    keep, stale = latest_of_each([message.sequence_number for message in page])
    if not stale:
        return page
    logger.info("backlog=%s received %d message(s) twice in one page (sequence numbers %s): only the latest "
                "delivery of each is settled", queue, len(stale), sorted({page[i].sequence_number for i in stale})[:10])
    for position in stale:
        try:
            release_message(receiver, page[position])
        except Exception:  # noqa: BLE001 - its lock is gone already: nothing to give back
            logger.debug("releasing an earlier delivery failed", exc_info=True)
    return [page[position] for position in keep]


def first_lock_end(messages: list) -> float | None:
    """When the first of these received messages' locks ends (epoch seconds), if the broker said."""
    ends = [m.locked_until_utc for m in messages if getattr(m, "locked_until_utc", None) is not None]
    if not ends:
        return None
    return min(end if end.tzinfo else end.replace(tzinfo=dt.timezone.utc) for end in ends).timestamp()


def lock_end_of(messages: list, received_at: float | None = None) -> float:
    """``first_lock_end``, or, where the broker did not say, the service's default lock from ``received_at``
    (or now)."""
    end = first_lock_end(messages)
    return end if end is not None else (received_at or time.time()) + UNKNOWN_LOCK_SECONDS


class LocksLostError(RuntimeError):
    """Every lock a page held was refused: the link that took them lost them all. The round ends and the
    link is closed (a fresh one next time); the next round receives those messages again."""


def settle_all(receiver, messages: list, deadline: float, timing: SettleTiming, dead_letter: tuple[str, str] | None,
               *, lane: bool = False, clock=time.time, sleep=time.sleep) -> BulkSettlement:
    """Complete received messages (``dead_letter`` None), or dead-letter them with one (reason code, reason),
    with one management request per partition instead of one round trip each; a request refused for a lost
    lock is looked at (a peek of its range: ``lane``, one partition's) and split where that says nothing went,
    a busy answer is asked again after the pacer's pause while the deadline allows, and nothing is sent after
    ``deadline`` (``purge.bulk_settlement.BulkSettlement``). Each request is timed into ``timing``. Returns the
    settlement: what was settled, and what was not (a lost lock; the deadline, a broken link or every lock
    gone: ``left``, for the caller to release)."""
    by_seq = {message.sequence_number: message for message in messages}
    settlement = BulkSettlement(sorted(by_seq), deadline, partition=partition_of)
    namespace = namespace_of(receiver)
    what = "completion" if dead_letter is None else "dead-lettering"
    requests = 0
    while (request := settlement.next_request(clock())) is not None:
        requests += 1
        tokens = [by_seq[seq].lock_token for seq in request]
        began = time.monotonic()
        try:
            _settle(namespace, receiver, tokens, dead_letter)
        except MessageLockLostError:
            timing.observed_request(time.monotonic() - began)
            present = None
            if settlement.needs_look(request):
                present = {seq for seq, _ in peek_identities(receiver, request[0], request[-1], lane=lane)}
            logger.info("bulk %s of %d message(s) refused for a lost lock: %s", what, len(request),
                        "split and tried again" if present is None or set(request) <= present else
                        f"{len(set(request) - present)} of them were settled, the rest lost their lock")
            settlement.lock_lost(request, present=present)
        except ServiceBusServerBusyError:
            pause = pause_of(namespace) if namespace is not None else None
            if pause is None or clock() + pause >= settlement.deadline:
                logger.info("bulk %s of %d message(s) throttled (server-busy) too close to the locks' end: released, "
                            "received again by a later round", what, len(request))
                settlement.stop()
            else:
                sleep(pause)  # the same request goes again
        except ServiceBusError as exc:
            logger.info("bulk %s of %d message(s) failed (%s); the rest is received again by the next round", what,
                        len(request), type(exc).__name__)
            settlement.stop()
        else:
            timing.observed_request(time.monotonic() - began)
            settlement.succeeded(request)
    if settlement.unsettled:
        logger.info("%d of %d message(s) not settled by %s (lock lost %d, not tried before their locks end, after a "
                    "failure or once every lock seemed gone %d) in %d request(s)", len(settlement.unsettled),
                    len(messages), what, len(settlement.lost), len(settlement.left), requests)
    return settlement


def _settle(namespace: NamespaceConfig | None, receiver, tokens: list, dead_letter: tuple[str, str] | None) -> None:
    """One bulk request, paced by the secondary's credits (one a lock token, an assumption); a busy answer is
    raised (the caller knows the deadline)."""
    def request() -> None:
        if dead_letter is None:
            complete_by_lock_tokens(receiver, tokens)
        else:
            dead_letter_by_lock_tokens(receiver, tokens, dead_letter[0], dead_letter[1][:DESCRIPTION_LIMIT])

    if namespace is None:  # a receiver of the caller's own (a test's): not paced
        request()
    else:
        paced(namespace, CreditKind.SETTLE, request, cost=lambda _: len(tokens), retry=False, wait=False)
