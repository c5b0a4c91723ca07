"""AMQP 1.0 front end: one selector loop on one thread drives proton's protocol engine for every
namespace listener and connection, and the broker state behind them.

Only the loop thread touches proton objects or broker state; other threads go through ``Server.call``.
Wire behaviour follows what azure-servicebus 7.15.0 expects (see docs/answers.md and docs/fidelity.md): SASL ANONYMOUS, ``$cbs``
put-token, null terminus plus closing detach for refused attaches, settlement echo of the outcome the
client sent, error conditions always carrying an ``info`` map. This module is the transport: sockets,
proton's engine, and the events it raises, handed on to ``attach`` (a link opened), ``links`` (credit, a
link gone), ``transfers`` (a message sent, a disposition), ``node_requests`` (``$cbs`` and
``$management``) and ``timers``. What a real namespace refuses or limits (``refusals``,
``entity_status``, ``peek_pages``, ``idle``) is decided there.

Each namespace listens on three ports, as a real namespace does: plain AMQP (the emulators' shortcut),
AMQP over TLS and AMQP over WebSockets over TLS (``wire``). A TLS or WebSocket connection's bytes go
through its ``Wire`` both ways: what the socket brings is decoded into ``inbuf`` and pushed into the
engine as it has room; what the engine produces is encoded and queued like delayed output.

Simulated latency: on a namespace with ``latency`` > 0, what the engine produces for a connection is
queued with a due time (produced + latency) and sent once due, in order; the loop's select timeout
never passes the earliest due time, so nothing blocks. With latency 0 a plain connection's output goes
straight out (a TLS or WebSocket connection's is queued, due at once).
"""
from __future__ import annotations

import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Deque, Dict, List, Optional, Tuple

from proton import Collector, Connection, Link, Transport

from . import events, links, timers
from .broker import now_ms
from .cbs import Grant
from .links import LinkCtx
from .namespace import Namespace
from .wire import Transport as AmqpTransport, Wire, wire_for  # proton's Transport is the engine's

log = logging.getLogger(__name__)

TICK_SECONDS = 0.02                  # timer resolution: lock expiry, schedules, TTL, session waits
IDLE_CHECK_SECONDS = 0.1             # idle timers' resolution (they run for seconds to minutes)


class Conn:
    """One client connection: its socket and proton engine, its links and grants, its output waiting for
    its due time (latency), and its idle timer's state."""

    def __init__(self, ns: Namespace, sock: socket.socket, wire: Optional[Wire] = None):
        self.ns, self.sock, self.wire = ns, sock, wire
        self.inbuf = bytearray()        # what the wire decoded that the engine has had no room for yet
        self.tail_closed = False        # the client's side has ended (told to the engine)
        self.eof = False                # ... seen, to tell the engine once inbuf is in
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
        self.closed_by_broker = False                       # the idle timer (or the connection quota) closed it
        self.admitted = False                               # opened within the namespace's connection quota


class Server:
    def __init__(self, config, ports: Optional[Dict[str, Dict[AmqpTransport, int]]] = None,
                 latency_ms: Optional[Dict[str, float]] = None):
        """``ports``: per namespace, the port of each transport (those left out: as configured)."""
        self.config = config
        ports, latency_ms = ports or {}, latency_ms or {}
        self.namespaces: Dict[str, Namespace] = {
            ns.name: Namespace(ns, {**configured_ports(ns), **ports.get(ns.name, {})},
                               latency_ms.get(ns.name, ns.latency_ms))
            for ns in config.namespaces}
        self.tls_context: Optional[ssl.SSLContext] = None    # set by start(): the TLS listeners' certificate
        self.sel = selectors.DefaultSelector()
        self._calls: "queue.Queue" = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._thread: Optional[threading.Thread] = None
        self._running = False
        self._last_tick = 0.0
        self._last_idle_check = 0.0
        self._delayed: set = set()      # connections with output waiting for its due time

    # ---- lifecycle / cross-thread -----------------------------------------------------------------
    def start(self, tls_context: ssl.SSLContext):
        self.tls_context = tls_context
        for ns in self.namespaces.values():
            try:
                self.listen(ns)
            except OSError:
                for bound in self.namespaces.values():
                    self.unlisten(bound)
                raise
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

    def listen(self, ns: Namespace):
        """Bind the namespace's listeners (a port 0 becomes the free port bound, kept for a later listen)."""
        for transport in AmqpTransport:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((ns.host, ns.ports[transport]))
                sock.listen(128)
            except OSError:
                sock.close()
                self.unlisten(ns)
                raise
            sock.setblocking(False)
            ns.ports[transport] = sock.getsockname()[1]
            ns.listeners[transport] = sock
            self.sel.register(sock, selectors.EVENT_READ, ("listen", (ns, transport)))

    def unlisten(self, ns: Namespace):
        for sock in ns.listeners.values():
            self.sel.unregister(sock)
            sock.close()
        ns.listeners.clear()

    def _shutdown(self):
        for ns in self.namespaces.values():
            self.unlisten(ns)
            for c in list(ns.conns):
                self.drop(c)
        self._running = False

    # ---- loop -------------------------------------------------------------------------------------
    def _run(self):
        while self._running:
            try:
                events = self.sel.select(self._select_timeout() if self._delayed else TICK_SECONDS)
                for key, mask in events:
                    kind, obj = key.data
                    if kind == "listen":
                        self._accept(*obj)
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

    def _accept(self, ns: Namespace, transport: AmqpTransport):
        try:
            sock, _ = ns.listeners[transport].accept()
        except (BlockingIOError, OSError):
            return
        if ns.refusing:
            sock.close()
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = Conn(ns, sock, wire_for(transport, self.tls_context))
        ns.accepted[transport.value] += 1
        ns.conns.add(c)
        self.sel.register(sock, selectors.EVENT_READ, ("conn", c))

    def _read(self, c: Conn):
        if c.wire is not None:
            self._read_wire(c)
            return
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

    def _read_wire(self, c: Conn):
        """Decode what the socket brought (TLS, WebSocket) and give the engine what it has room for."""
        if c.eof:
            return
        try:
            data = c.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            c.eof = True
        else:
            up, back = c.wire.receive(data)
            self._queue(c, back)
            if c.wire.failed:
                log.debug("namespace %s: connection ended: %s", c.ns.name, c.wire.failed)
                c.closing = True        # once what the wire answered (an alert, a refused upgrade) is out
                self._send_due(c)
                return
            c.inbuf += up
            c.eof = c.wire.ended
        self._feed(c)

    def _feed(self, c: Conn):
        """Push decoded bytes into the engine as far as it has room; what is left waits for the next loop."""
        t = c.transport
        while c.inbuf:
            cap = t.capacity()
            if cap < 0:
                c.inbuf.clear()
                break
            if cap == 0:
                self._process(c)   # let the engine consume what it has
                if c.dead or t.capacity() <= 0:
                    break
                continue
            n = min(cap, len(c.inbuf))
            t.push(bytes(c.inbuf[:n]))
            del c.inbuf[:n]
        if c.eof and not c.inbuf and not c.tail_closed:
            c.tail_closed = True
            t.close_tail()
        if not c.dead:
            self._process(c)

    def _queue(self, c: Conn, data: bytes):
        """Bytes for the socket, sent once due (now plus the namespace's latency), after those before them."""
        if data:
            c.outq.append((time.monotonic() + c.latency, data))
            self._delayed.add(c)

    def _write(self, c: Conn):
        if c.latency or c.wire is not None:
            self._write_later(c)
            return
        t = c.transport
        while True:
            pending = t.pending()
            if pending < 0 and c.closed_by_broker and not t.closed:
                break       # our close is out: the socket stays until the client answers (or goes)
            if pending < 0:
                self.drop(c)
                return
            if pending == 0:
                break
            try:
                n = c.sock.send(t.peek(pending))
            except BlockingIOError:
                break
            except OSError:
                t.close_head()
                self.drop(c)
                return
            t.pop(n)
            if n < pending:
                break
        self._want_write(c, t.pending() > 0)
        if t.closed:
            self.drop(c)

    def _want_write(self, c: Conn, want: bool):
        if want != c.want_write:
            c.want_write = want
            self.sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), ("conn", c))

    def _write_later(self, c: Conn):
        """Latency > 0, or a wire: take what the engine produced (encoded by the wire, once it is open), due
        ``latency`` from now, then send what is due."""
        t = c.transport
        chunks = []
        pending = t.pending()
        while pending > 0 and (c.wire is None or c.wire.open):
            chunks.append(t.peek(pending))
            t.pop(pending)
            pending = t.pending()
        if chunks:
            data = b"".join(chunks)
            self._queue(c, data if c.wire is None else c.wire.send(data))
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
                self.drop(c)
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
                self.drop(c)

    def _process_all(self):
        for ns in self.namespaces.values():
            for c in list(ns.conns):
                if not c.dead:
                    if c.inbuf:
                        self._feed(c)
                    else:
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

    def drop(self, c: Conn):
        """Close a connection's socket abruptly: its links are lost (their locks outlive them, ``links``)."""
        if c.dead:
            return
        c.dead = True
        c.outq.clear()
        self._delayed.discard(c)
        for ctx in list(c.links):
            links.link_gone(ctx)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.inbuf.clear()
        try:
            c.sock.close()
        except OSError:
            pass
        c.ns.conns.discard(c)
        if c.admitted:
            c.ns.admitted_connections -= 1
        c.transport.unbind()

    # ---- proton events (``events``) ------------------------------------------------------------------
    def _dispatch(self, c: Conn, ev):
        events.dispatch(c, ev, self._transport_closed)

    def _transport_closed(self, c: Conn):
        self._write(c)
        if c.outq:
            c.closing = True       # latency: the last frames (close, errors) still go out when due
        else:
            self.drop(c)

    # ---- time ------------------------------------------------------------------------------------
    def _tick(self):
        t = time.monotonic()
        if t - self._last_tick < TICK_SECONDS:
            return
        self._last_tick = t
        if t - self._last_idle_check >= IDLE_CHECK_SECONDS:
            self._last_idle_check = t
            timers.expire_idle(self.namespaces.values(), t)
        timers.expire_entities(self.namespaces.values(), now_ms(), t)


def configured_ports(cfg) -> Dict[AmqpTransport, int]:
    """A namespace configuration's port per transport."""
    return {AmqpTransport.AMQP: cfg.port, AmqpTransport.AMQPS: cfg.tls_port, AmqpTransport.WEBSOCKETS: cfg.websocket_port}
