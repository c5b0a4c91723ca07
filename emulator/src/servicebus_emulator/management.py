"""``$management`` request handlers: ``handle(...) -> (status code, response body)``.

Failures raise ``BrokerError``; ``node_requests`` turns it into ``statusCode`` + ``errorCondition``, which is
what the SDK maps to its exceptions. Unknown operations answer 501 ``amqp:not-implemented``.
"""
from __future__ import annotations

import uuid
from typing import Any, Dict, List

from proton import timestamp

from . import codec, refusals
from .broker import BrokerError, Entity, Topic, lock_lost, now_ms
from .credits import CreditKind
from .links import pump
from .message import Content
from .service_settings import DispositionMode
from .transfers import enqueue

_SETTLE_OPS = {"completed": "complete", "abandoned": "abandon", "defered": "defer", "deferred": "defer",
               "suspended": "dead_letter"}


def operation_name(op: str) -> str:
    """``com.microsoft:peek-message`` -> ``peek-message``."""
    return op.split(":", 1)[-1] if op.startswith("com.microsoft:") else op


def handle(ctx, target, op: str, body: Dict[str, Any], props: Dict[str, Any]):
    name = operation_name(op)
    fn = _HANDLERS.get(name)
    if fn is None:
        raise BrokerError("amqp:not-implemented",
                          f"The emulator does not support the management operation '{op}'.", 501)
    if isinstance(target, Topic) and name == "peek-message":
        target = target.held        # a topic's own log: its scheduled messages (azure-service-bus#352)
    if name not in ("schedule-message", "cancel-scheduled-message") and not isinstance(target, Entity):
        raise BrokerError("amqp:not-allowed", f"'{op}' is not supported on topic '{target.path}'.", 400)
    target.ops["peek" if name == "peek-message" else name.replace("-", "_")] += 1
    return fn(ctx, target, body)


_CREDIT_KINDS = {"peek-message": CreditKind.PEEK, "update-disposition": CreditKind.SETTLE,
                 "renew-lock": CreditKind.RENEW_LOCK, "schedule-message": CreditKind.SEND,
                 "receive-by-sequence-number": CreditKind.RECEIVE}


def credit_kind(name: str) -> CreditKind:
    """What kind of operation a management request is, for the namespace's credits (``credits``)."""
    return _CREDIT_KINDS.get(name, CreditKind.MANAGEMENT)


def credit_cost(name: str, body: Dict[str, Any], result) -> int:
    """The credits a request spent: one per message it peeked, received or scheduled, one per lock token it
    settled or renewed (asked for, whatever the answer), one for anything else."""
    if name == "peek-message":
        return max(1, _count((result[1] or {}).get("messages") if result is not None else None))
    listed = {"update-disposition": "lock-tokens", "renew-lock": "lock-tokens", "schedule-message": "messages",
              "receive-by-sequence-number": "sequence-numbers"}.get(name)
    return max(1, _count(body.get(listed))) if listed else 1


def _count(values) -> int:
    """How many items a request's list (a Python list, or proton's ``Array``) holds."""
    return sum(1 for _ in values) if values is not None else 0


def _tokens(body) -> List[uuid.UUID]:
    return [_token(t) for t in body.get("lock-tokens") or []]


def _token(value) -> uuid.UUID:
    """A lock token as a request names it: a uuid, its 16 bytes, or its text."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value) if isinstance(value, str) else uuid.UUID(bytes=bytes(value))
    except (TypeError, ValueError):
        raise BrokerError("amqp:invalid-field", f"{value!r} is not a lock token.", 400) from None


def _session_id(body):
    return codec.as_text(body.get("session-id"))


def _peek(ctx, e: Entity, body):
    """Up to 250 messages from a sequence number, in order, as many as the namespace's page budget
    holds (``peek_pages``); 204 when there are none (or the namespace answers empty this time)."""
    ns = ctx.conn.ns
    start = int(body.get("from-sequence-number") or 0)
    count = ns.pager.message_count(int(body.get("message-count") or 1))
    fault = ns.faults.take("peek", e, message_count=count, from_sequence=start)
    if fault is not None and fault.mode == "empty":
        return 204, None
    if fault is not None:               # "short": only the first message of the page
        count = 1
    if e.partitions and ns.settings.peek_one_per_call:
        count = 1                       # as reported of partitioned entities (docs/emulator.md)
    if count == 1:
        e.ops["peek_one"] += 1  # a single-message peek: how clients probe for where messages are
    if e.partitions and ns.settings.peek_other_partition_probability:
        start = ns.pager.elsewhere(e, start)   # the broker of another partition may answer first
    msgs = e.peek(start, count, _session_id(body))
    if not msgs or ns.pager.answers_empty():
        return 204, None
    page = ns.pager.fit(m.encode(with_state=True, locked_until=m.locked_until if m.lock_token else None)
                        for m in msgs)
    e.counters["peeked"] += len(page)
    return 200, {"messages": [{"message": encoded} for encoded in page]}


def _locked_messages(ctx, e: Entity, body) -> tuple:
    """The messages a settlement or renewal names by lock token, and the tokens that hold no lock (dead).
    A request whose live tokens span partitions is refused whole, as the service refuses it."""
    live, dead, seen = [], [], set()
    for token in _tokens(body):
        m = None if token in seen else e.locks.get(token)   # a token named twice holds one lock
        seen.add(token)
        (dead if m is None else live).append(token if m is None else (token, m))
    if e.partitions and len({m.partition for _, m in live}) > 1:
        raise BrokerError("amqp:not-allowed", ctx.conn.ns.described(refusals.LOCK_TOKENS_ACROSS_PARTITIONS, e.path),
                          400)
    return live, dead


def _partial(ctx) -> bool:
    """Whether a request with dead tokens still settles (or renews) its live ones (``multi_token_disposition``)."""
    return ctx.conn.ns.settings.multi_token_disposition is DispositionMode.PARTIAL


def _renew_lock(ctx, e: Entity, body):
    now = now_ms()
    if e.requires_session:
        raise BrokerError("amqp:not-allowed", "Renew the session lock instead on a session entity.", 400)
    live, dead = _locked_messages(ctx, e, body)
    if dead and not _partial(ctx):
        raise lock_lost(dead[0])
    expirations = [timestamp(e.renew(m, now)) for _, m in live]
    if dead:
        raise lock_lost(dead[0])
    return 200, {"expirations": expirations}


def _update_disposition(ctx, e: Entity, body):
    status = codec.as_text(body.get("disposition-status"))
    action = _SETTLE_OPS.get(status or "")
    if action is None:
        raise BrokerError("amqp:invalid-field", f"Unknown disposition-status {status!r}.", 400)
    sid = _session_id(body)
    if e.requires_session and sid is not None:
        _owned_session(e, sid)
    tokens = _tokens(body)
    if len(tokens) > 1 and ctx.conn.ns.faults.take("lose_lock", e) is not None:
        lost = e.locks.get(tokens[-1])
        if lost is not None:          # its lock runs out now: the message is available again (count + 1)
            e.abandon(lost)
    live, dead = _locked_messages(ctx, e, body)
    # One status answers the whole request: 410 when any token is dead. Whether the live ones were settled
    # is not documented; the namespace's ``multi_token_disposition`` says (partial: yes, atomic: no).
    if dead and not _partial(ctx):
        raise lock_lost(dead[0])
    for token, m in live:
        if m.lock_owner is not None:
            m.lock_owner.tokens.discard(token)
        if action == "dead_letter":
            e.dead_letter(m, codec.as_text(body.get("deadletter-reason")),
                          codec.as_text(body.get("deadletter-description")))
        else:
            getattr(e, action)(m)
        e.ops[action] += 1
    pump(e)
    if dead:
        raise lock_lost(dead[0])
    return 200, {}


def _schedule(ctx, target, body):
    contents = []
    for item in body.get("messages") or []:
        try:
            contents.append(Content.parse(bytes(item["message"])))
        except (KeyError, TypeError, codec.DecodeError) as exc:
            raise BrokerError("amqp:decode-error", f"Cannot decode the scheduled message: {exc}", 400) from None
    seqs = enqueue(ctx.conn.ns, target, contents)
    return 200, {"sequence-numbers": [int(s) for s in seqs]}


def _cancel_scheduled(ctx, target, body):
    entity = target.held if isinstance(target, Topic) else target
    for seq in body.get("sequence-numbers") or []:
        entity.cancel_scheduled(int(seq))
    return 200, {}


def _receive_by_sequence_number(ctx, e: Entity, body):
    peek_lock = int(body.get("receiver-settle-mode", 1) or 0) == 1
    sid = _session_id(body)
    now = now_ms()
    msgs = [e.deferred(int(seq)) for seq in body.get("sequence-numbers") or []]
    out = []
    for m in msgs:
        if sid is not None and m.session != sid:
            raise BrokerError("com.microsoft:message-not-found",
                              f"Deferred message {m.seq} is not in session '{sid}'.", 404)
        if peek_lock:
            token = e.lock(m, None, now)
            out.append({"lock-token": token, "message": m.encode(lock_token=token, locked_until=m.locked_until)})
        else:
            payload = m.encode()
            e.take(m)
            out.append({"message": payload})
    return 200, {"messages": out}


def _owned_session(e: Entity, sid: str):
    s = e.sessions.get(sid)
    if s is None or s.owner is None or s.locked_until <= now_ms():
        raise BrokerError("com.microsoft:session-lock-lost",
                          f"The session lock for '{sid}' is not held or has expired.", 410)
    return s


def _get_session_state(ctx, e: Entity, body):
    s = _owned_session(e, _session_id(body))
    return 200, {"session-state": s.state}


def _set_session_state(ctx, e: Entity, body):
    s = _owned_session(e, _session_id(body))
    state = body.get("session-state")
    s.state = bytes(state) if state is not None else None
    s.updated_ms = now_ms()
    return 200, {}


def _renew_session_lock(ctx, e: Entity, body):
    s = _owned_session(e, _session_id(body))
    s.locked_until = now_ms() + int(e.settings.lock_duration_seconds * 1000)
    return 200, {"expiration": timestamp(s.locked_until)}


# ``last-updated-time`` at .NET's DateTime.MaxValue (as its AMQP library encodes it): the default listing mode.
LIST_ALL_SESSIONS_MS = 253402300800000


def _get_message_sessions(ctx, e: Entity, body):
    """The service's two modes (as the SDKs send them, azure-servicebus 7.15.0 ``_session_browser.py``): with
    ``last-updated-time`` at DateTime.MaxValue, "sessions with active messages or stored session state"; with an
    earlier time, the sessions whose state was set or updated after it."""
    skip = int(body.get("skip") or 0)
    top = int(body.get("top") or 100)
    since = body.get("last-updated-time")
    since_ms = LIST_ALL_SESSIONS_MS if since is None else int(since)
    if since_ms >= LIST_ALL_SESSIONS_MS:
        ids = [s.id for s in e.sessions.values() if s.count > 0 or s.state is not None]
    else:
        ids = [s.id for s in e.sessions.values() if s.state is not None and s.updated_ms > since_ms]
    page = ids[skip:skip + top]
    if not page:
        return 204, None
    return 200, {"skip": skip + len(page), "sessions-ids": page}


_HANDLERS = {
    "peek-message": _peek,
    "renew-lock": _renew_lock,
    "update-disposition": _update_disposition,
    "schedule-message": _schedule,
    "cancel-scheduled-message": _cancel_scheduled,
    "receive-by-sequence-number": _receive_by_sequence_number,
    "get-session-state": _get_session_state,
    "set-session-state": _set_session_state,
    "renew-session-lock": _renew_session_lock,
    "get-message-sessions": _get_message_sessions,
}
