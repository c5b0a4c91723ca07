"""The migration mode end to end: a Standard namespace as a Standard -> Premium migration leaves it (its entities
reached through the post-migration name, the messages committed while the migration ran) drained into the Premium
namespace, on the emulator (conf/emulator-migration.yaml) with the unmodified SDK and real Delta tables.

One source holds every kind and state (``tools.migration_writer``): a plain queue with typed properties, time to
live, scheduled, deferred and dead-lettered messages and one that expired; a session-enabled queue with session
states, a deferred message in a session and a session with a state only; a partitioned queue; a topic with two
subscriptions (one sent to a queue, one by property), a topic with one subscription (sent to its topic) and
scheduled messages of its own, a topic whose two subscriptions hold the same messages (sent to it once, through
the first, the other's copies covered); the dead-letter sub-queues of the queues and of a subscription (``eu``'s,
sent along its route: to the topic by property).

- Before anything is read, a configuration that would duplicate silently is refused (a subscription of a topic with
  two sent to its topic; a subscription without a choice), and the dry run shows what matched and where it goes.
- The run (in process; the target answers ``server-busy`` for its first seconds) moves every message once, exact,
  in order per session, with its absolute expiry, the scheduled ones as scheduled (cancelled in the source), the
  deferred ones settled by their numbers, the session states before the messages; the expired one is not sent and
  stays where it was dead-lettered; one over the run's size limit is dead-lettered in its source with the reason,
  and a re-drive (``run.source: dead_letters`` with the same ``migration`` section) moves it once the limit is
  raised. The audit records each by identity with its state, the runs table says which mode ran, and ``--status``
  answers per entity.
- A run killed (SIGKILL) once its first batch is recorded is finished by the next run, which sends nothing twice.
"""

from __future__ import annotations

import collections
import threading

import pytest

from backlog_syphon.config import load_config
from backlog_syphon.errors import SettingsError
from backlog_syphon.model import MessageState, Outcome, RunMode, RunSource
from backlog_syphon.run.dry_run import dry_run
from backlog_syphon.run.status import status
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.storage import delta, runs_table
from tools.migration_writer import (
    ALERTS,
    EVENTS,
    LARGE_ID,
    NEWS,
    ORDERS,
    SESSIONS,
    SOURCE,
    TARGET,
    check_migration,
    write_migration_backlog,
)
from tools.testing import emulator_environment

from .conftest import ROOT

THROTTLED_SECONDS = 3.0  # the target answers server-busy this long once the run's query started


@pytest.fixture
def migration_emulator():
    from servicebus_emulator import Emulator, load_config as load_emulator_config

    with Emulator(load_emulator_config(ROOT / "conf/emulator-migration.yaml"), ports={TARGET: 0, SOURCE: 0}) as emu:
        yield emu


def migration_config(emulator, tmp_path, **overrides):
    """conf/local-migration.yaml against ``emulator``, state in ``tmp_path``; ``overrides``: dotted keys."""
    settings = {"storage.audit_table": str(tmp_path / "audit"), "storage.checkpoint_table": str(tmp_path / "checkpoint"),
                "storage.checkpoint_location": str(tmp_path / "stream"), "run.max_messages_per_trigger": "40"}
    settings.update(overrides)
    return load_config(ROOT / "conf/local-migration.yaml", environ=emulator_environment(emulator, TARGET, SOURCE),
                       overrides=settings)


@pytest.mark.timeout(600)
def test_a_standard_namespace_drains_into_premium_once_exact_in_order_with_its_states(migration_emulator, tmp_path,
                                                                                    spark):
    emulator = migration_emulator
    written = write_migration_backlog(emulator.connection_string(SOURCE))
    config = migration_config(emulator, tmp_path)

    # Refused before anything is read: each would duplicate silently.
    for subscriptions, why in (('{"events/Subscriptions/all": topic, "events/Subscriptions/eu": property, '
                                '"alerts/Subscriptions/ops": topic}', "other subscriptions"),
                               ('{"events/Subscriptions/all": property, "alerts/Subscriptions/ops": topic}',
                                "no choice for events/Subscriptions/eu")):
        with pytest.raises(SettingsError, match=why):
            run_syphon(spark, config.with_overrides({"migration.subscriptions": subscriptions,
                                                     "migration.destination_map": "{}"}))
    assert not delta.table_exists(spark, config.storage.audit_table)

    plan = dry_run(spark, config).lines()
    assert any("events/Subscriptions/eu" in line and "property" in line for line in plan), plan
    assert any("news/Subscriptions/web" in line and "covered: sent once, from news/Subscriptions/mobile" in line
               for line in plan), plan

    def throttle_the_target(run) -> None:
        emulator.set_unavailable(TARGET, mode="server-busy")
        threading.Timer(THROTTLED_SECONDS, emulator.set_available, (TARGET,)).start()

    limited = config.with_overrides({"sink.max_message_size_bytes": str(64 * 1024)})  # o-large is over it
    summary = run_syphon(spark, limited, on_start=throttle_the_target)
    assert summary.drained, summary.lines()
    assert emulator.stats(SOURCE)[ORDERS]["dead_letter_count"] == 2  # o-large beside the expired one
    redrive = run_syphon(spark, config.with_overrides({"run.source": "dead_letters",
                                                       "redrive.reason_codes": "[message_too_large]"}))
    assert redrive.drained and check_migration(emulator, written) == [], redrive.lines()

    audit = delta.read_table(spark, config.storage.audit_table)
    rows = audit.where(audit.outcome != Outcome.NOT_SELECTED)  # (the re-drive saw o-expired and left it)
    rows = rows.select("backlog_queue", "message_id", "outcome", "message_state", "reason_code").collect()
    by_id = collections.defaultdict(list)  # (source, message id): a topic's message is in each of its subscriptions
    for row in rows:
        by_id[(row["backlog_queue"], row["message_id"])].append(row)
    assert all(len(found) == 1 for found in by_id.values()), [r for r in by_id.values() if len(r) > 1][:3]
    states = collections.Counter((row["backlog_queue"], row["message_state"]) for row in rows
                                 if row["message_state"] != MessageState.ACTIVE)
    assert states == {(ORDERS, MessageState.DEFERRED): 3, (SESSIONS, MessageState.DEFERRED): 1,
                      (ORDERS, MessageState.SCHEDULED): 3, (ALERTS, MessageState.SCHEDULED): 2}
    news = collections.Counter((row["backlog_queue"], row["outcome"], row["reason_code"]) for row in rows
                               if row["backlog_queue"].startswith(NEWS))
    assert news == {(f"{NEWS}/Subscriptions/mobile", Outcome.DELIVERED, None): 5,
                    (f"{NEWS}/Subscriptions/web", Outcome.COVERED, "fanned_out"): 5}
    poisoned = {(row["message_id"], row["outcome"]) for row in rows
                if row["backlog_queue"] == f"{EVENTS}/Subscriptions/eu/$DeadLetterQueue"}
    assert poisoned == {(message_id, Outcome.DELIVERED) for message_id in written.subscription_dead_lettered}
    (expired,) = [row for row in rows if row["message_id"] == "o-expired"]
    assert (expired["outcome"], expired["reason_code"]) == (Outcome.EXPIRED, "expired_in_source")
    large = {row["backlog_queue"]: (row["outcome"], row["reason_code"]) for row in rows if row["message_id"] == LARGE_ID}
    assert large == {ORDERS: (Outcome.DEAD_LETTERED, "message_too_large"),
                     f"{ORDERS}/$DeadLetterQueue": (Outcome.DELIVERED, None)}
    redriven, run, *refused = runs_table.read_runs(spark, config.storage.resolved_runs_table, 5)  # newest first
    assert (redriven.source, redriven.mode, redriven.delivered) == (RunSource.DEAD_LETTERS, RunMode.MIGRATION, 1)
    assert (run.source, run.mode, run.exit_code, run.expired) == (RunSource.MIGRATION, RunMode.MIGRATION, 0, 1)
    assert [row.exit_code for row in refused] == [2, 2]

    report = status(spark, config)  # per source entity; the expired message stays where it was dead-lettered
    assert {queue.queue for queue in report.backlog} >= {ORDERS, SESSIONS, ALERTS, f"{EVENTS}/Subscriptions/eu"}
    assert not any(queue.count.messages for queue in report.backlog), report.lines()
    assert {queue.queue: queue.count.messages for queue in report.dead_letters if queue.count.messages} == {
        f"{ORDERS}/$DeadLetterQueue": 1}


@pytest.mark.timeout(900)
def test_a_migration_killed_after_recording_is_finished_by_the_next_run_without_sending_anything_twice(
        migration_emulator, tmp_path, spark):
    """SIGKILL of the job (``jobs/syphon.py --migrate``) once its first batch is recorded and before its purge: the
    next run (in this process, on the same tables) sends nothing of what was recorded again, settles it by identity
    (the deferred messages by their numbers, the scheduled ones cancelled, the sessions' messages session by
    session, from the audit rows the killed run left) and moves the rest: every message arrives once."""
    import os
    import sys

    from .helpers import JOB_SUBMIT_ARGS, job_command, kill_when_parked, tail

    emulator = migration_emulator
    written = write_migration_backlog(emulator.connection_string(SOURCE), count=12)
    env = {**{key: value for key, value in os.environ.items() if not key.startswith("SYPHON_")},
           **emulator_environment(emulator, TARGET, SOURCE), "PYTHONPATH": str(ROOT / "lib"),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.setdefault("PYSPARK_SUBMIT_ARGS", JOB_SUBMIT_ARGS)
    command = job_command(tmp_path, config="conf/local-migration.yaml", run__max_messages_per_trigger=25)
    log = tmp_path / "killed.log"
    why = kill_when_parked(command, env, "after_record", tmp_path / "marker", log, 300)
    assert not why, f"{why}:\n{tail(log)}"
    killed = delta.read_table(spark, str(tmp_path / "audit")).select("backlog_queue", "message_state").collect()
    assert killed and MessageState.DEFERRED in {row["message_state"] for row in killed}, killed

    summary = run_syphon(spark, migration_config(emulator, tmp_path, **{"storage.checkpoint_location":
                                                                        str(tmp_path / "checkpoint-stream")}))
    assert summary.drained, summary.lines()
    assert check_migration(emulator, written) == []
    rows = delta.read_table(spark, str(tmp_path / "audit")).select("backlog_queue", "message_id").collect()
    twice = [key for key, n in collections.Counter((r["backlog_queue"], r["message_id"]) for r in rows).items() if n > 1]
    assert not twice, twice
