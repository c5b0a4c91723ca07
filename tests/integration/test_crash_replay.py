"""Crash and replay with real processes: SIGKILL the syphon while its tasks are sending, restart it, lose nothing.

One backlog (150 messages; ``run.max_messages_per_trigger`` 100 makes two micro-batches) and one
streaming checkpoint. Run 1 of ``jobs/syphon.py`` runs in its own session (so its whole process tree,
JVM included, can be killed at once) with ``SYPHON_FAULT_PAUSE_AT=mid_send``: once a send task has sent
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
import subprocess
import time
from dataclasses import dataclass

import pytest

from .conftest import PRIMARY, ROOT, SECONDARY
from .helpers import drain_destinations, job_command, job_env, kill_tree, kill_when_parked, tail

MESSAGES = 150
BATCH_LIMIT = 100  # run.max_messages_per_trigger: 150 messages make two micro-batches
DESTINATIONS = ("orders", "payments")
KILL_WAIT_SECONDS = 300  # bound for a run to reach its fault point (a busy 2-core machine: about 1 min)
SETTLE_SECONDS = 10  # bound for the broker's counters to stop moving after a kill
CHAIN = ["mid_send"]  # the kills, one run each; then a run that drains
KILLED_BATCH_ID = 0


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
    config = load_config(ROOT / "conf/local.yaml", environ=job_env(emulator), overrides={})
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
        why = kill_when_parked(command, job_env(emulator), step, marker, log, KILL_WAIT_SECONDS, settle_seconds=0.5)
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
    # of its own (the pause hooks are the killed job's environment only).
    run_started = time.monotonic()
    caplog.set_level(logging.INFO, logger="backlog_syphon")
    summary = run_syphon(spark, load_config(ROOT / "conf/local.yaml", environ=job_env(emulator), overrides={
        "storage.audit_table": str(tmp_path / "audit"), "storage.checkpoint_table": str(tmp_path / "checkpoint"),
        "storage.checkpoint_location": str(stream), "run.max_messages_per_trigger": str(BATCH_LIMIT)}))
    assert summary.drained, f"the last run did not drain: {summary.remaining}"
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
    with open(log, "wb") as out:
        proc = subprocess.Popen(job_command(tmp_path), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env=job_env(emulator, {"SYPHON_FAULT_LOSE_TASK_AT": "mid_send",
                                                       "SYPHON_SPARK_MASTER": "local[2,2]"}))
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
