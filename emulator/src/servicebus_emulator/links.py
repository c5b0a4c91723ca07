"""A link's life on the broker's side: opened or refused, detached, gone; and what it carries to a
receiver: messages as credit allows, locks, sessions. Functions of the loop thread, on proton links.

Invariants:
- a link that is gone (closed by either side, or its connection dropped) delivers nothing more, its session
  is free, and the entity's other receivers are served at once (``link_gone``);
- the locks of a receive link the client closed (a detach with ``closed=true``, as the SDK's ``close``
  sends) end with it: the messages are available again at once, delivery count + 1; those of a receive link
  lost otherwise (its connection dropped, its process killed, a detach without ``closed``, a detach by the
  broker) outlive it, as on the service: the messages stay locked until their locks end (then delivery
  count + 1) and their tokens settle through ``$management`` meanwhile. A session's messages are freed with
  its link either way (the session lock ends with it). ``release_locks_on_link_loss`` (tests only) frees
  them at once on every loss, as the emulator once did;
- a refused attach is answered with null termini and a closing detach that carries the condition (with a
  terminus present the SDK would report a retried connection error instead);
- every error condition carries an ``info`` map with a tracking id: the SDK indexes it unconditionally;
- a receive (a grant of credit) the namespace throttles (its ``server-busy`` switch, or no credits left:
  ``credits``) on a link that holds no lock detaches the link with ``com.microsoft:server-busy``: AMQP has
  no other answer to a flow, and the throttling text reaches receivers on their receive links
  (azure-sdk-for-java#37594); on a link that holds locks it is held until the namespace has credits again
  (a detach would lose every lock the link holds, and no report of a throttled namespace describes
  consumers losing theirs); a receive whose credits run out part way gets what was delivered so far, the
  rest once credits return;
- a receive gets at most its allowance (``short_receives``): a part of what it asked for, or all of it.
"""
from __future__ import annotations

import itertools
import time
import uuid
from typing import List, Optional

from proton import Condition, Delivery, Disposition, Link, Terminus, symbol

from . import aad, cbs, refusals
from .broker import BrokerError, Entity, now_ms
from .credits import CreditKind
from .idle import TIMED_KINDS

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
DOTNET_EPOCH_TICKS = 621355968000000000
INCOMING_CREDIT = 500
# After a short receive, its link gets nothing for this long: the SDK stops collecting 0.2 s after the first
# message of a receive arrived (``_further_pull_receive_timeout``), so the receive returns short.
SHORT_RECEIVE_PAUSE_SECONDS = 0.3
LINK_NUMBERS = itertools.count(1)    # the number a link goes by in the service's texts


def condition(name: str, description: str) -> Condition:
    """An AMQP error condition as the service sends them, with an ``info`` map (never null)."""
    return Condition(symbol(name), description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})


class LinkCtx:
    """What a link is for. kind: cbs-in/cbs-out/mgmt-in/mgmt-out/send/recv."""

    def __init__(self, kind: str, conn, link: Link, path: str, target=None):
        self.kind, self.conn, self.link, self.path, self.target = kind, conn, link, path, target
        self.buf: List[bytes] = []
        self.rad = False
        self.session = None          # broker Session for session receivers
        self.tokens: set = set()     # lock tokens delivered on this link and not settled
        self.closed = False
        self.deadline = 0            # next-available session wait
        self.active_at = time.monotonic()    # last transfer, flow, delivery or settlement (idle timer)
        self.number = next(LINK_NUMBERS)
        self.withheld = False        # this credit's receive comes back empty (``receive_empty_probability``)
        self.allowance = None        # messages this receive may still get (None: all it asked for)
        self.paused_until = 0.0      # a short receive's pause: nothing more is delivered before (monotonic)


# ---- opening, refusing, detaching ------------------------------------------------------------------
def reject(link: Link, name: str, description: str):
    """Answer an attach with null termini and a closing detach."""
    link.source.type = Terminus.UNSPECIFIED
    link.target.type = Terminus.UNSPECIFIED
    link.open()
    link.condition = condition(name, description)
    link.close()


def open_link(ctx: LinkCtx):
    link = ctx.link
    link.source.copy(link.remote_source)
    link.target.copy(link.remote_target)
    link.snd_settle_mode = link.remote_snd_settle_mode
    link.rcv_settle_mode = link.remote_rcv_settle_mode
    link.ctx = ctx
    ctx.conn.links.append(ctx)
    if ctx.kind in TIMED_KINDS:
        ctx.conn.linkless_since, ctx.conn.ever_linked = None, True
    link.open()
    if link.is_receiver:
        link.flow(INCOMING_CREDIT)


def detach(ctx: LinkCtx, name: str, description: str):
    """Close the link with an error the client sees on its next use: a loss, not a clean close (its locks
    outlive it, ``link_gone``)."""
    link = ctx.link
    link_gone(ctx)
    if link.state & Link.LOCAL_ACTIVE:
        link.condition = condition(name, description)
        link.close()


def link_gone(ctx: LinkCtx, *, closed_by_client: bool = False):
    """The link delivers nothing more. ``closed_by_client``: the client closed it (a detach with
    ``closed=true``); otherwise it was lost, and its locks outlive it (the module's invariants)."""
    if ctx.closed:
        return
    ctx.closed = True
    if ctx in ctx.conn.links:
        ctx.conn.links.remove(ctx)
        if ctx.kind in TIMED_KINDS and not any(other.kind in TIMED_KINDS for other in ctx.conn.links):
            ctx.conn.linkless_since = time.monotonic()
    if ctx.kind in ("cbs-out", "mgmt-out"):
        for k, v in list(ctx.conn.reply_links.items()):
            if v == ctx.link:
                del ctx.conn.reply_links[k]
    if ctx.kind != "recv":
        return
    entity = ctx.target
    if ctx in entity.consumers:
        entity.consumers.remove(ctx)
    if ctx in entity.session_waiters:
        entity.session_waiters.remove(ctx)
    if closed_by_client or ctx.session is not None or ctx.conn.ns.settings.release_locks_on_link_loss:
        # the locks end with the link: the messages become available again (count + 1)
        for token in list(ctx.tokens):
            m = entity.locks.get(token)
            if m is not None and m.lock_owner is ctx:
                entity.abandon(m)
    # else each stays locked until its lock ends (``Entity.tick`` then abandons it, count + 1); its token
    # still settles through ``$management`` (``management._update_disposition``)
    ctx.tokens.clear()
    if ctx.session is not None and ctx.session.owner is ctx:
        ctx.session.owner = None
        ctx.session.locked_until = 0
    pump(entity)


# ---- sessions --------------------------------------------------------------------------------------
def try_next_session(entity: Entity, ctx: LinkCtx) -> bool:
    now = now_ms()
    for s in entity.sessions.values():
        if (s.owner is None or s.locked_until <= now) and entity.has_available(s):
            if s.owner is not None:
                session_lost(entity, s)
            open_session(ctx, s)
            return True
    return False


def open_session(ctx: LinkCtx, s):
    entity, link = ctx.target, ctx.link
    s.owner = ctx
    s.locked_until = now_ms() + int(entity.settings.lock_duration_seconds * 1000)
    ctx.session = s
    link.properties = {LOCKED_UNTIL_UTC: s.locked_until * 10000 + DOTNET_EPOCH_TICKS}
    open_link(ctx)
    f = link.source.filter
    f.clear()
    f.put_object({SESSION_FILTER: s.id})
    entity.consumers.append(ctx)


def session_lost(entity: Entity, s):
    owner = s.owner
    s.owner, s.locked_until = None, 0
    if owner is not None and not owner.closed:
        detach(owner, "com.microsoft:session-lock-lost", "The session lock expired.")


# ---- delivering to receivers -----------------------------------------------------------------------
def pump(entity: Entity):
    """Serve the entity's receivers, and the session receivers waiting for a session of it."""
    for ctx in list(entity.consumers):
        pump_link(ctx)
    if entity.session_waiters:
        for w in list(entity.session_waiters):
            if try_next_session(entity, w):
                entity.session_waiters.remove(w)


def on_credit(ctx: LinkCtx):
    ctx.active_at = time.monotonic()
    link = ctx.link
    if link.credit > 0 and not link.drain_mode and not ctx.closed:
        ns, entity = ctx.conn.ns, ctx.target
        fault = ns.faults.take("receive", entity)
        refusal = fault.error() if fault is not None else ns.load_refusal(CreditKind.RECEIVE, entity.path)
        if refusal is not None and (fault is not None or not ctx.tokens):
            # the receive the credit was issued for fails, as when a namespace detaches a link
            detach(ctx, refusal.condition, refusal.description)
            return
        if refusal is not None:      # throttled, and the link holds locks: held until there are credits
            ns.starved.add(entity)
            return
        # a partitioned entity's gateway may find nothing though messages wait: drawn anew for each receive
        ctx.withheld = bool(entity.partitions and ctx.session is None and not entity.requires_session
                            and ns.receive_gaps.answers_empty())
        if time.monotonic() >= ctx.paused_until:     # a new receive (flows within a short one's pause are not)
            ctx.allowance = ns.short_receives.allowance(link.credit)
    pump_link(ctx)


def resume_short_receive(ctx: LinkCtx):
    """A short receive's pause is over: the credit still open is a new receive."""
    if ctx.closed or ctx.conn.dead:
        return
    ctx.allowance = ctx.conn.ns.short_receives.allowance(ctx.link.credit) if ctx.link.credit > 0 else None
    pump_link(ctx)


def pump_link(ctx: LinkCtx):
    link, entity = ctx.link, ctx.target
    if ctx.closed or ctx.conn.dead:
        return
    ns = ctx.conn.ns
    if link.credit > 0 and not link.drain_mode:
        # a token that expired while the link was open, or an entity no longer receiving
        refusal = cbs.refusal(ctx.conn, ctx.path, aad.LISTEN) or refusals.status_refusal(ns, entity, send=False)
        if refusal is not None:
            detach(ctx, refusal.condition, refusal.description)
            return
    if not ns.is_busy(entity.path) and not ctx.withheld:
        while link.credit > 0 and ctx.allowance != 0:
            if ns.credits.exhausted(time.monotonic()):
                ns.starved.add(entity)      # served again once the namespace has credits (``timers``)
                break
            m = entity.next_available(ctx.session)
            if m is None:
                break
            deliver(ctx, m)
            if ctx.allowance is not None:
                ctx.allowance -= 1
                if not ctx.allowance:   # the receive is short: the client stops collecting before the pause ends
                    ctx.paused_until = time.monotonic() + SHORT_RECEIVE_PAUSE_SECONDS
                    ns.paused.add(ctx)
    if link.drain_mode and link.credit > 0:
        link.drained()


def deliver(ctx: LinkCtx, m):
    link, entity = ctx.link, ctx.target
    ctx.active_at = time.monotonic()
    entity.ops["receive"] += 1
    ctx.conn.ns.spend(CreditKind.RECEIVE, 1)
    if ctx.rad:
        payload = m.encode()
        entity.take(m)
        d = link.delivery(uuid.uuid4().bytes_le)
        link.send(payload)
        link.advance()
        d.settle()
        return
    token = entity.lock(m, ctx, now_ms(), ctx.session)
    ctx.tokens.add(token)
    d = link.delivery(token.bytes_le)
    d.ctx = token
    link.send(m.encode(lock_token=token, locked_until=m.locked_until))
    link.advance()


# ---- what the client transfers -----------------------------------------------------------------------
def read_transfer(ctx: LinkCtx, d: Delivery) -> Optional[bytes]:
    """The transfer's bytes once the whole of it has arrived (None until then, and for an aborted one),
    topping the link's credit up."""
    link = ctx.link
    if d.aborted:
        ctx.buf.clear()
        d.settle()
        return None
    if not d.readable:
        return None
    data = link.recv(d.pending)
    if data:
        ctx.buf.append(data)
    if d.partial:
        return None
    raw = b"".join(ctx.buf)
    ctx.buf.clear()
    ctx.active_at = time.monotonic()
    link.advance()
    if link.credit < INCOMING_CREDIT // 2:
        link.flow(INCOMING_CREDIT - link.credit)
    return raw


def reject_delivery(d: Delivery, error: BrokerError):
    """The ``rejected`` outcome with the error, unless the client settled the delivery already."""
    if not d.settled:
        d.local.condition = condition(error.condition, error.description)
        d.update(Disposition.REJECTED)

