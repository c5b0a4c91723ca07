"""Settling backlog messages for the purge: receive exactly what is planned, complete or dead-letter it,
release anything else, and leave no receive credit open.

The decisions are ``purge_plan.PurgeProgress``'s (pure); this is the I/O. Nothing here completes a
backlog message it has not been told was recorded. The receive goes through the SDK's decoder, which
only needs sequence numbers and lock tokens here (``decoder_patch`` teaches it the AMQP types legacy
clients write; ``clients`` installs it). Private SDK details used, pinned by azure-servicebus==7.15.0 and covered by tests:
the receive link's credit and buffer (``revoke_credit``) and the management form of settlement
(``complete_all``).
"""

from __future__ import annotations

import dataclasses
import logging
import queue as queue_module

from azure.servicebus.exceptions import ServiceBusError

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.servicebus.clients import pooled_receiver
from backlog_syphon.servicebus.peek import first_sequence_number_from, peek_sequence_numbers
from backlog_syphon.servicebus.purge_plan import PurgePlan, PurgeProgress, PurgeResult

logger = logging.getLogger(__name__)


def purge_backlog(namespace: NamespaceConfig, plan: PurgePlan, *, max_wait_seconds: float = 5.0) -> PurgeResult:
    """Settle what ``plan`` says in one backlog queue: complete or dead-letter recorded messages only.

    The decisions are ``purge_plan.PurgeProgress``'s; this receives (PeekLock, exactly as many as are
    planned), settles, and makes sure no receive credit stays open, so nothing that is not recorded is
    locked between calls (see ``revoke_credit``). Anything received outside the plan is released,
    which does not raise its delivery count.
    """
    with pooled_receiver(namespace, plan.queue, purpose="settle") as receiver:
        if plan.verify and plan.expected:
            present = len(peek_sequence_numbers(receiver, plan.first, plan.through))
            plan = dataclasses.replace(plan, expected=min(plan.expected, present))
        progress = PurgeProgress(plan)
        revoke_credit(receiver)  # the link's attach gave the broker one credit of its own
        while credit := progress.credit():
            page = receiver.receive_messages(max_message_count=credit, max_wait_time=max_wait_seconds)
            revoke_credit(receiver)  # a call that returns early leaves the rest of its credit open
            by_seq = {message.sequence_number: message for message in page}
            actions = progress.on_page(sorted(by_seq))
            for seq in actions.release:
                release_message(receiver, by_seq[seq])
            for seq, reason_code, reason in actions.dead_letter:
                receiver.dead_letter_message(by_seq[seq], reason=reason_code, error_description=reason[:1024])
            failed = complete_all(receiver, [by_seq[seq] for seq in actions.complete])
            progress.on_settled(len(actions.complete) - len(failed), len(actions.dead_letter))
            if actions.release:
                logger.warning("backlog=%s purge received sequence numbers %s outside its plan [%d, %d]; released "
                               "them untouched", plan.queue, list(actions.release), plan.first, plan.through)
        # Whatever could not be settled (lock lost, not there yet) is still there: look, don't count.
        # The peek is also the barrier behind any transfer still on its way (see revoke_credit).
        first_still_there = first_sequence_number_from(receiver, plan.first)
        release_buffered(receiver)
        return progress.result(first_still_there)


def revoke_credit(receiver) -> None:
    """Take back the receive credit the SDK leaves open, and release what it brought in.

    azure-servicebus 7.15.0 leaves the unused credit of a receive call that returns early open, and
    grants one credit more whenever a call uses up its credit before its batch is full; messages
    that arrive on such credit are locked. This sets the credit to 0 (a drain) and releases what is
    buffered (no delivery count). Transfers the broker sent before it saw the drain can still be on
    their way: a later call on the same connection reads them first (the next receive call counts
    them against its credit; the purge's closing peek is answered only after them, and the SDK
    releases what arrives outside a receive call).
    """
    handler = getattr(receiver, "_handler", None)
    link = getattr(handler, "_link", None)
    if link is None or getattr(link, "_is_closed", True):
        return
    if link.current_link_credit > 0:
        link.flow(link_credit=0, drain=True)
    release_buffered(receiver)


def release_buffered(receiver) -> None:
    """Release every message the SDK holds in its buffer (received outside, or beyond, a receive call)."""
    handler = receiver._handler  # noqa: SLF001
    while True:
        try:
            frame, _ = handler._received_messages.get_nowait()  # noqa: SLF001
        except queue_module.Empty:
            return
        handler.settle_messages(frame[1], frame[2], "released")
        handler._received_messages.task_done()  # noqa: SLF001


def release_message(receiver, message) -> None:
    """Give a received message back without settling it: unlike abandon, its delivery count stays."""
    receiver._handler.settle_messages(message._delivery_id, message._delivery_tag, "released")  # noqa: SLF001


def complete_all(receiver, messages: list) -> set[int]:
    """Complete received messages with one management request instead of one round trip each.

    ``update-disposition`` with a list of lock tokens is the management form of settlement (the
    SDK itself falls back to it); if it fails, each message is completed on its own. Returns the
    sequence numbers that could not be completed (their locks were lost).
    """
    if not messages:
        return set()
    try:
        receiver._settle_message_via_mgmt_link("completed", [m.lock_token for m in messages])  # noqa: SLF001
        return set()
    except ServiceBusError as exc:
        logger.info("bulk completion failed (%s); completing one by one", type(exc).__name__)
    failed = set()
    for message in messages:
        try:
            receiver.complete_message(message)
        except ServiceBusError as exc:
            logger.warning("sequence_number=%s not completed (%s)", message.sequence_number, type(exc).__name__)
            failed.add(message.sequence_number)
    return failed
