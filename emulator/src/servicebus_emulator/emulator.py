"""Public API: ``Emulator(config).start()`` runs the broker on a background thread."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Union

from .config import EmulatorConfig, QueueConfig, check_latency_ms, queue_from_dict
from .server import Server

DEVELOPMENT_SUFFIX = "UseDevelopmentEmulator=true"


class Emulator:
    """A local Service Bus emulator: one AMQP listener per configured namespace.

    ``ports`` overrides configured ports per namespace (0 = ephemeral). ``latency_ms`` overrides the
    configured ``latency_ms`` (delay added to every frame the emulator sends): one number for every
    namespace, or ``{namespace: ms}`` for some. Thread-safe: every method may be called from any thread
    while the emulator runs.
    """

    def __init__(self, config: EmulatorConfig, ports: Optional[Dict[str, int]] = None,
                 latency_ms: Union[None, float, Mapping[str, float]] = None):
        self.config = config
        self._server = Server(config, ports, resolve_latency(config, latency_ms))
        self._started = False

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "Emulator":
        """Bind every listener and start serving; returns once all namespaces accept connections."""
        if not self._started:
            self._server.start()
            self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            self._server.stop()
            self._started = False

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- addressing -----------------------------------------------------------------------------
    def port(self, namespace: str) -> int:
        return self._ns(namespace).port

    def latency_ms(self, namespace: str) -> float:
        """The delay added to every frame the emulator sends on ``namespace``'s connections."""
        return self._ns(namespace).latency_ms

    def connection_string(self, namespace: str, key_name: Optional[str] = None, key: Optional[str] = None,
                          *, mask: bool = False) -> str:
        """An SDK connection string for ``namespace``. ``mask=True`` hides the key (for printing)."""
        ns = self._ns(namespace)
        keys = ns.cfg.sas_keys
        if key_name is None:
            key_name = next(iter(keys), "RootManageSharedAccessKey")
        if key is None:
            key = keys.get(key_name, "local-emulator-key")
        if mask:
            key = "***"
        return (f"Endpoint=sb://{ns.host}:{ns.port};SharedAccessKeyName={key_name};"
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

    # ---- faults and test helpers ----------------------------------------------------------------
    def set_unavailable(self, namespace: str, entity: Optional[str] = None, mode: str = "server-busy") -> None:
        """``server-busy``: attaches, sends and management on the entity (or namespace) fail with
        ``com.microsoft:server-busy``. ``refuse`` (namespace only): the listener closes and open
        connections drop until ``set_available``."""
        self._ns(namespace)
        self._server.call(self._server.set_unavailable, namespace, entity, mode)

    def set_available(self, namespace: str, entity: Optional[str] = None) -> None:
        self._ns(namespace)
        self._server.call(self._server.set_available, namespace, entity)

    def drop_connections(self, namespace: str) -> int:
        """Close every open connection of the namespace abruptly; returns how many were open."""
        self._ns(namespace)
        return self._server.call(self._server.drop_connections, namespace)

    def add_queue(self, namespace: str, name: str, **settings) -> None:
        """Create a queue at runtime (tests)."""
        qcfg: QueueConfig = queue_from_dict({"name": name, **settings}, f"add_queue({name})")
        self._server.call(lambda: self._ns(namespace).add_queue(qcfg))

    def _ns(self, namespace: str):
        try:
            return self._server.namespaces[namespace]
        except KeyError:
            raise KeyError(f"unknown namespace {namespace!r}") from None


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
