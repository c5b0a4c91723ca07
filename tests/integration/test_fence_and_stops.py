"""One writer per backlog, plain failures, polite stops, and a purge that touches only what is recorded.

Against the emulator, with real jobs (``jobs/syphon.py`` subprocesses) where a process boundary
matters (two runs at once, a killed holder, signals, exit codes) and in-process otherwise:
- two runs started together on one configuration: one delivers, the other exits with the fence
  message; SIGTERM during the delivering one's send: that batch is finished, recorded and purged,
  the job exits 0, and the next run sends nothing twice; every message arrives exactly once
  (``payments`` has no duplicate detection: counted);
- (a holder killed with SIGKILL mid-send, taken over at once by the next run, which re-sends at most
  the killed batch: ``test_crash_replay.py``);
- a lease held by a run elsewhere: a run exits at once naming the holder, or (``run.wait_for_lease``)
  waits until the lease expires and then delivers;
- a wrong secondary key, a wrong primary key, an endpoint where nothing listens: exit 2 within
  30 s with one line that names the setting; the key never shows; the backlog is untouched;
- a continuous run of many small batches while messages keep arriving, on backlog queues that
  dead-letter at the second delivery: nothing is ever delivered twice by the broker (every message
  in the backlog always has delivery count 0), nothing is dead-lettered.
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import signal
import threading
import time

import pytest
import yaml

from tools.backlog_writer import OriginalMessage, write_backlog
from tools.testing import backlog_dead_letters

from .conftest import PRIMARY, ROOT, SECONDARY, make_config
from .helpers import (drain_destinations, finish_job, free_port, job_command, job_env, kill_tree, start_job, tail,
                      wait_for)

DESTINATION = "payments"  # no duplicate detection: every arrival counts
FENCE_MESSAGE = "another run is delivering from this backlog"


def _originals(tag: str, count: int, destination: str = DESTINATION) -> list[OriginalMessage]:
    return [OriginalMessage(destination, f"{tag} body {index}".encode(), message_id=f"{tag}-{index:05d}",
                            application_properties={"index": index})
            for index in range(count)]


def _arrivals(emulator, destinations=(DESTINATION,)) -> collections.Counter:
    received = drain_destinations(emulator, destinations)
    return collections.Counter(message.message_id for messages in received.values() for message in messages)


def _backlog(emulator) -> dict[str, dict]:
    stats = emulator.stats(SECONDARY)
    return {path: entry for path, entry in stats.items()
            if "x-servicebus-transfer/" in path and "$deadletterqueue" not in path.lower()}


def _job_config(emulator, tmp_path):
    return make_config(emulator, tmp_path)


# --- two runs at once, and a polite stop -----------------------------------------------------------

# How long the delivering job's send may stay paused: long enough to outlast the other job's start on a
# loaded machine, short enough for its lease (120 s, extended by commits that need a task slot).
PAUSE_SECONDS = "90"


@pytest.mark.timeout(900)
def test_two_runs_at_once_one_delivers_and_sigterm_ends_it_after_its_batch(emulator, tmp_path, spark):
    """Two jobs started together on one configuration: one takes the lease and pauses inside its first
    batch's send; the other exits 3 with the fence message. Then SIGTERM (to the driver only, as a
    runner stopping it would): the job finishes that batch, records and purges it, and exits 0. The
    next run delivers the rest, and every message arrives exactly once."""
    from backlog_syphon.run.syphon import run_syphon
    from backlog_syphon.storage import delta

    config = _job_config(emulator, tmp_path)
    originals = _originals("twice", 200)  # the paused batch (100), then one batch for the next run
    written = write_backlog(config.secondary, PRIMARY, originals, queue_count=10)
    command = job_command(tmp_path, run__max_messages_per_trigger=100)
    markers = {n: tmp_path / f"marker{n}" for n in (1, 2)}
    logs = {n: tmp_path / f"job{n}.log" for n in (1, 2)}
    jobs = {n: start_job(command, job_env(emulator, {
        "SYPHON_FAULT_PAUSE_AT": "mid_send", "SYPHON_FAULT_PAUSE_SECONDS": PAUSE_SECONDS,
        "SYPHON_FAULT_MARKER": str(markers[n])}), logs[n]) for n in (1, 2)}

    def paused() -> list[int]:
        return [n for n, marker in markers.items() if marker.exists() and marker.read_text().strip()]

    try:
        assert wait_for(lambda: (paused() and any(job.poll() is not None for job in jobs.values()))
                        or all(job.poll() is not None for job in jobs.values()), 300), \
            f"{tail(logs[1])}\n---\n{tail(logs[2])}"
        codes = {n: job.poll() for n, job in jobs.items()}
        assert len(paused()) == 1, f"exit codes {codes}:\n{tail(logs[1])}\n---\n{tail(logs[2])}"
        winner = paused()[0]
        loser = 3 - winner
        assert codes == {winner: None, loser: 3}, f"exit codes {codes}:\n{tail(logs[loser])}"
        os.kill(jobs[winner].pid, signal.SIGTERM)
        markers[winner].unlink()  # the send goes on once the stop is requested
        code = finish_job(jobs[winner], 300)
    finally:
        for job in jobs.values():
            if job.poll() is None:
                kill_tree(job)
    fenced = tail(logs[loser], 20000)
    assert FENCE_MESSAGE in fenced and "holds the lease" in fenced and "run.wait_for_lease=true" in fenced
    assert "Traceback" not in fenced
    output = tail(logs[winner], 20000)
    assert code == 0, output[-4000:]
    assert "SIGTERM: stopping after the batch in flight" in output and "stopped on request" in output

    audit = delta.read_table(spark, config.storage.audit_table).collect()
    assert {row["batch_id"] for row in audit} == {0}, "the run went on past the batch in flight"
    checkpoint = {row["backlog_queue"]: row for row in delta.read_table(
        spark, config.storage.checkpoint_table).collect()}
    assert checkpoint and all(row["purged_through"] == row["delivered_through"] for row in checkpoint.values())
    first = _arrivals(emulator)
    assert set(first.values()) == {1} and len(first) == len(audit) < len(originals)
    assert sum(entry["total"] for entry in _backlog(emulator).values()) == len(originals) - len(audit)

    # The next run (in this process: what matters is what the stopped one left behind).
    assert run_syphon(spark, config).drained
    second = _arrivals(emulator)
    assert set(second.values()) == {1}
    assert not set(first) & set(second), "the next run sent again what the stopped run had delivered"
    assert set(first) | set(second) == {message.message_id for message in originals}
    assert sum(written.values()) == len(originals)
    assert all(entry["total"] == 0 for entry in _backlog(emulator).values())


# --- a lease held elsewhere -----------------------------------------------------------------------

OTHER_LEASE_SECONDS = 15  # the other run's extension: longer than the next run takes to reach the lease


def test_a_lease_held_elsewhere_stops_a_run_or_makes_it_wait_until_it_expires(emulator, tmp_path, spark):
    from backlog_syphon.run import fence
    from backlog_syphon.run.lease import LeaseHeldError, new_lease
    from backlog_syphon.run.syphon import lease_key, run_syphon
    from backlog_syphon.storage import checkpoint_table, delta, lease_table

    # A lease long enough for a loaded 2-core machine's Delta commits (each extension is one, plus a read).
    config = make_config(emulator, tmp_path, **{"run.lease_seconds": 20})
    originals = _originals("held", 30)
    write_backlog(config.secondary, PRIMARY, originals, queue_count=10)
    storage = config.storage
    now = dt.datetime.now(dt.timezone.utc)
    other = new_lease(lease_key(config), "other-run", "another-host", 4242, now, 300)
    assert lease_table.write_lease(spark, storage.resolved_lease_table, other)

    with pytest.raises(LeaseHeldError) as held:
        run_syphon(spark, config)
    assert "run other-run on another-host (pid 4242)" in str(held.value)
    assert f"{other.expires_at:%Y-%m-%d %H:%M:%S} UTC" in str(held.value)
    assert emulator.stats(PRIMARY)[DESTINATION]["in"] == 0, "a fenced run sent something"
    assert sum(entry["total"] for entry in _backlog(emulator).values()) == len(originals)

    # The other run extends its lease, now for a few seconds: the next run waits for it to expire.
    other = new_lease(lease_key(config), "other-run", "another-host", 4242, dt.datetime.now(dt.timezone.utc),
                      OTHER_LEASE_SECONDS, lease_table.read_lease(spark, storage.resolved_lease_table))
    assert lease_table.write_lease(spark, storage.resolved_lease_table, other)
    lines: list[str] = []
    summary = run_syphon(spark, config.with_overrides({"run.wait_for_lease": "true"}), on_progress=lines.append)
    assert lines[0].startswith("waiting for the lease: ") and "another-host" in lines[0]
    assert summary.drained
    audit = delta.read_table(spark, storage.audit_table).collect()
    assert len(audit) == len(originals)
    assert min(row["outcome_time"].astimezone(dt.timezone.utc) for row in audit) >= other.expires_at
    assert set(_arrivals(emulator)) == {message.message_id for message in originals}
    # Given back by the run's last commit: its final checkpoint rows name it as ended.
    ended = lease_table.read_lease(spark, storage.resolved_lease_table)
    assert ended.expires_at > dt.datetime.now(dt.timezone.utc)
    assert checkpoint_table.ended_run(spark, storage.checkpoint_table) == ended.run_id
    assert fence.current_holder(spark, storage.resolved_lease_table, storage.checkpoint_table,
                                dt.datetime.now(dt.timezone.utc)) is None, "the lease was not given back at the end"
    taken = run_syphon(spark, config)  # at once: no wait for its expiry
    assert taken.drained


# --- plain failures -------------------------------------------------------------------------------

WRONG_KEY = "Wr0ngKeyThatMustNeverBeShown0000000000000000="


@pytest.mark.parametrize("case", ["wrong secondary key", "wrong primary key", "5671 blocked"])
def test_wrong_credentials_or_endpoint_end_the_run_in_seconds_with_one_line(emulator, tmp_path, case):
    config = _job_config(emulator, tmp_path)
    write_backlog(config.secondary, PRIMARY, _originals("untouched", 20), queue_count=10)
    primary, secondary = emulator.connection_string(PRIMARY), emulator.connection_string(SECONDARY)
    network = {}
    if case == "wrong secondary key":
        secondary = emulator.connection_string(SECONDARY, key=WRONG_KEY)
        expected = ("the secondary namespace", "refused the credentials",
                    "SharedAccessKeyName and SharedAccessKey in secondary.connection_string")
    elif case == "wrong primary key":
        primary = emulator.connection_string(PRIMARY, key=WRONG_KEY)
        expected = ("the primary namespace", "refused the credentials",
                    "SharedAccessKeyName and SharedAccessKey in primary.connection_string")
    else:  # AMQP over TLS (a real namespace's 5671) where nothing answers: a firewall that rejects it
        port = free_port()
        secondary = emulator.connection_string(SECONDARY, transport="amqps")
        network = {"SYPHON__SECONDARY__CUSTOM_ENDPOINT_ADDRESS": f"sb://127.0.0.1:{port}",
                   "SYPHON__SECONDARY__CA_FILE": emulator.ca_file}
        expected = (f"cannot reach the secondary namespace 127.0.0.1 over amqp at 127.0.0.1:{port}: TCP port {port} "
                    f"refused the connection", "secondary.custom_endpoint_address",
                    "set secondary.transport: amqp-websockets")
    before = {path: (entry["total"], entry["ops"]) for path, entry in _backlog(emulator).items()}

    started = time.monotonic()
    job = start_job(job_command(tmp_path), job_env(emulator, network, primary=primary, secondary=secondary),
                    tmp_path / "job.log")
    code = finish_job(job, 60)
    seconds = time.monotonic() - started
    output = tail(tmp_path / "job.log")

    assert code == 2, output
    assert seconds < 30, f"took {seconds:.1f} s"
    error_lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and all(part in error_lines[0] for part in expected), output
    assert WRONG_KEY not in output and "local-emulator-key" not in output and "Traceback" not in output
    log_file = output.split("(details in ", 1)[1].split(")", 1)[0]
    log_text = open(log_file).read()
    assert WRONG_KEY not in log_text and "local-emulator-key" not in log_text
    after = {path: (entry["total"], entry["ops"]) for path, entry in _backlog(emulator).items()}
    assert {p: total for p, (total, _) in after.items()} == {p: total for p, (total, _) in before.items()}
    for path, (_, ops) in after.items():
        touched = {op: count - before[path][1].get(op, 0) for op, count in ops.items()
                   if op not in ("attach", "peek", "peek_one") and count != before[path][1].get(op, 0)}
        assert not touched, f"{path} was touched: {touched}"
    assert not any(entry.get("dead_letter_count") for entry in _backlog(emulator).values())
    assert emulator.stats(PRIMARY)[DESTINATION]["in"] == 0


# --- the purge in a long continuous run -----------------------------------------------------------

@pytest.fixture
def strict_emulator():
    """The usual namespaces, but backlog queues that dead-letter a message at its second delivery."""
    from servicebus_emulator import Emulator, EmulatorConfig

    raw = yaml.safe_load((ROOT / "conf/emulator.yaml").read_text())
    for namespace in raw["namespaces"]:
        for queue in namespace.get("queues", []):
            if "x-servicebus-transfer" in queue["name"]:
                queue["max_delivery_count"] = 2
    with Emulator(EmulatorConfig.from_dict(raw), ports={PRIMARY: 0, SECONDARY: 0}) as emu:
        yield emu


@pytest.mark.timeout(900)
def test_many_small_batches_never_raise_a_delivery_count(strict_emulator, tmp_path, spark):
    from azure.servicebus import ServiceBusClient

    from backlog_syphon.run.syphon import start_syphon

    emulator = strict_emulator
    config = make_config(emulator, tmp_path, **{"run.trigger": "1 second", "run.max_messages_per_trigger": 10,
                                                "run.idle_probe_max_seconds": 2})
    # 60 messages at most 10 a trigger: six batches or more, each purging while others wait.
    originals = _originals("small", 60)
    write_backlog(config.secondary, PRIMARY, originals[:40], queue_count=10, seed=1)
    counts_seen: collections.Counter = collections.Counter()
    stop_sampling = threading.Event()

    def sample_delivery_counts():
        # One link per backlog queue, kept open: the sampler must not slow the run it watches.
        with ServiceBusClient.from_connection_string(emulator.connection_string(SECONDARY)) as client:
            receivers = [client.get_queue_receiver(f"{PRIMARY}/x-servicebus-transfer/{index}") for index in range(10)]
            try:
                while not stop_sampling.wait(1.0):
                    for receiver in receivers:
                        seq = 1
                        while page := receiver.peek_messages(max_message_count=250, sequence_number=seq):
                            counts_seen.update(message.delivery_count for message in page)
                            seq = page[-1].sequence_number + 1
            finally:
                for receiver in receivers:
                    receiver.close()

    sampler = threading.Thread(target=sample_delivery_counts, daemon=True)
    sampler.start()
    run = start_syphon(spark, config)
    try:
        for chunk in range(2):  # messages keep arriving while it runs, so purges meet unplanned ones
            time.sleep(3)
            write_backlog(config.secondary, PRIMARY, originals[40 + 10 * chunk:50 + 10 * chunk],
                          queue_count=10, seed=2 + chunk)
        assert wait_for(lambda: emulator.stats(PRIMARY)[DESTINATION]["in"] >= len(originals)
                        or not run.query.isActive, 600, interval=1), "the continuous run did not keep up"
    finally:
        stop_sampling.set()
        sampler.join(30)
        run.finish(spark)
    assert run.query.exception() is None
    batches = len([p for p in run.listener.points if p.stats is not None])
    print(f"\n[purge] {batches} batches; delivery counts seen in the backlog: {dict(counts_seen)}")
    assert batches >= len(originals) // 10  # 10 per trigger at most: many small batches
    assert counts_seen and set(counts_seen) == {0}, f"a backlog message was delivered more than once: {counts_seen}"
    dead = backlog_dead_letters(emulator.connection_string(SECONDARY),
                                [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(10)])
    assert not dead, f"dead-lettered: {[m.dead_letter_reason for m in dead][:5]}"
    arrivals = _arrivals(emulator)
    assert set(arrivals) == {message.message_id for message in originals} and set(arrivals.values()) == {1}
    for path, entry in _backlog(emulator).items():
        assert entry["ops"].get("abandon", 0) == 0 and entry["total"] == 0, (path, entry["ops"])
