"""Crash and replay with real processes: SIGKILL the syphon while its tasks are sending, restart it, lose nothing.

The kill and the rerun reach the emulator over AMQP over WebSockets (TLS, as on 443), the way a firewalled
workspace does (the other end-to-end tests cover plain AMQP; the lost task's test stays on it).

One backlog (150 messages; ``run.max_messages_per_trigger`` 100 makes two micro-batches) and one
streaming checkpoint. Run 1 of ``jobs/syphon.py`` runs in its own session (so its whole process tree,
JVM included, can be killed at once) under the fault harness (``tools/faulty_job.py``) with
``SYPHON_FAULT_PAUSE_AT=mid_send``: once a send task has sent
something it parks, and the job is killed with SIGKILL. Run 2 (in the test's own Spark: only the killed
run needs a process of its own) starts on the same checkpoint and Delta tables, replays batch 0 (planned,
not committed: the same offsets), and drains the backlog.

Every other crash point of the batch (before_send, after_send, after_record) and what each leaves
behind is walked in milliseconds by ``tests/unit/test_micro_batch.py`` against the pure state machine; this
test keeps the one that needs real processes, real Spark and the real broker: a kill in the middle of
the sends, whose re-sends are the documented duplicate window.

A re-send is counted at the destinations: after every run the destination queues are drained, and a
MessageId arriving again, or dropped by the broker's duplicate detection (``orders`` has it on,
``payments`` not), counts as a re-send by that run.

Checked (design invariants 1 and 2):
- every original MessageId reached its destination at least once, nothing was dead-lettered, the
  backlog queues are empty;
- the re-sends are at least one and at most the killed batch, each with the MessageId (and body) of
  its original;
- the audit table holds exactly one ``delivered`` row per message, the checkpoint table's
  delivered-through (and purged-through) of each queue is the queue's highest sequence number.
The restart takes over the lease of the run it follows at once: that run's process is gone.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from dataclasses import dataclass

import pytest

from .conftest import PRIMARY, ROOT, SECONDARY
from .helpers import drain_destinations, job_command, job_env, kill_tree, kill_when_parked, start_job, tail

MESSAGES = 150
BATCH_LIMIT = 100  # run.max_messages_per_trigger: 150 messages make two micro-batches
DESTINATIONS = ("orders", "payments")
KILL_WAIT_SECONDS = 300  # bound for a run to reach its fault point (a busy 2-core machine: about 1 min)
SETTLE_SECONDS = 10  # bound for the broker's counters to stop moving after a kill
CHAIN = ["mid_send"]  # the kills, one run each; then a run that drains
KILLED_BATCH_ID = 0
TRANSPORT = "amqp-websockets"  # the kill's and the rerun's way to the emulator (``testing.emulator_environment``)


# --- helpers --------------------------------------------------------------------------------------

def _backlog_messages():
    from tools.backlog_writer import OriginalMessage

    return [OriginalMessage(DESTINATIONS[index % 2], f"crash body {index}".encode() * 4,
                            message_id=f"crash-{index:04d}", subject="crash-test",
                            application_properties={"index": index})
            for index in range(MESSAGES)]


def _job_command(tmp_path) -> list[str]:
    return job_command(tmp_path, run__max_messages_per_trigger=BATCH_LIMIT)


def _highest_sequence_numbers(emulator) -> dict[str, int]:
    """Per backlog queue with messages: the highest sequence number (peeked, nothing removed)."""
    from tools.testing import read_queues

    def highest(receiver) -> int | None:
        seq, last = 1, None
        while page := receiver.peek_messages(max_message_count=250, sequence_number=seq):
            last = page[-1].sequence_number
            seq = last + 1
        return last

    queues = [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(10)]
    found = read_queues(emulator.connection_string(SECONDARY), queues, highest)
    return {queue: last for queue, last in found.items() if last is not None}


def _send_counters(emulator, destinations=DESTINATIONS) -> dict[str, tuple[int, int]]:
    """Per destination: (messages stored, re-sends dropped by the broker's duplicate detection)."""
    stats = emulator.stats(PRIMARY)
    return {d: (stats[d]["in"], stats[d]["duplicates"]) for d in destinations}


def _settled_send_counters(emulator, destinations=DESTINATIONS) -> dict[str, tuple[int, int]]:
    """The send counters once they stop moving (a killed sender's last frames may still be read)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    last = _send_counters(emulator, destinations)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _send_counters(emulator, destinations)
        if now == last:
            return now
        last = now
    return last


def _stream_log(location) -> tuple[set[int], set[int]]:
    """Batch ids in the streaming checkpoint's offset log (planned) and commit log (finished)."""
    def ids(kind: str) -> set[int]:
        folder = location / kind
        return {int(name) for name in os.listdir(folder) if name.isdigit()} if folder.is_dir() else set()

    return ids("offsets"), ids("commits")


@dataclass
class Run:
    """One run of the chain and what reached the destinations while it ran."""

    fault: str | None
    seconds: float
    sent: int = 0  # sends the broker took: stored, or dropped as a duplicate
    resent: int = 0  # of which re-sends of a MessageId sent before (arrived again or dropped)
    arrived_again: int = 0
    dropped: int = 0
    killed_batch_id: int | None = None


class Destinations:
    """Drains the destinations after each run; checks every arrival against its original."""

    def __init__(self, emulator, originals, destinations=DESTINATIONS):
        self.emulator, self.destinations = emulator, tuple(destinations)
        self.expected = {message.message_id: message for message in originals}
        self.arrived: collections.Counter = collections.Counter()
        self.counters = _send_counters(emulator, self.destinations)

    def account(self, run: Run) -> None:
        counters = _settled_send_counters(self.emulator, self.destinations)
        received = drain_destinations(self.emulator, self.destinations)
        stored = sum(counters[d][0] - self.counters[d][0] for d in self.destinations)
        run.dropped = sum(counters[d][1] - self.counters[d][1] for d in self.destinations)
        self.counters = counters
        for destination, messages in received.items():
            for message in messages:
                assert message.message_id in self.expected, f"unexpected message {message.message_id} at {destination}"
                original = self.expected[message.message_id]
                assert destination == original.destination
                assert b"".join(message.body) == original.body  # a re-send is the same message, not a new one
                assert message.application_properties[b"index"] == original.application_properties["index"]
                run.arrived_again += self.arrived[message.message_id] > 0
                self.arrived[message.message_id] += 1
        assert sum(len(messages) for messages in received.values()) == stored, "drained other than stored"
        run.sent = stored + run.dropped
        run.resent = run.arrived_again + run.dropped
        where = f"fault={run.fault}, killed in batch {run.killed_batch_id}" if run.fault else "no fault, drained"
        print(f"\n[crash-chain] run ({where}): sent={run.sent} re-sent={run.resent} "
              f"(arrived again={run.arrived_again}, dropped by duplicate detection={run.dropped}) "
              f"{run.seconds:.1f}s", flush=True)


# --- the test -------------------------------------------------------------------------------------

# Every wait below is bounded; this only keeps pytest's default per-test timeout out of their way.
@pytest.mark.timeout(len(CHAIN) * (KILL_WAIT_SECONDS + 60) + 600)
def test_a_kill_in_the_middle_of_the_sends_loses_nothing_and_resends_at_most_that_batch(emulator, tmp_path, spark,
                                                                                         caplog):
    from tools.backlog_writer import write_backlog
    from backlog_syphon.config import load_config
    from backlog_syphon.run.syphon import run_syphon

    started = time.monotonic()
    config = load_config(ROOT / "conf/local.yaml", environ=job_env(emulator, transport=TRANSPORT), overrides={})
    originals = _backlog_messages()
    written = write_backlog(config.secondary, PRIMARY, originals, queue_count=10)
    assert sum(written.values()) == MESSAGES
    highest = _highest_sequence_numbers(emulator)
    assert set(highest) == set(written)
    destinations = Destinations(emulator, originals)
    command = _job_command(tmp_path)
    stream = tmp_path / "checkpoint-stream"
    runs: list[Run] = []

    # Each kill: park at its fault point, SIGKILL the whole job, then the next run on the same state.
    for number, step in enumerate(CHAIN, start=1):
        run_started = time.monotonic()
        marker = tmp_path / f"fault-marker-{number}"
        log = tmp_path / f"run{number}-{step}.log"
        # Once parked, other tasks of a mid_send batch get half a second to get as far as they get.
        why = kill_when_parked(command, job_env(emulator, transport=TRANSPORT), step, marker, log, KILL_WAIT_SECONDS,
                               settle_seconds=0.5)
        assert not why, f"run {number}: {why}:\n{tail(log)}"
        run = Run(step, time.monotonic() - run_started)
        planned, committed = _stream_log(stream)
        uncommitted = planned - committed
        assert len(uncommitted) == 1, f"run {number} ({step}): planned {planned}, committed {committed}"
        run.killed_batch_id = uncommitted.pop()
        assert run.killed_batch_id == KILLED_BATCH_ID, f"{step} was reached in batch {run.killed_batch_id}"
        destinations.account(run)
        runs.append(run)

    # Then no fault, same checkpoint and tables: an available-now run that must drain. It runs in this
    # process's Spark: what matters is what the killed job left behind, and the restart needs no JVM
    # of its own (the fault hooks are the killed job's harness only).
    run_started = time.monotonic()
    caplog.set_level(logging.INFO, logger="backlog_syphon")
    before = emulator.connection_stats(PRIMARY)
    environ = job_env(emulator, transport=TRANSPORT)
    summary = run_syphon(spark, load_config(ROOT / "conf/local.yaml", environ=environ, overrides={
        "storage.audit_table": str(tmp_path / "audit"), "storage.checkpoint_table": str(tmp_path / "checkpoint"),
        "storage.checkpoint_location": str(stream), "run.max_messages_per_trigger": str(BATCH_LIMIT)}))
    assert summary.drained, f"the last run did not drain: {summary.remaining}"
    after = emulator.connection_stats(PRIMARY)  # the rerun's sends went over WebSockets (as the kill's did)
    assert after[TRANSPORT] > before[TRANSPORT] and after["amqp"] == before["amqp"], (before, after)
    # The killed run's lease is taken over at once (its process is gone), not after it expires.
    assert any("crashed (its process is gone): taking its lease over" in record.getMessage()
               for record in caplog.records), [record.getMessage() for record in caplog.records][-20:]
    final = Run(None, time.monotonic() - run_started)
    destinations.account(final)
    runs.append(final)
    planned, committed = _stream_log(stream)
    assert planned == committed == {0, 1}, f"planned {planned}, committed {committed}"

    # Re-sends per kill: those of the run after it.
    resent_after = {step: runs[index + 1].resent for index, step in enumerate(CHAIN)}
    print(f"\n[crash-chain] re-sends per kill: {resent_after}; total {time.monotonic() - started:.1f}s", flush=True)

    # Destinations: every message at least once.
    missing = sorted(set(destinations.expected) - set(destinations.arrived))
    assert not missing, f"lost after the crash chain: {missing[:10]} ({len(missing)} in all)"
    assert sum(run.sent for run in runs) == MESSAGES + sum(run.resent for run in runs)

    # Backlog: empty, nothing dead-lettered.
    backlog = emulator.stats(SECONDARY)
    for queue in highest:
        assert backlog[queue]["total"] == 0, f"{queue} still holds {backlog[queue]['total']} messages"
    assert sum(entry.get("dead_letter_count", 0) for entry in backlog.values()) == 0
    stats = emulator.stats(PRIMARY)
    for destination in DESTINATIONS:
        assert stats[destination].get("dead_letter_count", 0) == 0

    # Tables: one delivered row per message; delivered-through = highest sequence number.
    audit = [row.asDict() for row in spark.read.format("delta").load(str(tmp_path / "audit")).collect()]
    checkpoint = {row["backlog_queue"]: row.asDict()
                  for row in spark.read.format("delta").load(str(tmp_path / "checkpoint")).collect()}
    assert collections.Counter(row["outcome"] for row in audit) == {"delivered": MESSAGES}
    per_id = collections.Counter(row["message_id"] for row in audit)
    assert set(per_id) == set(destinations.expected) and set(per_id.values()) == {1}, "duplicate or missing audit rows"
    assert len({(row["backlog_queue"], row["sequence_number"]) for row in audit}) == MESSAGES
    assert {queue: row["delivered_through"] for queue, row in checkpoint.items()} == highest
    assert {queue: row["purged_through"] for queue, row in checkpoint.items()} == highest
    assert {queue: row["delivered_count"] for queue, row in checkpoint.items()} == written

    # Re-sends per kill. The killed batch is batch 0 every time.
    killed_batch = sum(1 for row in audit if row["batch_id"] == KILLED_BATCH_ID)
    print(f"[crash-chain] killed batch {KILLED_BATCH_ID}: {killed_batch} messages, "
          f"batch 1: {MESSAGES - killed_batch}", flush=True)
    assert 0 < killed_batch < MESSAGES
    assert runs[0].resent == 0  # nothing was sent before the first run

    resent = resent_after["mid_send"]
    assert 1 <= resent <= killed_batch, f"{resent} re-sent after mid_send; killed batch: {killed_batch}"
    assert runs[0].sent >= 1  # the kill came after a send


@pytest.mark.timeout(600)
def test_a_lost_send_task_is_run_again_and_resends_only_what_its_first_attempt_sent(emulator, tmp_path):
    """A send task whose process dies after its first send is run again by Spark (``local[2,2]``: two
    attempts, as ``spark.task.maxFailures`` gives on a cluster). The retry re-sends what the lost attempt
    had sent, and nothing else: the documented duplicate window, counted at a destination without
    duplicate detection."""
    from tools.backlog_writer import OriginalMessage, write_backlog
    from backlog_syphon.config import load_config

    originals = [OriginalMessage("payments", f"retry body {index}".encode(), message_id=f"retry-{index:03d}")
                 for index in range(60)]
    config = load_config(ROOT / "conf/local.yaml", environ=job_env(emulator), overrides={})
    written = write_backlog(config.secondary, PRIMARY, originals, queue_count=10)
    log = tmp_path / "job.log"
    proc = start_job(job_command(tmp_path), job_env(emulator, {"SYPHON_FAULT_LOSE_TASK_AT": "mid_send",
                                                                "SYPHON_SPARK_MASTER": "local[2,2]"}), log)
    try:
        rc = proc.wait(timeout=420)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert rc == 0, tail(log)
    arrived = collections.Counter(message.message_id
                                  for message in drain_destinations(emulator, ["payments"])["payments"])
    assert set(arrived) == {message.message_id for message in originals}
    resent = sum(count - 1 for count in arrived.values())
    # Every task of the batch lost its first attempt after its first send (one batched send: its queue's
    # messages to payments): the retries re-sent exactly those, each queue's window once.
    print(f"\n[task retry] {resent} re-sent of {len(originals)} over {len(written)} queues", flush=True)
    assert resent == len(originals)
    assert emulator.stats(SECONDARY)  # the backlog: settled
    assert all(emulator.stats(SECONDARY)[queue]["total"] == 0 for queue in written)


# --- every step of the last batch and of its purge ------------------------------------------------

# The kills, one a test, each on a fresh backlog and state of its own (tables, streaming checkpoint).
# mid_settle is the scenario in small: 300 messages over four queues (one partitioned), 100 a batch,
# killed once every batch was recorded and committed while its purge was at work; the others, one batch each.
KILL_POINTS = ("after_send", "after_record", "mid_settle", "after_final_checkpoint")
KILL_QUEUES = 4  # backlog queues 0-2 plain, 3 partitioned (16 partitions)
PARTITIONED = 3
# The backlog queues' lock: what the killed purge held must still be locked when the rerun's purge starts, which
# then waits out the rest. The last batch, the kill and the rerun's start in this process take 15-30 s on 2 busy
# cores (11 and 18 s measured from the kill to the rerun's wait, at a load of 11 and 17).
LOCK_SECONDS = 40
# mid_settle: a purge round of the scenario's second batch (of three) or a later one stops; the last batch's
# messages wait behind it, unreceived (a purge round of the last batch alone completes its only page first).
PAUSED_BATCH = 1
# Longer than a kill and the rerun's start take, so that the rerun must take the killed run's lease over (its
# process is gone): it never waits for the lease to expire, whatever its length.
LEASE_SECONDS = 180
# 3 * 75 + 75 = 300 messages, one in 25 poison; the small ones: one batch, the last message poison
SCENARIO = {"plain": 75, "partitioned": 75, "batch": 100, "poison_every": 25}
SMALL = {"plain": 8, "partitioned": 8, "batch": 1000, "poison_every": 8}
TAKEOVER = "crashed (its process is gone): taking its lease over"
LOCK_WAIT = "locked by an earlier receiver"


def _kill_backlog(point: str, shape: dict) -> dict[str, list]:
    """Per backlog queue, its originals: every ``poison_every``-th message is poison (no x-ms-path:
    dead-lettered with a reason), so purge pages hold a dead-lettering (``mid_settle`` stops between a page's
    completions and its dead-letterings); the rest to orders (duplicate detection) and payments (none)."""
    from backlog_syphon.restore.queue_names import backlog_queue_name
    from tools.backlog_writer import OriginalMessage

    backlog = {}
    for index in range(KILL_QUEUES):
        count = shape["partitioned" if index == PARTITIONED else "plain"]
        backlog[backlog_queue_name(PRIMARY, index)] = [
            OriginalMessage(None if n % shape["poison_every"] == shape["poison_every"] - 1 else DESTINATIONS[n % 2],
                            f"{point} q{index} body {n}".encode(),
                            message_id=f"{point}-{index}-{n:04d}", application_properties={"index": n})
            for n in range(count)]
    return backlog


def _backlog_totals(emulator, queues) -> dict[str, int]:
    """What each backlog queue holds now (locked messages included)."""
    stats = emulator.stats(SECONDARY)
    return {queue: stats[queue]["total"] for queue in queues}


@pytest.mark.timeout(KILL_WAIT_SECONDS + 180 + 300)
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_kill_at_each_step_of_the_last_batch_and_its_purge_leaves_nothing_for_the_run_after_it(
        point, emulator, tmp_path, spark, caplog):
    """SIGKILL the job at each step of its last batch and of that batch's purge, then run it again on the same
    state: the rerun ends with exit code 0, the backlog empty and its poison dead-lettered with its reason,
    nothing lost, at most the killed batch sent again (each re-send the same MessageId and body).

    The emulator keeps the locks of the killed process's purge until they end (as the service keeps a lost
    link's), so the rerun's purge meets recorded messages it cannot receive yet and waits them out. In the
    issue's scenario (mid_settle) every batch was committed before the kill: the rerun reads nothing new
    (no batch at all) and still settles everything the killed run recorded. The rerun takes the killed run's
    lease over at once (its process is gone, same host); after the killed run's last commit it finds it free."""
    from backlog_syphon.config import load_config
    from backlog_syphon.errors import EXIT_OK
    from backlog_syphon.restore.queue_names import backlog_queue_name
    from backlog_syphon.run.dry_run import dry_run
    from backlog_syphon.run.runs import summary_end
    from backlog_syphon.run.syphon import run_syphon
    from tools.backlog_writer import send_legacy_backlog
    from tools.testing import read_queues

    queues = [backlog_queue_name(PRIMARY, index) for index in range(KILL_QUEUES)]
    for index, queue in enumerate(queues):
        emulator.recreate_queue(SECONDARY, queue, lock_duration_seconds=LOCK_SECONDS,
                                enable_partitioning=index == PARTITIONED)
    env = job_env(emulator)
    state = {"storage.audit_table": str(tmp_path / "audit"), "storage.checkpoint_table": str(tmp_path / "checkpoint"),
             "storage.checkpoint_location": str(tmp_path / "checkpoint-stream"),
             "backlog.queue_count": str(KILL_QUEUES), "run.lease_seconds": str(LEASE_SECONDS)}
    stream = tmp_path / "checkpoint-stream"
    caplog.set_level(logging.INFO, logger="backlog_syphon")
    originals: list = []
    poison: set[str] = set()
    destinations = None
    # One kill point a test, each on its own state (tables, streaming checkpoint) and a fresh backlog: the points
    # share nothing, so the suite's lanes take them apart.
    shape = SCENARIO if point == "mid_settle" else SMALL
    backlog = _kill_backlog(point, shape)
    config = load_config(ROOT / "conf/local.yaml", environ=env, overrides={
        **state, "run.max_messages_per_trigger": str(shape["batch"])})
    send_legacy_backlog(config.secondary, {q: m for q, m in backlog.items() if q != queues[PARTITIONED]})
    send_legacy_backlog(config.secondary, {queues[PARTITIONED]: backlog[queues[PARTITIONED]]}, singly=True)
    written = [message for messages in backlog.values() for message in messages]
    originals += written
    poison |= {message.message_id for message in written if message.destination is None}
    if destinations is None:
        destinations = Destinations(emulator, written)
    destinations.expected.update({message.message_id: message for message in written})
    planned_before = _stream_log(stream)[0]

    # The kill. mid_settle parks the threads of a purge round of the last batches only: the job goes on to its
    # end (every batch recorded and committed) and waits there for them; it is killed once the streaming
    # checkpoint says so, its purge's locks a few seconds old.
    started = time.monotonic()
    marker, log = tmp_path / f"marker-{point}", tmp_path / f"{point}.log"
    first_batch = max(planned_before, default=-1) + 1

    sent_before = sum(map(sum, _send_counters(emulator).values()))
    to_send = sum(1 for message in written if message.destination is not None)

    def all_committed() -> bool:
        """Every message of the point sent, and its batch committed: the last batch is done."""
        planned, committed = _stream_log(stream)
        return (sum(map(sum, _send_counters(emulator).values())) - sent_before >= to_send
                and planned != planned_before and planned == committed)

    why = kill_when_parked(job_command(tmp_path, backlog__queue_count=KILL_QUEUES,
                                       run__lease_seconds=LEASE_SECONDS,
                                       run__max_messages_per_trigger=shape["batch"]),
                           {**env, "SYPHON_FAULT_PAUSE_PURGE_FROM_BATCH": str(first_batch + PAUSED_BATCH)},
                           point, marker, log, KILL_WAIT_SECONDS,
                           until=all_committed if point == "mid_settle" else None)
    assert not why, f"{point}: {why}:\n{tail(log)}"
    killed = Run(point, time.monotonic() - started)
    killed_at = time.time()
    planned, committed = _stream_log(stream)
    killed_batches = planned - planned_before
    left = _backlog_totals(emulator, queues)
    if point == "mid_settle":
        assert planned == committed and len(killed_batches) > PAUSED_BATCH, (planned, committed)  # none to replay
        locked = sum(emulator.stats(SECONDARY)[queue]["locked"] for queue in queues)
        print(f"\n[kill points] {point}: {len(killed_batches)} batches committed in {killed.seconds:.1f}s, "
              f"{sum(left.values())} messages left in the backlog, {locked} locked by the killed purge", flush=True)
        assert locked >= 1 and sum(left.values()) > locked  # its purge was at work, its locks held
    else:
        assert len(killed_batches) == 1 and planned - committed == (
            set() if point == "after_final_checkpoint" else killed_batches)
        destinations.account(killed)  # (mid_settle's sends are counted with its rerun's: its locks run)
    if point == "after_record":
        # The dry run counts what waits to be settled apart from what is to deliver: nothing, here.
        report = dry_run(spark, config)
        assert report.recorded == {queue: count for queue, count in left.items() if count}, report.recorded
        assert report.per_destination == [] and sum(report.per_queue.values()) == sum(left.values())
        assert "waiting to be settled: " in "\n".join(report.lines())

    # The rerun, in this process's Spark (what matters is what the killed job left behind).
    caplog.clear()
    started = time.monotonic()
    summary = run_syphon(spark, config)
    end = summary_end(summary, config.run.trigger)
    rerun = Run(None, time.monotonic() - started)
    destinations.account(rerun)
    messages = [record.getMessage() for record in caplog.records]
    print(f"[kill points] rerun after {point}: exit {end.exit_code} ({end.line}) in {rerun.seconds:.1f}s, "
          f"re-sent {rerun.resent}", flush=True)
    assert (end.exit_code, summary.drained) == (EXIT_OK, True), (point, end.line, summary.remaining)
    assert _backlog_totals(emulator, queues) == dict.fromkeys(queues, 0), point
    if point == "after_final_checkpoint":
        assert not any(TAKEOVER in message for message in messages)  # the killed run's last commit freed it
    else:
        assert any(TAKEOVER in message for message in messages), (point, messages[-20:])
    if point == "mid_settle":
        assert not [p for p in summary.progress if p.stats is not None]  # no batch: nothing new to read
        waits = [record for record in caplog.records if LOCK_WAIT in record.getMessage()]
        assert waits, messages[-20:]
        # (how much of LOCK_SECONDS the kill and the rerun's start took: the margin left to the wait)
        print(f"[kill points] {waits[0].created - killed_at:.1f}s after the kill: {waits[0].getMessage()}",
              flush=True)
    planned_after, committed_after = _stream_log(stream)
    assert planned_after == committed_after

    # Re-sends: only after a kill between the sends and their record, and at most the killed batch.
    audit = [row.asDict() for row in spark.read.format("delta").load(str(tmp_path / "audit")).collect()]
    killed_rows = sum(1 for row in audit if row["batch_id"] in killed_batches)
    assert rerun.resent <= (killed_rows if point == "after_send" else 0), (point, rerun.resent, killed_rows)
    if point == "after_send":
        assert rerun.resent >= 1

    # Nothing lost: every deliverable message at its destination, every poison dead-lettered once, with its reason.
    deliverable = {message.message_id for message in originals} - poison
    assert set(destinations.arrived) == deliverable, sorted(deliverable - set(destinations.arrived))[:10]
    # (received, not peeked: a peek of the partitioned queue's sub-queue answers from one partition)
    def received(receiver) -> list:
        got = []
        while page := receiver.receive_messages(max_message_count=100, max_wait_time=2):
            for message in page:
                receiver.complete_message(message)
            got += page
        return got

    dead = [message for messages in read_queues(emulator.connection_string(SECONDARY), queues, received,
                                                dead_letters=True).values() for message in messages]
    assert collections.Counter(message.message_id for message in dead) == dict.fromkeys(poison, 1)
    assert {message.dead_letter_reason for message in dead} == {"missing_path"}
    audit = [row.asDict() for row in spark.read.format("delta").load(str(tmp_path / "audit")).collect()]
    final = collections.Counter((row["message_id"], row["outcome"]) for row in audit)
    assert final == {**{(m, "delivered"): 1 for m in deliverable}, **{(m, "dead_lettered"): 1 for m in poison}}
