"""Answering a client's attach: which node it names (``$cbs``, an entity's ``$management``, a queue or
topic to send to, an entity to receive from), whether the namespace lets it, and for a session receiver
which session it gets (the one it names, the next available, or a wait until one is).

Invariants:
- an attach is checked in one order, and the first check that fails answers it: the node exists, a token
  grants the right, the entity is not busy, its status allows it (receivers), the receiver's kind
  (session or not) matches the entity;
- a sender's link advertises the entity's maximum message size and no batch size (the SDK then takes its
  own fallback, as against the service).
"""
from __future__ import annotations

from typing import Dict

from proton import Link, symbol

from . import aad, cbs, codec, refusals
from .broker import now_ms
from .links import SESSION_FILTER, LinkCtx, open_link, open_session, reject, try_next_session
from .namespace import entity_path, not_found

OPERATION_TIMEOUT = symbol("com.microsoft:timeout")
DEFAULT_SESSION_WAIT_MS = 60000


def on_link_open(c, link: Link):
    ns = c.ns
    address = (link.remote_source if link.is_sender else link.remote_target).address
    path = entity_path(address)
    lower = path.lower()
    if lower == "$cbs":
        ctx = LinkCtx("cbs-out" if link.is_sender else "cbs-in", c, link, path)
        open_link(ctx)
        if link.is_sender:
            c.reply_links["$cbs"] = link
        return
    if lower.endswith("/$management"):
        node = lower[: -len("/$management")]
        target = ns.entities.get(node) or ns.senders.get(node)
        if target is None:
            return reject(link, "amqp:not-found", not_found(ns, node).description)
        # server-busy is answered per request (503), not on attach
        ctx = LinkCtx("mgmt-out" if link.is_sender else "mgmt-in", c, link, path, target)
        open_link(ctx)
        if link.is_sender:
            c.reply_links[lower] = link
        return
    if lower.startswith("$") or not lower:
        return reject(link, "amqp:not-implemented", f"The emulator does not support the node '{path}'.")
    if link.is_receiver:   # the client sends to us
        return _open_sender(c, link, path)
    return _open_receiver(c, link, path)


def _open_sender(c, link: Link, path: str):
    ns, lower = c.ns, path.lower()
    target = ns.senders.get(lower)
    if target is None:
        if lower in ns.entities:
            return reject(link, "amqp:not-allowed", f"Cannot send to '{path}': not a queue or topic.")
        return reject(link, "amqp:not-found", not_found(ns, path).description)
    refusal = cbs.refusal(c, path, aad.SEND)
    if refusal is not None:
        return reject(link, refusal.condition, refusal.description)
    busy = refusals.busy_refusal(ns, path)
    if busy is not None:
        return reject(link, busy.condition, busy.description)
    # like the service, no com.microsoft:max-message-batch-size: the SDK then takes 256 KB, or
    # 1 MB where the entity takes messages of 1 MB or more (its own fallback)
    link.max_message_size = target.settings.max_message_size_kb * 1024
    target.ops["attach"] += 1
    open_link(LinkCtx("send", c, link, path, target))


def _open_receiver(c, link: Link, path: str):
    ns, lower = c.ns, path.lower()
    entity = ns.entities.get(lower)
    if entity is None:
        return reject(link, "amqp:not-found", not_found(ns, path).description)
    refusal = cbs.refusal(c, path, aad.LISTEN)
    if refusal is not None:
        return reject(link, refusal.condition, refusal.description)
    busy = refusals.busy_refusal(ns, path)
    if busy is not None:
        return reject(link, busy.condition, busy.description)
    refusal = refusals.status_refusal(ns, entity, send=False)
    if refusal is not None:
        return reject(link, refusal.condition, refusal.description)
    ctx = LinkCtx("recv", c, link, path, entity)
    ctx.rad = link.remote_snd_settle_mode == Link.SND_SETTLED
    entity.ops["attach"] += 1
    source_filters = _filters(link.remote_source)
    wants_session = SESSION_FILTER in source_filters
    if wants_session != entity.requires_session:
        return reject(link, "amqp:not-allowed",
                      f"'{path}' {'requires' if entity.requires_session else 'does not support'} "
                      f"session receivers.")
    if not wants_session:
        open_link(ctx)
        entity.consumers.append(ctx)
        return
    sid = source_filters.get(SESSION_FILTER)
    link.ctx = ctx
    if sid is not None:
        sid = codec.as_text(sid)
        s = entity.session(sid)
        if s.owner is not None and s.locked_until > now_ms():
            link.ctx = None
            return reject(link, "com.microsoft:session-cannot-be-locked",
                          f"The requested session '{sid}' cannot be accepted. It may be locked by "
                          f"another receiver.")
        open_session(ctx, s)
    else:
        timeout = (link.remote_properties or {}).get(OPERATION_TIMEOUT)
        ctx.deadline = now_ms() + int(timeout if timeout is not None else DEFAULT_SESSION_WAIT_MS)
        if not try_next_session(entity, ctx):
            entity.session_waiters.append(ctx)


def _filters(source) -> Dict:
    """An attach's source filter map, keys as symbols."""
    data = source.filter
    data.rewind()
    if not data.next():
        return {}
    obj = codec.owned(data.get_object())
    return {symbol(str(k)): v for k, v in obj.items()} if isinstance(obj, dict) else {}
