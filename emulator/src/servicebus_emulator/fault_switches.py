"""The switches tests turn on a running namespace (``Emulator.set_unavailable`` and the rest): entities
or a whole namespace unavailable, sends refused, statuses set, connections dropped, queues deleted.
Functions of the loop thread; ``faults`` holds the one-shot injected failures.

Invariants:
- a switch changes what the namespace answers from then on; turning one off (or setting a status)
  serves at once the receivers that may receive again.
"""
from __future__ import annotations

from typing import Optional

from . import entity_status
from .entity_status import EntityStatus
from .links import detach, pump, reject
from .namespace import Namespace, not_found
from .refusals import SEND_REFUSALS

# "disabled" makes the entity SendDisabled; the SEND_REFUSALS modes refuse sends on attached links
UNAVAILABLE_MODES = ("server-busy", "refuse", "disabled", *SEND_REFUSALS)


def set_unavailable(server, ns: Namespace, entity: Optional[str], mode: str):
    if mode not in UNAVAILABLE_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, UNAVAILABLE_MODES))}, got {mode!r}")
    if mode == "disabled":
        entity_status.disable_sends(ns, entity, True)
    elif mode in SEND_REFUSALS:
        ns.refusals[entity.lower() if entity is not None else None] = mode
    elif entity is not None:
        if mode != "server-busy":
            raise ValueError("mode 'refuse' applies to a whole namespace (entity=None)")
        ns.busy_entities.add(entity.lower())
    elif mode == "server-busy":
        ns.busy_all = True
    else:
        ns.refusing = True
        server.unlisten(ns)
        for c in list(ns.conns):
            server.drop(c)


def set_available(server, ns: Namespace, entity: Optional[str]):
    if entity is None or entity.lower() in ns.senders:
        entity_status.disable_sends(ns, entity, False)
    if entity is not None:
        ns.busy_entities.discard(entity.lower())
        ns.refusals.pop(entity.lower(), None)
    else:
        ns.busy_all = False
        ns.busy_entities.clear()
        ns.refusals.clear()
        if ns.refusing:
            ns.refusing = False
            server.listen(ns)
    for e in ns.all_entities():
        pump(e)


def set_status(ns: Namespace, path: str, status) -> EntityStatus:
    """Give a queue, topic or subscription (``topic/Subscriptions/name``) a status the service allows it."""
    target = entity_status.status_holder(ns, path)
    target.status = entity_status.parse_status(status, entity_status.kind_of(target))
    for e in ns.all_entities():      # receivers of entities that receive again get their messages
        pump(e)
    return target.status


def drop_connections(server, ns: Namespace) -> int:
    conns = list(ns.conns)
    for c in conns:
        server.drop(c)
    return len(conns)


def delete_queue(ns: Namespace, name: str):
    """Remove a queue with its messages. Send and receive links attached to it (or its dead-letter
    queue) are detached with ``amqp:not-found``, and attaches waiting for one of its sessions are
    refused the same way. ``$management`` links stay: their requests answer 404 ``amqp:not-found``,
    which the SDK raises as ``MessagingEntityNotFoundError`` (a detached one it reports as a generic
    ``ServiceBusError``)."""
    queue = ns.remove_queue(name)
    gone = (queue, queue.dlq)
    for c in list(ns.conns):
        for ctx in list(c.links):
            if ctx.target in gone and ctx.kind in ("send", "recv"):
                detach(ctx, "amqp:not-found", not_found(ns, ctx.target.path).description)
    for waiter in queue.session_waiters:
        waiter.link.ctx = None
        reject(waiter.link, "amqp:not-found", not_found(ns, queue.path).description)
    queue.session_waiters.clear()
