"""YAML config validation, latency settings and the command line (a real subprocess with SIGTERM)."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from servicebus_emulator import ConfigError, Emulator, EmulatorConfig, load_config
from servicebus_emulator.__main__ import resolve_ports

DIST = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_YAML = DIST / "examples" / "emulator.yaml"
SAMPLE_JSON = DIST / "examples" / "Config.json"


@pytest.mark.parametrize("bad, key", [
    ({"namespaces": [{"name": "a", "queues": [{"name": "q", "lock_duration_seconds": "x"}]}]},
     "namespaces[0].queues[0].lock_duration_seconds"),
    ({"namespaces": [{"name": "a", "queues": [{"name": "q", "bogus": 1}]}]}, "namespaces[0].queues[0].bogus"),
    ({"namespaces": [{"name": "a", "port": 70000}]}, "namespaces[0].port"),
    ({"namespaces": []}, "namespaces"),
    ({"namespaces": [{"name": "a", "topics": [{"name": "t", "subscriptions": [
        {"name": "s", "correlation_filter": {"sql": "1=1"}}]}]}]},
     "namespaces[0].topics[0].subscriptions[0].correlation_filter.sql"),
    ({"namespaces": [{"name": "a", "topics": [{"name": "t", "subscriptions": [
        {"name": "s", "rules": [{"name": "r", "correlation_filter": {"label": "x"}}, {"name": "R"}]}]}]}]},
     "namespaces[0].topics[0].subscriptions[0].rules: duplicate name 'R'"),
    ({"namespaces": [{"name": "a", "topics": [{"name": "t", "subscriptions": [
        {"name": "s", "rules": [{"name": "r"}], "correlation_filter": {"label": "x"}}]}]}]},
     "namespaces[0].topics[0].subscriptions[0]: give either correlation_filter or rules"),
    ({"namespaces": [{"name": "a", "latency_ms": -1}]}, "namespaces[0].latency_ms: must be"),
    ({"namespaces": [{"name": "a", "latency_ms": True}]}, "namespaces[0].latency_ms: expected a number"),
])
def test_bad_config_names_the_key(bad, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        EmulatorConfig.from_dict(bad)


def test_sample_yaml_subscription_rules():
    (events,) = load_config(SAMPLE_YAML).namespace("contoso").topics
    rules = {s.name: [(r.name, r.correlation_filter) for r in s.rules] for s in events.subscriptions}
    assert rules == {
        "all": [("$Default", None)],
        "eu": [("$Default", {"properties": {"region": "eu"}})],
        "eu-or-alerts": [("eu", {"properties": {"region": "eu"}}), ("alerts", {"subject": "alert"})],
    }


def test_port_overrides():
    cfg = load_config(SAMPLE_YAML)
    assert resolve_ports(cfg, 100, environ={}) == {"contoso": 5772, "contoso-dr": 5773}
    assert resolve_ports(cfg, 0, environ={"SB_EMULATOR_PORT_CONTOSO_DR": "0"})["contoso-dr"] == 0


def test_latency_from_config_and_overrides():
    cfg = EmulatorConfig.from_dict({"namespaces": [{"name": "a", "port": 0, "latency_ms": 2.5},
                                                   {"name": "b", "port": 0}]})
    assert [ns.latency_ms for ns in cfg.namespaces] == [2.5, 0.0]
    as_configured = Emulator(cfg)
    assert (as_configured.latency_ms("a"), as_configured.latency_ms("b")) == (2.5, 0.0)
    everywhere = Emulator(cfg, latency_ms=40)
    assert (everywhere.latency_ms("a"), everywhere.latency_ms("b")) == (40.0, 40.0)
    one = Emulator(cfg, latency_ms={"a": 0})
    assert (one.latency_ms("a"), one.latency_ms("b")) == (0.0, 0.0)
    with pytest.raises(KeyError, match="unknown namespace 'c'"):
        Emulator(cfg, latency_ms={"c": 1})
    with pytest.raises(ConfigError, match="latency_ms: must be a number of milliseconds >= 0"):
        Emulator(cfg, latency_ms=-0.5)


def _cli(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(DIST / "src"), **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-m", "servicebus_emulator", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_bad_config_one_line_error(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("namespaces:\n  - name: a\n    queues:\n      - {name: q, max_delivery_count: 0}\n")
    proc = _cli("--config", str(cfg))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert err.strip().count("\n") == 0 and "max_delivery_count" in err and str(cfg) in err


def test_cli_serves_until_sigterm(tmp_path):
    ready, stats = tmp_path / "ready.json", tmp_path / "stats.json"
    proc = _cli("--config", str(SAMPLE_YAML), "--ready-file", str(ready),
                "--stats-file", str(stats), "--stats-interval", "0.2",
                env_extra={"SB_EMULATOR_PORT_CONTOSO": "0", "SB_EMULATOR_PORT_CONTOSO_DR": "0"})
    try:
        deadline = time.time() + 20
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        conn = json.loads(ready.read_text())
        assert set(conn) == {"contoso", "contoso-dr"}
        with ServiceBusClient.from_connection_string(conn["contoso"], retry_total=0) as c:
            with c.get_queue_sender("orders") as s:
                s.send_messages(ServiceBusMessage("via-cli"))
        time.sleep(0.5)
        assert json.loads(stats.read_text())["contoso"]["orders"]["in"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    lines = [l for l in out.splitlines() if "ready on" in l]
    assert len(lines) == 2 and all("SharedAccessKey=***" in l for l in lines)
    assert "local-emulator-key" not in out


def test_cli_reads_config_json_with_latency(tmp_path):
    ready = tmp_path / "ready.json"
    proc = _cli("--config", str(SAMPLE_JSON), "--ready-file", str(ready), "--latency-ms", "30",
                env_extra={"SB_EMULATOR_PORT_SBEMULATORNS": "0"})
    try:
        deadline = time.time() + 20
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        (conn,) = json.loads(ready.read_text()).values()
        assert conn.startswith("Endpoint=sb://127.0.0.1:") and conn.endswith(
            ";SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true")
        with ServiceBusClient.from_connection_string(conn, retry_total=0) as c:
            with c.get_queue_sender("queue.1") as s:
                s.send_messages(ServiceBusMessage("via-config-json"))
            with c.get_queue_receiver("queue.1") as r:
                assert [str(m) for m in r.peek_messages(max_message_count=5)] == ["via-config-json"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    (line,) = [l for l in out.splitlines() if "ready on" in l]
    assert "namespace sbemulatorns ready on 127.0.0.1:" in line and line.endswith("(latency 30 ms per frame sent)")


def test_cli_refuses_negative_latency():
    proc = _cli("--config", str(SAMPLE_YAML), "--latency-ms", "-1")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "config error: --latency-ms: must be a number of milliseconds >= 0" in err
