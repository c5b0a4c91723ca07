"""Delivering one backlog queue's rows: grouping, building, sending with retries, and one outcome per
row. Pure: building, sending and waiting for the primary are passed in (``servicebus.send`` has the
real ones), so the retry state machine is tested with fakes in milliseconds.

Invariants:
- Order: rows are sent in sequence-number order per destination and session; a batched send holds
  consecutive messages of one destination and session only.
- One row, one outcome: delivered, dead-lettered (with a reason code and text) or skipped.
- No single message stops the run: a message that cannot be built (decoded, restored, encoded)
  becomes that message's dead-letter outcome, with the exception's text, and the rest goes on.
- A transient failure is retried with back-off, and after every ``max_send_attempts`` failures the
  primary is waited for (health probe) rather than drained into failure; a destination that stays
  unavailable fails the batch (nothing recorded, so nothing lost) rather than reorder or drop.
- A final failure (no such destination, not authorized, too large) dead-letters the messages it
  concerns: the first pending one for "too large", all pending ones of the group otherwise.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

from backlog_syphon.config import SinkConfig
from backlog_syphon.model import Action, Outcome, ReasonCode

logger = logging.getLogger(__name__)

Row = Mapping[str, Any]  # a classified backlog row (``restore.rows`` columns + the restore rules')


@dataclass(frozen=True)
class Outgoing:
    """A restored message ready to send: its AMQP bytes and what a batch envelope needs."""

    encoded: bytes
    message_id: str | None
    session_id: str | None
    partition_key: str | None


@dataclass(frozen=True)
class SendFailure:
    """How a send error is handled: retried (transient) or final for the messages concerned."""

    transient: bool
    reason_code: ReasonCode
    reason: str


class PartialSendError(Exception):
    """A send that stopped after ``sent`` messages of the group went out, because of ``cause``."""

    def __init__(self, sent: int, cause: BaseException):
        super().__init__(f"{sent} sent before {type(cause).__name__}")
        self.sent = sent
        self.cause = cause


class PrimaryUnreachableError(RuntimeError):
    """The primary stayed unreachable for the whole outage wait: the batch fails, nothing is lost."""


class Sender(Protocol):
    def send(self, destination: str, messages: Sequence[Outgoing]) -> int:
        """Send in order; return how many went, or raise ``PartialSendError``."""

    def reset(self, destination: str) -> None:
        """Drop the destination's link after an error."""

    def wait_until_reachable(self, destination: str, max_wait_seconds: float) -> bool:
        """Probe the primary until it answers (True) or the wait is over (False)."""


@dataclass(frozen=True)
class Delivery:
    """What became of one row."""

    row: Row
    outcome: Outcome
    reason_code: ReasonCode | str | None  # a ReasonCode, or its value as the restore rules' column holds it
    reason: str | None
    attempts: int


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
            key = (row["backlog_queue"], "deliver", row["destination"], row["session_id"], row.get("partition_key"))
        else:
            key = (row["backlog_queue"], "reject", row["sequence_number"], None, None)
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def deliver_rows(rows: Iterable[Row], *, build: Callable[[Row], Outgoing], sender: Sender,
                 classify: Callable[[BaseException, str], SendFailure], sink: SinkConfig,
                 sleep: Callable[[float], None] = time.sleep, on_sent: Callable[[], None] = lambda: None
                 ) -> Iterator[Delivery]:
    """Deliver rows (one backlog queue's, or several) and yield one ``Delivery`` per row.

    ``on_sent`` is called after each send that delivered something (a test hook for crashes).
    """
    for group in send_groups(rows):
        first = group[0]
        if first["action"] != Action.DELIVER:
            outcome = Outcome.SKIPPED_PING if first["action"] == Action.SKIP else Outcome.DEAD_LETTERED
            for row in group:
                yield Delivery(row, outcome, row["reason_code"], row["reason"], 0)
            continue
        yield from _deliver_group(group, build=build, sender=sender, classify=classify, sink=sink, sleep=sleep,
                                  on_sent=on_sent)


def _deliver_group(group: list[Row], *, build, sender: Sender, classify, sink: SinkConfig, sleep,
                   on_sent) -> Iterator[Delivery]:
    destination = group[0]["destination"]
    pending: list[tuple[Row, Outgoing]] = []
    for row in group:
        try:
            pending.append((row, build(row)))
        except Exception as exc:  # noqa: BLE001 - one message's problem is that message's outcome
            yield Delivery(row, Outcome.DEAD_LETTERED, ReasonCode.RESTORE_FAILED,
                           f"the restored message could not be built: {type(exc).__name__}: {exc}"[:1024], 0)
    attempts = 0
    while pending:
        attempts += 1
        try:
            sent = sender.send(destination, [message for _, message in pending])
            cause = None
        except PartialSendError as error:
            sent, cause = error.sent, error.cause
        for row, _ in pending[:sent]:
            yield Delivery(row, Outcome.DELIVERED, None, None, attempts)
        pending = pending[sent:]
        if sent:
            on_sent()
        if cause is None:
            return
        failure = classify(cause, destination)
        sender.reset(destination)
        if not failure.transient:
            # Too large: only the first pending message is at fault; the rest may still go.
            rejected = pending[:1] if failure.reason_code == ReasonCode.MESSAGE_TOO_LARGE else pending
            for row, _ in rejected:
                yield Delivery(row, Outcome.DEAD_LETTERED, failure.reason_code, failure.reason, attempts)
            pending = pending[len(rejected):]
            continue
        logger.warning("destination=%s backlog=%s sequence_number=%s transient send failure (%s), attempt %d",
                       destination, pending[0][0]["backlog_queue"], pending[0][0]["sequence_number"],
                       failure.reason, attempts)
        if attempts % sink.max_send_attempts == 0:
            # Persistently failing: wait for the primary instead of draining into failure.
            if not sender.wait_until_reachable(destination, sink.outage_wait_seconds):
                raise PrimaryUnreachableError(
                    f"the primary namespace stayed unreachable for {sink.outage_wait_seconds:.0f} s while sending to "
                    f"'{destination}' ({failure.reason}); nothing was lost, run again when it is back")
        else:
            sleep(min(sink.max_retry_backoff_seconds, sink.retry_backoff_seconds * 2 ** (attempts - 1)))
