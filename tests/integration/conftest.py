"""Fixtures for end-to-end tests: a fresh emulator (both namespaces) and a syphon config per test."""

import logging
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRIMARY, SECONDARY = "contoso", "contoso-secondary"


@pytest.fixture
def emulator():
    from servicebus_emulator import Emulator, load_config

    with Emulator(load_config(ROOT / "conf/emulator.yaml"), ports={PRIMARY: 0, SECONDARY: 0}) as emu:
        yield emu


def make_config(emulator, tmp_path, *, transport: str = "amqp", proxy=None, **overrides):
    """conf/local.yaml against ``emulator`` (over ``transport``, through ``proxy``: ``testing.emulator_environment``)
    with state in ``tmp_path``; ``overrides``: dotted keys."""
    from backlog_syphon.config import load_config

    from tools.testing import emulator_environment

    environ = emulator_environment(emulator, PRIMARY, SECONDARY, transport=transport, proxy=proxy)
    settings = {"storage.audit_table": str(tmp_path / "audit"),
                "storage.checkpoint_table": str(tmp_path / "checkpoint"),
                "storage.checkpoint_location": str(tmp_path / "checkpoint-stream"),
                "run.max_messages_per_trigger": "500"}
    settings.update({key: str(value) for key, value in overrides.items()})
    return load_config(ROOT / "conf/local.yaml", environ=environ, overrides=settings)


@pytest.fixture
def syphon_config(emulator, tmp_path):
    return make_config(emulator, tmp_path)


@pytest.fixture
def command_line():
    """The command line's logging and signal handlers are the process's: put the test runner's back."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    signals = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    for signum, handler in signals.items():
        signal.signal(signum, handler)
