"""Messages a receive never brings: scheduled ones are cancelled, deferred ones received by sequence number, each
settled within its lock (``servicebus.lock_settlement``). I/O."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from azure.servicebus.exceptions import MessageNotFoundError

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.model import SettleKind
from backlog_syphon.servicebus.clients import discard_source_sender, source_sender
from backlog_syphon.servicebus.lock_settlement import give_back, lock_end_of, settle_all
from backlog_syphon.servicebus.peek import first_identity_from
from backlog_syphon.purge.plan import PurgePlan, PurgeResult
from backlog_syphon.servicebus.sdk_internals import received_identity, release_message
from backlog_syphon.purge.settle_timing import SettleTiming

logger = logging.getLogger(__name__)


ANY_SESSION = object()  # a plain receiver receives deferred messages whatever SessionId they carry


@dataclass(frozen=True)
class SpecialSettlement:
    """What ``settle_special`` settled: completed (cancelled, or received and completed) and dead-lettered."""

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


def settle_special(namespace: NamespaceConfig, peeker, plan: PurgePlan, timing: SettleTiming,
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
            give_back(receiver, [message for message in group if message.sequence_number in settlement.left])
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
