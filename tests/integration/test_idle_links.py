"""A continuous job that waits, as one does for the next failover, past Service Bus's idle timers: the
broker detaches links that carried nothing (10 minutes on Azure, 3 s here) and closes connections left
without links. The next messages are still delivered once each, from links opened again, without a failed
batch, a lost lock (no message is received twice) or, where the pooled links are refreshed before the
broker's timer runs out (as they are on Azure by default), an error line in the job's log."""

from __future__ import annotations

import collections
import signal

import pytest
import yaml

from tools.backlog_writer import OriginalMessage, write_backlog
from tools.testing import backlog_dead_letters, drain_destinations

from backlog_syphon.restore.queue_names import backlog_queue_names

from .conftest import PRIMARY, ROOT, SECONDARY, make_config
from .helpers import finish_job, job_command, job_env, start_job, tail, wait_for

QUEUES = backlog_queue_names(PRIMARY, 2)
IDLE_SECONDS = 3.0  # the emulator's link and connection idle timers here


@pytest.fixture
def idle_emulator():
    from servicebus_emulator import Emulator
    from servicebus_emulator.config import EmulatorConfig

    raw = yaml.safe_load((ROOT / "conf/emulator.yaml").read_text())
    for namespace in raw["namespaces"]:
        namespace.update(link_idle_timeout_seconds=IDLE_SECONDS, connection_idle_timeout_seconds=IDLE_SECONDS)
    with Emulator(EmulatorConfig.from_dict(raw), ports={PRIMARY: 0, SECONDARY: 0}) as emulator:
        yield emulator


def _messages(tag: str) -> list[OriginalMessage]:
    return [OriginalMessage("orders", f"{tag} {i}".encode(), message_id=f"{tag}-{i}") for i in range(10)]


def _arrived(emulator) -> int:
    return emulator.stats(PRIMARY)["orders"]["in"]


# Idle queues are probed less often than the broker's timer, so the pooled links go idle.
SETTINGS = {"run.trigger": "1 second", "backlog.queue_count": 2, "backlog.discover": "false",
            "run.idle_probe_max_seconds": 2 * IDLE_SECONDS}
# As on Azure by default (8 of the broker's 10 minutes): the pooled links are refreshed before its timer.
REFRESHED_BEFORE_THE_TIMER = {"primary.idle_link_seconds": IDLE_SECONDS / 2,
                              "secondary.idle_link_seconds": IDLE_SECONDS / 2}


def _idle_then_deliver(emulator, running, output) -> None:
    """Messages, then a wait past every idle timer, then more messages: delivered and purged while the syphon
    keeps ``running()`` (``output()``: what it said so far, for a failure's message)."""
    write_backlog(emulator_config_secondary(emulator), PRIMARY, _messages("first"), queue_count=2)
    assert wait_for(lambda: _arrived(emulator) == 10 or not running(), 240), output()
    # Waiting for the next failover: every link idle for longer than the broker allows.
    detached = emulator.idle_stats(PRIMARY)["links"] + emulator.idle_stats(SECONDARY)["links"]
    assert wait_for(lambda: emulator.idle_stats(PRIMARY)["links"] + emulator.idle_stats(SECONDARY)["links"]
                    >= detached + 4 and _left(emulator) == 0, 60), "no idle link was detached"
    assert wait_for(lambda: False, 3 * IDLE_SECONDS) is False  # and longer still: connections closed too
    assert emulator.idle_stats(SECONDARY)["connections"] + emulator.idle_stats(PRIMARY)["connections"] > 0
    write_backlog(emulator_config_secondary(emulator), PRIMARY, _messages("second"), queue_count=2)
    assert wait_for(lambda: _arrived(emulator) == 20 or not running(), 120), output()
    assert wait_for(lambda: _left(emulator) == 0, 60), "the second messages were not purged"
    assert running(), output()


def _delivered_once_and_purged_once(emulator) -> None:
    received = drain_destinations(emulator.connection_string(PRIMARY), ["orders"])["orders"]
    assert sorted(m.message_id for m in received) == sorted(m.message_id for m in _messages("first") +
                                                             _messages("second"))
    assert not backlog_dead_letters(emulator_config_secondary(emulator), QUEUES)
    # Each backlog message was received by the purge once: no lock was lost on a detached link.
    stats = emulator.stats(SECONDARY)
    assert collections.Counter({queue: stats[queue]["ops"].get("receive", 0) for queue in QUEUES}).total() == 20


@pytest.mark.timeout(400)
def test_a_continuous_job_whose_links_are_refreshed_before_the_timer_delivers_the_next_and_logs_no_error(
        idle_emulator, tmp_path):
    """The job (its output is the claim: the executors' lines are in it): no failed batch or send, and, the
    pooled links refreshed before the broker's timer runs out, no error line at all."""
    emulator = idle_emulator
    settings = SETTINGS | REFRESHED_BEFORE_THE_TIMER
    command = job_command(tmp_path, **{key.replace(".", "__"): value for key, value in settings.items()})
    log = tmp_path / "job.log"
    proc = start_job(command, job_env(emulator), log)
    try:
        _idle_then_deliver(emulator, lambda: proc.poll() is None, lambda: tail(log))
        proc.send_signal(signal.SIGTERM)
        assert finish_job(proc, 120) == 0, tail(log)
    finally:
        if proc.poll() is None:
            proc.kill()
    _delivered_once_and_purged_once(emulator)
    text = log.read_text(errors="replace")
    assert "failed in step" not in text and "send failed" not in text
    assert "Traceback" not in text and " ERROR " not in text and "Handler shutting down" not in text, text[-3000:]


@pytest.mark.timeout(400)
def test_a_continuous_run_whose_idle_links_the_broker_closed_delivers_the_next_messages(idle_emulator, tmp_path,
                                                                                        spark):
    """In-process (the claim is what moved, not what was logged): links and connections the broker closed are
    opened again, without a failed batch, a send tried twice or a lost lock."""
    from backlog_syphon.run.syphon import start_syphon
    from backlog_syphon.storage import delta

    emulator = idle_emulator
    config = make_config(emulator, tmp_path, **SETTINGS)
    run = start_syphon(spark, config)
    try:
        _idle_then_deliver(emulator, lambda: run.query.isActive, lambda: str(run.query.exception()))
    finally:
        run.finish(spark)
    assert run.query.exception() is None
    _delivered_once_and_purged_once(emulator)
    audit = delta.read_table(spark, config.storage.audit_table).collect()
    # Every message sent at its first attempt: no send failed on a link the broker had closed.
    assert (len(audit), {row["outcome"] for row in audit}, {row["attempts"] for row in audit}) == (
        20, {"delivered"}, {1})


def _left(emulator) -> int:
    stats = emulator.stats(SECONDARY)
    return sum(stats[queue]["total"] for queue in QUEUES)


def emulator_config_secondary(emulator):
    from backlog_syphon.config import NamespaceConfig, Secret

    return NamespaceConfig(connection_string=Secret(emulator.connection_string(SECONDARY), "test"))
