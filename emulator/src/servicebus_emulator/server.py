"""AMQP 1.0 front end: one selector loop on one thread drives proton's protocol engine for every
namespace listener and connection, and the broker state behind them.

Only the loop thread touches proton objects or broker state; other threads go through ``Server.call``.
Wire behaviour follows what azure-servicebus 7.15.0 expects (see README.md): SASL ANONYMOUS, ``$cbs``
put-token, null terminus plus closing detach for refused attaches, settlement echo of the outcome the
client sent, error conditions always carrying an ``info`` map. What a real namespace refuses or
limits (``refusals``, ``entity_status``, ``peek_pages``, ``idle``) is decided there; this module applies it.

Simulated latency: on a namespace with ``latency`` > 0, what the engine produces for a connection is
queued with a due time (produced + latency) and sent once due, in order; the loop's select timeout
never passes the earliest due time, so nothing blocks. With latency 0 output goes straight out.
"""
from __future__ import annotations

import itertools
import logging
import queue
import selectors
import socket
import threading
import time
import uuid
from collections import Counter, deque
from datetime import datetime, timezone
from concurrent.futures import Future
from typing import Any, Deque, Dict, List, Optional, Tuple

from proton import (Collector, Condition, Connection, Delivery, Disposition, Event, Link, Message,
                    Terminus, Transport, symbol)

from . import aad, codec, entity_status, management, refusals, sas
from .broker import (PING_CONTENT_TYPE, BrokerError, Content, Entity, Topic, any_rule_matches,
                     is_batch_envelope, now_ms)
from .entity_status import EntityStatus
from .faults import Faults
from .idle import CONNECTION_FORCED, LINK_DETACH_FORCED, TIMED_KINDS, IdleTimers
from .peek_pages import PeekPager

log = logging.getLogger(__name__)

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
OPERATION_TIMEOUT = symbol("com.microsoft:timeout")
DOTNET_EPOCH_TICKS = 621355968000000000
DEFAULT_SESSION_WAIT_MS = 60000
INCOMING_CREDIT = 500
TICK_SECONDS = 0.02                  # timer resolution: lock expiry, schedules, TTL, session waits
IDLE_CHECK_SECONDS = 0.1             # idle timers' resolution (they run for seconds to minutes)
LINK_NUMBERS = itertools.count(1)    # the number a link goes by in the service's texts

# set_unavailable modes that let senders attach and then refuse every message, as a namespace does for
# a full entity or a namespace that throttles (a Standard namespace out of its credits answers sends
# with server-busy on links that stay attached; the SDK maps the condition to ServiceBusServerBusyError):
# mode -> (condition, description, status code). Mode "disabled" makes the entity SendDisabled.
SEND_REFUSALS = {
    "quota-exceeded": ("amqp:resource-limit-exceeded",
                       "The maximum entity size has been reached or exceeded for '{path}'.", 403),
    "throttled": ("com.microsoft:server-busy",
                  "The request was terminated because the entity '{path}' is being throttled. "
                  "Please wait 2 seconds and try again.", 503),
}
UNAVAILABLE_MODES = ("server-busy", "refuse", "disabled", *SEND_REFUSALS)


def _info(**extra) -> Dict:
    # the SDK indexes error[2] (info) unconditionally: never leave it null
    info = {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())}
    info.update({symbol(k): v for k, v in extra.items()})
    return info


def _condition(name: str, description: str) -> Condition:
    return Condition(symbol(name), description, _info())


# Management operations that need Send; every other one needs Listen (as on Service Bus).
SEND_OPERATIONS = ("schedule-message", "cancel-scheduled-message")


def entity_path(address: Optional[str]) -> str:
    """``amqps://host:port/a/b`` -> ``a/b``; bare node paths are returned as they are."""
    addr = address or ""
    if "://" in addr:
        addr = addr.split("://", 1)[1]
        addr = addr.split("/", 1)[1] if "/" in addr else ""
    return addr.strip("/")


class Namespace:
    def __init__(self, cfg, port: int, latency_ms: float):
        self.cfg = cfg
        self.name = cfg.name
        self.host = cfg.host
        self.port = port
        self.latency_ms = latency_ms
        self.entities: Dict[str, Entity] = {}     # receivable entities by lower-case path
        self.senders: Dict[str, Any] = {}         # send targets (queues, topics) by lower-case path
        self.listener: Optional[socket.socket] = None
        self.conns: set = set()
        self.busy_all = False
        self.refusing = False
        self.busy_entities: set = set()
        self.refusals: Dict[Optional[str], str] = {}   # lower-case path (None = every entity) -> mode
        self.deleted: Dict[str, Any] = {}              # lower-case name -> settings of a deleted queue
        self.faults = Faults()
        self.auth_counts: Counter = Counter()          # put-tokens taken (sas, jwt) and refused
        self.role_assignments = list(cfg.azure_ad.role_assignments) if cfg.azure_ad else []
        self.settings = cfg.service
        self.pager = PeekPager(cfg.service)
        self.idle = IdleTimers.of(cfg.service)
        self.idle_counts: Counter = Counter()          # links detached and connections closed for idleness
        for q in cfg.queues:
            self.add_queue(q)
        for t in cfg.topics:
            self.add_topic(t)

    def add_queue(self, qcfg) -> Entity:
        key = qcfg.name.lower()
        if key in self.senders or key in self.entities:
            raise ValueError(f"an entity named {qcfg.name!r} already exists in namespace {self.name!r}")
        e = Entity(qcfg.name, qcfg)    # a new Entity: its own sequencer, so numbering starts at 1
        self._register(e)
        self.senders[key] = e
        return e

    def queue(self, name: str) -> Optional[Entity]:
        target = self.senders.get(name.lower())
        return target if isinstance(target, Entity) else None

    def remove_queue(self, name: str) -> Entity:
        """Forget a queue and its dead-letter sub-queue (their messages go with them)."""
        e = self.queue(name)
        if e is None:
            raise KeyError(f"no queue {name!r} in namespace {self.name!r}")
        key = name.lower()
        del self.senders[key]
        for path in (key, key + "/$deadletterqueue", key + "/$transfer/$deadletterqueue"):
            del self.entities[path]
        self.deleted[key] = e.settings        # what recreate_queue starts from
        return e

    def add_topic(self, tcfg) -> Topic:
        subs, filters = [], {}
        for s in tcfg.subscriptions:
            e = Entity(f"{tcfg.name}/Subscriptions/{s.name}", s)
            subs.append(e)
            filters[e.path] = tuple(r.correlation_filter for r in s.rules)
            self._register(e)
        t = Topic(tcfg, subs, filters)
        for e in subs:
            e.topic = t
        self.senders[tcfg.name.lower()] = t
        return t

    def _register(self, e: Entity):
        key = e.path.lower()
        self.entities[key] = e
        self.entities[key + "/$deadletterqueue"] = e.dlq
        self.entities[key + "/$transfer/$deadletterqueue"] = e.dlq

    def is_busy(self, path: str) -> bool:
        if self.busy_all:
            return True
        if not self.busy_entities:
            return False
        p = path.lower()
        return any(p == b or p.startswith(b + "/") for b in self.busy_entities)

    def exists(self, target) -> bool:
        """False for an entity deleted (or replaced) since a link was attached to it."""
        return self.entities.get(target.path.lower(), self.senders.get(target.path.lower())) is target

    def send_refusal(self, path: str) -> Optional[BrokerError]:
        mode = self.refusals.get(path.lower(), self.refusals.get(None))
        if mode is None:
            return None
        condition, description, status = SEND_REFUSALS[mode]
        return BrokerError(condition, description.format(path=f"{self.name}/{path}"), status)

    def described(self, text: str, path: str) -> str:
        """A status description as the service writes them: the text, then where and when."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{text} TrackingId:{uuid.uuid4().hex}, SystemTracker:{self.name}:{path}, Timestamp:{stamp}"

    def rights(self, principal: Optional[str], path: str) -> frozenset:
        """What a token's principal may do on ``path`` (lower case): a SAS token (no principal) everything,
        an Azure AD one what its role assignments on the namespace or on the entity grant."""
        if principal is None:
            return aad.ALL_RIGHTS
        granted: set = set()
        for assignment in self.role_assignments:
            scope = assignment.scope.lower()
            if assignment.principal == principal and (not scope or path == scope or path.startswith(scope + "/")):
                granted |= aad.ROLES[assignment.role]
        return frozenset(granted)

    def refusal(self, conn: "Conn", path: str, right: str) -> Optional[BrokerError]:
        """Why ``conn`` may not use ``right`` on ``path`` now, or None. Only namespaces with ``azure_ad`` or
        ``sas_key_rights`` check rights: a token put for the entity (or an entity above it, or the namespace)
        that has not expired, whose key or principal holds the right there."""
        if self.cfg.azure_ad is None and not self.cfg.sas_key_rights:
            return None
        lower = path.lower()
        now = time.time()
        grants = [grant for audience, grant in conn.grants.items()
                  if not audience or lower == audience or lower.startswith(audience + "/")]
        if grants and all(grant.expires_on <= now for grant in grants):
            return BrokerError("amqp:unauthorized-access", self.described(
                f"Unauthorized access. The token for '{path}' has expired: put a new one on $cbs before it "
                f"expires.", lower), 401)
        if not any(right in (grant.key_rights if grant.principal is None else self.rights(grant.principal, lower))
                   for grant in grants if grant.expires_on > now):
            return BrokerError("amqp:unauthorized-access", self.described(
                f"Unauthorized access. '{right}' claim(s) are required to perform this operation. Resource: "
                f"'sb://{self.host}:{self.port}/{lower}'.", lower), 401)
        return None

    def all_entities(self):
        seen = set()
        for e in self.entities.values():
            if id(e) not in seen:
                seen.add(id(e))
                yield e


class Grant:
    """A token put on a connection for an audience: who (None for a SAS token, whose key has ``key_rights``)
    until when."""

    __slots__ = ("principal", "expires_on", "key_rights")

    def __init__(self, principal: Optional[str], expires_on: float, key_rights: frozenset = aad.ALL_RIGHTS):
        self.principal, self.expires_on, self.key_rights = principal, expires_on, key_rights


class LinkCtx:
    """What a link is for. kind: cbs-in/cbs-out/mgmt-in/mgmt-out/send/recv."""

    def __init__(self, kind: str, conn: "Conn", link: Link, path: str, target=None):
        self.kind, self.conn, self.link, self.path, self.target = kind, conn, link, path, target
        self.buf: List[bytes] = []
        self.rad = False
        self.session = None          # broker Session for session receivers
        self.tokens: set = set()     # lock tokens delivered on this link and not settled
        self.closed = False
        self.deadline = 0            # next-available session wait
        self.active_at = time.monotonic()    # last transfer, flow, delivery or settlement (idle timer)
        self.number = next(LINK_NUMBERS)


class Conn:
    def __init__(self, server: "Server", ns: Namespace, sock: socket.socket):
        self.server, self.ns, self.sock = server, ns, sock
        self.transport = Transport(Transport.SERVER)
        self.transport.max_frame_size = 1 << 20
        sasl = self.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        self.connection = Connection()
        self.connection.container = f"servicebus-emulator-{ns.name}"
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.links: List[LinkCtx] = []
        self.reply_links: Dict[str, Link] = {}
        self.grants: Dict[str, Grant] = {}                  # lower-case audience entity path ("" = namespace)
        self.want_write = False
        self.dead = False
        self.latency = ns.latency_ms / 1000.0              # seconds; 0 = write output at once
        self.outq: Deque[Tuple[float, bytes]] = deque()     # (due time, bytes) when latency > 0
        self.closing = False                                # drop once outq is sent
        self.linkless_since: Optional[float] = time.monotonic()   # None while a link is open (idle timer)
        self.ever_linked = False
        self.closed_by_broker = False                       # the idle timer closed it


class Server:
    def __init__(self, config, ports: Optional[Dict[str, int]] = None,
                 latency_ms: Optional[Dict[str, float]] = None):
        self.config = config
        ports, latency_ms = ports or {}, latency_ms or {}
        self.namespaces: Dict[str, Namespace] = {
            ns.name: Namespace(ns, ports.get(ns.name, ns.port), latency_ms.get(ns.name, ns.latency_ms))
            for ns in config.namespaces}
        self.sel = selectors.DefaultSelector()
        self._calls: "queue.Queue" = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._thread: Optional[threading.Thread] = None
        self._running = False
        self._last_tick = 0.0
        self._last_idle_check = 0.0
        self._tag = 0
        self._delayed: set = set()      # connections with output waiting for its due time

    # ---- lifecycle / cross-thread -----------------------------------------------------------------
    def start(self):
        for ns in self.namespaces.values():
            self._listen(ns)
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._running = True
        self._thread = threading.Thread(target=self._run, name="servicebus-emulator", daemon=True)
        self._thread.start()

    def stop(self):
        if not self._running:
            return
        self.call(self._shutdown)
        self._thread.join(10)
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def call(self, fn, *args, **kwargs):
        """Run ``fn`` on the loop thread and return its result (or raise its exception)."""
        if threading.current_thread() is self._thread or not self._running:
            return fn(*args, **kwargs)
        fut: Future = Future()
        self._calls.put((fut, fn, args, kwargs))
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        return fut.result(timeout=30)

    def _listen(self, ns: Namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((ns.host, ns.port))
        sock.listen(128)
        sock.setblocking(False)
        ns.port = sock.getsockname()[1]
        ns.listener = sock
        self.sel.register(sock, selectors.EVENT_READ, ("listen", ns))

    def _unlisten(self, ns: Namespace):
        if ns.listener is not None:
            self.sel.unregister(ns.listener)
            ns.listener.close()
            ns.listener = None

    def _shutdown(self):
        for ns in self.namespaces.values():
            self._unlisten(ns)
            for c in list(ns.conns):
                self._drop(c)
        self._running = False

    # ---- loop -------------------------------------------------------------------------------------
    def _run(self):
        while self._running:
            try:
                events = self.sel.select(self._select_timeout() if self._delayed else TICK_SECONDS)
                for key, mask in events:
                    kind, obj = key.data
                    if kind == "listen":
                        self._accept(obj)
                    elif kind == "wake":
                        self._run_calls()
                    elif not obj.dead:
                        if mask & selectors.EVENT_READ:
                            self._read(obj)
                        if mask & selectors.EVENT_WRITE and not obj.dead:
                            self._write(obj)
                if not self._running:
                    break
                self._tick()
                self._process_all()         # also sends delayed output that has come due
            except Exception:  # keep serving; one bad event must not kill the broker
                log.exception("emulator loop error")

    def _select_timeout(self) -> float:
        """Wake no later than the earliest due output (connections waiting for a writable socket excepted)."""
        due = min((c.outq[0][0] for c in self._delayed if not c.want_write), default=None)
        if due is None:
            return TICK_SECONDS
        return min(TICK_SECONDS, max(0.0, due - time.monotonic()))

    def _run_calls(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            try:
                fut, fn, args, kwargs = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    def _accept(self, ns: Namespace):
        try:
            sock, _ = ns.listener.accept()
        except (BlockingIOError, OSError):
            return
        if ns.refusing:
            sock.close()
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = Conn(self, ns, sock)
        ns.conns.add(c)
        self.sel.register(sock, selectors.EVENT_READ, ("conn", c))

    def _read(self, c: Conn):
        t = c.transport
        while True:
            cap = t.capacity()
            if cap < 0:
                break
            if cap == 0:
                self._process(c)   # let the engine consume what it has
                if t.capacity() <= 0:
                    break
                continue
            try:
                data = c.sock.recv(min(cap, 1 << 20))
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                t.close_tail()
                break
            t.push(data)
            if len(data) < cap:
                break
        self._process(c)

    def _write(self, c: Conn):
        if c.latency:
            self._write_later(c)
            return
        t = c.transport
        while True:
            pending = t.pending()
            if pending < 0 and c.closed_by_broker and not t.closed:
                break       # our close is out: the socket stays until the client answers (or goes)
            if pending < 0:
                self._drop(c)
                return
            if pending == 0:
                break
            try:
                n = c.sock.send(t.peek(pending))
            except BlockingIOError:
                break
            except OSError:
                t.close_head()
                self._drop(c)
                return
            t.pop(n)
            if n < pending:
                break
        self._want_write(c, t.pending() > 0)
        if t.closed:
            self._drop(c)

    def _want_write(self, c: Conn, want: bool):
        if want != c.want_write:
            c.want_write = want
            self.sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), ("conn", c))

    def _write_later(self, c: Conn):
        """Latency > 0: take what the engine produced, due ``latency`` from now, then send what is due."""
        t = c.transport
        chunks = []
        pending = t.pending()
        while pending > 0:
            chunks.append(t.peek(pending))
            t.pop(pending)
            pending = t.pending()
        if chunks:
            c.outq.append((time.monotonic() + c.latency, b"".join(chunks)))
            self._delayed.add(c)
        if t.closed or (pending < 0 and not c.closed_by_broker):
            c.closing = True
        self._send_due(c)

    def _send_due(self, c: Conn):
        q, now, blocked = c.outq, time.monotonic(), False
        while q and q[0][0] <= now:
            due, data = q[0]
            try:
                n = c.sock.send(data)
            except BlockingIOError:
                n = 0
            except OSError:
                self._drop(c)
                return
            if n < len(data):
                q[0] = (due, data[n:])
                blocked = True
                break
            q.popleft()
        self._want_write(c, blocked)
        if not q:
            self._delayed.discard(c)
            if c.closing:
                self._drop(c)

    def _process_all(self):
        for ns in self.namespaces.values():
            for c in list(ns.conns):
                if not c.dead:
                    self._process(c)

    def _process(self, c: Conn):
        coll = c.collector
        while True:
            ev = coll.peek()
            if ev is None:
                break
            try:
                self._dispatch(c, ev)
            except Exception:
                log.exception("error handling %s", ev.type)
            coll.pop()
        if not c.dead:
            self._write(c)

    def _drop(self, c: Conn):
        """Close a connection's socket abruptly and release everything its links held."""
        if c.dead:
            return
        c.dead = True
        c.outq.clear()
        self._delayed.discard(c)
        for ctx in list(c.links):
            self._link_gone(ctx)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        try:
            c.sock.close()
        except OSError:
            pass
        c.ns.conns.discard(c)
        c.transport.unbind()

    # ---- proton events ---------------------------------------------------------------------------
    def _dispatch(self, c: Conn, ev):
        t = ev.type
        if t == Event.DELIVERY:
            d = ev.delivery
            ctx = getattr(d.link, "ctx", None)
            if ctx is None or ctx.closed:   # a link the broker detached takes nothing more
                return
            if d.link.is_receiver:
                self._on_incoming(ctx, d)
            elif d.updated:
                self._on_settlement(ctx, d)
        elif t == Event.LINK_FLOW:
            ctx = getattr(ev.link, "ctx", None)
            if ctx is not None and ctx.kind == "recv":
                self._on_credit(ctx)
        elif t == Event.LINK_REMOTE_OPEN:
            self._on_link_open(c, ev.link)
        elif t in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            link = ev.link
            ctx = getattr(link, "ctx", None)
            if ctx is not None:
                self._link_gone(ctx)
            if link.state & Link.LOCAL_ACTIVE:
                link.close()
        elif t == Event.SESSION_REMOTE_OPEN:
            ev.session.open()
        elif t == Event.SESSION_REMOTE_CLOSE:
            if ev.session.state & Link.LOCAL_ACTIVE:
                ev.session.close()
        elif t == Event.CONNECTION_REMOTE_OPEN:
            ev.connection.open()
        elif t == Event.CONNECTION_REMOTE_CLOSE:
            if ev.connection.state & Link.LOCAL_ACTIVE:
                ev.connection.close()
        elif t == Event.TRANSPORT_CLOSED:
            self._write(c)
            if c.outq:
                c.closing = True       # latency: the last frames (close, errors) still go out when due
            else:
                self._drop(c)

    def _next_tag(self) -> bytes:
        self._tag += 1
        return self._tag.to_bytes(8, "big")

    # ---- attach ----------------------------------------------------------------------------------
    def _reject(self, link: Link, condition: str, description: str):
        """Answer an attach with null termini and a closing detach; with a terminus present the SDK would
        report a retried connection error instead of the condition."""
        link.source.type = Terminus.UNSPECIFIED
        link.target.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = _condition(condition, description)
        link.close()

    def _open(self, ctx: LinkCtx):
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

    def _on_link_open(self, c: Conn, link: Link):
        ns = c.ns
        address = (link.remote_source if link.is_sender else link.remote_target).address
        path = entity_path(address)
        lower = path.lower()
        if lower == "$cbs":
            ctx = LinkCtx("cbs-out" if link.is_sender else "cbs-in", c, link, path)
            self._open(ctx)
            if link.is_sender:
                c.reply_links["$cbs"] = link
            return
        if lower.endswith("/$management"):
            node = lower[: -len("/$management")]
            target = ns.entities.get(node) or ns.senders.get(node)
            if target is None:
                return self._reject(link, "amqp:not-found", not_found(ns, node).description)
            # server-busy is answered per request (503), not on attach
            ctx = LinkCtx("mgmt-out" if link.is_sender else "mgmt-in", c, link, path, target)
            self._open(ctx)
            if link.is_sender:
                c.reply_links[lower] = link
            return
        if lower.startswith("$") or not lower:
            return self._reject(link, "amqp:not-implemented",
                                f"The emulator does not support the node '{path}'.")
        if link.is_receiver:   # the client sends to us
            target = ns.senders.get(lower)
            if target is None:
                if lower in ns.entities:
                    return self._reject(link, "amqp:not-allowed",
                                        f"Cannot send to '{path}': not a queue or topic.")
                return self._reject(link, "amqp:not-found", not_found(ns, path).description)
            refusal = ns.refusal(c, path, aad.SEND)
            if refusal is not None:
                return self._reject(link, refusal.condition, refusal.description)
            if ns.is_busy(lower):
                return self._reject(link, "com.microsoft:server-busy", "The entity is unavailable (server busy).")
            # like the service, no com.microsoft:max-message-batch-size: the SDK then takes 256 KB, or
            # 1 MB where the entity takes messages of 1 MB or more (its own fallback)
            link.max_message_size = target.settings.max_message_size_kb * 1024
            target.ops["attach"] += 1
            self._open(LinkCtx("send", c, link, path, target))
            return
        entity = ns.entities.get(lower)
        if entity is None:
            return self._reject(link, "amqp:not-found", not_found(ns, path).description)
        refusal = ns.refusal(c, path, aad.LISTEN)
        if refusal is not None:
            return self._reject(link, refusal.condition, refusal.description)
        if ns.is_busy(lower):
            return self._reject(link, "com.microsoft:server-busy", "The entity is unavailable (server busy).")
        refusal = refusals.status_refusal(ns, entity, send=False)
        if refusal is not None:
            return self._reject(link, refusal.condition, refusal.description)
        ctx = LinkCtx("recv", c, link, path, entity)
        ctx.rad = link.remote_snd_settle_mode == Link.SND_SETTLED
        entity.ops["attach"] += 1
        filters = self._filters(link.remote_source)
        wants_session = SESSION_FILTER in filters
        if wants_session != entity.requires_session:
            return self._reject(link, "amqp:not-allowed",
                                f"'{path}' {'requires' if entity.requires_session else 'does not support'} "
                                f"session receivers.")
        if not wants_session:
            self._open(ctx)
            entity.consumers.append(ctx)
            return
        sid = filters.get(SESSION_FILTER)
        link.ctx = ctx
        if sid is not None:
            sid = codec.as_text(sid)
            s = entity.session(sid)
            if s.owner is not None and s.locked_until > now_ms():
                link.ctx = None
                return self._reject(link, "com.microsoft:session-cannot-be-locked",
                                    f"The requested session '{sid}' cannot be accepted. It may be locked by "
                                    f"another receiver.")
            self._open_session(ctx, s)
        else:
            timeout = (link.remote_properties or {}).get(OPERATION_TIMEOUT)
            ctx.deadline = now_ms() + int(timeout if timeout is not None else DEFAULT_SESSION_WAIT_MS)
            if not self._try_next_session(entity, ctx):
                entity.session_waiters.append(ctx)

    @staticmethod
    def _filters(source) -> Dict:
        data = source.filter
        data.rewind()
        if not data.next():
            return {}
        obj = codec.owned(data.get_object())
        return {symbol(str(k)): v for k, v in obj.items()} if isinstance(obj, dict) else {}

    def _try_next_session(self, entity: Entity, ctx: LinkCtx) -> bool:
        now = now_ms()
        for s in entity.sessions.values():
            if (s.owner is None or s.locked_until <= now) and entity.has_available(s):
                if s.owner is not None:
                    self._session_lost(entity, s)
                self._open_session(ctx, s)
                return True
        return False

    def _open_session(self, ctx: LinkCtx, s):
        entity, link = ctx.target, ctx.link
        s.owner = ctx
        s.locked_until = now_ms() + int(entity.settings.lock_duration_seconds * 1000)
        ctx.session = s
        link.properties = {LOCKED_UNTIL_UTC: s.locked_until * 10000 + DOTNET_EPOCH_TICKS}
        self._open(ctx)
        f = link.source.filter
        f.clear()
        f.put_object({SESSION_FILTER: s.id})
        entity.consumers.append(ctx)

    def _link_gone(self, ctx: LinkCtx):
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
        # locks held through this link end with it: the messages become available again (count + 1)
        for token in list(ctx.tokens):
            m = entity.locks.get(token)
            if m is not None and m.lock_owner is ctx:
                entity.abandon(m)
        ctx.tokens.clear()
        if ctx.session is not None and ctx.session.owner is ctx:
            ctx.session.owner = None
            ctx.session.locked_until = 0
        self._pump(entity)

    # ---- incoming transfers ----------------------------------------------------------------------
    def _on_incoming(self, ctx: LinkCtx, d: Delivery):
        link = ctx.link
        if d.aborted:
            ctx.buf.clear()
            d.settle()
            return
        if not d.readable:
            return
        data = link.recv(d.pending)
        if data:
            ctx.buf.append(data)
        if d.partial:
            return
        raw = b"".join(ctx.buf)
        ctx.buf.clear()
        ctx.active_at = time.monotonic()
        link.advance()
        if link.credit < INCOMING_CREDIT // 2:
            link.flow(INCOMING_CREDIT - link.credit)
        if ctx.kind == "send":
            error = ctx.conn.ns.refusal(ctx.conn, ctx.path, aad.SEND)
            try:
                if error is None:
                    self._send(ctx, raw)
            except refusals.LinkRefusal as exc:     # the transfer stays unsettled: the detach answers it
                self._detach(ctx, exc.condition, exc.description)
                return
            except BrokerError as exc:
                error = exc
            if error is not None:
                self._reject_delivery(d, error)
            elif not d.settled:
                d.update(Disposition.ACCEPTED)
            d.settle()
        elif ctx.kind in ("cbs-in", "mgmt-in"):
            if not d.settled:
                d.update(Disposition.ACCEPTED)
            d.settle()
            self._on_request(ctx, raw)
        else:
            d.settle()

    def _send(self, ctx: LinkCtx, raw: bytes):
        ns, target = ctx.conn.ns, ctx.target
        target.ops["send"] += 1
        if ns.is_busy(target.path):
            raise BrokerError("com.microsoft:server-busy", "The entity is unavailable (server busy).")
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
        self.enqueue(ns, target, contents)

    def enqueue(self, ns: Namespace, target, contents: List[Content]) -> List[int]:
        """Store messages in a queue or topic; returns their sequence numbers (-1 = not stored)."""
        if not ns.exists(target):     # a transfer that was on its way when the queue was deleted
            raise not_found(ns, target.path)
        refusal = (ns.send_refusal(target.path) or refusals.status_refusal(ns, target, send=True)
                   or refusals.message_refusal(ns, target, contents))
        if refusal is not None:
            raise refusal
        now = now_ms()
        seqs, touched = [], set()
        for content in contents:
            if content.content_type == PING_CONTENT_TYPE:
                target.counters["pings"] += 1
                seqs.append(-1)
                continue
            if target.dedupe.is_duplicate(content.message_id, now):
                target.counters["duplicates"] += 1
                seqs.append(-1)
                continue
            seq = target.sequencer.next()
            seqs.append(seq)
            if isinstance(target, Topic):
                target.counters["in"] += 1
                for sub in target.subscriptions:
                    if any_rule_matches(target.filters[sub.path], content):
                        if sub.requires_session and content.session_id is None:   # the service's answer
                            sub.dead_letter(sub.enqueue(content, seq, now), *refusals.SESSIONLESS_COPY)
                            touched.add(sub.dlq)
                            continue
                        sub.enqueue(content, seq, now)
                        touched.add(sub)
            else:
                target.enqueue(content, seq, now)
                touched.add(target)
        for e in touched:
            self._pump(e)
        return seqs

    # ---- outgoing deliveries ---------------------------------------------------------------------
    def _pump(self, entity: Entity):
        for ctx in list(entity.consumers):
            self._pump_link(ctx)
        if entity.session_waiters:
            for w in list(entity.session_waiters):
                if self._try_next_session(entity, w):
                    entity.session_waiters.remove(w)

    def _on_credit(self, ctx: LinkCtx):
        ctx.active_at = time.monotonic()
        link = ctx.link
        if link.credit > 0 and not link.drain_mode and not ctx.closed:
            fault = ctx.conn.ns.faults.take("receive", ctx.target)
            if fault is not None:
                # the receive the credit was issued for fails, as when a namespace detaches a link
                self._detach(ctx, fault.condition, fault.error().description)
                return
        self._pump_link(ctx)

    def _pump_link(self, ctx: LinkCtx):
        link, entity = ctx.link, ctx.target
        if ctx.closed or ctx.conn.dead:
            return
        ns = ctx.conn.ns
        if link.credit > 0 and not link.drain_mode:
            # a token that expired while the link was open, or an entity no longer receiving
            refusal = ns.refusal(ctx.conn, ctx.path, aad.LISTEN) or refusals.status_refusal(ns, entity, send=False)
            if refusal is not None:
                self._detach(ctx, refusal.condition, refusal.description)
                return
        if not ns.is_busy(entity.path):
            while link.credit > 0:
                m = entity.next_available(ctx.session)
                if m is None:
                    break
                self._deliver(ctx, m)
        if link.drain_mode and link.credit > 0:
            link.drained()

    def _deliver(self, ctx: LinkCtx, m):
        link, entity = ctx.link, ctx.target
        ctx.active_at = time.monotonic()
        entity.ops["receive"] += 1
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

    def _on_settlement(self, ctx: LinkCtx, d: Delivery):
        token = getattr(d, "ctx", None)
        entity = ctx.target
        state = d.remote_state
        ctx.active_at = time.monotonic()
        if token is None:
            d.settle()
            return
        if not d.settled:     # only a disposition the client waits an answer for can be refused
            ns = ctx.conn.ns
            fault = ns.faults.take("settle", entity)
            error = fault.error() if fault is not None else refusals.status_refusal(ns, entity, send=False)
            if error is not None:
                # the message keeps its lock (and this link its token): a retry can still settle it
                self._reject_delivery(d, error)
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
                self._settle(entity, m, state, d.remote)
            if not d.settled:
                if state == Disposition.MODIFIED:
                    d.local.failed = d.remote.failed
                    d.local.undeliverable = d.remote.undeliverable
                d.update(state)
        except BrokerError as exc:
            self._reject_delivery(d, exc)
        d.settle()
        self._pump(entity)

    @staticmethod
    def _reject_delivery(d: Delivery, error: BrokerError):
        """The ``rejected`` outcome with the error, unless the client settled the delivery already."""
        if not d.settled:
            d.local.condition = _condition(error.condition, error.description)
            d.update(Disposition.REJECTED)

    def _settle(self, entity: Entity, m, state, remote):
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

    # ---- time ------------------------------------------------------------------------------------
    def _tick(self):
        t = time.monotonic()
        if t - self._last_tick < TICK_SECONDS:
            return
        self._last_tick = t
        if t - self._last_idle_check >= IDLE_CHECK_SECONDS:
            self._last_idle_check = t
            self._expire_idle(t)
        now = now_ms()
        for ns in self.namespaces.values():
            for e in ns.all_entities():
                changed = False
                deadline = e.next_deadline()
                if deadline is not None and deadline <= now:
                    changed = e.tick(now)
                for s in list(e.sessions.values()):
                    if s.owner is not None and s.locked_until <= now:
                        self._session_lost(e, s)
                        changed = True
                for w in list(e.session_waiters):
                    if w.deadline <= now:
                        e.session_waiters.remove(w)
                        w.link.ctx = None
                        self._reject(w.link, "com.microsoft:timeout",
                                     "No session available to accept within the timeout.")
                if changed:
                    self._pump(e)

    def _expire_idle(self, now: float):
        """Detach the links and close the connections whose idle timer ran out (``idle``)."""
        for ns in self.namespaces.values():
            for c in list(ns.conns):
                for ctx in list(c.links):
                    if ctx.kind in TIMED_KINDS and ns.idle.link_expired(ctx.active_at, now):
                        ns.idle_counts["links"] += 1
                        if ctx.target is not None:
                            ctx.target.ops["idle_detach"] += 1
                        self._detach(ctx, LINK_DETACH_FORCED, ns.described(
                            ns.idle.link_description(ctx.link.name, ctx.number, ctx.kind), ctx.path))
                if not c.dead and ns.idle.connection_expired(c.linkless_since, c.ever_linked, now):
                    ns.idle_counts["connections"] += 1
                    c.linkless_since, c.closed_by_broker = None, True
                    c.connection.condition = _condition(CONNECTION_FORCED, ns.described(
                        ns.idle.connection_description(c.connection.container, c.ever_linked), "gateway"))
                    c.connection.close()

    def _session_lost(self, entity: Entity, s):
        owner = s.owner
        s.owner, s.locked_until = None, 0
        if owner is not None and not owner.closed:
            self._detach(owner, "com.microsoft:session-lock-lost", "The session lock expired.")

    def _detach(self, ctx: LinkCtx, condition: str, description: str):
        """Release what the link held, then close it with an error the client sees on its next use."""
        link = ctx.link
        self._link_gone(ctx)
        if link.state & Link.LOCAL_ACTIVE:
            link.condition = _condition(condition, description)
            link.close()

    # ---- $cbs and $management --------------------------------------------------------------------
    def _on_request(self, ctx: LinkCtx, raw: bytes):
        req = Message()
        req.decode(raw)
        props = codec.owned(req.properties) or {}
        body = codec.owned(req.body)
        msg_id = codec.owned(req.id)
        reply_to = (req.reply_to or "").lower()
        if ctx.kind == "cbs-in":
            code, desc = self._put_token(ctx.conn, props, body)
            resp = Message(correlation_id=msg_id, properties={"status-code": code, "status-description": desc})
            link = ctx.conn.reply_links.get("$cbs")
        else:
            op = codec.as_text(props.get("operation")) or ""
            try:
                code, result = self._management(ctx, op, body if isinstance(body, dict) else {}, props)
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
        d = link.delivery(self._next_tag())
        link.send(resp.encode())
        link.advance()
        d.settle()

    def _put_token(self, conn: Conn, props: Dict, token) -> tuple:
        ns = conn.ns
        if codec.as_text(props.get("operation")) != "put-token":
            return 501, "amqp:not-implemented: only put-token is supported"
        token = codec.as_text(token) or ""
        audience = entity_path(codec.as_text(props.get("name"))).lower()
        key_rights = aad.ALL_RIGHTS
        if sas.is_sas(token):
            if not ns.cfg.local_auth:
                ns.auth_counts["refused"] += 1
                return 401, ns.described("LocalAuthDisabled: Authorization failed because SAS authentication has "
                                         "been disabled for the namespace.", audience or "$cbs")
            try:
                signed = sas.verify(ns.cfg.sas_keys, token)
                code, desc, expires_on, principal = 200, "OK", signed.expires_on, None
                key_rights = ns.cfg.key_rights(signed.key_name)
            except sas.SasRefused as exc:
                code, desc = 401, str(exc)
        elif ns.cfg.azure_ad is not None:
            try:
                claims = aad.verify_token(ns.cfg.azure_ad.signing_key, token)
                code, desc, expires_on, principal = 200, "OK", claims.expires_on, claims.principal
            except aad.TokenRefused as exc:
                code, desc = 401, ns.described(str(exc), audience or "$cbs")
        elif ns.cfg.sas_keys:
            code, desc = 401, "Unauthorized: not a SharedAccessSignature token"
        else:
            return 200, "OK"
        if code != 200:
            ns.auth_counts["refused"] += 1
            return code, desc
        ns.auth_counts["sas" if principal is None else "jwt"] += 1
        conn.grants[audience] = Grant(principal, expires_on, key_rights)
        return 200, "OK"

    def _management(self, ctx: LinkCtx, op: str, body: Dict, props: Dict):
        ns = ctx.conn.ns
        target = ctx.target
        if not ns.exists(target):
            raise not_found(ns, target.path)
        if ns.is_busy(target.path):
            raise BrokerError("com.microsoft:server-busy", "The entity is unavailable (server busy).", 503)
        # a settlement fault takes update-disposition before a fault on every management operation
        name = management.operation_name(op)
        refusal = ns.refusal(ctx.conn, target.path, aad.SEND if name in SEND_OPERATIONS else aad.LISTEN)
        if refusal is not None:
            raise refusal
        fault = ns.faults.take("settle", target) if name == "update-disposition" else None
        fault = fault or ns.faults.take("management", target)
        if fault is not None:
            raise fault.error()
        refusal = refusals.status_refusal(ns, target, send=name in SEND_OPERATIONS)
        if refusal is not None:
            raise refusal
        return management.handle(self, ctx, target, op, body, props)

    # ---- faults ----------------------------------------------------------------------------------
    def set_unavailable(self, ns_name: str, entity: Optional[str], mode: str):
        ns = self.namespaces[ns_name]
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
            self._unlisten(ns)
            for c in list(ns.conns):
                self._drop(c)

    def set_available(self, ns_name: str, entity: Optional[str]):
        ns = self.namespaces[ns_name]
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
                self._listen(ns)
        for e in ns.all_entities():
            self._pump(e)

    def set_status(self, ns_name: str, path: str, status) -> EntityStatus:
        """Give a queue, topic or subscription (``topic/Subscriptions/name``) a status the service allows it."""
        ns = self.namespaces[ns_name]
        target = entity_status.status_holder(ns, path)
        target.status = entity_status.parse_status(status, entity_status.kind_of(target))
        for e in ns.all_entities():      # receivers of entities that receive again get their messages
            self._pump(e)
        return target.status

    def drop_connections(self, ns_name: str) -> int:
        ns = self.namespaces[ns_name]
        conns = list(ns.conns)
        for c in conns:
            self._drop(c)
        return len(conns)

    def delete_queue(self, ns_name: str, name: str):
        """Remove a queue with its messages. Send and receive links attached to it (or its dead-letter
        queue) are detached with ``amqp:not-found``, and attaches waiting for one of its sessions are
        refused the same way. ``$management`` links stay: their requests answer 404 ``amqp:not-found``,
        which the SDK raises as ``MessagingEntityNotFoundError`` (a detached one it reports as a generic
        ``ServiceBusError``)."""
        ns = self.namespaces[ns_name]
        queue = ns.remove_queue(name)
        gone = (queue, queue.dlq)
        for c in list(ns.conns):
            for ctx in list(c.links):
                if ctx.target in gone and ctx.kind in ("send", "recv"):
                    self._detach(ctx, "amqp:not-found", not_found(ns, ctx.target.path).description)
        for waiter in queue.session_waiters:
            waiter.link.ctx = None
            self._reject(waiter.link, "amqp:not-found", not_found(ns, queue.path).description)
        queue.session_waiters.clear()


def not_found(ns: Namespace, path: str) -> BrokerError:
    return BrokerError("amqp:not-found", f"The messaging entity '{ns.name}/{path}' could not be found.", 404)
