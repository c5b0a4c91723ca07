"""The whole job, end to end, on whatever pyspark (and paired delta-spark) this interpreter has.

``make test-runtimes`` runs it in one virtualenv per extra Spark line (``.venv-spark4.0``,
``.venv-spark4.1``); ``python -m pytest tests/runtimes`` with the main ``.venv`` runs it on the pinned
Spark 4.2. It relies only on what every rewrite of the job keeps: ``jobs/syphon.py``'s command line
and exit codes, the audit table's columns, ``tools/`` and ``tests/integration/helpers.py``.

The scenario, against the local emulator:
- a realistic backlog (plain queues, a session queue, a topic, TTLs, a few schedules) plus the five
  poison messages, spread over the backlog queues like the legacy client did;
- ``run.max_messages_per_trigger`` small enough for several micro-batches;
- run 1 is SIGKILLed once, parked after its first micro-batch was sent and before its outcomes were
  recorded (``kill_when_parked_after_send``); run 2, on the same checkpoint and tables, replays that
  batch and drains the rest (exit 0);
- then: every original message reached its destination at least once (each topic subscription
  that should have it), in order within each session (first arrivals; the replayed batch arrives
  twice where the destination has no duplicate detection); each poison message is in its backlog
  queue's dead-letter queue with its reason code; the backlog queues are empty; the audit table
  holds exactly one ``delivered`` row per delivered MessageId (and one ``dead_lettered`` row, with
  the reason code, per poison message); no micro-batch is larger than the limit, so there are several.
The same backlog and checks once more with an interval trigger (what the continuous Databricks job
runs), no crash: the run is stopped with SIGTERM once the backlog is empty. On Spark 4.0/4.1, which
give Python streaming sources no read limit, the ``available_now`` run is played by the syphon
(bounded batches under a processing-time trigger): its batches are bounded all the same.
A closing note gives, per test, the pyspark version, the micro-batches and their sizes, and the wall times.
"""

from __future__ import annotations

import collections
import math
import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.conftest import PRIMARY, SECONDARY, make_config
from tests.integration.helpers import finish_job, job_command, job_env, kill_when_parked, start_job, tail, wait_for

MESSAGES = 300  # realistic ones, plus the 5 poison messages
BATCH_LIMIT = 80  # run.max_messages_per_trigger: 305 messages make at least 4 micro-batches
INTERVAL_MESSAGES, INTERVAL_BATCH_LIMIT = 150, 40  # the interval-trigger run: at least 4 micro-batches
QUEUE_COUNT = 10
SEED = 11
KILL_WAIT_SECONDS = 420  # bound for run 1 to park after its first send (about a minute on 2 cores)
DRAIN_WAIT_SECONDS = 600  # bound for a run to drain
SESSION_QUEUE = "sessions-orders"
DESTINATIONS = ("orders", "payments", SESSION_QUEUE, "events/all", "events/eu", "small")


def _pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def kill_when_parked_after_send(command, env, marker: Path, log: Path, timeout: float) -> str:
    """Run the job until it parks after sending its first micro-batch (before recording it), then
    SIGKILL its whole process tree. Returns '' once killed there, or why it never parked.

    The one place that knows the fault harness (``tools/faulty_job.py``, which ``start_job`` runs when
    ``SYPHON_FAULT_PAUSE_AT`` and ``SYPHON_FAULT_MARKER`` are set: the process that reaches the step writes
    ``<step> <pid>`` to the marker file and sleeps).
    """
    return kill_when_parked(command, env, "after_send", marker, log, timeout)


def _stream_log(location: Path) -> tuple[set[int], set[int]]:
    """Batch ids in the streaming checkpoint's offset log (planned) and commit log (finished)."""
    def ids(kind: str) -> set[int]:
        folder = location / kind
        return {int(name) for name in os.listdir(folder) if name.isdigit()} if folder.is_dir() else set()

    return ids("offsets"), ids("commits")


def _expected_entities(message) -> list[str]:
    """The primary's entities where an original should arrive (conf/emulator.yaml's topic filters)."""
    if message.destination == "events":
        return ["events/all"] + (["events/eu"] if message.application_properties.get("region") == "eu" else [])
    return [message.destination]


class Backlog:
    """A realistic backlog with the poison messages in its middle, written like the legacy client did."""

    def __init__(self, emulator, tmp_path, count: int, seed: int):
        from tools.backlog_writer import poison_backlog, realistic_backlog, write_backlog

        self.originals = realistic_backlog(count, seed=seed, body_size=256)
        self.poison = poison_backlog(seed=seed)
        half = count // 2
        self.messages = self.originals[:half] + [message for message, _ in self.poison] + self.originals[half:]
        self.config = make_config(emulator, tmp_path)
        self.written = write_backlog(self.config.secondary, PRIMARY, self.messages, queue_count=QUEUE_COUNT,
                                     seed=seed)
        assert sum(self.written.values()) == len(self.messages) and len(self.written) >= 3, self.written
        self.sessions = collections.defaultdict(list)
        for message in self.originals:
            if message.session_id:
                self.sessions[message.session_id].append(message.message_id)
        assert len(self.sessions) >= 5, "the backlog should hold several sessions"

    def describe(self) -> str:
        return (f"{len(self.messages)} messages ({len(self.poison)} poison) in {len(self.written)} queues, "
                f"{len(self.sessions)} sessions")

    def empty(self, emulator) -> bool:
        stats = emulator.stats(SECONDARY)
        return all(stats[queue]["total"] == 0 for queue in self.written)


def check_drained(emulator, spark, backlog: Backlog, audit_table: Path, where: str, facts: dict) -> list[int]:
    """Every check of a drained backlog (module docstring); returns the micro-batch sizes (audit rows per batch)."""
    from tools.testing import backlog_dead_letters, drain_destinations

    # Destinations: every original at least once, where it belongs; nothing else.
    received = drain_destinations(emulator.connection_string(PRIMARY), DESTINATIONS, session_entities=[SESSION_QUEUE],
                                  settle_seconds=3)
    arrived = {entity: collections.Counter(m.message_id for m in messages) for entity, messages in received.items()}
    by_id = {message.message_id: message for message in backlog.originals}
    missing = [(mid, entity) for mid, message in by_id.items() for entity in _expected_entities(message)
               if not arrived[entity][mid]]
    assert not missing, f"{where}: {len(missing)} originals never arrived, e.g. {missing[:5]}"
    strays = [(entity, mid) for entity, ids in arrived.items() for mid in ids
              if mid not in by_id or entity not in _expected_entities(by_id[mid])]
    assert not strays, f"{where}: messages at the wrong destination: {strays[:5]}"
    facts["arrived_again"] = sum(sum(ids.values()) - len(ids) for ids in arrived.values())

    # Sessions: each session's messages arrive together, first arrivals in the original order.
    first_arrivals = collections.defaultdict(list)
    for message in received[SESSION_QUEUE]:
        if message.message_id not in first_arrivals[message.session_id]:
            first_arrivals[message.session_id].append(message.message_id)
    assert dict(first_arrivals) == dict(backlog.sessions), f"{where}: session order not kept"

    # Backlog: empty; the poison messages in its dead-letter queues with their reason codes.
    stats = emulator.stats(SECONDARY)
    left = {queue: stats[queue]["total"] for queue in backlog.written if stats[queue]["total"]}
    assert not left, f"{where}: backlog queues not empty: {left}"
    dead = backlog_dead_letters(backlog.config.secondary, backlog.written)
    expected_dead = {message.message_id: str(reason) for message, reason in backlog.poison}
    assert {m.message_id: m.dead_letter_reason for m in dead} == expected_dead, f"{where}: dead-letters"
    assert len(dead) == len(backlog.poison), f"{where}: a poison message was dead-lettered twice"

    # Audit: one delivered row per delivered MessageId, one dead_lettered row per poison message.
    audit = [row.asDict() for row in spark.read.format("delta").load(str(audit_table)).collect()]
    sizes = collections.Counter(row["batch_id"] for row in audit)
    batch_sizes = [sizes[batch] for batch in sorted(sizes)]
    facts["micro_batches"] = f"{len(batch_sizes)} {batch_sizes}"
    delivered = collections.Counter(row["message_id"] for row in audit if row["outcome"] == "delivered")
    assert set(delivered) == set(by_id), f"{where}: delivered rows {len(delivered)} for {len(by_id)} originals"
    duplicated = {mid: count for mid, count in delivered.items() if count != 1}
    assert not duplicated, f"{where}: more than one delivered row for {list(duplicated)[:5]}"
    assert all(row["destination"] == by_id[row["message_id"]].destination
               for row in audit if row["outcome"] == "delivered"), f"{where}: audit destination"
    dead_rows = {row["message_id"]: row["reason_code"] for row in audit if row["outcome"] == "dead_lettered"}
    assert dead_rows == expected_dead, f"{where}: dead_lettered audit rows"
    assert len(audit) == len(backlog.messages), f"{where}: {len(audit)} audit rows for {len(backlog.messages)}"
    assert len({(row["backlog_queue"], row["sequence_number"]) for row in audit}) == len(backlog.messages)
    return batch_sizes


def check_batches(batch_sizes: list[int], total: int, limit: int, where: str, trigger: str) -> None:
    """No micro-batch larger than run.max_messages_per_trigger, so at least total/limit of them."""
    if max(batch_sizes) <= limit and len(batch_sizes) >= math.ceil(total / limit):
        return
    raise AssertionError(f"{where}, trigger {trigger}: micro-batches {batch_sizes} for {total} messages and "
                         f"run.max_messages_per_trigger={limit}: expected at least {math.ceil(total / limit)} "
                         f"batches of at most {limit}")


def _noted(runtime_note, name: str, scenario) -> None:
    """Run ``scenario(facts)`` and add one line of facts to the closing note, pass or fail."""
    facts = {"pyspark": _pyspark_version()}
    started = time.monotonic()
    try:
        scenario(facts)
        facts["result"] = "PASS"
    except BaseException as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        facts["result"] = f"FAIL ({type(exc).__name__}: {first_line[:160]})"
        raise
    finally:
        facts["wall"] = f"{time.monotonic() - started:.1f}s"
        runtime_note(f"{name}: " + " ".join(f"{key}={value}" for key, value in facts.items()))


# --- the tests ------------------------------------------------------------------------------------

@pytest.mark.timeout(KILL_WAIT_SECONDS + DRAIN_WAIT_SECONDS + 300)
def test_backlog_drains_across_a_crash_on_this_runtime(emulator, tmp_path, request, runtime_note):
    def scenario(facts):
        where = f"on pyspark {facts['pyspark']}"
        backlog = Backlog(emulator, tmp_path, MESSAGES, SEED)
        facts["backlog"] = backlog.describe()
        command = job_command(tmp_path, run__max_messages_per_trigger=BATCH_LIMIT)
        stream = tmp_path / "checkpoint-stream"

        # Run 1: killed once, parked after its first micro-batch was sent, before anything was recorded.
        started = time.monotonic()
        log1 = tmp_path / "run1.log"
        why = kill_when_parked_after_send(command, job_env(emulator), tmp_path / "fault-marker", log1,
                                          KILL_WAIT_SECONDS)
        facts["run1"] = f"{time.monotonic() - started:.1f}s"
        assert not why, f"run 1 {where}: {why}:\n{tail(log1)}"
        planned, committed = _stream_log(stream)
        killed = planned - committed
        assert len(killed) == 1, f"run 1 {where}: planned batches {planned}, committed {committed}"
        facts["run1"] += f"(SIGKILLed after sending batch {killed.pop()})"

        # Run 2: same checkpoint and tables; replays the killed batch, then drains (exit 0).
        started = time.monotonic()
        log2 = tmp_path / "run2.log"
        rc = finish_job(start_job(command, job_env(emulator), log2), DRAIN_WAIT_SECONDS)
        facts["run2"] = f"{time.monotonic() - started:.1f}s(rc={rc})"
        assert rc == 0, f"run 2 {where} did not drain the backlog (rc={rc}; 4 = messages left):\n{tail(log2)}"
        planned, committed = _stream_log(stream)
        assert planned == committed, f"run 2 {where}: planned batches {planned}, committed {committed}"

        sizes = check_drained(emulator, request.getfixturevalue("spark"), backlog, tmp_path / "audit", where, facts)
        check_batches(sizes, len(backlog.messages), BATCH_LIMIT, where, "available_now")

    _noted(runtime_note, f"available_now, SIGKILL after_send, limit {BATCH_LIMIT}", scenario)


@pytest.mark.timeout(DRAIN_WAIT_SECONDS + 300)
def test_backlog_drains_with_an_interval_trigger_on_this_runtime(emulator, tmp_path, request, runtime_note):
    def scenario(facts):
        where = f"on pyspark {facts['pyspark']}"
        backlog = Backlog(emulator, tmp_path, INTERVAL_MESSAGES, SEED + 1)
        facts["backlog"] = backlog.describe()
        command = job_command(tmp_path, run__trigger="1 second", run__max_messages_per_trigger=INTERVAL_BATCH_LIMIT)
        command += ["--timeout", str(DRAIN_WAIT_SECONDS)]  # a bound only: stopped below once drained

        started = time.monotonic()
        log = tmp_path / "run.log"
        proc = start_job(command, job_env(emulator), log)
        drained = wait_for(lambda: backlog.empty(emulator) or proc.poll() is not None, DRAIN_WAIT_SECONDS, 1.0)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # a polite stop: the batch in flight ends, exit 0
        rc = finish_job(proc, 180)
        facts["run"] = f"{time.monotonic() - started:.1f}s(rc={rc})"
        assert drained and backlog.empty(emulator), f"{where}: the backlog was not drained (rc={rc}):\n{tail(log)}"
        assert rc == 0, f"{where}: the run did not stop cleanly on SIGTERM (rc={rc}):\n{tail(log)}"

        sizes = check_drained(emulator, request.getfixturevalue("spark"), backlog, tmp_path / "audit", where, facts)
        check_batches(sizes, len(backlog.messages), INTERVAL_BATCH_LIMIT, where, "1 second")

    _noted(runtime_note, f"interval trigger 1 second, limit {INTERVAL_BATCH_LIMIT}", scenario)
