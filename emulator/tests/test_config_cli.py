"""Config validation and the command line (a real subprocess with SIGTERM)."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from servicebus_emulator import ConfigError, EmulatorConfig, load_config
from servicebus_emulator.__main__ import resolve_ports

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("bad, key", [
    ({"namespaces": [{"name": "a", "queues": [{"name": "q", "lock_duration_seconds": "x"}]}]},
     "namespaces[0].queues[0].lock_duration_seconds"),
    ({"namespaces": [{"name": "a", "queues": [{"name": "q", "bogus": 1}]}]}, "namespaces[0].queues[0].bogus"),
    ({"namespaces": [{"name": "a", "port": 70000}]}, "namespaces[0].port"),
    ({"namespaces": []}, "namespaces"),
    ({"namespaces": [{"name": "a", "topics": [{"name": "t", "subscriptions": [
        {"name": "s", "correlation_filter": {"sql": "1=1"}}]}]}]},
     "namespaces[0].topics[0].subscriptions[0].correlation_filter.sql"),
])
def test_bad_config_names_the_key(bad, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        EmulatorConfig.from_dict(bad)


def test_port_overrides():
    cfg = load_config(str(ROOT / "conf" / "emulator.yaml"))
    assert resolve_ports(cfg, 100, environ={}) == {"contoso": 5772, "contoso-secondary": 5773}
    assert resolve_ports(cfg, 0, environ={"SB_EMULATOR_PORT_CONTOSO_SECONDARY": "0"})["contoso-secondary"] == 0


def _cli(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "emulator" / "src"), **(env_extra or {}))
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
    proc = _cli("--config", str(ROOT / "conf" / "emulator.yaml"), "--ready-file", str(ready),
                "--stats-file", str(stats), "--stats-interval", "0.2",
                env_extra={"SB_EMULATOR_PORT_CONTOSO": "0", "SB_EMULATOR_PORT_CONTOSO_SECONDARY": "0"})
    try:
        deadline = time.time() + 20
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        conn = json.loads(ready.read_text())
        assert set(conn) == {"contoso", "contoso-secondary"}
        with ServiceBusClient.from_connection_string(conn["contoso"], retry_total=0) as c:
            with c.get_queue_sender("payments") as s:
                s.send_messages(ServiceBusMessage("via-cli"))
        time.sleep(0.5)
        assert json.loads(stats.read_text())["contoso"]["payments"]["in"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    lines = [l for l in out.splitlines() if "ready on" in l]
    assert len(lines) == 2 and all("SharedAccessKey=***" in l for l in lines)
    assert "local-emulator-key" not in out
