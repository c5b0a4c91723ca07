"""Command line: ``python -m servicebus_emulator --config emulator.yaml`` (or the official emulator's Config.json).

Prints one ready line per namespace (secrets masked unless --show-secrets), one line per namespace for its
AMQP over TLS and over WebSockets, one for its administration API (HTTPS) and one naming the certificate
authority clients trust, optionally writes
``--ready-file`` (JSON {namespace: connection string}) once every listener accepts, and runs until
SIGTERM/SIGINT, then exits 0. A bad config prints one line naming the key and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from typing import Dict, Optional

from .config import check_latency_ms
from .config_error import ConfigError
from .loader import load_config
from .emulator import Emulator


def env_port_var(namespace: str, kind: str = "PORT") -> str:
    """SB_EMULATOR_PORT_<NAMESPACE> (``kind`` ADMIN_PORT: SB_EMULATOR_ADMIN_PORT_<NAMESPACE>), upper case,
    non-alphanumerics as underscores."""
    return f"SB_EMULATOR_{kind}_" + re.sub(r"[^A-Za-z0-9]", "_", namespace).upper()


def resolve_ports(cfg, port_offset: int, environ=os.environ) -> Dict[str, int]:
    """Per-namespace port: SB_EMULATOR_PORT_<NS> wins, else configured port + offset (0 stays 0)."""
    return {ns.name: _env_port(environ, env_port_var(ns.name), ns.port + port_offset if ns.port else 0)
            for ns in cfg.namespaces}


def resolve_admin_ports(cfg, ports: Dict[str, int], port_offset: int, environ=os.environ,
                        key: str = "admin_port") -> Dict[str, int]:
    """Per-namespace administration port (``key`` ``tls_port``, ``websocket_port``: that listener's port):
    SB_EMULATOR_<KEY>_<NS> wins, else 0 when the AMQP port is 0, else the configured one + offset (0 stays 0)."""
    return {ns.name: _env_port(environ, env_port_var(ns.name, key.upper()),
                               getattr(ns, key) + port_offset if getattr(ns, key) and ports[ns.name] else 0)
            for ns in cfg.namespaces}


def _env_port(environ, var: str, default: int) -> int:
    raw = environ.get(var)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{var}: expected a port number, got {raw!r}") from None


def _write_json(path: str, data) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servicebus_emulator", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True,
                   help="YAML config file, or the official emulator's Config.json (see README.md)")
    p.add_argument("--port-offset", type=int, default=int(os.environ.get("SB_EMULATOR_PORT_OFFSET", "0")),
                   help="added to every configured non-zero port, AMQP (plain, TLS, WebSockets) and administration "
                        "(env SB_EMULATOR_PORT_OFFSET); SB_EMULATOR_PORT_<NAMESPACE>, SB_EMULATOR_TLS_PORT_<NAMESPACE>, "
                        "SB_EMULATOR_WEBSOCKET_PORT_<NAMESPACE> and SB_EMULATOR_ADMIN_PORT_<NAMESPACE> override one "
                        "namespace")
    p.add_argument("--ready-file", help="write JSON {namespace: connection string} here once listening")
    p.add_argument("--stats-file", help="write per-entity counters (JSON) here every --stats-interval s")
    p.add_argument("--stats-interval", type=float, default=1.0)
    p.add_argument("--show-secrets", action="store_true", help="print keys in the ready lines")
    p.add_argument("--tls-dir", help="write the certificates (administration API, AMQP over TLS and WebSockets) "
                                     "here (ca.pem is what clients trust); default: a temporary directory removed "
                                     "on exit")
    p.add_argument("--latency-ms", type=float,
                   help="delay every frame the emulator sends by this many milliseconds, on every namespace "
                        "(overrides latency_ms in the config). Only what the emulator sends is delayed, so each "
                        "client round trip gets it once: 5 stands in for an in-region namespace (2.5 ms each way)")
    args = p.parse_args(argv)

    try:
        cfg = load_config(args.config)
        ports = resolve_ports(cfg, args.port_offset)
        admin_ports = resolve_admin_ports(cfg, ports, args.port_offset)
        tls_ports = resolve_admin_ports(cfg, ports, args.port_offset, key="tls_port")
        websocket_ports = resolve_admin_ports(cfg, ports, args.port_offset, key="websocket_port")
        if args.latency_ms is not None:
            check_latency_ms(args.latency_ms, "--latency-ms")
    except ConfigError as exc:
        print(f"servicebus-emulator: config error: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    emu = Emulator(cfg, ports=ports, latency_ms=args.latency_ms, admin_ports=admin_ports, tls_dir=args.tls_dir,
                   tls_ports=tls_ports, websocket_ports=websocket_ports)
    try:
        emu.start()
    except OSError as exc:
        print(f"servicebus-emulator: cannot listen: {exc}", file=sys.stderr)
        return 1

    def write_stats():
        if args.stats_file:
            _write_json(args.stats_file, {ns.name: emu.stats(ns.name) for ns in cfg.namespaces})

    try:
        for ns in cfg.namespaces:
            latency = emu.latency_ms(ns.name)
            way_in = (emu.connection_string(ns.name, mask=not args.show_secrets) if ns.local_auth else
                      "(Azure AD only: tokens signed with its azure_ad.signing_key)")
            print(f"servicebus-emulator: namespace {ns.name} ready on {ns.host}:{emu.port(ns.name)} {way_in}"
                  f"{f' (latency {latency:g} ms per frame sent)' if latency else ''}", flush=True)
            print(f"servicebus-emulator: namespace {ns.name} AMQP over TLS on {emu.endpoint(ns.name, 'amqps')}, over "
                  f"WebSockets on {emu.endpoint(ns.name, 'amqp-websockets')} (a client passes it as "
                  f"custom_endpoint_address, with Endpoint=sb://{ns.host}/ and no UseDevelopmentEmulator)", flush=True)
            print(f"servicebus-emulator: namespace {ns.name} administration API on https://"
                  f"{emu.admin_endpoint(ns.name)}", flush=True)
        print(f"servicebus-emulator: certificate authority {emu.ca_file} (of the administration API and AMQP over TLS "
              f"and WebSockets: a client passes it as connection_verify)", flush=True)
        if args.ready_file:
            _write_json(args.ready_file, emu.connection_strings())
        while not stop.wait(args.stats_interval if args.stats_file else 3600):
            write_stats()
        write_stats()
    finally:
        emu.stop()
        if args.ready_file:
            try:
                os.unlink(args.ready_file)
            except OSError:
                pass
    print("servicebus-emulator: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
