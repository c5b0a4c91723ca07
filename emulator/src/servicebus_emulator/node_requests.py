"""Requests to a connection's ``$cbs`` node (put-token) and to an entity's ``$management`` node: the
request decoded, checked, handed to ``cbs`` or ``management``, and answered on the reply link the client
attached for it.

Invariants:
- a management request is checked in one order, and the first check that fails answers it (a status code
  with ``errorCondition``): the entity still exists, it is not busy, a token grants the operation's right
  (Send for scheduling, Listen for the rest), no injected fault takes it, its status allows it;
- a request whose reply link is gone is dropped (logged).
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Dict

from proton import Delivery, Disposition, Message, symbol

from . import aad, cbs, codec, management, refusals
from .broker import BrokerError
from .links import LinkCtx
from .namespace import not_found

log = logging.getLogger(__name__)

# Management operations that need Send; every other one needs Listen (as on Service Bus).
SEND_OPERATIONS = ("schedule-message", "cancel-scheduled-message")
REPLY_TAGS = itertools.count(1)


def on_request(ctx: LinkCtx, d: Delivery, raw: bytes):
    """A whole transfer on a ``$cbs`` or ``$management`` link: accept it, then answer it."""
    if not d.settled:
        d.update(Disposition.ACCEPTED)
    d.settle()
    req = Message()
    req.decode(raw)
    props = codec.owned(req.properties) or {}
    body = codec.owned(req.body)
    msg_id = codec.owned(req.id)
    reply_to = (req.reply_to or "").lower()
    if ctx.kind == "cbs-in":
        code, desc = cbs.put_token(ctx.conn, props, body)
        resp = Message(correlation_id=msg_id, properties={"status-code": code, "status-description": desc})
        link = ctx.conn.reply_links.get("$cbs")
    else:
        op = codec.as_text(props.get("operation")) or ""
        try:
            code, result = _management(ctx, op, body if isinstance(body, dict) else {}, props)
            resp = Message(correlation_id=msg_id, body=result,
                           properties={"statusCode": code, "statusDescription": "OK" if code < 300 else ""})
        except BrokerError as exc:
            resp = Message(correlation_id=msg_id, body=None,
                           properties={"statusCode": exc.status, "statusDescription": exc.description,
                                       "errorCondition": symbol(exc.condition)})
        link = ctx.conn.reply_links.get(reply_to) or ctx.conn.reply_links.get(ctx.path.lower())
    if link is None:
        log.warning("no reply link for request on %s", ctx.path)
        return
    if getattr(link, "ctx", None) is not None:
        link.ctx.active_at = time.monotonic()
    reply = link.delivery(next(REPLY_TAGS).to_bytes(8, "big"))
    link.send(resp.encode())
    link.advance()
    reply.settle()


def _management(ctx: LinkCtx, op: str, body: Dict, props: Dict):
    ns = ctx.conn.ns
    target = ctx.target
    if not ns.exists(target):
        raise not_found(ns, target.path)
    name = management.operation_name(op)
    kind = management.credit_kind(name)
    refusal = ns.load_refusal(kind, target.path)
    if refusal is not None:
        raise refusal
    # a settlement fault takes update-disposition before a fault on every management operation
    refusal = cbs.refusal(ctx.conn, target.path, aad.SEND if name in SEND_OPERATIONS else aad.LISTEN)
    if refusal is not None:
        raise refusal
    fault = ns.faults.take("settle", target) if name == "update-disposition" else None
    fault = fault or ns.faults.take("management", target)
    if fault is not None:
        raise fault.error()
    refusal = refusals.status_refusal(ns, target, send=name in SEND_OPERATIONS)
    if refusal is not None:
        raise refusal
    result = None
    try:
        result = management.handle(ctx, target, op, body, props)
        return result
    finally:
        ns.spend(kind, management.credit_cost(name, body, result))
