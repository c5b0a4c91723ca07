"""What the loop does as time passes: locks and schedules run out, expired messages are collected (every
``expiry_sweep_seconds``, the service's garbage collection; a receive collects those it meets at once),
session locks expire, session receivers waiting for a session time out, receivers that waited for the
namespace's credits are served once there are credits again, and links and connections idle too long are
closed (``idle`` decides when). Functions of the loop thread; the loop decides how often they run.

Invariants:
- an entity whose availability changed has its receivers served in the same pass;
- an idle link is detached with ``LINK_DETACH_FORCED`` and counted on its namespace (and its entity);
  an idle connection is closed with ``CONNECTION_FORCED`` and counted.
"""
from __future__ import annotations

from typing import Iterable

from .idle import CONNECTION_FORCED, LINK_DETACH_FORCED, TIMED_KINDS
from .links import condition, detach, pump, reject, resume_short_receive, session_lost
from .namespace import Namespace


def expire_entities(namespaces: Iterable[Namespace], now: int, clock: float):
    """Everything in the namespaces' entities that is due at ``now`` (epoch milliseconds; ``clock``: monotonic
    seconds, for the sweeps and the credits)."""
    for ns in namespaces:
        sweep = clock >= ns.next_sweep
        if sweep:
            ns.next_sweep = clock + ns.settings.expiry_sweep_seconds
        for e in ns.all_entities():
            changed = False
            deadline = e.next_deadline(sweep=sweep)
            if deadline is not None and deadline <= now:
                changed = e.tick(now, sweep=sweep)
            for s in list(e.sessions.values()):
                if s.owner is not None and s.locked_until <= now:
                    session_lost(e, s)
                    changed = True
            for w in list(e.session_waiters):
                if w.deadline <= now:
                    e.session_waiters.remove(w)
                    w.link.ctx = None
                    reject(w.link, "com.microsoft:timeout", "No session available to accept within the timeout.")
            if changed:
                pump(e)
            while e.touched_elsewhere:       # a topic's scheduled message fanned out to its subscriptions
                pump(e.touched_elsewhere.pop())
        for ctx in [ctx for ctx in ns.paused if ctx.paused_until <= clock]:
            ns.paused.discard(ctx)
            resume_short_receive(ctx)
        if ns.starved and not ns.credits.exhausted(clock):
            starved, ns.starved = ns.starved, set()
            for e in starved:
                pump(e)


def expire_idle(namespaces: Iterable[Namespace], now: float):
    """Detach the links and close the connections whose idle timer ran out at ``now`` (monotonic)."""
    for ns in namespaces:
        for c in list(ns.conns):
            for ctx in list(c.links):
                if ctx.kind in TIMED_KINDS and ns.idle.link_expired(ctx.active_at, now):
                    ns.idle_counts["links"] += 1
                    if ctx.target is not None:
                        ctx.target.ops["idle_detach"] += 1
                    detach(ctx, LINK_DETACH_FORCED, ns.described(
                        ns.idle.link_description(ctx.link.name, ctx.number, ctx.kind), ctx.path))
            if not c.dead and ns.idle.connection_expired(c.linkless_since, c.ever_linked, now):
                ns.idle_counts["connections"] += 1
                c.linkless_since, c.closed_by_broker = None, True
                c.connection.condition = condition(CONNECTION_FORCED, ns.described(
                    ns.idle.connection_description(c.connection.container, c.ever_linked), "gateway"))
                c.connection.close()
