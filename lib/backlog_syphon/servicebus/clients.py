"""Service Bus clients and links: one client per namespace and process, senders and receivers pooled.

Every SDK sender or receiver opens its own AMQP connection: a handshake of about ten frames, and a
close (``sdk_internals.prompt`` takes the SDK's idle waits out of both, which were about a second per
link on any network). Like Spark's Kafka connector pools its consumers, executors
and the driver keep them open per process and reuse them across tasks and batches; a link that
fails is discarded and reopened on next use. Clients of a namespace with Azure AD share the
process's credential (``credentials.credential_for``), so its token is taken once per process.
Every client goes the way its namespace's settings say (``network_options``: the transport, a custom
endpoint, an HTTP proxy, the certificate authorities to trust), on the driver and the executors alike.
Connection strings and the proxy's password never appear in an exception or log line raised from here.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterable, TypeVar

from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode, TransportType

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.errors import SettingsError
from backlog_syphon.model import Transport
from backlog_syphon.partitions import split_lane_key
from backlog_syphon.servicebus import sdk_internals
from backlog_syphon.servicebus.credentials import credential_for

logger = logging.getLogger(__name__)

# Whatever this process receives or peeks through the SDK's decoder (the purge, reports, tests) may
# hold AMQP chars and decimals legacy clients write: teach the decoder before any client exists.
sdk_internals.install_decoder_patch()


class ServiceBusAccessError(SettingsError):
    """A namespace cannot be used as configured (auth, bad endpoint, missing entity): operator action needed."""


def network_options(namespace: NamespaceConfig) -> dict[str, Any]:
    """``ServiceBusClient`` keywords for the way to the namespace: its transport (AMQP over TLS, or over
    WebSockets), a custom endpoint, the certificate authorities to trust, an HTTP proxy."""
    websockets = namespace.transport_kind is Transport.AMQP_WEBSOCKETS
    options: dict[str, Any] = {"transport_type": TransportType.AmqpOverWebsocket if websockets else TransportType.Amqp}
    if namespace.custom_endpoint_address:
        options["custom_endpoint_address"] = namespace.custom_endpoint_address
    if namespace.ca_file:
        options["connection_verify"] = namespace.ca_file
    if namespace.proxy_host:
        proxy: dict[str, Any] = {"proxy_hostname": namespace.proxy_host, "proxy_port": namespace.proxy_port}
        if namespace.proxy_user is not None:
            proxy.update(username=namespace.proxy_user, password=namespace.proxy_password.reveal())
        options["http_proxy"] = proxy
    return options


def open_client(namespace: NamespaceConfig, *, retry_total: int = 3, role: str = "namespace") -> ServiceBusClient:
    """A ServiceBusClient for a namespace config; the caller closes it (``with``)."""
    retries = {"retry_total": retry_total, "retry_backoff_factor": 0.5, "retry_backoff_max": 10,
               **network_options(namespace)}
    if namespace.connection_string is not None:
        try:
            return ServiceBusClient.from_connection_string(namespace.connection_string.reveal(), **retries)
        except (ValueError, TypeError) as exc:
            # The SDK's message can quote the string it failed to parse: never pass it on.
            raise ServiceBusAccessError(
                f"the {role} connection string (from {namespace.connection_string.source}) is not valid: "
                f"{type(exc).__name__}; check Endpoint, SharedAccessKeyName and SharedAccessKey") from None
    return ServiceBusClient(namespace.fully_qualified_namespace, credential_for(namespace.azure_ad), **retries,
                            **sdk_internals.emulator_client_options(namespace.use_development_emulator))


class _HandlerPool:
    """Senders and receivers kept open per process (executor Python worker or driver) and reused
    (see the module docstring); a handler that fails is discarded and reopened on next use.

    Service Bus detaches a link that has carried nothing for 10 minutes (``amqp:link:detach-forced``,
    IdleTimerExpired) and closes a connection 5 minutes after its last link went. A handler idle for the
    namespace's ``idle_link_seconds`` (8 minutes by default) is closed and opened afresh before it is used
    again, rather than met detached: its next operation would fail first (the SDK logs it as an error and
    waits out its retry back-off, or, for a management request, raises it) and locks received on a detached
    link can no longer be settled. A peek receiver is replaced once it is that old, however often it
    peeks: its peeks go over its management link, while its receive link, which never receives, sits
    idle from the start (and the broker's detach of it breaks the next peek)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._lock = threading.Lock()
        self._clients: dict[tuple, ServiceBusClient] = {}
        self._handlers: dict[tuple, Any] = {}
        self._used: dict[tuple, float] = {}  # when each handler was last handed out (or, ``by_age``, opened)
        self._clock = clock

    @staticmethod
    def _namespace_key(namespace: NamespaceConfig, role: str) -> tuple:
        secret = namespace.connection_string.reveal() if namespace.connection_string else ""
        credential = namespace.azure_ad.cache_key if namespace.azure_ad is not None else None
        return (role, namespace.fully_qualified_namespace, hashlib.sha256(secret.encode()).hexdigest(), credential,
                namespace.use_development_emulator, namespace.network_key)

    def get(self, namespace: NamespaceConfig, role: str, key: tuple, make: Callable[[ServiceBusClient], Any], *,
            by_age: bool = False):
        client_key = self._namespace_key(namespace, role)
        now = self._clock()
        stale = None
        with self._lock:
            handler = self._handlers.get((client_key, key))
            if handler is not None and now - self._used.get((client_key, key), now) > namespace.idle_link_seconds:
                stale, handler = self._handlers.pop((client_key, key)), None
            if handler is None or not by_age:
                self._used[(client_key, key)] = now
            if handler is None:
                handler = sdk_internals.prompt(make(self._client(client_key, namespace, role)))
                if role == "secondary":  # its operations are paced by ``throttling``, which retries busy answers
                    handler = sdk_internals.busy_answers_raise(handler)
                    try:
                        _NAMESPACES[handler] = namespace
                    except TypeError:  # not weakly referenceable: a test's stand-in, not paced
                        pass
                self._handlers[(client_key, key)] = handler
        if stale is not None:
            logger.debug("a pooled Service Bus link idle for over %.0f s was closed and opened again",
                         namespace.idle_link_seconds)
            _close_quietly(stale)
        return handler

    def client(self, namespace: NamespaceConfig, role: str) -> ServiceBusClient:
        """The process's client of the namespace in that role (opened on first use)."""
        with self._lock:
            return self._client(self._namespace_key(namespace, role), namespace, role)

    def _client(self, client_key: tuple, namespace: NamespaceConfig, role: str) -> ServiceBusClient:
        client = self._clients.get(client_key)
        if client is None:
            client = self._clients[client_key] = open_client(namespace, role=role,
                                                             retry_total=2 if role == "primary" else 3)
        return client

    def discard(self, namespace: NamespaceConfig, role: str, key: tuple) -> None:
        with self._lock:
            handler = self._handlers.pop((self._namespace_key(namespace, role), key), None)
            self._used.pop((self._namespace_key(namespace, role), key), None)
        if handler is not None:
            _close_quietly(handler)

    def close(self, namespace: NamespaceConfig, role: str, keys: Iterable[tuple]) -> None:
        """Close the given handlers, and the namespace's client once no handler of it is left."""
        client_key, keys = self._namespace_key(namespace, role), list(keys)
        with self._lock:
            handlers = [self._handlers.pop((client_key, key), None) for key in keys]
            for key in keys:
                self._used.pop((client_key, key), None)
            unused = not any(known == client_key for known, _ in self._handlers)
            client = self._clients.pop(client_key, None) if unused else None
        for handler in handlers + [client]:
            if handler is not None:
                _close_quietly(handler)


def _close_quietly(handler) -> None:
    try:
        handler.close()
    except Exception:  # noqa: BLE001 - closing a broken link may fail; nothing to keep
        pass


_POOL = _HandlerPool()
# The namespace each pooled handler operates on: its operations are paced by that namespace's credits
# (``throttling``), wherever in the process they are made.
_NAMESPACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def namespace_of(handler) -> NamespaceConfig | None:
    """The namespace a handler of the pool operates on (None: not the pool's)."""
    try:
        return _NAMESPACES.get(handler)
    except TypeError:  # not weakly referenceable: a test's stand-in
        return None


@contextmanager
def pooled_receiver(namespace: NamespaceConfig, queue: str, *, purpose: str = "peek"):
    """A PEEK_LOCK receiver without prefetch on ``queue`` from the process pool, one per purpose.

    ``peek`` receivers only peek (the management link; their receive link never gets credit, so
    they lock nothing); ``settle`` receivers receive and settle for the purge.
    """
    key = ("receiver", purpose, queue)
    receiver = _receiver(namespace, queue, purpose)
    try:
        yield receiver
    except BaseException:
        _POOL.discard(namespace, "secondary", key)
        raise


def _receiver(namespace: NamespaceConfig, queue: str, purpose: str):
    # ``queue`` may name one partition lane of a queue (``partitions.lane_key``): the planner probes a
    # partitioned queue's lanes at once, each on a link of its own (one link serves one request at a time).
    entity = split_lane_key(queue)[0]
    if purpose == "peek" and entity.lower() in _BROWSE_ONLY.get(namespace.endpoint, ()):
        return _POOL.get(namespace, "secondary", ("receiver", purpose, queue),
                         lambda client: sdk_internals.management_handle(client, entity), by_age=True)
    return _POOL.get(namespace, "secondary", ("receiver", purpose, queue), lambda client: client.get_queue_receiver(
        entity, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0), by_age=purpose == "peek")


# Entities (lower-case paths, per namespace endpoint) peeked through a management-only link in this process:
# a session-enabled entity refuses a receive link without a session, a topic any receive link (``browse_only``).
_BROWSE_ONLY: dict[str, frozenset[str]] = {}


def browse_only(namespace: NamespaceConfig, entities: Iterable[str]) -> None:
    """Peek ``entities`` (paths) of ``namespace`` through a management-only link from now on in this process (the
    migration mode's session-enabled sources and topics: ``model.SourceEntity.browse_only``). Each process that
    peeks them registers them first: the driver at the run's start, an executor with the source's options."""
    names = frozenset(entity.lower() for entity in entities)
    if names:
        with _BROWSE_LOCK:
            _BROWSE_ONLY[namespace.endpoint] = _BROWSE_ONLY.get(namespace.endpoint, frozenset()) | names


_BROWSE_LOCK = threading.Lock()


def open_peek_receivers(namespace: NamespaceConfig, queues: Iterable[str]) -> None:
    """Open the pooled peek receivers of ``queues`` at once (see ``open_in_parallel``)."""
    open_in_parallel(_receiver(namespace, queue, "peek") for queue in queues)


def close_peek_receivers(namespace: NamespaceConfig, queues: Iterable[str]) -> None:
    """Close the pooled peek receivers of ``queues`` (and the client, once nothing else uses it)."""
    _POOL.close(namespace, "secondary", [("receiver", "peek", queue) for queue in queues])


@contextmanager
def session_receiver(namespace: NamespaceConfig, entity: str, session_id: str, *, role: str = "secondary"):
    """A PEEK_LOCK receiver of one session of ``entity`` (it takes the session's lock), without prefetch, closed
    on leaving: session locks are the purge's and the state move's for as long as they need them, never pooled.
    ``role``: the namespace's role (the source's, or ``primary`` for the target's session states)."""
    receiver = sdk_internals.prompt(_POOL.client(namespace, role).get_queue_receiver(
        entity, session_id=session_id, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0))
    with receiver:
        yield receiver


def source_sender(namespace: NamespaceConfig, entity: str):
    """The process pool's sender to a source entity (a queue or topic of the secondary namespace): what cancels
    its scheduled messages, by sequence number."""
    return _POOL.get(namespace, "secondary", ("sender", entity), lambda client: client.get_queue_sender(entity))


def discard_source_sender(namespace: NamespaceConfig, entity: str) -> None:
    _POOL.discard(namespace, "secondary", ("sender", entity))


def pooled_sender(namespace: NamespaceConfig, destination: str):
    """The process pool's sender to ``destination`` in the primary namespace (opened on first use)."""
    return _POOL.get(namespace, "primary", ("sender", destination), lambda client: client.get_queue_sender(destination))


def discard_sender(namespace: NamespaceConfig, destination: str) -> None:
    """Drop a pooled sender after an error, so the next use opens a fresh link."""
    _POOL.discard(namespace, "primary", ("sender", destination))


LINKS_AT_ONCE = 32  # links of different entities at once: each waits on its own connection, nearly all on the network

K = TypeVar("K")
T = TypeVar("T")


def each_at_once(items: Iterable[K], work: Callable[[K], T], *, name: str) -> dict[K, T]:
    """``{item: work(item)}``, the items' work concurrently (up to ``LINKS_AT_ONCE`` threads named ``name``):
    one round trip of time for many entities where one after the other would cost one per entity. The
    first error raises; a single item runs in this thread."""
    from concurrent.futures import ThreadPoolExecutor

    items = list(items)
    if len(items) <= 1:
        return {item: work(item) for item in items}
    with ThreadPoolExecutor(max_workers=min(LINKS_AT_ONCE, len(items)), thread_name_prefix=name) as pool:
        return dict(zip(items, pool.map(work, items)))


def open_in_parallel(handlers: Iterable) -> None:
    """Open SDK senders or receivers concurrently instead of one after the other.

    Each opens its own connection, a few round trips (``sdk_internals.prompt``), almost all of it
    waiting on the network; so they open at once (``each_at_once``). A failure is left for the first real
    operation on the handler to report.
    """
    def open_one(handler) -> None:
        try:
            sdk_internals.open_with_retry(handler)  # what the first operation would do
        except Exception:  # noqa: BLE001 - reported by the operation that needs the handler
            logger.debug("opening a Service Bus link in advance failed", exc_info=True)

    handlers = list(handlers)
    if len(handlers) > 1:
        each_at_once(range(len(handlers)), lambda index: open_one(handlers[index]), name="open-link")
