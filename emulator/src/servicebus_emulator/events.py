"""What the broker does with each proton event of a connection: deliveries (sends stored, requests answered,
settlements), link credit, links and sessions opened and closed (a link lost without the client's close keeps
its locks, ``links``), connections admitted within the namespace's quota. Called on the server's loop thread
(``server``), which alone touches proton objects and broker state."""

from __future__ import annotations

from typing import Callable

from proton import Event, Link

from . import attach, links, node_requests, refusals, transfers
from .links import LinkCtx

REQUEST_KINDS = ("cbs-in", "mgmt-in")


def dispatch(c, ev, transport_closed: Callable) -> None:
    """One event of connection ``c`` (``server.Conn``); ``transport_closed(c)`` once its transport is closed."""
    t = ev.type
    if t == Event.DELIVERY:
        d = ev.delivery
        ctx = getattr(d.link, "ctx", None)
        if ctx is None or ctx.closed:   # a link the broker detached takes nothing more
            return
        if d.link.is_receiver:
            on_transfer(ctx, d)
        elif d.updated:
            transfers.on_settlement(ctx, d)
    elif t == Event.LINK_FLOW:
        ctx = getattr(ev.link, "ctx", None)
        if ctx is not None and ctx.kind == "recv":
            links.on_credit(ctx)
    elif t == Event.LINK_REMOTE_OPEN:
        attach.on_link_open(c, ev.link)
    elif t in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
        link = ev.link
        ctx = getattr(link, "ctx", None)
        if ctx is not None:
            # a detach with closed=true is the client's close; one without it (or none at all: a dropped
            # connection) loses the link, whose locks outlive it (``links``)
            links.link_gone(ctx, closed_by_client=t == Event.LINK_REMOTE_CLOSE)
        if link.state & Link.LOCAL_ACTIVE:
            link.close()
    elif t == Event.SESSION_REMOTE_OPEN:
        ev.session.open()
    elif t == Event.SESSION_REMOTE_CLOSE:
        if ev.session.state & Link.LOCAL_ACTIVE:
            ev.session.close()
    elif t == Event.CONNECTION_REMOTE_OPEN:
        ev.connection.open()
        admit(c)
    elif t == Event.CONNECTION_REMOTE_CLOSE:
        if ev.connection.state & Link.LOCAL_ACTIVE:
            ev.connection.close()
    elif t == Event.TRANSPORT_CLOSED:
        transport_closed(c)


def admit(c) -> None:
    """A connection opens within the namespace's quota (``max_connections``), or is closed with the
    service's refusal (``amqp:resource-limit-exceeded``, "ConnectionsQuotaExceeded for namespace ...")."""
    ns = c.ns
    if ns.admitted_connections < ns.settings.max_connections:
        ns.admitted_connections += 1
        c.admitted = True
        return
    ns.refused_connections += 1
    c.closed_by_broker = True
    c.connection.condition = links.condition(refusals.RESOURCE_LIMIT_EXCEEDED, ns.described(
        refusals.CONNECTIONS_QUOTA_EXCEEDED.format(namespace=ns.name), "gateway"))
    c.connection.close()


def on_transfer(ctx: LinkCtx, d) -> None:
    raw = links.read_transfer(ctx, d)
    if raw is None:
        return
    if ctx.kind == "send":
        transfers.on_message(ctx, d, raw)
    elif ctx.kind in REQUEST_KINDS:
        node_requests.on_request(ctx, d, raw)
    else:
        d.settle()
