"""The dry run against the emulator: an exact plan of what a replay would do, and nothing changed."""

import datetime as dt

from tools.testing import emulator_environment
from tools import backlog_writer
from tools.backlog_writer import OriginalMessage
from backlog_syphon.cli import main as cli_main
from backlog_syphon.run.dry_run import dry_run

from .conftest import PRIMARY, ROOT, SECONDARY


def _backlog(now: dt.datetime) -> tuple[list[OriginalMessage], dict[str, str]]:
    messages = [OriginalMessage("orders", b"o" * 100, message_id=f"order-{i}") for i in range(3)]
    messages += [OriginalMessage("sessions-orders", b"s" * 10, message_id=f"session-{s}-{i}", session_id=f"s{s}")
                 for s in range(2) for i in range(2)]
    messages.append(OriginalMessage("orders", b"later", message_id="scheduled",
                                    scheduled_enqueue_time=now + dt.timedelta(hours=1)))
    messages.append(OriginalMessage("payments", b"stale", message_id="expired", time_to_live=dt.timedelta(milliseconds=1)))
    poison = backlog_writer.poison_backlog(seed=5)
    expected_dead = {message.message_id: code for message, code in poison}
    expected_dead["expired"] = "expired_in_backlog"
    return messages + [message for message, _ in poison], expected_dead


def _activity(emulator) -> dict:
    """Every counter that a send, a settlement or a receive would move, per namespace and entity."""
    out = {}
    for namespace in (PRIMARY, SECONDARY):
        for entity, stats in emulator.stats(namespace).items():
            out[(namespace, entity)] = {k: stats.get(k) for k in ("in", "out", "completed", "dead_lettered", "total")}
    return out


def test_dry_run_reports_the_plan_and_changes_nothing(emulator, syphon_config, spark):
    now = dt.datetime.now(dt.timezone.utc)
    messages, expected_dead = _backlog(now)
    written = backlog_writer.write_backlog(syphon_config.secondary, PRIMARY, messages, queue_count=10, seed=2)
    before = _activity(emulator)

    report = dry_run(spark, syphon_config, now=now + dt.timedelta(seconds=1))

    assert _activity(emulator) == before, "the dry run sent, settled or received something"
    assert report.per_queue == {queue: written.get(queue, 0) for queue in report.per_queue}
    assert len(report.per_queue) == 10 and sum(report.per_queue.values()) == len(messages)
    by_destination = {row["destination"]: row for row in report.per_destination}
    assert set(by_destination) == {"orders", "sessions-orders", "payments", "no-such-queue", "small",
                                   "(no destination)"}
    orders = by_destination["orders"]
    # 3 good + 1 scheduled, the two with a wrongly typed legacy property (their path decodes), and the one whose
    # SessionId and PartitionKey differ (Service Bus would refuse it)
    assert (orders["messages"], orders["to_deliver"], orders["to_dead_letter"], orders["scheduled"]) == (7, 4, 3, 1)
    assert orders["body_bytes"] == 300 + len(b"later") + sum(
        len(m.body) for m in messages if m.message_id.endswith(("session-type", "ttl-type", "keys-differ")))
    sessions = by_destination["sessions-orders"]
    # the session queue's settings come from the administration API: the session-less one would be refused
    assert (sessions["messages"], sessions["sessions"], sessions["to_deliver"], sessions["to_dead_letter"]) == (
        5, 2, 4, 1)
    assert sessions["oldest_enqueued"] <= sessions["newest_enqueued"]
    assert (by_destination["payments"]["expired"], by_destination["payments"]["to_dead_letter"]) == (1, 1)
    assert by_destination["no-such-queue"]["to_dead_letter"] == 1
    assert by_destination["small"]["to_dead_letter"] == 1
    assert report.dead_letter_total == len(expected_dead)
    assert {row["message_id"]: row["reason_code"] for row in report.dead_letters} == expected_dead
    assert all(row["reason"] for row in report.dead_letters)
    assert report.unchecked == {}
    text = "\n".join(report.lines())
    assert "would dead-letter 8 messages" in text and "destination_not_found" in text
    assert "session_required: destination 'sessions-orders' requires sessions" in text
    assert f"a replay here: batches of at most {syphon_config.run.max_messages_per_trigger} messages" in text


def test_cli_dry_run_prints_the_plan(emulator, tmp_path, spark, capsys, monkeypatch):
    backlog_writer.write_backlog(
        _config(emulator, tmp_path, monkeypatch).secondary, PRIMARY,
        [OriginalMessage("orders", b"x", message_id=f"m{i}") for i in range(7)], queue_count=10, seed=1)

    code = cli_main(["--config", str(ROOT / "conf/local.yaml"), "--dry-run",
                     "--set", f"storage.audit_table={tmp_path / 'audit'}"])

    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("dry run: nothing was sent, settled or written")
    orders_line = next(line for line in out.splitlines() if line.strip().startswith("orders "))
    assert orders_line.split()[1:3] == ["7", "7"]  # messages, bytes
    assert "backlog queues: 7 messages" in out
    assert not (tmp_path / "audit").exists(), "a dry run must not create tables"


def _config(emulator, tmp_path, monkeypatch):
    from backlog_syphon.config import load_config

    for name, value in emulator_environment(emulator, PRIMARY, SECONDARY).items():
        monkeypatch.setenv(name, value)
    return load_config(ROOT / "conf/local.yaml")
