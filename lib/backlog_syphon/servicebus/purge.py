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

import dataclasses
import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Callable

from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageNotFoundError,
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
from backlog_syphon.servicebus.clients import (
    discard_source_sender,
    each_at_once,
    namespace_of,
    pooled_receiver,
    session_receiver,
    source_sender,
)
from backlog_syphon.servicebus.peek import first_identity_from, peek_identities, peek_round_trip
from backlog_syphon.purge.bulk_settlement import BulkSettlement
from backlog_syphon.purge.plan import PurgePlan, PurgeResult, span_after_peek
from backlog_syphon.purge.progress import PurgeProgress, dead_letter_groups, latest_of_each
from backlog_syphon.servicebus.sdk_internals import (
    complete_by_lock_tokens,
    dead_letter_by_lock_tokens,
    received_identity,
    release_buffered,
    release_message,
    revoke_credit,
)
from backlog_syphon.purge.settle_timing import SettleTiming
from backlog_syphon.servicebus.throttling import await_credits, pause_of, paced

# The logger keeps the module's former name (``servicebus.settle``): log pipelines may filter on it.
logger = logging.getLogger(__name__)

UNKNOWN_LOCK_SECONDS = 60.0  # the service's default lock, for a page whose messages carry no locked-until
DESCRIPTION_LIMIT = 1024  # characters of a reason kept as the DeadLetterErrorDescription


def purge_backlog(namespace: NamespaceConfig, plan: PurgePlan, *, timing: SettleTiming | None = None,
                  max_wait_seconds: float = 5.0, on_completions_sent: Callable[[], None] | None = None) -> PurgeResult:
    """Settle what ``plan`` says in one backlog queue: complete or dead-letter recorded messages only.

    Receives in PeekLock exactly as many as are planned, settles those the plan holds, releases the
    rest (which does not raise their delivery count), and makes sure no receive credit stays open, so
    nothing that is not recorded stays locked between calls (see ``sdk_internals.revoke_credit``).
    A queue that no longer exists holds none of the plan's messages: everything is settled. ``timing``:
    what this queue's earlier rounds measured (updated here). The migration mode's recorded scheduled and
    deferred messages are settled by their own means first (``_settle_special``), and a session-enabled source
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
    special = _settle_special(namespace, receiver, plan, timing, {ANY_SESSION: receiver}, session=ANY_SESSION)
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
        special = _settle_special(namespace, peeker, plan, timing, receivers, kinds=(SettleKind.CANCEL_SCHEDULED,))
        for session in sorted(set(sessions) | {s for s in deferred_sessions if s is not None}):
            try:
                with session_receiver(namespace, plan.queue, session) as receiver:
                    receivers[session] = receiver
                    in_session = _settle_special(namespace, peeker, plan, timing, {session: receiver},
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


ANY_SESSION = object()  # a plain receiver receives deferred messages whatever SessionId they carry


@dataclass(frozen=True)
class SpecialSettlement:
    """What ``_settle_special`` settled: completed (cancelled, or received and completed) and dead-lettered."""

    completed: int = 0
    dead_lettered: int = 0

    @property
    def settled(self) -> int:
        return self.completed + self.dead_lettered

    def plus(self, other: SpecialSettlement) -> SpecialSettlement:
        return SpecialSettlement(self.completed + other.completed, self.dead_lettered + other.dead_lettered)

    def added_to(self, result: PurgeResult) -> PurgeResult:
        return dataclasses.replace(result, completed=result.completed + self.completed,
                                   dead_lettered=result.dead_lettered + self.dead_lettered)


def _settle_special(namespace: NamespaceConfig, peeker, plan: PurgePlan, timing: SettleTiming,
                    receivers: dict, *, kinds: tuple[SettleKind, ...] = tuple(SettleKind),
                    session=None) -> SpecialSettlement:
    """Settle the plan's recorded messages that no receive brings, by identity: a scheduled one is cancelled by its
    sequence number once a peek there finds its identity (enqueue time included: a recreated entity numbers from 1
    again); a deferred one is received by its sequence number (on ``receivers[its session]``), checked, and
    completed or dead-lettered with its recorded reason. A scheduled message that became active meanwhile cannot be
    cancelled any more (``model`` docs: it is back under a new number); one that is gone is simply gone."""
    result = SpecialSettlement()
    orders = [order for order in plan.special.values() if order.kind in kinds
              and (order.kind is not SettleKind.RECEIVE_DEFERRED or session is ANY_SESSION
                   or order.session_id == session)]
    scheduled = [order for order in orders if order.kind is SettleKind.CANCEL_SCHEDULED]
    if scheduled:
        present = [order.sequence_number for order in scheduled
                   if first_identity_from(peeker, order.sequence_number) == order.identity]
        if present:
            try:
                cancel_scheduled(namespace, plan.queue, present)
                result = result.plus(SpecialSettlement(completed=len(present)))
            except MessageNotFoundError:
                logger.info("%s: %d recorded scheduled message(s) were no longer scheduled when cancelled (they became "
                            "active meanwhile, under a new sequence number, or went)", plan.queue, len(present))
    deferred = [order for order in orders if order.kind is SettleKind.RECEIVE_DEFERRED]
    receiver = receivers.get(session)
    if deferred and receiver is not None:
        messages = receive_deferred(receiver, [order.sequence_number for order in deferred])
        wanted = {order.identity for order in deferred}
        mine = [message for message in messages if received_identity(message) in wanted]
        for message in messages:
            if message not in mine:
                release_message(receiver, message)
        deadline = timing.deadline(lock_end_of(mine)) if mine else 0.0
        by_reason: dict = {}
        for message in mine:
            by_reason.setdefault(plan.dead_letters.get(received_identity(message)), []).append(message)
        for reason, group in by_reason.items():
            settlement = settle_all(receiver, group, deadline, timing, reason)
            done = len(settlement.completed)
            result = result.plus(SpecialSettlement(done, 0) if reason is None else SpecialSettlement(0, done))
            _give_back(receiver, [message for message in group if message.sequence_number in settlement.left])
    return result


def cancel_scheduled(namespace: NamespaceConfig, entity: str, sequence_numbers: list[int]) -> None:
    """Cancel scheduled messages of a source queue or topic by their sequence numbers, in one request."""
    sender = source_sender(namespace, entity)
    try:
        sender.cancel_scheduled_messages(sequence_numbers)
    except MessageNotFoundError:
        raise
    except Exception:
        discard_source_sender(namespace, entity)
        raise


def receive_deferred(receiver, sequence_numbers: list[int]) -> list:
    """Receive deferred messages by their sequence numbers (PeekLock); one that is not there (settled, or gone) is
    left out: asked for alone when the request for all of them is refused for a missing one."""
    try:
        return list(receiver.receive_deferred_messages(sequence_numbers))
    except MessageNotFoundError:
        found = []
        for number in sequence_numbers:
            try:
                found += receiver.receive_deferred_messages([number])
            except MessageNotFoundError:
                logger.info("deferred message %d is no longer there", number)
        return found


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
        _give_back(receiver, [by_seq[seq] for settlement in settlements for seq in settlement.left])
        raise LocksLostError(f"backlog={plan.queue}: every lock of a page of {len(actions.complete)} message(s) was "
                             f"refused; the link that took them is closed, the next round receives them again")
    late = [seq for settlement in settlements for seq in settlement.left]
    _give_back(receiver, [by_seq[seq] for seq in late])
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


def _give_back(receiver, messages: list) -> None:
    """Release received messages this round could not settle in time (a no-op for a lock already gone)."""
    for message in messages:
        try:
            release_message(receiver, message)
        except Exception:  # noqa: BLE001 - its lock is gone already, or the link: nothing to give back
            logger.debug("releasing an unsettled message failed", exc_info=True)


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
