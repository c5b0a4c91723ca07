"""Public API: ``Emulator(config).start()`` runs the broker on a background thread and each namespace's
administration API (HTTPS) on threads of its own."""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any, Dict, Iterable, Mapping, Optional, Union

from . import entity_status, fault_switches
from .aad import ROLES
from .admin_api import AdminApi
from .admin_tls import TlsFiles, server_context, write_certificates
from .config import EmulatorConfig, QueueConfig, RoleAssignment, check_latency_ms, check_partitioning, queue_from_dict
from .entity_status import EntityStatus
from .faults import DEFAULT_CONDITIONS, OPERATIONS, PEEK_MODES, Fault
from .server import Server
from .wire import Transport

DEVELOPMENT_SUFFIX = "UseDevelopmentEmulator=true"


class Emulator:
    """A local Service Bus emulator: per configured namespace, three AMQP listeners (plain, TLS, WebSockets
    over TLS) and one administration API (HTTPS).

    ``ports`` overrides configured ports per namespace (0 = ephemeral). ``admin_ports`` does the same for
    the administration API; a namespace it leaves out whose AMQP port ``ports`` sets to 0 gets an ephemeral
    administration port too, so tests that pick free ports never collide on a configured one.
    ``latency_ms`` overrides the configured ``latency_ms`` (delay added to every frame the emulator sends,
    and to every administration answer): one number for every namespace, or ``{namespace: ms}`` for some.
    ``tls_ports`` and ``websocket_ports`` do the same for AMQP over TLS and over WebSockets.
    ``tls_dir``: where the certificates are written (default: a temporary directory removed by ``stop()``).
    ``certificate_names``: the host names and addresses the server certificate names (default: 127.0.0.1,
    ::1, localhost and the namespaces' hosts): a test of a host name it does not name gives others.
    Thread-safe: every method may be called from any thread while the emulator runs.
    """

    def __init__(self, config: EmulatorConfig, ports: Optional[Dict[str, int]] = None,
                 latency_ms: Union[None, float, Mapping[str, float]] = None,
                 admin_ports: Optional[Dict[str, int]] = None, tls_dir: Optional[str] = None,
                 tls_ports: Optional[Dict[str, int]] = None, websocket_ports: Optional[Dict[str, int]] = None,
                 certificate_names: Optional[Iterable[str]] = None):
        self.config = config
        tls = resolve_admin_ports(config, ports, tls_ports, "tls_port")
        websocket = resolve_admin_ports(config, ports, websocket_ports, "websocket_port")
        listener_ports = {ns.name: {Transport.AMQP: (ports or {}).get(ns.name, ns.port), Transport.AMQPS: tls[ns.name],
                                    Transport.WEBSOCKETS: websocket[ns.name]} for ns in config.namespaces}
        self._server = Server(config, listener_ports, resolve_latency(config, latency_ms))
        self._admin = AdminApi(self._server, resolve_admin_ports(config, ports, admin_ports))
        self._tls_dir = tls_dir
        self._own_tls_dir: Optional[str] = None
        self._certificate_names = None if certificate_names is None else list(certificate_names)
        self._tls: Optional[TlsFiles] = None
        self._started = False

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "Emulator":
        """Make the certificates, bind every listener and start serving; returns once all namespaces accept
        connections (AMQP, TLS, WebSockets and HTTPS)."""
        if not self._started:
            directory = self._tls_dir or tempfile.mkdtemp(prefix="servicebus-emulator-tls-")
            os.makedirs(directory, exist_ok=True)
            self._own_tls_dir = None if self._tls_dir else directory
            try:
                self._tls = write_certificates(directory, [ns.host for ns in self.config.namespaces],
                                               self._certificate_names)
                context = server_context(self._tls)
                self._server.start(context)
                try:
                    self._admin.start(context)
                except BaseException:
                    self._server.stop()
                    raise
            except BaseException:
                self._remove_own_tls_dir()
                raise
            self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            self._admin.stop()
            self._server.stop()
            self._remove_own_tls_dir()
            self._started = False

    def _remove_own_tls_dir(self) -> None:
        if self._own_tls_dir:
            shutil.rmtree(self._own_tls_dir, ignore_errors=True)
            self._own_tls_dir = None

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- addressing -----------------------------------------------------------------------------
    def port(self, namespace: str, transport: Union[str, Transport] = Transport.AMQP) -> int:
        """The port of ``namespace``'s listener for ``transport`` (``amqp``: plain, ``amqps``: TLS,
        ``amqp-websockets``: WebSockets over TLS), as bound once started."""
        return self._ns(namespace).ports[Transport(transport)]

    def endpoint(self, namespace: str, transport: Union[str, Transport] = Transport.AMQP) -> str:
        """``sb://host:port`` of a listener: what a client passes as ``custom_endpoint_address`` to reach the
        TLS or WebSocket listener (with ``transport_type`` and ``connection_verify=emulator.ca_file``)."""
        return f"sb://{self._ns(namespace).host}:{self.port(namespace, transport)}"

    def client_options(self, namespace: str, transport: Union[str, Transport]) -> Dict[str, Any]:
        """The ``ServiceBusClient`` keywords that reach ``transport``'s listener with a connection string of
        ``connection_string(namespace, transport=...)`` (or a credential and the namespace's host): the
        listener as ``custom_endpoint_address``, the transport type, and the authority to trust."""
        from azure.servicebus import TransportType     # the SDK is a client's, not the emulator's, dependency

        transport = Transport(transport)
        if transport is Transport.AMQP:
            return {}
        kind = TransportType.AmqpOverWebsocket if transport is Transport.WEBSOCKETS else TransportType.Amqp
        return {"custom_endpoint_address": self.endpoint(namespace, transport), "transport_type": kind,
                "connection_verify": self.ca_file}

    def latency_ms(self, namespace: str) -> float:
        """The delay added to every frame the emulator sends on ``namespace``'s connections."""
        return self._ns(namespace).latency_ms

    def connection_string(self, namespace: str, key_name: Optional[str] = None, key: Optional[str] = None,
                          *, mask: bool = False, transport: Union[str, Transport] = Transport.AMQP) -> str:
        """An SDK connection string for ``namespace``. ``mask=True`` hides the key (for printing).

        ``transport`` ``amqp`` (plain) names the plain port and says ``UseDevelopmentEmulator=true``; for TLS or
        WebSockets the string names the namespace's host only, as a real namespace's does (the SDK then goes
        to 5671 or 443 over TLS): a client adds ``client_options(namespace, transport)`` to reach the
        emulator's port and trust its certificate."""
        if Transport(transport) is Transport.AMQP:
            return self._connection_string(namespace, self._ns(namespace).port, key_name, key, mask)
        return self._connection_string(namespace, None, key_name, key, mask)

    def admin_port(self, namespace: str) -> int:
        """The administration API's HTTPS port of ``namespace`` (as bound, once started)."""
        self._ns(namespace)
        return self._admin.apis[namespace].port

    def admin_endpoint(self, namespace: str) -> str:
        """``host:port`` of the administration API: what ``ServiceBusAdministrationClient`` takes as
        ``fully_qualified_namespace`` (with ``connection_verify=emulator.ca_file``)."""
        return f"{self._ns(namespace).host}:{self.admin_port(namespace)}"

    def admin_connection_string(self, namespace: str, key_name: Optional[str] = None, key: Optional[str] = None,
                                *, mask: bool = False) -> str:
        """A connection string naming the administration API's endpoint, for
        ``ServiceBusAdministrationClient.from_connection_string(..., connection_verify=emulator.ca_file)``."""
        return self._connection_string(namespace, self.admin_port(namespace), key_name, key, mask)

    @property
    def ca_file(self) -> str:
        """The PEM file of the authority that signed the certificate of the administration API and of the
        TLS and WebSocket listeners (made at ``start()``): pass it as ``connection_verify``."""
        if self._tls is None:
            raise RuntimeError("the certificates are made by start(): start the emulator first")
        return self._tls.ca_file

    def _connection_string(self, namespace: str, port: Optional[int], key_name: Optional[str], key: Optional[str],
                           mask: bool) -> str:
        ns = self._ns(namespace)
        keys = ns.cfg.sas_keys
        if key_name is None:
            key_name = next(iter(keys), "RootManageSharedAccessKey")
        if key is None:
            key = keys.get(key_name, "local-emulator-key")
        if mask:
            key = "***"
        if port is None:
            return f"Endpoint=sb://{ns.host}/;SharedAccessKeyName={key_name};SharedAccessKey={key}"
        return (f"Endpoint=sb://{ns.host}:{port};SharedAccessKeyName={key_name};"
                f"SharedAccessKey={key};{DEVELOPMENT_SUFFIX}")

    def connection_strings(self, *, mask: bool = False) -> Dict[str, str]:
        return {name: self.connection_string(name, mask=mask) for name in self._server.namespaces}

    # ---- inspection -----------------------------------------------------------------------------
    def stats(self, namespace: str) -> Dict[str, Dict[str, Any]]:
        """Counters and live depths per entity (queues, topics, subscriptions, dead-letter queues)."""
        def collect():
            ns = self._ns(namespace)
            out: Dict[str, Dict[str, Any]] = {}
            for target in ns.senders.values():
                out[target.path] = target.stats()
                for sub in getattr(target, "subscriptions", ()):
                    out[sub.path] = sub.stats()
                    out[sub.dlq.path] = sub.dlq.stats()
                if getattr(target, "dlq", None) is not None:
                    out[target.dlq.path] = target.dlq.stats()
            return out
        return self._server.call(collect)

    def auth_stats(self, namespace: str) -> Dict[str, int]:
        """Put-tokens the namespace took (``sas``, ``jwt``: Azure AD) and ``refused``, since it started."""
        return self._server.call(lambda: dict(self._ns(namespace).auth_counts))

    def credit_stats(self, namespace: str) -> Dict[str, Any]:
        """The namespace's credit budget (``credits_per_second``; 0: none) and, since it started, the credits
        spent per kind of operation (``spent``: send, filter, receive, peek, settle, renew_lock, management,
        administration; ``spent_total``) and the operations throttled per kind (``throttled``,
        ``throttled_total``: out of credits, or under the ``server-busy`` switch). Spending is counted with the budget off too. Connections refused for the
        namespace's quota are ``refused_connections``."""
        def collect():
            ns = self._ns(namespace)
            return {**ns.credits.stats(), "refused_connections": ns.refused_connections}
        return self._server.call(collect)

    def set_credits_per_second(self, namespace: str, credits_per_second: float) -> None:
        """Change the namespace's credit budget while it runs (0: none), from the next operation on."""
        if not 0 <= credits_per_second < float("inf"):
            raise ValueError(f"credits_per_second must be 0 or more, got {credits_per_second!r}")
        def apply():
            credits = self._ns(namespace).credits
            credits.per_second = credits.balance = float(credits_per_second)
        self._server.call(apply)

    def connection_stats(self, namespace: str) -> Dict[str, int]:
        """Connections the namespace has taken since it started, per transport (``amqp``, ``amqps``,
        ``amqp-websockets``)."""
        return self._server.call(lambda: {t.value: self._ns(namespace).accepted[t.value] for t in Transport})

    def idle_stats(self, namespace: str) -> Dict[str, int]:
        """Links the namespace detached (``links``) and connections it closed (``connections``) because
        their idle timer ran out, since it started."""
        return self._server.call(lambda: {"links": 0, "connections": 0, **self._ns(namespace).idle_counts})

    # ---- faults and test helpers ----------------------------------------------------------------
    def assign_role(self, namespace: str, principal: str, role: str, scope: str = "") -> None:
        """Give ``principal`` an Azure role on the namespace (``scope`` empty) or one entity, as
        ``az role assignment create`` does; links attached from then on get its rights (the namespace
        needs an ``azure_ad`` section)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        ns = self._ns(namespace)
        if ns.cfg.azure_ad is None:
            raise ValueError(f"namespace {namespace!r} has no azure_ad section")
        self._server.call(ns.role_assignments.append, RoleAssignment(principal, role, scope.strip("/")))

    def set_unavailable(self, namespace: str, entity: Optional[str] = None, mode: str = "server-busy") -> None:
        """``server-busy``: every operation on the entity (or namespace) is throttled, as a namespace out of its
        credits answers: attaches, sends, peeks and every other management request (503), settlements,
        a receive's credit (the link is detached) and the administration API's reads (HTTP 503) fail
        with ``com.microsoft:server-busy`` and the service's text. ``refuse`` (namespace only): the listener closes and open
        connections drop until ``set_available``. ``quota-exceeded``: senders still attach, and every
        message sent (or scheduled) to the entity is refused with ``amqp:resource-limit-exceeded``;
        receiving and peeking go on. ``disabled``: the queue or topic (None: every one) becomes
        SendDisabled, as ``set_status`` does. ``throttled``: the same as quota-exceeded, refused
        with ``com.microsoft:server-busy`` (status 503), as a namespace out of its throughput credits
        answers: links stay attached, peeks and receives go on, and the next send after
        ``set_available`` succeeds on the same link."""
        self._server.call(fault_switches.set_unavailable, self._server, self._ns(namespace), entity, mode)

    def set_available(self, namespace: str, entity: Optional[str] = None) -> None:
        """Undo ``set_unavailable``: the entity's own switches, or (no entity) every switch of the namespace
        (sending is enabled again however it was disabled; a ReceiveDisabled status stays)."""
        self._server.call(fault_switches.set_available, self._server, self._ns(namespace), entity)

    def set_status(self, namespace: str, entity: str, status: Union[str, EntityStatus]) -> EntityStatus:
        """Set a queue's, topic's or subscription's (``topic/Subscriptions/name``) status while the
        emulator runs: ``Active``, ``SendDisabled``, ``ReceiveDisabled`` or ``Disabled`` for a queue;
        topics take no ``ReceiveDisabled``, subscriptions no ``SendDisabled`` (``ValueError``). Sends to a
        queue or topic that does not send, and receives, peeks and settlements on one that does not
        receive, are refused with ``com.microsoft:entity-disabled``; attached receivers are detached
        with it on their next receive. Returns the status set."""
        return self._server.call(fault_switches.set_status, self._ns(namespace), entity, status)

    def status(self, namespace: str, entity: str) -> EntityStatus:
        """A queue's, topic's or subscription's status now."""
        self._ns(namespace)
        return self._server.call(lambda: entity_status.status_holder(self._ns(namespace), entity).status)

    def drop_connections(self, namespace: str) -> int:
        """Close every open connection of the namespace abruptly; returns how many were open."""
        return self._server.call(fault_switches.drop_connections, self._server, self._ns(namespace))

    def add_queue(self, namespace: str, name: str, **settings) -> None:
        """Create a queue at runtime (tests); ``ValueError`` when the name is taken. ``settings`` are a queue's
        configuration keys (``enable_partitioning=True`` for a partitioned one)."""
        ns = self._ns(namespace)
        qcfg: QueueConfig = queue_from_dict({"name": name, **settings}, f"add_queue({name})",
                                            allow_short_locks=ns.settings.allow_short_locks)
        check_partitioning(ns.settings, [qcfg], f"add_queue({name})")
        self._server.call(lambda: ns.add_queue(qcfg))

    def delete_queue(self, namespace: str, name: str) -> None:
        """Delete a queue with its dead-letter queue and their messages (``KeyError`` if there is none).
        Send and receive links attached to them are detached with ``amqp:not-found``; their
        ``$management`` links stay and answer every request 404 ``amqp:not-found``; new attaches are
        refused with ``amqp:not-found`` until the queue is added again."""
        self._server.call(fault_switches.delete_queue, self._ns(namespace), name)

    def recreate_queue(self, namespace: str, name: str, **settings) -> None:
        """Delete the queue if it exists and create it afresh (empty, sequence numbers from 1), with the
        settings it had (or had when it was deleted) unless ``settings`` overrides some."""
        def run():
            ns = self._ns(namespace)
            old = ns.queue(name)
            before = old.settings if old is not None else ns.deleted.get(name.lower())
            previous = dataclasses.asdict(before) if before is not None else {}
            # checked before anything is deleted: a bad setting leaves the queue as it was
            qcfg = queue_from_dict({**previous, **settings, "name": name}, f"recreate_queue({name})",
                                   allow_short_locks=ns.settings.allow_short_locks)
            check_partitioning(ns.settings, [qcfg], f"recreate_queue({name})")
            if old is not None:
                fault_switches.delete_queue(ns, name)
            ns.add_queue(qcfg)
        self._server.call(run)

    def inject_peek_fault(self, namespace: str, entity: str, *, mode: str = "empty", count: int = 1,
                          min_message_count: int = 2, min_from_sequence: int = 1) -> None:
        """The next ``count`` peeks (``com.microsoft:peek-message``) on ``entity`` asking for at least
        ``min_message_count`` messages from a sequence number >= ``min_from_sequence`` answer no messages
        (``empty``: status 204) or only the first message of the page (``short``). Single-message probes
        pass by default."""
        if mode not in PEEK_MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, PEEK_MODES))}, got {mode!r}")
        self._add_fault(namespace, Fault("peek", entity.lower(), count, mode=mode,
                                         min_message_count=min_message_count, min_from_sequence=min_from_sequence))

    def inject_fault(self, namespace: str, operation: str, *, entity: Optional[str] = None, count: int = 1,
                     condition: Optional[str] = None) -> None:
        """Fail the next ``count`` requests of ``operation`` on ``entity`` (None: any entity of the
        namespace) with the AMQP ``condition`` (None: the operation's default):

        - ``receive`` (``amqp:link:detach-forced``): a receive link that is given credit is detached with
          the condition instead of delivering, so the ``receive_messages`` that issued the credit raises;
        - ``settle`` (``com.microsoft:message-lock-lost``): a disposition the client waits for is answered
          ``rejected`` with the condition, or an ``update-disposition`` request fails with it; the
          messages keep their locks;
        - ``management`` (``com.microsoft:server-busy``): any management request fails with the condition;
        - ``lose_lock``: an ``update-disposition`` of several lock tokens finds the lock of its last token lost
          (the message available again, delivery count + 1, as when a lock expires), and is answered as the
          namespace's ``multi_token_disposition`` says (410 ``com.microsoft:message-lock-lost``, the live tokens
          settled or not).
        """
        if operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {', '.join(map(repr, OPERATIONS))}, got {operation!r}")
        self._add_fault(namespace, Fault(operation, entity.lower() if entity is not None else None, count,
                                         condition=condition or DEFAULT_CONDITIONS[operation]))

    def faults_pending(self, namespace: str, operation: Optional[str] = None, entity: Optional[str] = None) -> int:
        """How many injected failures have not fired yet, of ``operation`` (``peek``, ``receive``,
        ``settle``, ``management``; None: all) injected for ``entity`` (None: for any)."""
        return self._server.call(lambda: self._ns(namespace).faults.count(operation, entity))

    def clear_faults(self, namespace: str) -> int:
        """Drop the namespace's pending injected faults; returns how many failures were left."""
        return self._server.call(lambda: self._ns(namespace).faults.clear())

    def _add_fault(self, namespace: str, fault: Fault) -> None:
        self._server.call(lambda: self._ns(namespace).faults.add(fault))

    def _ns(self, namespace: str):
        try:
            return self._server.namespaces[namespace]
        except KeyError:
            raise KeyError(f"unknown namespace {namespace!r}") from None


def resolve_admin_ports(config: EmulatorConfig, ports: Optional[Mapping[str, int]],
                        admin_ports: Optional[Mapping[str, int]], key: str = "admin_port") -> Dict[str, int]:
    """Administration port per namespace (``key`` ``tls_port``, ``websocket_port``: the port of that listener):
    the one ``admin_ports`` gives, else 0 where ``ports`` picks a free AMQP port, else the configured one."""
    ports, admin_ports = ports or {}, admin_ports or {}
    names = [ns.name for ns in config.namespaces]
    for name in admin_ports:
        if name not in names:
            raise KeyError(f"{key}s: unknown namespace {name!r} (configured: {', '.join(names)})")
    return {ns.name: admin_ports.get(ns.name, 0 if ports.get(ns.name) == 0 else getattr(ns, key))
            for ns in config.namespaces}


def resolve_latency(config: EmulatorConfig, override: Union[None, float, Mapping[str, float]]) -> Dict[str, float]:
    """Latency per namespace: the override (a number for all, or a mapping for some) over the config."""
    latency = {ns.name: ns.latency_ms for ns in config.namespaces}
    if override is None:
        return latency
    if isinstance(override, Mapping):
        for name, ms in override.items():
            if name not in latency:
                raise KeyError(f"latency_ms: unknown namespace {name!r} (configured: {', '.join(latency)})")
            latency[name] = check_latency_ms(ms, f"latency_ms[{name!r}]")
        return latency
    ms = check_latency_ms(override, "latency_ms")
    return {name: ms for name in latency}
