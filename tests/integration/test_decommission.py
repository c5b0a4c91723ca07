"""Finishing a migration, against the emulator with real Spark and Delta: ``--status`` says whether the backlog
is safe to remove, and ``--decommission`` removes the drained backlog queues through the administration API,
a dry run first, and refuses each queue that is not drained, naming what holds it.

One backlog of ten queues (conf/emulator.yaml) lives through it, in one test so no worker repeats the drain:
1. a dry run before anything ran: the queues that hold messages are refused, the empty ones would go;
2. a run drains it, one poison message dead-lettered; nothing is left recorded but unsettled;
3. one queue's purge marks are set back (the state a run leaves when it settled its last batch but lost the
   checkpoint write, as a Spark Connect run does), messages are written to another: the status shows the
   unsettled records apart from the messages to deliver; ``--decommission --confirm`` removes the seven empty
   queues under the backlog's lease, refuses the three (dead-letters, unsettled records, messages) and says why;
4. the export acknowledged (``backlog.exported_dead_letters``), a last run settles and delivers the rest, and a
   last confirmation removes every queue; another finds nothing left to remove.
The missing right (exit code 2, one line naming the role) is in ``test_azure_ad.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from backlog_syphon.model import BacklogState, DrainHold, RunMode
from backlog_syphon.run.decommission import decommission
from backlog_syphon.run.status import status
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.servicebus.removal import require_manage
from backlog_syphon.storage import checkpoint_table, lease_table, runs_table
from tools.backlog_writer import OriginalMessage, send_legacy_backlog

from .conftest import PRIMARY, SECONDARY, make_config

QUEUES = [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(10)]
Q0, Q1, Q2 = QUEUES[:3]


def _messages(tag: str, count: int, destination: str | None = "orders") -> list[OriginalMessage]:
    return [OriginalMessage(destination, f"{tag} {index}".encode(), message_id=f"{tag}-{index}")
            for index in range(count)]


def _holds(plan) -> dict[str, set[DrainHold]]:
    return {removal.queue: {hold.kind for hold in removal.holds} for removal in plan if removal.holds}


@pytest.mark.timeout(600)
def test_status_says_when_the_backlog_is_safe_to_remove_and_decommission_removes_only_drained_queues(
        spark, emulator, tmp_path):
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 2})
    send_legacy_backlog(config.secondary, {Q0: _messages("a", 3) + _messages("poison", 1, None),
                                           Q1: _messages("b", 3)})

    # 1. Nothing ran yet: the queues holding messages are refused; a dry run changes nothing.
    dry = decommission(spark, config, confirm=False, run_id="unused")
    assert (dry.confirmed, dry.exit_code, dry.removed) == (False, 4, ())
    assert _holds(dry.plan) == {Q0: {DrainHold.MESSAGES}, Q1: {DrainHold.MESSAGES}}
    assert [removal.queue for removal in dry.plan if removal.removable] == QUEUES[2:]
    assert dry.closing_line == f"dry run: would remove 8 backlog queue(s), refused 2 not drained ({Q0}, {Q1}); " \
                               f"--confirm removes them"
    assert require_manage(config.secondary, PRIMARY) == sorted(QUEUES)
    assert not any(path.exists() for path in tmp_path.iterdir()), "the dry run wrote something"

    # 2. Drained, the poison dead-lettered: every outcome recorded is settled.
    assert run_syphon(spark, config).drained
    drained = status(spark, config)
    assert (drained.verdict.exit_code, drained.unsettled) == (5, {})
    assert _holds(drained.removal) == {Q0: {DrainHold.DEAD_LETTERS}}

    # 3. Q1's marks set back (its messages settled, the marks' write lost); new messages in Q2.
    marks = checkpoint_table.read_checkpoint(spark, config.storage.checkpoint_table)
    assert marks[Q1].purged_through == marks[Q1].delivered_through == 3
    checkpoint_table.write_checkpoint(spark, config.storage.checkpoint_table, [
        dataclasses.replace(mark, purged_through=0, purged_enqueued_ms=None) if queue == Q1 else mark
        for queue, mark in marks.items()])
    send_legacy_backlog(config.secondary, {Q2: _messages("late", 2)})
    report = status(spark, config)
    assert report.unsettled == {Q1: 3}
    lines = report.lines()
    assert "  still to deliver: 2 message(s) in the backlog queues" in lines
    assert f"  recorded, not yet settled: 3 message(s) ({Q1} 3): the next run settles them" in lines
    assert any(line.startswith("  removal: not safe to remove yet: 3 of 10 backlog queue(s) held") for line in lines)

    done = decommission(spark, config, confirm=True, run_id="decommission-1")
    assert (done.exit_code, done.removed) == (4, tuple(QUEUES[3:]))
    assert _holds(done.plan) == {Q0: {DrainHold.DEAD_LETTERS}, Q1: {DrainHold.UNSETTLED}, Q2: {DrainHold.MESSAGES}}
    assert [line for line in done.lines() if line.startswith("  refused")] == [
        f"  refused      {Q0}: held by 1 dead-letter(s) not exported (export them, then name the count in "
        f"backlog.exported_dead_letters)",
        f"  refused      {Q1}: held by 3 recorded message(s) not yet settled (the next run settles them)",
        f"  refused      {Q2}: held by 2 message(s) in the queue"]
    stats = emulator.stats(SECONDARY)
    assert sorted(path for path in stats if path in QUEUES) == [Q0, Q1, Q2]
    assert (stats[Q2]["total"], stats[f"{Q0}/$DeadLetterQueue"]["total"]) == (2, 1), "a refused queue was touched"
    lease = lease_table.read_lease(spark, config.storage.resolved_lease_table)
    assert lease.run_id == "decommission-1" and lease.expires_at == lease.renewed_at  # taken, then released
    [row] = runs_table.read_runs(spark, config.storage.resolved_runs_table, 1)
    assert (row.run_id, row.mode, row.exit_code, row.removed_queues, row.remaining) == (
        "decommission-1", RunMode.DECOMMISSION, 4, QUEUES[3:], {Q0: 0, Q1: 0, Q2: 2})

    # 4. The dead-letter acknowledged as exported; a last run settles Q1's records and delivers Q2's messages.
    acknowledged = config.with_overrides({"backlog.exported_dead_letters": f"{{{Q0}: 1}}"})
    assert run_syphon(spark, acknowledged).drained
    assert status(spark, acknowledged).lines()[-2] == (
        "  removal: safe to remove: all 3 backlog queue(s) drained (backlog-syphon --decommission shows what it "
        "would remove)")
    last = decommission(spark, acknowledged, confirm=True, run_id="decommission-2")
    assert (last.exit_code, last.removed, last.closing_line) == (0, (Q0, Q1, Q2), "removed 3 backlog queue(s)")
    assert not [path for path in emulator.stats(SECONDARY) if path.startswith(f"{PRIMARY}/x-servicebus-transfer")]
    again = decommission(spark, acknowledged, confirm=True, run_id="unused")
    assert (again.exit_code, again.closing_line) == (
        0, "nothing to remove: the secondary namespace has no backlog queue of this primary namespace")
    assert [run.mode for run in runs_table.read_runs(spark, config.storage.resolved_runs_table, 5)] == [
        RunMode.DECOMMISSION, RunMode.SYPHON, RunMode.DECOMMISSION, RunMode.SYPHON]
    gone = status(spark, acknowledged)  # no backlog queue is left, and the runs table says why: not a wrong setting
    assert (gone.verdict.state, gone.verdict.exit_code) == (BacklogState.DECOMMISSIONED, 0)
    assert gone.verdict.line.startswith("decommissioned: no backlog queue is left (3 removed by run decommission-2 at ")
