"""Settling backlog messages for the purge: receive exactly what is planned, complete or dead-letter what
the plan holds by identity, release anything else, and leave no receive credit open.

The decisions are ``purge_plan.PurgeProgress``'s (pure); this is the I/O. Nothing here completes a
backlog message unless one of the plan's recorded spans holds it (sequence number and enqueue time).
The receive goes through the SDK's decoder, which only needs sequence numbers, enqueue times and lock
tokens here (``sdk_internals`` teaches it the AMQP types legacy clients write; ``clients`` installs it).
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from azure.servicebus.exceptions import MessageLockLostError, MessagingEntityNotFoundError, ServiceBusError

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.servicebus.clients import pooled_receiver
from backlog_syphon.servicebus.peek import first_identity_from, peek_identities
from backlog_syphon.servicebus.purge_plan import (
    LOCK_MARGIN_SECONDS,
    BulkCompletion,
    PurgePlan,
    PurgeProgress,
    PurgeResult,
    latest_of_each,
)
from backlog_syphon.servicebus.sdk_internals import (
    complete_by_lock_tokens,
    received_identity,
    release_buffered,
    release_message,
    revoke_credit,
)

logger = logging.getLogger(__name__)


def purge_backlog(namespace: NamespaceConfig, plan: PurgePlan, *, max_wait_seconds: float = 5.0) -> PurgeResult:
    """Settle what ``plan`` says in one backlog queue: complete or dead-letter recorded messages only.

    Receives in PeekLock exactly as many as are planned, settles those the plan holds, releases the
    rest (which does not raise their delivery count), and makes sure no receive credit stays open, so
    nothing that is not recorded stays locked between calls (see ``sdk_internals.revoke_credit``).
    A queue that no longer exists holds none of the plan's messages: everything is settled.
    """
    for fresh_link in (False, True):
        try:
            with pooled_receiver(namespace, plan.queue, purpose="settle") as receiver:  # a failed link leaves the pool
                return _purge(receiver, plan, max_wait_seconds)
        except (MessagingEntityNotFoundError, BacklogQueueMissingError):
            # A pooled link to a queue deleted and created since says "not found" too: ask once on a fresh one.
            if fresh_link:
                logger.warning("backlog=%s no longer exists: the %d recorded message(s) the purge was to settle "
                               "went with it", plan.queue, plan.expected)
    return PurgeResult(0, 0, 0, (), plan.spans)


# A round that passes over messages that stay ends this long before the first of their locks would (in a
# backlog queue an expired lock raises the delivery count; released, it does not).
PASS_OVER_LOCK_MARGIN_SECONDS = 10.0


def _purge(receiver, plan: PurgePlan, max_wait_seconds: float) -> PurgeResult:
    if plan.verify and plan.expected:
        plan = plan.verified(peek_identities(receiver, plan.first, plan.last))
    progress = PurgeProgress(plan)
    passed_over: list = []  # messages that stay (held, or left by a re-drive): locked until the round ends
    revoke_credit(receiver)  # the link's attach gave the broker one credit of its own
    try:
        while credit := progress.credit():
            if passed_over and _locks_end_soon(passed_over):
                progress.locks_running_out()
                break
            page = receiver.receive_messages(max_message_count=credit, max_wait_time=max_wait_seconds)
            received_at = time.time()
            revoke_credit(receiver)  # a call that returns early leaves the rest of its credit open
            _settle_page(receiver, plan, progress, page, passed_over, received_at)
    finally:
        _release_passed_over(receiver, plan, passed_over)
    # Whatever could not be settled (lock lost, not there yet) is still there: look, don't count.
    # The peeks are also the barrier behind any transfer still on its way (see revoke_credit).
    heads = {span.first: first_identity_from(receiver, span.first) for span in plan.spans}
    release_buffered(receiver)
    return progress.result(heads)


def _settle_page(receiver, plan: PurgePlan, progress: PurgeProgress, page: list, passed_over: list,
                 received_at: float) -> None:
    page = latest_deliveries(receiver, plan.queue, page)
    by_seq = {message.sequence_number: message for message in page}
    actions = progress.on_page([received_identity(message) for message in page])
    passed_over.extend(by_seq[seq] for seq in actions.pass_over)
    for seq in actions.release:
        release_message(receiver, by_seq[seq])
    lock_ends = first_lock_end(page)
    deadline = (lock_ends or received_at + 60.0) - LOCK_MARGIN_SECONDS
    began = time.monotonic()
    dead_lettered = dead_letter_all(receiver, [(by_seq[seq], code, reason) for seq, code, reason in actions.dead_letter],
                                    deadline)
    completion, requests = complete_all(receiver, [by_seq[seq] for seq in actions.complete], deadline)
    if completion.all_lost:
        raise LocksLostError(f"backlog={plan.queue}: every lock of a page of {len(actions.complete)} message(s) was "
                             f"refused; the link that took them is closed, the next round receives them again")
    progress.on_settled(len(completion.completed), dead_lettered)
    requests += len(actions.dead_letter)
    if requests:
        progress.measured(None if lock_ends is None else lock_ends - received_at, (time.monotonic() - began) / requests)
    if actions.release:
        logger.warning("backlog=%s purge received %d message(s) whose outcome is not recorded (sequence numbers "
                       "%s): released untouched, not settled; the purge of this queue stops here until they "
                       "are recorded", plan.queue, len(actions.release), list(actions.release)[:10])


def _release_passed_over(receiver, plan: PurgePlan, passed_over: list) -> None:
    """Release the messages that stay, unchanged. Runs in a ``finally``: it never raises, so it never masks
    the purge's own error."""
    for message in passed_over:
        try:
            release_message(receiver, message)
        except ServiceBusError:  # its lock ran out meanwhile: it is available again, untouched, anyway
            logger.info("%s sequence_number=%s: lock lost before its release", plan.queue, message.sequence_number)
        except Exception as exc:  # noqa: BLE001 - a broken link: the locks end by themselves, nothing is settled
            logger.warning("%s sequence_number=%s passed-over message not released (%s); its lock runs out",
                           plan.queue, message.sequence_number, type(exc).__name__)
            break
    if passed_over:
        logger.info("%s purge passed over %d message(s) that stay (held for skipped destinations, or left by a "
                    "re-drive; locked meanwhile, released untouched)", plan.queue, len(passed_over))


def _locks_end_soon(messages: list) -> bool:
    """Whether the first of these received messages' locks ends within ``PASS_OVER_LOCK_MARGIN_SECONDS``."""
    ends = [m.locked_until_utc for m in messages if getattr(m, "locked_until_utc", None) is not None]
    if not ends:
        return False
    first = min(end if end.tzinfo else end.replace(tzinfo=dt.timezone.utc) for end in ends)
    return (first - dt.datetime.now(dt.timezone.utc)).total_seconds() < PASS_OVER_LOCK_MARGIN_SECONDS


def latest_deliveries(receiver, queue: str, page: list) -> list:
    """``page`` with each message once, its latest delivery (``purge_plan.latest_of_each``); the earlier
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


class LocksLostError(RuntimeError):
    """Every lock a page held was refused: the link that took them lost them all. The round ends and the
    link is closed (a fresh one next time); the next round receives those messages again."""


def complete_all(receiver, messages: list, deadline: float, *, clock=time.time) -> tuple[BulkCompletion, int]:
    """Complete received messages with one management request instead of one round trip each; a request
    refused for a lost lock is split and tried again, and nothing is sent after ``deadline``
    (``purge_plan.BulkCompletion``). Returns the completion (what was completed; what was not: a lost
    lock, the deadline, a broken link, every lock gone, all received again by the next round) and the
    requests made."""
    by_seq = {message.sequence_number: message for message in messages}
    completion = BulkCompletion(sorted(by_seq), deadline)
    requests = 0
    while (request := completion.next_request(clock())) is not None:
        requests += 1
        try:
            complete_by_lock_tokens(receiver, [by_seq[seq].lock_token for seq in request])
        except MessageLockLostError:
            if len(request) > 1:
                logger.info("bulk completion of %d message(s) refused for a lost lock: split and tried again",
                            len(request))
            completion.lock_lost(request)
        except ServiceBusError as exc:
            logger.info("bulk completion of %d message(s) failed (%s); the rest is received again by the next round",
                        len(request), type(exc).__name__)
            completion.stop()
        else:
            completion.succeeded(request)
    if completion.unsettled:
        logger.info("%d of %d message(s) not completed (lock lost %d, not tried before their locks end, after a "
                    "failure or once every lock seemed gone %d) in %d request(s); the next round receives them again",
                    len(completion.unsettled), len(messages), len(completion.lost), len(completion.left), requests)
    return completion, requests


def dead_letter_all(receiver, orders: list, deadline: float, *, clock=time.time) -> int:
    """Dead-letter received messages with their reasons, one request each (each its own reason), while their
    locks last; one whose lock was lost is received again by the next round. Returns how many were."""
    done = 0
    for message, reason_code, reason in orders:
        if clock() >= deadline:
            break
        try:
            receiver.dead_letter_message(message, reason=reason_code, error_description=reason[:1024])
            done += 1
        except MessageLockLostError:
            logger.info("sequence_number=%s not dead-lettered (lock lost); the next round receives it again",
                        message.sequence_number)
    return done
