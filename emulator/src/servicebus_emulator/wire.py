"""What lies between a socket and proton's engine on the listeners a real namespace has: TLS (AMQP on
5671) and AMQP over WebSockets over TLS (443, path ``/$servicebus/websocket``, subprotocol ``AMQPWSB10``).

Sans-I/O: a ``Wire`` takes the bytes a socket received and gives back the AMQP bytes for the engine and
the bytes to send back (handshakes, answers to pings); it takes the engine's AMQP bytes and gives back
what to send. The server's loop does all reading and writing (``server``). TLS is Python's ``ssl``
(``SSLObject`` over memory buffers), WebSocket framing is ``wsproto``.

Invariants:
- nothing of the engine's reaches the socket before every layer is open (the TLS handshake done, the
  WebSocket upgrade accepted); the engine's bytes wait in the engine until then;
- the bytes each layer sends go out in the order it made them, through the layers below it;
- a failed handshake (a client that does not trust the certificate, an upgrade to another path or
  without the AMQP subprotocol) ends the connection: ``failed`` says why, for the log.
"""
from __future__ import annotations

import ssl
from enum import Enum
from typing import List, Optional, Tuple

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Message, Ping, RejectConnection,
                            Request, TextMessage)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError



class Transport(str, Enum):
    """The ways into a namespace, each on a listener of its own."""
    AMQP = "amqp"                       # plain AMQP: the emulators' shortcut (UseDevelopmentEmulator=true)
    AMQPS = "amqps"                     # AMQP over TLS: 5671 on a real namespace
    WEBSOCKETS = "amqp-websockets"      # AMQP over WebSockets over TLS: 443 on a real namespace


WEBSOCKET_PATH = "/$servicebus/websocket"
WEBSOCKET_SUBPROTOCOL = "AMQPWSB10"
READ_CHUNK = 1 << 16


class TlsLayer:
    """The server side of TLS on one connection."""

    def __init__(self, context: ssl.SSLContext):
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=True)
        self.open = False       # handshake done
        self.ended = False      # the client closed its side (close_notify)
        self.failed: Optional[str] = None

    def receive(self, data: bytes) -> Tuple[bytes, bytes]:
        """(plaintext for the layer above, bytes to send back)."""
        self._in.write(data)
        if not self.open:
            try:
                self._tls.do_handshake()
                self.open = True
            except ssl.SSLWantReadError:
                return b"", self._out.read()
            except ssl.SSLError as exc:
                self.failed = f"TLS handshake failed: {getattr(exc, 'reason', None) or exc}"
                return b"", self._out.read()
        chunks: List[bytes] = []
        while True:
            try:
                chunk = self._tls.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.ended = True
                break
            except ssl.SSLError as exc:
                self.failed = f"TLS error: {getattr(exc, 'reason', None) or exc}"
                break
            if not chunk:
                self.ended = True
                break
            chunks.append(chunk)
        return b"".join(chunks), self._out.read()

    def send(self, data: bytes) -> bytes:
        if data:
            self._tls.write(data)
        return self._out.read()


class WebSocketLayer:
    """The server side of a WebSocket carrying AMQP: the upgrade of ``WEBSOCKET_PATH`` with the
    ``AMQPWSB10`` subprotocol, then binary messages both ways."""

    def __init__(self):
        self._ws = WSConnection(ConnectionType.SERVER)
        self.open = False
        self.ended = False
        self.failed: Optional[str] = None

    def receive(self, data: bytes) -> Tuple[bytes, bytes]:
        up: List[bytes] = []
        down: List[bytes] = []
        try:
            self._ws.receive_data(data)
            for event in self._ws.events():
                if isinstance(event, Request):
                    down.append(self._upgrade(event))
                elif isinstance(event, BytesMessage):
                    up.append(bytes(event.data))
                elif isinstance(event, TextMessage):
                    self.failed = "a text message on an AMQP WebSocket (AMQP frames travel as binary messages)"
                elif isinstance(event, Ping):
                    down.append(self._ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    self.ended = True
                    down.append(self._ws.send(event.response()))
        except (RemoteProtocolError, LocalProtocolError) as exc:
            self.failed = f"WebSocket protocol error: {exc}"
        return b"".join(up), b"".join(down)

    def _upgrade(self, request: Request) -> bytes:
        path = request.target.split("?", 1)[0]
        if path != WEBSOCKET_PATH:
            self.failed = f"WebSocket upgrade of {path!r} refused (AMQP is served on {WEBSOCKET_PATH})"
            return self._ws.send(RejectConnection(status_code=404))
        if WEBSOCKET_SUBPROTOCOL not in request.subprotocols:
            self.failed = f"WebSocket upgrade without the {WEBSOCKET_SUBPROTOCOL} subprotocol refused"
            return self._ws.send(RejectConnection(status_code=400))
        self.open = True
        return self._ws.send(AcceptConnection(subprotocol=WEBSOCKET_SUBPROTOCOL))

    def send(self, data: bytes) -> bytes:
        if not data or self._ws.state is not ConnectionState.OPEN:
            return b""      # after a close, nothing more goes out (the engine's last words included)
        return self._ws.send(Message(data=data))


class Wire:
    """Layers between a socket and the engine, the socket's side first (TLS, then WebSocket)."""

    def __init__(self, layers):
        self.layers = list(layers)

    @property
    def open(self) -> bool:
        return all(layer.open for layer in self.layers)

    @property
    def ended(self) -> bool:
        return any(layer.ended for layer in self.layers)

    @property
    def failed(self) -> Optional[str]:
        return next((layer.failed for layer in self.layers if layer.failed), None)

    def receive(self, data: bytes) -> Tuple[bytes, bytes]:
        """(AMQP bytes for the engine, bytes to send on the socket) from bytes the socket received."""
        out: List[bytes] = []
        for index, layer in enumerate(self.layers):
            if not data:
                break
            data, back = layer.receive(data)
            out.append(self._down(index, back))
            if layer.failed or layer.ended:
                return b"", b"".join(out)
        return data, b"".join(out)

    def send(self, data: bytes) -> bytes:
        """The bytes to send on the socket for the engine's ``data``."""
        return self._down(len(self.layers), data)

    def _down(self, index: int, data: bytes) -> bytes:
        """``data`` made by layer ``index`` (or the engine), through the layers below it."""
        for layer in reversed(self.layers[:index]):
            if not data:
                break
            data = layer.send(data)
        return data


def wire_for(transport: Transport, context: Optional[ssl.SSLContext]) -> Optional[Wire]:
    """The layers a connection accepted on ``transport``'s listener goes through (None: none, plain AMQP)."""
    if transport is Transport.AMQP:
        return None
    if transport is Transport.AMQPS:
        return Wire([TlsLayer(context)])
    return Wire([TlsLayer(context), WebSocketLayer()])
