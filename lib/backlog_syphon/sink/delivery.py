"""Delivering one backlog queue's rows: grouping, building, sending with retries, and one outcome per
row. Pure: building and sending are passed in (``servicebus.send`` has the real ones), and so are the
clock and the sleep, so the retry state machine is tested with fakes in milliseconds.

Invariants:
- Order: rows are sent in sequence-number order per destination and session; a batched send holds
  consecutive messages of one destination and session only.
- One row, one outcome: delivered, dead-lettered (with a reason code and text), skipped, unsent, or left
  where it is on purpose (``Outcome.stays``): held (its destination is in ``restore.skip_destinations``)
  or, in a re-drive, not selected. Those are never sent.
- No single message stops the run: a message that cannot be built (decoded, restored, encoded)
  becomes that message's dead-letter outcome, with the exception's text, and the rest goes on.
- No destination holds the others hostage: a destination that refuses or cannot be reached is
  retried with back-off while the other destinations' messages go on; only its own later messages
  wait (their order is kept). After ``sink.outage_wait_seconds`` of failures in a row its messages
  are left *unsent* (``DESTINATION_UNAVAILABLE``): they stay in the backlog, untouched, and the
  batch fails once what was delivered is recorded, so its replay sends only them.
- Nothing is sent after the round's deadline (the lease's expiry less a safety margin): what is left
  then is unsent (``ROUND_DEADLINE``) and the next round, under an extended lease, sends it.
- A final failure dead-letters the messages it concerns, and only those. No such destination, or not
  authorized: every pending message of the group. A refusal of one message (too large, ``amqp:not-allowed``,
  an argument error: ``SendFailureClass.REFUSED``) is never waited out and never dead-letters a message
  that could have been delivered: a refused batch is sent again in halves, in order, until the refused
  message goes alone, and only that one is dead-lettered. A destination the service said requires sessions
  gets no more session-less messages.
- Sends have the destination's shape (``sink.send_shape``): batches of one session and partition key, or
  one message per send for a partitioned destination with duplicate detection, several in flight on the
  link, in order. A batch refused for its shape (``BATCH_SHAPE_REFUSED``) teaches the sender: the same
  messages go again one per send, and so does everything later for that destination. Nothing is
  dead-lettered for the shape of a batch.
- Batches respect the service's limits whatever the link advertises (``servicebus.send``: 4,500
  messages, 1 MB).
- Politely (``sink.pacing``): sends wait for the task's ``Pacer`` (its share of
  ``sink.max_messages_per_second``, lowered after throttling). A throttling failure (server busy,
  quota exceeded, throttled) slows the task down and makes its destination wait (doubling from
  ``sink.retry_backoff_seconds`` up to ``sink.max_retry_backoff_seconds``) without counting against
  ``sink.max_send_attempts`` and without dropping the link; it is still bounded by
  ``sink.outage_wait_seconds`` like any other failure.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

from backlog_syphon.config import SinkConfig
from backlog_syphon.model import (
    Action,
    ExpiredBeforeSendError,
    Outcome,
    Outgoing,
    PartialSendError,
    RefusedBeforeSending,
    ReasonCode,
    SendFailure,
    SendFailureClass,
    SendShape,
)
from backlog_syphon.restore.destination_fit import SESSION_REQUIRED_REASON
from backlog_syphon.sink.pacing import PaceEvent, Pacer, PaceSignal
from backlog_syphon.sink.send_shape import SendShapes, batch_key, next_send_size

logger = logging.getLogger(__name__)

Row = Mapping[str, Any]  # a classified backlog row (``rows`` columns + the restore rules')

# The outcome of a row the restore rules decided not to send.
NOT_SENT_OUTCOMES = {Action.SKIP: Outcome.SKIPPED_PING, Action.DEAD_LETTER: Outcome.DEAD_LETTERED,
                     Action.HOLD: Outcome.HELD, Action.LEAVE: Outcome.NOT_SELECTED, Action.EXPIRE: Outcome.EXPIRED,
                     Action.COVER: Outcome.COVERED}


class Sender(Protocol):
    def send(self, destination: str, messages: Sequence[Outgoing]) -> int:
        """Send in order; return how many went, or raise ``PartialSendError``."""

    def send_singly(self, destination: str, messages: Sequence[Outgoing]) -> int:
        """Send each message on its own (``SendShape.SINGLE_MESSAGES``), several in flight at once, in order;
        return how many went, or raise ``PartialSendError`` (``attempted`` 1: the refused one)."""

    def reset(self, destination: str) -> None:
        """Drop the destination's link after an error."""


@dataclass(frozen=True)
class RoundLimits:
    """What bounds one send round: nothing is sent at or after ``deadline`` (wall-clock seconds since
    the epoch), and destinations that already failed in earlier rounds carry their first failure's time."""

    deadline: float = float("inf")
    unavailable_since: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Delivery:
    """What became of one row."""

    row: Row
    outcome: Outcome
    reason_code: ReasonCode | str | None  # a ReasonCode, or its value as the restore rules' column holds it
    reason: str | None
    attempts: int
    at: float | None = None  # UNSENT: since when its destination has been failing (or the deadline)


def session_required(destination: str) -> SendFailure:
    """The outcome of a session-less message to a destination the service said requires sessions."""
    return SendFailure(False, ReasonCode.SESSION_REQUIRED, SESSION_REQUIRED_REASON.format(destination=destination))


def send_groups(rows: Iterable[Row]) -> list[list[Row]]:
    """Rows that share one batched send: same backlog queue, destination, session and partition key, in order.

    Only the order within a destination (and so within a session) can be observed by anyone, so a
    backlog queue's messages are batched per destination instead of per run of neighbours: with
    destinations interleaved in a backlog queue that is many times fewer sends. A partitioned entity
    takes a batch only of one partition key (a session's messages share one). Rows not to deliver
    form groups of one.
    """
    groups: dict[tuple, list[Row]] = {}
    for row in sorted(rows, key=lambda r: (r["backlog_queue"], r["sequence_number"])):
        if row["action"] == Action.DELIVER:
            key = (row["backlog_queue"], "deliver", row["destination"],
                   *batch_key(row["session_id"], row.get("partition_key")))
        else:
            key = (row["backlog_queue"], "reject", row["sequence_number"], None, None)
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def deliver_rows(rows: Iterable[Row], *, build: Callable[[Row], Outgoing], sender: Sender,
                 classify: Callable[[BaseException, str], SendFailure], sink: SinkConfig,
                 limits: RoundLimits = RoundLimits(), clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, on_sent: Callable[[], None] = lambda: None,
                 carry: Carry | None = None, pacer: Pacer | None = None,
                 shapes: SendShapes | None = None) -> Iterator[Delivery]:
    """Deliver rows (one backlog queue's, or several) and yield one ``Delivery`` per row.

    ``on_sent`` is called after each send that delivered something (a test hook for crashes).
    ``pacer``: the task's pacing (None: no cap, and still backing off on throttling).
    ``carry``: the destinations' state from the rows before these (a task delivers its window in
    chunks, ``deliver_chunks``): one that was left unsent keeps its later messages unsent too.
    ``shapes``: each destination's send shape, known and learned (None: keyed batches until a refusal teaches).
    """
    waiting: dict[str, deque[list[tuple[Row, Outgoing]]]] = {}
    for group in send_groups(rows):
        first = group[0]
        if first["action"] != Action.DELIVER:
            outcome = NOT_SENT_OUTCOMES[Action(first["action"])]
            for row in group:
                yield Delivery(row, outcome, row["reason_code"], row["reason"], 0)
            continue
        pending = []
        for row in group:
            try:
                pending.append((row, build(row)))
            except ExpiredBeforeSendError as exc:  # a migrated message's expiry passed since it was classified
                yield Delivery(row, Outcome.EXPIRED, ReasonCode.EXPIRED_IN_SOURCE, str(exc)[:1024], 0)
            except RefusedBeforeSending as refused:  # its destination would refuse it for good: never sent
                yield Delivery(row, Outcome.DEAD_LETTERED, refused.reason_code, refused.reason[:1024], 0)
            except Exception as exc:  # noqa: BLE001 - one message's problem is that message's outcome
                yield Delivery(row, Outcome.DEAD_LETTERED, ReasonCode.RESTORE_FAILED,
                               f"the restored message could not be built: {type(exc).__name__}: {exc}"[:1024], 0)
        if pending:
            waiting.setdefault(first["destination"], deque()).append(pending)
    carry = carry or Carry()
    if carry.pacer is None:
        carry.pacer = pacer or Pacer(None, sink.throttle_recovery_seconds, clock())
    if carry.shapes is None:
        carry.shapes = shapes or SendShapes()
    yield from _DestinationRounds(waiting, sender=sender, classify=classify, sink=sink, limits=limits, clock=clock,
                                  sleep=sleep, on_sent=on_sent, carry=carry).run()


def deliver_chunks(chunks: Iterable[Iterable[Row]], *, pacer: Pacer | None = None, shapes: SendShapes | None = None,
                   **kwargs) -> Iterator[list[Delivery]]:
    """``deliver_rows`` over consecutive chunks of one task's rows (in sequence order), one list of
    results per chunk: a task's memory holds one chunk, not its whole window, and each destination's
    order and state (and the task's pacing) carry over from one chunk to the next."""
    carry = Carry(pacer=pacer, shapes=shapes)
    for chunk in chunks:
        yield list(deliver_rows(chunk, carry=carry, **kwargs))


@dataclass
class Carry:
    """What a task's delivery remembers from one chunk to the next."""

    retry: dict[str, _Retry] = field(default_factory=dict)
    left: dict[str, tuple[ReasonCode, str, float]] = field(default_factory=dict)  # destination -> why unsent
    pacer: Pacer | None = None
    # Destinations the service said require sessions (it refused a session-less message for that): their
    # later session-less messages are dead-lettered without being sent.
    sessions_required: set[str] = field(default_factory=set)
    shapes: SendShapes | None = None  # each destination's send shape (what refusals teach is kept in it)


@dataclass
class _Retry:
    attempts: int = 0  # failures in a row, throttling not counted
    throttled: int = 0  # throttling answers in a row
    failing_since: float | None = None
    next_try: float = 0.0
    # While a refused send is narrowed down: its first ``suspect`` messages (the destination's next ones)
    # hold a refused message. Sends take at most half of them, so each answer halves the range.
    suspect: int | None = None

    def largest_send(self, count: int) -> int:
        return count if self.suspect is None else min(count, max(1, self.suspect // 2))

    def went(self, sent: int) -> None:
        """``sent`` of the destination's next messages were delivered: the refused one lies after them."""
        if self.suspect is not None:
            self.suspect = self.suspect - sent if self.suspect > sent else None


class _DestinationRounds:
    """Sends each destination's groups in order, taking turns between destinations, so that one that
    fails waits (with back-off) without holding the others up."""

    def __init__(self, waiting, *, sender: Sender, classify, sink: SinkConfig, limits: RoundLimits, clock, sleep,
                 on_sent, carry: Carry):
        self.waiting = waiting
        self.sender, self.classify, self.sink, self.limits = sender, classify, sink, limits
        self.clock, self.sleep, self.on_sent = clock, sleep, on_sent
        self.carry = carry
        self.pacer: Pacer = carry.pacer
        for destination in waiting:
            carry.retry.setdefault(destination, _Retry(failing_since=limits.unavailable_since.get(destination)))
        self.retry = carry.retry

    def run(self) -> Iterator[Delivery]:
        for destination in [d for d in self.waiting if d in self.carry.left]:
            yield from self._leave(destination, *self.carry.left[destination])
        while self.waiting:
            now = self.clock()
            if now >= self.limits.deadline:
                for destination in list(self.waiting):
                    yield from self._leave(destination, ReasonCode.ROUND_DEADLINE,
                                           "the send round ended before the lease could run out; the next round "
                                           "sends it", self.retry[destination].failing_since or now)
                return
            ready = [d for d in self.waiting if self.retry[d].next_try <= now]
            if not ready:
                wake = min(self.retry[d].next_try for d in self.waiting)
                self.sleep(max(0.0, min(wake, self.limits.deadline) - now))
                continue
            # The ready destination whose next message came first: the backlog's order, as far as it can be kept.
            destination = min(ready, key=lambda d: self.waiting[d][0][0][0]["sequence_number"])
            # As many of its next messages as the pacer lets one send carry, once it lets them go.
            largest = self.pacer.largest_send()
            group = self.waiting[destination][0]
            largest = self.retry[destination].largest_send(len(group) if largest is None else min(largest, len(group)))
            count = next_send_size(self.carry.shapes.of(destination), [message for _, message in group[:largest]])
            wait = self.pacer.wait(count, now)
            if wait > 0:
                self.sleep(max(0.0, min(now + wait, self.limits.deadline) - now))
                continue
            yield from self._send_next(destination, count, now)

    def _send_next(self, destination: str, count: int, now: float) -> Iterator[Delivery]:
        groups = self.waiting[destination]
        group = groups[0]
        retry = self.retry[destination]
        if destination in self.carry.sessions_required and group[0][0]["session_id"] is None:
            yield from self._dead_letter(destination, group, session_required(destination), retry.attempts)
            return
        self.pacer.sending(count, now)
        singly = self.carry.shapes.of(destination) is SendShape.SINGLE_MESSAGES
        try:
            send = self.sender.send_singly if singly else self.sender.send
            sent = send(destination, [message for _, message in group[:count]])
            cause, attempted = None, 0
        except PartialSendError as error:
            sent, cause, attempted = error.sent, error.cause, error.attempted
        for row, _ in group[:sent]:
            yield Delivery(row, Outcome.DELIVERED, None, None, retry.attempts + 1)
        group = groups[0] = group[sent:]
        retry.went(sent)
        if sent:
            self.pacer.observe(PaceEvent(PaceSignal.SENT, self.clock(), sent))
            self.on_sent()
            retry.attempts, retry.throttled, retry.failing_since = 0, 0, None
        if cause is None:
            if not group:
                self._done_with_group(destination)
            return
        failure = self.classify(cause, destination)
        if failure.failure_class is SendFailureClass.THROTTLED:
            # from when the refusal came: the SDK's own retries of a ServerBusy take a second or two
            yield from self._throttled(destination, failure, self.clock())
            return
        if failure.reason_code == ReasonCode.BATCH_SHAPE_REFUSED:
            if self._shape_refused(destination, failure, attempted):
                return  # the same messages go again, one per send
            # one message refused with those words: refused for itself (the service says so of a message
            # without a MessageId), the outcome of that message under the code of any message refusal
            failure, attempted = SendFailure(False, ReasonCode.DESTINATION_REFUSED, failure.reason), max(attempted, 1)
        if failure.failure_class is SendFailureClass.REFUSED and attempted:
            # Final for one message of the send (or for its shape): never dead-letter a message that could
            # have been delivered. Send fewer at once until the refused one goes alone; the link is fine.
            if attempted > 1:
                retry.suspect = attempted
                logger.info("destination=%s backlog=%s sequence_number=%s refused a send of %d message(s) (%s): "
                            "sending fewer at once to find the refused one", destination,
                            group[0][0]["backlog_queue"], group[0][0]["sequence_number"], attempted, failure.reason)
                return
            retry.suspect = None
            if failure.reason_code == ReasonCode.SESSION_REQUIRED:
                self.carry.sessions_required.add(destination)
            yield from self._dead_letter(destination, group[:1], failure, retry.attempts + 1)
            return
        self.sender.reset(destination)
        if not failure.transient:  # the destination refuses everything (or its link was refused)
            yield from self._dead_letter(destination, group, failure, retry.attempts + 1)
            return
        retry.attempts += 1
        retry.failing_since = retry.failing_since if retry.failing_since is not None else now
        waited = now - retry.failing_since
        first_row = group[0][0]
        logger.warning("destination=%s backlog=%s sequence_number=%s send failed (%s), attempt %d, failing for %.0f s",
                       destination, first_row["backlog_queue"], first_row["sequence_number"], failure.reason,
                       retry.attempts, waited)
        if waited >= self.sink.outage_wait_seconds:
            yield from self._leave_unavailable(destination, failure, retry.failing_since)
            return
        backoff = self.sink.max_retry_backoff_seconds
        if retry.attempts < self.sink.max_send_attempts:
            backoff = min(backoff, self.sink.retry_backoff_seconds * 2 ** (retry.attempts - 1))
        retry.next_try = now + backoff

    def _shape_refused(self, destination: str, failure: SendFailure, attempted: int) -> bool:
        """Whether a refusal for the send's shape was a batch's (True): the destination gets single messages
        from now on, and the batch goes again that way. False: a single message was refused."""
        if attempted > 1 or (attempted == 0 and self.carry.shapes.of(destination) is not SendShape.SINGLE_MESSAGES):
            first_row = self.waiting[destination][0][0][0]
            self.carry.shapes.refusals += 1
            if self.carry.shapes.learn(destination):
                logger.warning("destination=%s backlog=%s sequence_number=%s reason_code=%s refused a batch of %d "
                               "for its shape (%s): sending its messages one at a time from now on",
                               destination, first_row["backlog_queue"], first_row["sequence_number"],
                               ReasonCode.BATCH_SHAPE_REFUSED, attempted, failure.reason)
            return True
        return False

    def _throttled(self, destination: str, failure: SendFailure, now: float) -> Iterator[Delivery]:
        """The primary is over its capacity: the task slows down (the pacer) and this destination waits,
        on the same link, without spending ``sink.max_send_attempts``; ``sink.outage_wait_seconds`` still
        bounds how long it may last."""
        retry = self.retry[destination]
        self.pacer.observe(PaceEvent(PaceSignal.THROTTLED, now))
        retry.throttled += 1
        retry.failing_since = retry.failing_since if retry.failing_since is not None else now
        waited = now - retry.failing_since
        first_row = self.waiting[destination][0][0][0]
        logger.warning("destination=%s backlog=%s sequence_number=%s throttled (%s), %d in a row, for %.0f s; "
                       "rate limit now %s msg/s", destination, first_row["backlog_queue"],
                       first_row["sequence_number"], failure.reason, retry.throttled, waited,
                       "none" if self.pacer.controller.rate is None else f"{self.pacer.controller.rate:.0f}")
        if waited >= self.sink.outage_wait_seconds:
            yield from self._leave_unavailable(destination, failure, retry.failing_since)
            return
        retry.next_try = now + min(self.sink.max_retry_backoff_seconds,
                                   self.sink.retry_backoff_seconds * 2 ** min(retry.throttled - 1, 30))

    def _leave_unavailable(self, destination: str, failure: SendFailure, since: float) -> Iterator[Delivery]:
        """Failing (or throttled) for all of ``sink.outage_wait_seconds``: its rows are left unsent."""
        if failure.failure_class is SendFailureClass.THROTTLED:
            # Not an outage: the primary namespace is out of its credits (or a destination is full) for longer
            # than the wait. Say what this task spent, and what to change.
            reason = (f"the primary namespace throttled sends to '{destination}' for "
                      f"{self.sink.outage_wait_seconds:.0f} s ({failure.reason}) after this send task sent "
                      f"{self.pacer.sent_total} message(s) ({self.pacer.sent_total} credits); set "
                      f"primary.max_credits_per_second (or sink.max_messages_per_second) to what its other clients "
                      f"leave of its 1,000 credits a second, or move it to Premium (no credit budget); nothing was "
                      f"lost: its messages stay in the backlog for the next run")
        else:
            reason = (f"destination '{destination}' stayed unavailable for {self.sink.outage_wait_seconds:.0f} s "
                      f"({failure.reason}); nothing was lost: its messages stay in the backlog for the next run")
        yield from self._leave(destination, ReasonCode.DESTINATION_UNAVAILABLE, reason, since)

    def _dead_letter(self, destination: str, rows: list, failure: SendFailure, attempts: int) -> Iterator[Delivery]:
        """Dead-letter the first ``len(rows)`` waiting messages of the destination's next group."""
        for row, _ in rows:
            logger.info("destination=%s backlog=%s sequence_number=%s message_id=%s outcome=%s reason_code=%s",
                        destination, row["backlog_queue"], row["sequence_number"], row["message_id"],
                        Outcome.DEAD_LETTERED, failure.reason_code)
            yield Delivery(row, Outcome.DEAD_LETTERED, failure.reason_code, failure.reason, attempts)
        groups = self.waiting[destination]
        groups[0] = groups[0][len(rows):]
        if not groups[0]:
            self._done_with_group(destination)

    def _done_with_group(self, destination: str) -> None:
        groups = self.waiting[destination]
        groups.popleft()
        self.retry[destination].suspect = None
        if not groups:
            del self.waiting[destination]

    def _leave(self, destination: str, reason_code: ReasonCode, reason: str, since: float) -> Iterator[Delivery]:
        """Every message still waiting for ``destination`` stays unsent (in order; nothing after it goes either)."""
        attempts = self.retry[destination].attempts
        self.carry.left[destination] = (reason_code, reason, since)
        for group in self.waiting.pop(destination):
            for row, _ in group:
                yield Delivery(row, Outcome.UNSENT, reason_code, reason[:1024], attempts, since)
