"""What the client transfers to a queue or topic, and how it settles what it received: a message (or a
batch envelope) sent on a sender's link is checked and stored, or refused; a disposition of a delivered
message completes, abandons, defers, dead-letters or releases it.

Invariants:
- a transfer is stored whole or refused whole (a batch is one transfer), and its outcome is the
  transfer's disposition: accepted, or rejected with the refusal's condition; a refusal the service
  answers by detaching (``refusals.LinkRefusal``) leaves the transfer unsettled;
- a disposition refused (injected fault, a status that does not receive) leaves the message locked and
  the link holding its token, so a retry can still settle it.
"""
from __future__ import annotations

import time
from typing import List

from proton import Delivery, Disposition

from . import aad, cbs, codec, refusals
from .broker import BrokerError, Entity, Topic, now_ms
from .credits import CreditKind
from .links import LinkCtx, detach, pump, reject_delivery
from .message import Content, is_batch_envelope
from .namespace import Namespace, not_found, store


# ---- sends -----------------------------------------------------------------------------------------
def on_message(ctx: LinkCtx, d: Delivery, raw: bytes):
    """A whole transfer on a sender's link: store it, and answer its disposition."""
    error = cbs.refusal(ctx.conn, ctx.path, aad.SEND)
    try:
        if error is None:
            _send(ctx, raw)
    except refusals.LinkRefusal as exc:     # the transfer stays unsettled: the detach answers it
        detach(ctx, exc.condition, exc.description)
        return
    except BrokerError as exc:
        error = exc
    if error is not None:
        reject_delivery(d, error)
    elif not d.settled:
        d.update(Disposition.ACCEPTED)
    d.settle()


def _send(ctx: LinkCtx, raw: bytes):
    ns, target = ctx.conn.ns, ctx.target
    target.ops["send"] += 1
    refusal = ns.load_refusal(CreditKind.SEND, target.path)
    if refusal is not None:
        raise refusal
    limit = target.settings.max_message_size_kb * 1024
    if len(raw) > limit:
        raise BrokerError("amqp:link:message-size-exceeded",
                          f"The received message (size {len(raw)} bytes) exceeds the limit "
                          f"({limit} bytes) of '{target.path}'.")
    inner = is_batch_envelope(raw)
    if inner is not None:
        target.ops["send_batch"] += 1
        refusal = refusals.batch_refusal(ns, target, count=len(inner), size=len(raw), link_name=ctx.link.name,
                                         link_number=ctx.number)
        if refusal is not None:
            raise refusal
    try:
        contents = [Content.parse(r) for r in (inner or [raw])]
    except codec.DecodeError as exc:
        raise BrokerError("amqp:decode-error", f"Cannot decode the message: {exc}") from None
    enqueue(ns, target, contents, batch=inner is not None)
    ns.spend(CreditKind.SEND, len(contents))
    if isinstance(target, Topic):      # each message is evaluated against every subscription's rules
        ns.spend(CreditKind.FILTER, len(contents) * target.filter_count)


def enqueue(ns: Namespace, target, contents: List[Content], *, batch: bool = False) -> List[int]:
    """Store messages in a queue or topic (a send, or a schedule request); returns their sequence numbers
    (-1 = not stored). A ``batch`` (one transfer's envelope) is one partition's on a partitioned entity."""
    if not ns.exists(target):     # a transfer that was on its way when the queue was deleted
        raise not_found(ns, target.path)
    refusal = (ns.send_refusal(target.path) or refusals.status_refusal(ns, target, send=True)
               or refusals.message_refusal(ns, target, contents)
               or (refusals.partitioned_batch_refusal(ns, target, contents) if batch else None))
    if refusal is not None:
        raise refusal
    seqs, touched = store(target, contents, now_ms(), batch=batch)
    for e in touched:
        pump(e)
    return seqs


# ---- settlements -----------------------------------------------------------------------------------
def on_settlement(ctx: LinkCtx, d: Delivery):
    token = getattr(d, "ctx", None)
    entity = ctx.target
    state = d.remote_state
    ctx.active_at = time.monotonic()
    if token is None:
        d.settle()
        return
    ns = ctx.conn.ns
    if not d.settled:     # only a disposition the client waits an answer for can be refused
        fault = ns.faults.take("settle", entity)
        error = fault.error() if fault is not None else refusals.status_refusal(ns, entity, send=False)
        if error is None and state != Disposition.RELEASED:
            error = ns.load_refusal(CreditKind.SETTLE, entity.path)
        if error is not None:
            # the message keeps its lock (and this link its token): a retry can still settle it
            reject_delivery(d, error)
            d.settle()
            return
    ctx.tokens.discard(token)
    try:
        if ctx.session is not None and (ctx.session.owner is not ctx or ctx.session.locked_until <= now_ms()):
            raise BrokerError("com.microsoft:session-lock-lost", "The session lock was lost.", 410)
        if state == Disposition.RELEASED:
            m = entity.locks.get(token)
            if m is not None:
                entity.ops["release"] += 1
                entity.abandon(m, count=False)
        else:
            m = entity.locked(token)
            _settle(entity, m, state, d.remote)
            ns.spend(CreditKind.SETTLE, 1)
        if not d.settled:
            if state == Disposition.MODIFIED:
                d.local.failed = d.remote.failed
                d.local.undeliverable = d.remote.undeliverable
            d.update(state)
    except BrokerError as exc:
        reject_delivery(d, exc)
    d.settle()
    pump(entity)


def _settle(entity: Entity, m, state, remote):
    if state == Disposition.ACCEPTED:
        entity.ops["complete"] += 1
        entity.complete(m)
    elif state == Disposition.MODIFIED:
        if remote.undeliverable:
            entity.ops["defer"] += 1
            entity.defer(m)
        else:
            entity.ops["abandon"] += 1
            entity.abandon(m)
    elif state == Disposition.REJECTED:
        cond = remote.condition
        info = {str(k): codec.as_text(v) for k, v in ((cond.info if cond else None) or {}).items()}
        entity.ops["dead_letter"] += 1
        entity.dead_letter(m, info.get("DeadLetterReason"), info.get("DeadLetterErrorDescription"))
    else:
        raise BrokerError("amqp:not-implemented", f"Unsupported delivery outcome {state}.", 501)
