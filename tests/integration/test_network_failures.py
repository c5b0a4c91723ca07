"""What an operator sees when the way to a namespace is wrong: the pre-flight (``servicebus.preflight``) against the
emulator's TLS and WebSocket listeners and a real HTTP proxy (proxy.py), with the unmodified SDK. Each failure is
one line naming the namespace, the transport, the endpoint (and the proxy), what went wrong and the setting to
fix, within seconds, and never a secret; it is a ``SettingsError`` (exit code 2). The job's own exit code and
its one ``error:`` line for a blocked 5671 are ``test_fence_and_stops``' (``5671 blocked``)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from backlog_syphon.errors import EXIT_SETTINGS
from backlog_syphon.servicebus.preflight import PreflightError, preflight
from tools.http_proxy import HttpProxy

from .conftest import ROOT, SECONDARY, make_config
from .helpers import free_port

USER, PASSWORD = "egress-user", "egress-password-4-tests"


def test_each_wrong_certificate_host_name_proxy_or_port_is_one_line_naming_the_setting(emulator, tmp_path):
    from servicebus_emulator import Emulator, load_config

    config_file = load_config(ROOT / "conf/emulator.yaml")
    with HttpProxy(user=USER, password=PASSWORD, refused_hosts=("127.0.0.2",)) as proxy, \
            Emulator(config_file, ports={"contoso": 0, SECONDARY: 0}) as stranger, \
            Emulator(config_file, ports={"contoso": 0, SECONDARY: 0}, certificate_names=["servicebus.test"]) as misnamed:
        tls = emulator.endpoint(SECONDARY, "amqps")[len("sb://"):]
        websocket = emulator.endpoint(SECONDARY, "amqp-websockets")[len("sb://"):]
        blocked = free_port()
        cases = {
            "a wrong authority": (emulator, "amqps", None, {"secondary.ca_file": stranger.ca_file}, (
                f"cannot reach the secondary namespace 127.0.0.1 over amqp at {tls}: its TLS certificate is not "
                f"trusted (unable to get local issuer certificate) by the authorities in secondary.ca_file: set "
                f"secondary.ca_file to the PEM file of the authority that signed it")),
            "a host name the certificate does not name": (misnamed, "amqp-websockets", None, {}, (
                "cannot reach the secondary namespace 127.0.0.1 over amqp-websockets at 127.0.0.1:",
                "its TLS certificate does not name 127.0.0.1 (IP address mismatch, certificate is not valid for "
                "'127.0.0.1'.): set secondary.custom_endpoint_address to a host name the certificate names")),
            "a proxy that asks for credentials": (emulator, "amqp-websockets", _as(proxy, user=None), {}, (
                f"cannot reach the secondary namespace 127.0.0.1 over amqp-websockets at {websocket} through the "
                f"proxy 127.0.0.1:{proxy.port}: the proxy asks for credentials (HTTP 407): set secondary.proxy_user "
                f"and secondary.proxy_password")),
            "a proxy that refuses the password": (emulator, "amqp-websockets", _as(proxy, password="wrong"), {}, (
                f"the proxy refused the credentials of secondary.proxy_user '{USER}' (HTTP 407): check "
                f"secondary.proxy_user and secondary.proxy_password")),
            "a proxy that refuses the tunnel": (emulator, "amqp-websockets", proxy, {
                "secondary.custom_endpoint_address": f"sb://127.0.0.2:{websocket.split(':')[1]}"}, (
                f"the proxy refused the tunnel (HTTP 418): have it allow CONNECT to 127.0.0.2:{websocket.split(':')[1]}")),
            "a proxy that is not there": (emulator, "amqp-websockets", proxy, {"secondary.proxy_port": str(blocked)}, (
                f"through the proxy 127.0.0.1:{blocked}: the proxy refused the connection: check secondary.proxy_host "
                f"and secondary.proxy_port")),
            "a blocked 5671": (emulator, "amqps", None, {"secondary.custom_endpoint_address": f"sb://127.0.0.1:{blocked}"}, (
                f"cannot reach the secondary namespace 127.0.0.1 over amqp at 127.0.0.1:{blocked}: TCP port {blocked} "
                f"refused the connection (blocked on the way, or nothing listens there): let this machine reach "
                f"127.0.0.1:{blocked}, or check secondary.custom_endpoint_address, or set secondary.transport: "
                f"amqp-websockets to go over 443 where only that is open")),
        }
        lines = {}
        for case, (target, transport, via, overrides, expected) in cases.items():
            config = make_config(target, tmp_path, transport=transport, proxy=via, **overrides)
            started = time.monotonic()
            with pytest.raises(PreflightError) as failed:
                preflight(config, primary=False, timeout_seconds=15)
            seconds = time.monotonic() - started
            lines[case] = line = str(failed.value)
            assert failed.value.exit_code == EXIT_SETTINGS
            assert "\n" not in line and PASSWORD not in line and "SharedAccessKey" not in line, line
            for part in expected if isinstance(expected, tuple) else (expected,):
                assert part in line, f"{case}: {line}"
            assert seconds < 10, f"{case}: {seconds:.1f} s"
    print("\n" + "\n".join(f"{case}: {line}" for case, line in lines.items()))


def _as(proxy: HttpProxy, **changes) -> SimpleNamespace:
    """The proxy as the syphon's settings name it, with other credentials."""
    return SimpleNamespace(**{"host": proxy.host, "port": proxy.port, "user": proxy.user, "password": proxy.password,
                              **changes})
