"""The purge's I/O: receive exactly what is planned, complete or dead-letter what
the plan holds by identity, release anything else, and leave no receive credit open.

The decisions are ``purge.progress.PurgeProgress``'s and the timing ``purge.settle_timing.SettleTiming``'s (both
pure); this is the I/O. Nothing here completes a backlog message unless one of the plan's recorded spans
holds it (sequence number and enqueue time). The receive goes through the SDK's decoder, which only needs
sequence numbers, enqueue times and lock tokens here (``sdk_internals`` teaches it the AMQP types legacy
clients write; ``clients`` installs it).

Invariants:
- A page is settled with one bulk completion, then one bulk dead-lettering per distinct reason, the
  largest first (each an ``update-disposition`` for many lock tokens), each sent only before the page's
  deadline (its first lock's end less a round trip and a safety share of the lock); what misses it is
  released at once (no delivery count) and received again, never left to run out its lock.
- Messages passed over are released before their own locks end: the next page is received only while it
  and the releases fit before that (``SettleTiming.receive_wait_while_passing``).
- Every request is timed, and the timing is kept for the queue's next rounds; a round with no request measured
  yet times a peek first (``peek.peek_round_trip``), so the first page's margins are a request's round trip.
- A receive that comes back short (the service answers a part of what was asked, and sends the rest on the credit
  left open, which the SDK releases when it arrives between receive calls) is followed at once by receives for
  the rest of the page while its requests still fit inside its first lock (``_rest_of_page``): the page is
  settled in its one bulk completion and dead-lettering per reason, and nothing is delivered twice.
- Lock tokens go in one request per partition (a partitioned entity refuses a request across partitions);
  a request refused for a lost lock is looked at before it is split (``BulkSettlement``): whether the
  service settled its live tokens or none, nothing settled is sent again and nothing live taken for settled.
- Every receive, settlement and peek is paced by the secondary's credits (``throttling``): a receive waits
  until the process's share allows it, and its page's settlements go at once (their credits are paid by the
  next receive's wait), so the pacing never eats into the locks; a busy settlement is asked again while its
  page's deadline allows (else its messages are released, received again later); a busy receive ends the
  round (the SDK's receiver, its link detached, is dropped), and the next goes on.
- A round that misses recorded messages peeks for them before it ends (``PurgeProgress.on_look``); those
  another receiver holds locked (a killed run's) are waited for, within one lock duration, with receives
  that answer as soon as they come back (``purge.lock_wait``), and the wait is said on one line.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusError,
    ServiceBusServerBusyError,
    SessionCannotBeLockedError,
)

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.model import CreditKind
from backlog_syphon.partitions import lane_key, partition_of
from backlog_syphon.model import SettleKind
from backlog_syphon.servicebus.clients import each_at_once, pooled_receiver, session_receiver
from backlog_syphon.servicebus.peek import first_identity_from, peek_identities, peek_round_trip
from backlog_syphon.purge.plan import PurgePlan, PurgeResult, span_after_peek
from backlog_syphon.purge.progress import PurgeProgress, dead_letter_groups
from backlog_syphon.servicebus.lock_settlement import (
    LocksLostError,
    first_lock_end,
    give_back,
    latest_deliveries,
    lock_end_of,
    settle_all,
)
from backlog_syphon.servicebus.special_settlement import ANY_SESSION, settle_special
from backlog_syphon.servicebus.sdk_internals import received_identity, release_buffered, release_message, revoke_credit
from backlog_syphon.purge.settle_timing import SettleTiming
from backlog_syphon.servicebus.throttling import await_credits, pause_of, paced

# The logger keeps the module's former name (``servicebus.settle``): log pipelines may filter on it.
logger = logging.getLogger(__name__)



def purge_backlog(namespace: NamespaceConfig, plan: PurgePlan, *, timing: SettleTiming | None = None,
                  max_wait_seconds: float = 5.0, on_completions_sent: Callable[[], None] | None = None) -> PurgeResult:
    """Settle what ``plan`` says in one backlog queue: complete or dead-letter recorded messages only.

    Receives in PeekLock exactly as many as are planned, settles those the plan holds, releases the
    rest (which does not raise their delivery count), and makes sure no receive credit stays open, so
    nothing that is not recorded stays locked between calls (see ``sdk_internals.revoke_credit``).
    A queue that no longer exists holds none of the plan's messages: everything is settled. ``timing``:
    what this queue's earlier rounds measured (updated here). The migration mode's recorded scheduled and
    deferred messages are settled by their own means first (``settle_special``), and a session-enabled source
    session by session (``_purge_sessions``). ``on_completions_sent``: called after the completions of a page
    that has dead-letterings too, before those (where a test may stop the process).
    """
    timing = timing if timing is not None else SettleTiming()
    for fresh_link in (False, True):
        try:
            if plan.sessions is not None or _cancels_only(plan):
                return _purge_sessions(namespace, plan, timing, max_wait_seconds, on_completions_sent)
            with pooled_receiver(namespace, plan.queue, purpose="settle") as receiver:  # a failed link leaves the pool
                return _purge(namespace, receiver, plan, timing, max_wait_seconds, on_completions_sent)
        except ThrottledRound as throttled:
            # A receive the namespace throttled: its link is detached (the SDK's receiver raises that again on
            # every receive: the pool dropped it). The round says what it settled; the next one comes after
            # the namespace's pause.
            pause = pause_of(namespace)
            logger.info("backlog=%s: the secondary is throttling (server-busy) the purge's receives: this round "
                        "ends (completed=%d dead_lettered=%d), the next one goes on in %.1f s at a lower rate",
                        plan.queue, throttled.result.completed, throttled.result.dead_lettered, pause)
            time.sleep(pause)
            return throttled.result
        except (MessagingEntityNotFoundError, BacklogQueueMissingError):
            # A pooled link to a queue deleted and created since says "not found" too: ask once on a fresh one.
            if fresh_link:
                logger.warning("backlog=%s no longer exists: the %d recorded message(s) the purge was to settle "
                               "went with it", plan.queue, plan.expected)
    return PurgeResult(0, 0, 0, (), plan.spans)


def _cancels_only(plan: PurgePlan) -> bool:
    """Whether every recorded message of the plan is a scheduled one: nothing to receive (a topic's, whose only
    link is its management one)."""
    return bool(plan.special) and not plan.expected and all(
        order.kind is SettleKind.CANCEL_SCHEDULED for order in plan.special.values())


class ThrottledRound(Exception):
    """A receive of the round was throttled (server-busy): ``result`` is what the round settled before it."""

    def __init__(self, result: PurgeResult):
        super().__init__("throttled")
        self.result = result


def _purge(namespace: NamespaceConfig, receiver, plan: PurgePlan, timing: SettleTiming,
           max_wait_seconds: float, on_completions_sent: Callable[[], None] | None) -> PurgeResult:
    if plan.verify and (plan.expected or plan.special):
        plan = plan.verified(_present(namespace, receiver, plan))
    special = settle_special(namespace, receiver, plan, timing, {ANY_SESSION: receiver}, session=ANY_SESSION)
    try:
        progress = _receive_round(namespace, receiver, plan, timing, max_wait_seconds, on_completions_sent,
                                  present=lambda: _present(namespace, receiver, plan))
    except ThrottledRound as throttled:
        throttled.result = special.added_to(throttled.result)
        raise
    # Whatever could not be settled (lock lost, not there yet) is still there: look, don't count. An empty
    # answer where the round left something is looked at twice (a peek may come back empty while messages
    # exist). The peeks are also the barrier behind any transfer still on its way (see revoke_credit).
    # A span this round settled whole needs no look (a look can miss where a peek answers from another partition).
    unsettled = progress.completed + progress.dead_lettered + special.settled < plan.expected + len(plan.special)
    heads = {span.first: first_identity_from(receiver, span.first, confirm=unsettled, lane=plan.interleaved)
             for span in plan.spans if not progress.settled_whole(span)}
    release_buffered(receiver)
    return special.added_to(progress.result(heads))


def _receive_round(namespace: NamespaceConfig, receiver, plan: PurgePlan, timing: SettleTiming,
                   max_wait_seconds: float, on_completions_sent: Callable[[], None] | None, *,
                   present: Callable[[], list]) -> PurgeProgress:
    """Receive what ``plan`` expects and settle what it holds, page by page, within the locks (the purge's round
    on one receiver: the queue's, or one session's). ``present``: peeks the identities still in the plan's ranges
    where this receiver could receive them (a look, ``_look``)."""
    progress = PurgeProgress(plan, timing=timing)
    passed_over: list = []  # messages that stay (held, or left by a re-drive): locked until the round ends
    revoke_credit(receiver)  # the link's attach gave the broker one credit of its own
    if not timing.requests_measured and plan.spans:
        # The first page is settled (and the rest of a short one received) within a margin of round trips: a
        # request's, not the first receive's, which holds the link's attach and whatever the broker waited before
        # it answered, and would leave no time for the rest of a page that comes back short.
        round_trip = peek_round_trip(receiver, plan.spans[0].first)
        if round_trip is not None:
            timing.observed_request(round_trip)
    try:
        while (credit := progress.credit()) or progress.wants_look:
            if not credit:
                _look(present, plan, progress)
                continue
            time.sleep(progress.pause_before_receive(time.time()))
            waiting = progress.lock_wait is not None  # the receive may wait until locks held elsewhere end
            wait = progress.receive_wait(time.time(), max_wait_seconds)
            if passed_over:
                wait = timing.receive_wait_while_passing(lock_end_of(passed_over) - time.time(),
                                                         progress.requests_needed())
                if wait is None:
                    progress.locks_running_out()
                    break
                wait = min(wait, max_wait_seconds)
            await_credits(namespace, reserve=credit)  # the page's receive is timed from here, not from the pacing
            started, began = time.time(), time.monotonic()
            try:
                page = _receive(namespace, receiver, credit, wait)
            except ServiceBusServerBusyError:
                # Refused while the link held no lock (else the service holds the receive back instead):
                # nothing was received, and nothing is left to release. The link is detached: no look.
                raise ThrottledRound(progress.throttled_result()) from None
            if page and not waiting:  # an empty one waited out its time, which says nothing about the link;
                # nor does one that waited for locks to end
                lock_end = first_lock_end(page)
                timing.observed_page(time.monotonic() - began, None if lock_end is None else lock_end - started)
            page += _rest_of_page(namespace, receiver, page, passed_over, credit, timing, progress.requests_needed(),
                                  max_wait_seconds, wanted=lambda messages: _recorded(plan, messages) < progress.left)
            revoke_credit(receiver)  # a call that returns early leaves the rest of its credit open
            _settle_page(receiver, plan, progress, timing, page, passed_over, time.time() if waiting else started,
                         on_completions_sent)
    finally:
        _release_passed_over(receiver, plan, passed_over)
    if progress.page < 1 or progress.late_only:
        logger.warning("backlog=%s: locks of %.1f s (as seen here) were too short to settle a page at a round trip of "
                       "%.2f s; what was received is released untouched, and the next round measures again. If this "
                       "lasts, raise the queue's lock duration", plan.queue, timing.lock_seconds or 0.0,
                       timing.round_trip or 0.0)
        timing.forget()  # a slow moment must not keep every later round from trying
    return progress


def _purge_sessions(namespace: NamespaceConfig, plan: PurgePlan, timing: SettleTiming,
                    max_wait_seconds: float, on_completions_sent: Callable[[], None] | None) -> PurgeResult:
    """The purge of a source whose messages no plain receive link can settle: a session-enabled entity, session by
    session (each session's receiver takes its lock, receives exactly its recorded count, settles what a span holds
    and releases the rest), and a topic, whose recorded messages are all scheduled ones. What is left is looked at
    through the entity's management-only link (``clients.browse_only``)."""
    with pooled_receiver(namespace, plan.queue) as peeker:
        if plan.verify and (plan.expected or plan.special):
            plan = plan.verified(_present(namespace, peeker, plan))
        receivers: dict[str | None, object] = {}
        settled: dict[str, int] = {}
        totals = PurgeResult(0, 0, 0, (), ())
        sessions = dict(plan.sessions or {})
        deferred_sessions = {order.session_id for order in plan.special.values()
                             if order.kind is SettleKind.RECEIVE_DEFERRED}
        # Scheduled messages first (no session needed), then each session with recorded messages in turn.
        special = settle_special(namespace, peeker, plan, timing, receivers, kinds=(SettleKind.CANCEL_SCHEDULED,))
        for session in sorted(set(sessions) | {s for s in deferred_sessions if s is not None}):
            try:
                with session_receiver(namespace, plan.queue, session) as receiver:
                    receivers[session] = receiver
                    in_session = settle_special(namespace, peeker, plan, timing, {session: receiver},
                                                 kinds=(SettleKind.RECEIVE_DEFERRED,), session=session)
                    special = special.plus(in_session)
                    count = sessions.get(session, 0)
                    if count:
                        in_plan = plan.in_session(session, count)
                        # A look peeks this session only (its receiver's peeks are the session's).
                        progress = _receive_round(
                            namespace, receiver, in_plan, timing, max_wait_seconds, on_completions_sent,
                            present=lambda: [identity for span in in_plan.ranges
                                             for identity in peek_identities(receiver, *span)])
                        totals = PurgeResult(totals.completed + progress.completed,
                                             totals.dead_lettered + progress.dead_lettered,
                                             totals.released + progress.released, (), ())
                        # A look found none of its recorded messages left: what the count still expects is not there
                        # (settled before a crash).
                        settled[session] = count if progress.came_up_empty else progress.completed + \
                            progress.dead_lettered
                    receivers.pop(session, None)
            except SessionCannotBeLockedError:
                logger.warning("%s session %r is locked by another receiver: its recorded messages are settled by a "
                               "later round", plan.queue, session)
            except ThrottledRound as throttled:  # the namespace throttles: the other sessions wait for a later round
                settled[session] = throttled.result.completed + throttled.result.dead_lettered
                raise ThrottledRound(special.added_to(PurgeResult(
                    totals.completed + throttled.result.completed, totals.dead_lettered + throttled.result.dead_lettered,
                    totals.released + throttled.result.released, plan.spans, (), sessions_settled=settled,
                    throttled=True))) from None
        unsettled = totals.completed + totals.dead_lettered + special.settled < plan.expected + len(plan.special)
        heads = {span.first: first_identity_from(peeker, span.first, confirm=unsettled) for span in plan.spans}
    remaining, done = [], []
    for span in plan.spans:
        left = span_after_peek(span, heads.get(span.first))
        (done if left is None else remaining).append(left or span)
    return special.added_to(PurgeResult(totals.completed, totals.dead_lettered, totals.released, tuple(remaining),
                                        tuple(done), sessions_settled=settled if plan.sessions is not None else None))


def _receive(namespace: NamespaceConfig, receiver, credit: int, wait: float) -> list:
    """One receive call, paced by the secondary's credits (one a message; the caller's ``await_credits``
    reserved ``credit`` of them); a busy answer is raised: it ends the round (see ``purge_backlog``)."""
    return paced(namespace, CreditKind.RECEIVE, lambda: receiver.receive_messages(max_message_count=credit,
                                                                                  max_wait_time=wait),
                 cost=len, retry=False, wait=False, reserve=credit)


def _recorded(plan: PurgePlan, messages: list) -> int:
    return sum(1 for message in messages if plan.holds(received_identity(message)))


def _rest_of_page(namespace: NamespaceConfig, receiver, page: list, passed_over: list, credit: int,
                  timing: SettleTiming, requests: int, max_wait_seconds: float,
                  wanted: Callable[[list], bool] = lambda messages: True) -> list:
    """The rest of a page whose receive came back short (the service answers a part of what was asked, and sends
    the rest on the credit left open), received at once: what comes on that credit between two receive calls the
    SDK releases, and it would be received again later (``progress``'s page would be settled in more requests).
    Each further receive goes while the page's requests (and the releases of messages passed over) still fit inside
    its first lock after it (``SettleTiming.receive_wait_for_rest``) and the round still ``wanted`` more than it holds
    (a partitioned queue's credit may ask for more than is recorded); one that brings nothing, or is throttled, ends
    the page."""
    rest: list = []
    lock_end = lock_end_of(page)
    if passed_over:  # their releases go out after the page's requests (as in ``_settle_page``)
        lock_end = min(lock_end, lock_end_of(passed_over) - (timing.round_trip or 0.0))
    while page and len(page) + len(rest) < credit and wanted(page + rest):
        wait = timing.receive_wait_for_rest(lock_end - time.time(), requests)
        if wait is None:
            break
        try:
            more = paced(namespace, CreditKind.RECEIVE, lambda: receiver.receive_messages(
                max_message_count=credit - len(page) - len(rest), max_wait_time=min(wait, max_wait_seconds)),
                cost=len, retry=False, wait=False)
        except ServiceBusServerBusyError:  # the page in hand is settled; the rest comes with a later receive
            break
        if not more:
            break
        rest += more
    return rest


def _look(present: Callable[[], list], plan: PurgePlan, progress: PurgeProgress) -> None:
    """A receive missed recorded messages: peek what is still in the plan's ranges (``PurgeProgress.on_look``),
    and say when the round starts waiting for locks another receiver holds, and when it gives up."""
    waiting, now = progress.lock_wait, time.time()
    progress.on_look(present(), now)
    wait = progress.lock_wait
    if wait is not None and waiting is None:
        logger.warning("backlog=%s: %d recorded message(s) are in the queue but locked by an earlier receiver (a run "
                       "that ended without settling them, or a lost link): waiting up to %.0f s for their locks to end "
                       "(a lock of %.0f s%s, and a round trip)", plan.queue, wait.locked, wait.bound_seconds,
                       wait.lock_seconds,
                       "" if wait.lock_known else ", the service's longest: this queue's is not known")
    elif wait is not None and progress.stopped and wait.over(now):
        logger.warning("backlog=%s: recorded message(s) still locked after %.0f s, longer than their lock: another "
                       "receiver holds them; the next purge round tries again", plan.queue, wait.bound_seconds)


def _present(namespace: NamespaceConfig, receiver, plan: PurgePlan) -> list:
    """The identities of the messages still in the plan's ranges (``PurgePlan.ranges``), peeked. A partitioned
    queue's partitions are walked at once, each on its lane's pooled peek link: a peek may answer one message
    a call there (as reported of the service), and 16 walks one after the other would cost their round trips
    end to end."""
    ranges = plan.ranges
    if len(ranges) == 1:
        return peek_identities(receiver, *ranges[0], lane=plan.interleaved)

    def walk(lane: tuple[int, int]) -> list:
        with pooled_receiver(namespace, lane_key(plan.queue, partition_of(lane[0]))) as lane_receiver:
            return peek_identities(lane_receiver, *lane, lane=True)

    return [identity for present in each_at_once(ranges, walk, name="purge-verify").values() for identity in present]


def _settle_page(receiver, plan: PurgePlan, progress: PurgeProgress, timing: SettleTiming, page: list,
                 passed_over: list, received_at: float, on_completions_sent: Callable[[], None] | None) -> None:
    page = latest_deliveries(receiver, plan.queue, page)
    by_seq = {message.sequence_number: message for message in page}
    actions = progress.on_page([received_identity(message) for message in page])
    passed_over.extend(by_seq[seq] for seq in actions.pass_over)
    for seq in actions.release:
        release_message(receiver, by_seq[seq])
    deadline = timing.deadline(lock_end_of(page, received_at))
    if passed_over:  # their releases go out after this page's last answer, before their own locks end
        deadline = min(deadline, timing.deadline(lock_end_of(passed_over)) - (timing.round_trip or 0.0))
    completion = settle_all(receiver, [by_seq[seq] for seq in actions.complete], deadline, timing, None,
                            lane=plan.interleaved)
    if on_completions_sent is not None and actions.dead_letter:
        on_completions_sent()
    settlements = [completion]
    for (code, reason), seqs in dead_letter_groups(actions.dead_letter):
        settlements.append(settle_all(receiver, [by_seq[seq] for seq in seqs], deadline, timing, (code, reason),
                                      lane=plan.interleaved))
    if completion.all_lost:
        give_back(receiver, [by_seq[seq] for settlement in settlements for seq in settlement.left])
        raise LocksLostError(f"backlog={plan.queue}: every lock of a page of {len(actions.complete)} message(s) was "
                             f"refused; the link that took them is closed, the next round receives them again")
    late = [seq for settlement in settlements for seq in settlement.left]
    give_back(receiver, [by_seq[seq] for seq in late])
    dead_lettered = [seq for settlement in settlements[1:] for seq in settlement.completed]
    progress.on_settled(len(completion.completed), dead_lettered, given_back=len(late),
                        completed_numbers=completion.completed)
    if late:
        logger.info("backlog=%s %d message(s) not settled before their locks' end (a round trip of %.2f s, locks of "
                    "%.1f s): released untouched and received again", plan.queue, len(late), timing.round_trip or 0.0,
                    timing.lock_seconds or 0.0)
    if actions.release and plan.interleaved:
        logger.info("backlog=%s purge received %d message(s) of other partitions whose outcome is not recorded "
                    "(sequence numbers %s): released untouched, not settled; a partitioned queue's receives "
                    "interleave partitions, so the purge goes on", plan.queue, len(actions.release),
                    list(actions.release)[:10])
    elif actions.release:
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
