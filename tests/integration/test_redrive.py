"""Re-driving dead-lettered messages, end to end against the emulator with the unmodified SDK and real Delta tables.

One backlog, drained while a destination is missing: its messages are dead-lettered (``destination_not_found``)
in the backlog queue's dead-letter sub-queue, with another missing destination's and a message without
``x-ms-path``. The missing queue is then created (the emulator's management), and the re-drive runs through
the same source, restore rules, sink, audit and purge:
- the dry run (``jobs/syphon.py --redrive-dead-letters --dry-run``) shows what would move, per destination
  and reason, and changes nothing;
- a re-drive filtered on the syphon's reason code delivers the messages for the queue that now exists with
  every section and AMQP type intact (the proton comparison of ``test_fidelity_matrix``), leaves the others,
  and the audit shows both outcomes with the original dead-letter reason;
- a second re-drive moves nothing twice: what was delivered is gone, what was dead-lettered again is not
  sent again although its queue now exists;
- a third, asked to retry, delivers those, and the dead-letter sub-queue ends empty.
"""

from __future__ import annotations

import pytest

from backlog_syphon.cli import main as cli_main
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.storage import checkpoint_table, delta
from tools.testing import emulator_environment
from tools.testing import backlog_dead_letters

from .conftest import PRIMARY, ROOT, SECONDARY, make_config
from .test_fidelity_matrix import (
    APPLICATION_PROPERTIES,
    DATA,
    _RawSender,
    arrived_sections,
    expected_sections,
    legacy_message,
    matrix,
    properties_section,
    receive_raw,
    section,
    url,
)

BACKLOG_QUEUE = f"{PRIMARY}/x-servicebus-transfer/3"
DEAD_LETTERS = f"{BACKLOG_QUEUE}/$DeadLetterQueue"
CREATED_LATER = "created-later"  # does not exist when the backlog is drained
STILL_MISSING = "still-missing"  # exists only before the third re-drive


def _peek_dead_letters(emulator, *queues: str) -> list:
    """What the queues' dead-letter sub-queues hold, queue after queue (peeked at once)."""
    return backlog_dead_letters(emulator.connection_string(SECONDARY), queues, max_count=500)


def _activity(emulator) -> dict:
    return {(namespace, entity): {k: stats.get(k) for k in ("in", "out", "completed", "dead_lettered", "total")}
            for namespace in (PRIMARY, SECONDARY) for entity, stats in emulator.stats(namespace).items()}


@pytest.mark.timeout(900)
def test_dead_letters_are_redriven_with_every_property_filtered_and_never_twice(emulator, tmp_path, spark, capsys,
                                                                                monkeypatch):
    messages = matrix(CREATED_LATER)
    missing = {f"missing-{n}": legacy_message(f"missing-{n}", [section(DATA, b"m")], {"n": n}, STILL_MISSING)[0]
               for n in range(2)}
    no_path = properties_section("no-path") + section(APPLICATION_PROPERTIES, {"kind": "poison"}) + section(DATA, b"?")
    sender = _RawSender(url(emulator, SECONDARY), BACKLOG_QUEUE)
    try:
        for raw, _ in messages.values():
            sender.send(raw)
        for raw in missing.values():
            sender.send(raw)
        sender.send(no_path)
    finally:
        sender.close()

    # 1. The backlog run: nothing can be delivered; everything is dead-lettered with its reason.
    backlog = make_config(emulator, tmp_path)
    summary = run_syphon(spark, backlog)
    assert summary.drained and summary.per_destination[CREATED_LATER]["dead_lettered"] == len(messages)
    reasons = {str(m.message_id): m.dead_letter_reason for m in _peek_dead_letters(emulator, BACKLOG_QUEUE)}
    assert reasons == {**{message_id: "destination_not_found" for message_id in expected_sections(messages)},
                       **dict.fromkeys(missing, "destination_not_found"), "no-path": "missing_path"}
    emulator.add_queue(PRIMARY, CREATED_LATER)

    # 2. The dry run of a re-drive, from the command line: what would move, per destination and reason.
    for name, value in emulator_environment(emulator, PRIMARY, SECONDARY).items():
        monkeypatch.setenv(name, value)
    before = _activity(emulator)
    code = cli_main(["--config", str(ROOT / "conf/local.yaml"), "--redrive-dead-letters", "--dry-run",
                     "--set", f"storage.audit_table={backlog.storage.audit_table}",
                     "--set", "redrive.reason_codes=destination_not_found"])
    out = capsys.readouterr().out
    assert code == 0 and _activity(emulator) == before, "the dry run sent, settled or received something"
    plan = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines() if line.startswith("  ")
            and line.split()[0] in (CREATED_LATER, STILL_MISSING, "(no")}
    assert plan[(CREATED_LATER, "destination_not_found")] == [str(len(messages)), str(len(messages)), "0", "0"]
    assert plan[(STILL_MISSING, "destination_not_found")] == ["2", "0", "2", "0"]  # tried, and still undeliverable
    assert any(line.split()[-4:] == ["1", "0", "0", "1"] and "missing_path" in line for line in out.splitlines())
    assert f"would move {len(messages)} message(s)" in out

    # 3. A re-drive filtered on the syphon's reason code: the queue that now exists gets its messages intact.
    redrive = make_config(emulator, tmp_path, **{"run.source": "dead_letters",
                                                 "redrive.reason_codes": "destination_not_found"})
    first = run_syphon(spark, redrive)
    assert first.per_destination[CREATED_LATER]["delivered"] == len(messages)
    assert first.per_destination[STILL_MISSING] == {"delivered": 0, "dead_lettered": 2, "skipped_ping": 0,
                                                 "held": 0, "not_selected": 0, "expired": 0, "covered": 0}
    assert first.remaining[DEAD_LETTERS] == 3  # the two still undeliverable, and the one not selected
    arrived = arrived_sections(receive_raw(url(emulator, PRIMARY), CREATED_LATER, len(messages)))
    assert arrived == expected_sections(messages)  # every section, every AMQP type, no DeadLetterReason
    assert sorted(str(m.message_id) for m in _peek_dead_letters(emulator, BACKLOG_QUEUE)) == [
        "missing-0", "missing-1", "no-path"]

    audit = delta.read_table(spark, backlog.storage.audit_table)
    rows = [row.asDict() for row in audit.collect()]
    for message_id in expected_sections(messages):  # both outcomes, the original dead-letter reason kept
        mine = sorted((row["backlog_queue"], row["outcome"], row["reason_code"], row["dead_letter_reason"])
                      for row in rows if row["message_id"] == message_id)
        assert mine == [(BACKLOG_QUEUE, "dead_lettered", "destination_not_found", None),
                        (DEAD_LETTERS, "delivered", None, "destination_not_found")], message_id
    redriven = [row for row in rows if row["backlog_queue"] == DEAD_LETTERS and row["outcome"] == "delivered"]
    assert all(row["dead_letter_error_description"] and CREATED_LATER in row["dead_letter_error_description"]
               for row in redriven)
    assert {(row["message_id"], row["outcome"], row["reason_code"]) for row in rows
            if row["backlog_queue"] == DEAD_LETTERS and row["outcome"] != "delivered"} == {
        ("missing-0", "dead_lettered", "destination_not_found"), ("missing-1", "dead_lettered", "destination_not_found"),
        ("no-path", "not_selected", "filtered_out")}
    checkpoint = checkpoint_table.read_checkpoint(spark, backlog.storage.checkpoint_table)
    assert checkpoint[DEAD_LETTERS].delivered_count == len(messages)
    assert checkpoint[BACKLOG_QUEUE].dead_lettered_count == len(messages) + 3

    # 4. A second re-drive, unfiltered, once the other queue exists too: nothing moves twice.
    emulator.add_queue(PRIMARY, STILL_MISSING)
    second = run_syphon(spark, make_config(emulator, tmp_path, **{"run.source": "dead_letters"}))
    assert not any(counts["delivered"] for counts in second.per_destination.values())
    assert emulator.stats(PRIMARY)[CREATED_LATER]["in"] == len(messages)
    assert emulator.stats(PRIMARY)[STILL_MISSING]["in"] == 0  # dead-lettered again before: not re-sent unasked
    second_rows = {row["message_id"]: (row["outcome"], row["reason_code"])
                   for row in delta.read_table(spark, backlog.storage.audit_table).collect()
                   if row["run_id"] == second.run_id}
    assert second_rows == {"missing-0": ("not_selected", "redriven_before"),
                           "missing-1": ("not_selected", "redriven_before"),
                           "no-path": ("dead_lettered", "missing_path")}  # still no x-ms-path: stays

    # 5. Asked to retry, for that destination only: delivered, and the dead-letter sub-queue ends empty but
    # for the message the filter leaves.
    third = run_syphon(spark, make_config(emulator, tmp_path, **{
        "run.source": "dead_letters", "redrive.retry_dead_lettered": "true", "redrive.destinations": STILL_MISSING}))
    assert third.per_destination[STILL_MISSING]["delivered"] == 2
    assert emulator.stats(PRIMARY)[STILL_MISSING]["in"] == 2
    assert [str(m.message_id) for m in _peek_dead_letters(emulator, BACKLOG_QUEUE)] == ["no-path"]
    assert emulator.stats(SECONDARY)[BACKLOG_QUEUE]["total"] == 0


def test_the_notebook_offers_the_redrive_with_its_dry_run(emulator, tmp_path, spark, capsys, monkeypatch):
    import runpy

    from azure.servicebus import ServiceBusClient

    from tools import backlog_writer
    from tools.backlog_writer import OriginalMessage

    from .test_run_modes import NOTEBOOK, backlog_env

    for name, value in backlog_env(emulator, tmp_path).items():  # as test_run_modes runs the notebook
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT / "notebooks")
    config = make_config(emulator, tmp_path)
    backlog_writer.write_backlog(config.secondary, PRIMARY, [OriginalMessage("orders", b"o", message_id=f"o{n}")
                                                             for n in range(3)], queue_count=1, seed=1)
    queue = f"{PRIMARY}/x-servicebus-transfer/0"
    with ServiceBusClient.from_connection_string(emulator.connection_string(SECONDARY)) as client:
        with client.get_queue_receiver(queue) as receiver:  # as a run that found no 'orders' queue left them
            for message in receiver.receive_messages(max_message_count=3, max_wait_time=5):
                receiver.dead_letter_message(message, reason="destination_not_found", error_description="gone")
    monkeypatch.setenv("SYPHON_WIDGET_SOURCE", "dead_letters")
    monkeypatch.setenv("SYPHON_WIDGET_REDRIVE_REASON_CODES", "destination_not_found")

    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(NOTEBOOK), run_name="__main__")

    out = capsys.readouterr().out
    assert stopped.value.code == 0
    assert "(re-drive of their dead-letter sub-queues)" in out
    assert "re-drive of the dead-letter queues: what would move, per destination and dead-letter reason" in out
    assert any(line.split() == ["orders", "destination_not_found", "3", "3", "0", "0"] for line in out.splitlines())
    assert "dead-letter queues: 3 messages in 1 of 10 queues" in out
    assert "dry run only: set the 'replay' widget to 'yes'" in out
    assert len(_peek_dead_letters(emulator, queue)) == 3  # the dry run moved nothing


@pytest.mark.timeout(900)
def test_a_redrive_killed_after_recording_is_finished_by_the_next_without_sending_anything_twice(emulator, tmp_path,
                                                                                                 spark):
    """Crash and replay of a re-drive: ``jobs/syphon.py --redrive-dead-letters``, a real process, is killed
    (SIGKILL, its whole process tree) once its first batch is recorded and before that batch's purge; the
    next re-drive (in the test's Spark), with a streaming checkpoint of its own, reads the dead-letter
    queues from their first message again, sends only what was not recorded, and settles the killed
    run's messages."""
    import collections

    from azure.servicebus import ServiceBusClient

    from tools import backlog_writer
    from tools.backlog_writer import OriginalMessage

    from .helpers import drain_destinations, job_command, job_env, kill_when_parked, tail

    count = 40  # two batches of 25 sequence numbers: the first recorded then killed, the second sent by the restart
    originals = [OriginalMessage("orders", f"body {n}".encode(), message_id=f"redrive-{n:03d}") for n in range(count)]
    originals.append(OriginalMessage("payments", b"poison", message_id="poison"))
    config = make_config(emulator, tmp_path)
    written = backlog_writer.write_backlog(config.secondary, PRIMARY, originals, queue_count=2, seed=4)
    with ServiceBusClient.from_connection_string(emulator.connection_string(SECONDARY)) as client:
        for queue, n in written.items():
            with client.get_queue_receiver(queue) as receiver:
                for message in receiver.receive_messages(max_message_count=n, max_wait_time=5):
                    poison = str(message.message_id) == "poison"  # as the broker would, after failed deliveries
                    receiver.dead_letter_message(message, reason="MaxDeliveryCountExceeded" if poison else
                                                 "destination_not_found", error_description="test")
    assert len(_peek_dead_letters(emulator, *written)) == count + 1

    command = job_command(tmp_path, run__max_messages_per_trigger=25, redrive__reason_codes="destination_not_found")
    command.append("--redrive-dead-letters")
    env = job_env(emulator)
    why = kill_when_parked(command, env, "after_record", tmp_path / "marker", tmp_path / "killed.log", 300)
    assert why == "", f"{why}\n{tail(tmp_path / 'killed.log')}"
    killed = collections.Counter(str(m.message_id) for m in drain_destinations(emulator, ["orders"])["orders"])
    assert killed and sum(killed.values()) < count  # the first batch (or a part of it) went, and no more

    # The next re-drive, in this process's Spark: what matters is what the killed one left behind.
    restart = make_config(emulator, tmp_path, **{"run.source": "dead_letters", "run.max_messages_per_trigger": 25,
                                                 "redrive.reason_codes": "destination_not_found"})
    assert run_syphon(spark, restart).drained
    restarted = collections.Counter(str(m.message_id) for m in drain_destinations(emulator, ["orders"])["orders"])

    assert killed + restarted == collections.Counter(f"redrive-{n:03d}" for n in range(count))  # each once
    assert [str(m.message_id) for m in _peek_dead_letters(emulator, *written)] == ["poison"]
    audit = delta.read_table(spark, str(tmp_path / "audit"))
    delivered = collections.Counter(row["message_id"] for row in audit.where("outcome = 'delivered'").collect())
    assert delivered == collections.Counter(f"redrive-{n:03d}" for n in range(count))
    assert {row["reason_code"] for row in audit.where("message_id = 'poison'").collect()} == {"filtered_out"}

