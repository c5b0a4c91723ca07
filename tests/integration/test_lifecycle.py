"""A backlog's life around the syphon: queues recreated or missing, peeks coming back short, a deleted
streaming checkpoint, failed purge rounds, destinations full or disabled, a lease under starvation, and a
``--timeout`` that falls inside a send (design invariants 1, 2, 8, 10 and 11).

In-process (the session's Spark) wherever no process boundary matters; real jobs (``jobs/syphon.py``)
for what is the command line's (its output, exit codes, ``--timeout``) or needs its own Spark
(``local[1]``). Re-sends are counted by MessageId at destinations without duplicate
detection (``payments``, ``small``); each test checks that every message arrived exactly once, that
the backlog queues are empty at the end, that nothing was dead-lettered, and that the audit holds
exactly one final outcome row per message. Counts and durations are printed (``-s`` shows them).
"""

from __future__ import annotations

import collections
import logging
import shutil
import threading
import time

import pytest

from backlog_syphon.restore.queue_names import backlog_queue_name
from tools.backlog_writer import OriginalMessage, send_legacy_backlog

from .conftest import PRIMARY, SECONDARY, make_config
from .helpers import JOB_SUBMIT_ARGS, drain_destinations, finish_job, job_command, job_env, start_job, tail, wait_for

DESTINATIONS = ("payments", "small")  # neither has duplicate detection: every arrival counts
FINAL_OUTCOMES = {"delivered", "dead_lettered", "skipped_ping"}


@pytest.fixture(autouse=True)
def _duration(request):
    started = time.monotonic()
    yield
    print(f"\n[lifecycle] {request.node.name}: {time.monotonic() - started:.1f} s")


# --- helpers ------------------------------------------------------------------------------------

def _queue(index: int) -> str:
    return backlog_queue_name(PRIMARY, index)


def _originals(tag: str, count: int, destinations=DESTINATIONS) -> list[OriginalMessage]:
    return [OriginalMessage(destinations[index % len(destinations)], f"{tag} body {index}".encode(),
                            message_id=f"{tag}-{index:05d}", application_properties={"index": index})
            for index in range(count)]


def _write(config, per_queue: dict[int, list[OriginalMessage]]) -> None:
    """Each list into its backlog queue, in order, as the legacy client wrote them."""
    send_legacy_backlog(config.secondary, {_queue(index): originals for index, originals in per_queue.items()})


def _backlog(emulator) -> dict[str, dict]:
    stats = emulator.stats(SECONDARY)
    return {path: entry for path, entry in stats.items()
            if "x-servicebus-transfer/" in path and "$deadletterqueue" not in path.lower()}


def _remaining(emulator) -> int:
    return sum(entry["total"] for entry in _backlog(emulator).values())


def _dead_letters(emulator) -> int:
    backlog = sum(entry.get("dead_letter_count", 0) for entry in _backlog(emulator).values())
    primary = emulator.stats(PRIMARY)
    return backlog + sum(primary[d].get("dead_letter_count", 0) for d in DESTINATIONS)


def _arrived(emulator, destination: str) -> int:
    return emulator.stats(PRIMARY)[destination]["in"]


def _arrivals(emulator, destinations=DESTINATIONS) -> collections.Counter:
    """Drain the destinations: MessageId -> how often it arrived (each checked against its destination)."""
    received = drain_destinations(emulator, destinations)
    counts: collections.Counter = collections.Counter()
    for destination, messages in received.items():
        for message in messages:
            counts[(destination, message.message_id)] += 1
    return counts


def _check_exactly_once(arrivals: collections.Counter, originals, label: str) -> None:
    expected = {(message.destination, message.message_id) for message in originals}
    twice = {key: n for key, n in arrivals.items() if n > 1}
    missing = expected - set(arrivals)
    unexpected = set(arrivals) - expected
    print(f"[{label}] delivered={len(set(arrivals) & expected)} of {len(expected)} duplicates={len(twice)} "
          f"missing={len(missing)} unexpected={len(unexpected)}")
    assert not missing, f"{label}: missing {sorted(missing)[:10]}"
    assert not unexpected, f"{label}: unexpected {sorted(unexpected)[:10]}"
    assert not twice, f"{label}: delivered twice {sorted(twice.items())[:10]}"


def _audit(spark, config) -> list:
    from backlog_syphon.storage import delta

    return delta.read_table(spark, config.storage.audit_table).collect()


def _check_audit(rows, originals) -> dict[str, object]:
    """Exactly one final outcome row per message, and it is ``delivered``; returns message id -> that row."""
    final = [row for row in rows if row["outcome"] in FINAL_OUTCOMES]
    per_message = collections.Counter(row["message_id"] for row in final)
    expected = {message.message_id for message in originals}
    assert set(per_message) == expected, f"audit: missing {sorted(expected - set(per_message))[:10]}, " \
                                         f"unexpected {sorted(set(per_message) - expected)[:10]}"
    assert set(per_message.values()) == {1}, \
        f"audit: several final rows for {[m for m, n in per_message.items() if n > 1][:10]}"
    assert {row["outcome"] for row in final} == {"delivered"}
    return {row["message_id"]: row for row in final}


# --- 1. recreated backlog queues (invariant 10) -------------------------------------------------

@pytest.mark.timeout(600)
def test_recreated_backlog_queues_are_drained_from_their_start(spark, emulator, tmp_path):
    from backlog_syphon.run.syphon import run_syphon
    from backlog_syphon.storage import checkpoint_table

    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 3, "run.max_messages_per_trigger": 60})
    first = {index: _originals(f"first{index}", 30) for index in range(3)}
    _write(config, first)
    summary = run_syphon(spark, config)
    assert summary.drained, summary.remaining
    first_all = [message for batch in first.values() for message in batch]
    _check_exactly_once(_arrivals(emulator), first_all, "recreated: first backlog")
    assert _remaining(emulator) == 0
    before = checkpoint_table.read_checkpoint(spark, config.storage.checkpoint_table)
    assert {queue: row.incarnation for queue, row in before.items()} == {_queue(i): 1 for i in range(3)}

    for index in range(3):
        emulator.recreate_queue(SECONDARY, _queue(index))
    # More than the first time: a reader that went on from the old offset (31) would skip 1..30.
    second = {index: _originals(f"second{index}", 60) for index in range(3)}
    _write(config, second)
    assert _remaining(emulator) == 180

    summary = run_syphon(spark, config)
    second_all = [message for batch in second.values() for message in batch]
    arrivals = _arrivals(emulator)
    _check_exactly_once(arrivals, second_all, "recreated: second backlog")
    assert summary.drained, summary.remaining
    assert _remaining(emulator) == 0 and _dead_letters(emulator) == 0
    checkpoint = checkpoint_table.read_checkpoint(spark, config.storage.checkpoint_table)
    marks = [(queue, row.incarnation, row.delivered_through, row.purged_through)
             for queue, row in sorted(checkpoint.items())]
    print(f"[recreated] checkpoint: {marks}")
    assert {queue: row.incarnation for queue, row in checkpoint.items()} == {_queue(i): 2 for i in range(3)}
    assert all(row.delivered_through == 60 for row in checkpoint.values())
    rows = _check_audit(_audit(spark, config), first_all + second_all)
    assert {rows[message.message_id]["run_id"] for message in second_all} == {summary.run_id}


# --- 2. peeks that come back empty or short mid-window (invariant 11) ---------------------------

@pytest.mark.timeout(600)
def test_an_empty_or_short_peek_page_mid_window_loses_nothing(spark, emulator, tmp_path):
    """One run, two backlog queues: on the first a peek page comes back empty mid-window, on the second short."""
    from backlog_syphon.run.syphon import run_syphon

    modes = ("empty", "short")
    # 300 messages a queue and a budget of 500 each: the window [0, 301) is read in two pages of at most
    # 250 (PEEK_PAGE_SIZE); the fault takes the first page that starts at sequence number 100 or later,
    # in the middle of the window.
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": len(modes),
                                                "run.max_messages_per_trigger": 500 * len(modes)})
    originals = {index: _originals(f"peek-{mode}", 300) for index, mode in enumerate(modes)}
    _write(config, originals)
    for index, mode in enumerate(modes):
        emulator.inject_peek_fault(SECONDARY, _queue(index), mode=mode, count=1, min_message_count=2,
                                   min_from_sequence=100)

    summary = run_syphon(spark, config)
    for index, mode in enumerate(modes):
        queue = _queue(index)
        fired = _backlog(emulator)[queue]["ops"].get("fault_peek", 0)
        print(f"[peek {mode}] fault fired {fired} time(s), pending {emulator.faults_pending(SECONDARY, 'peek', queue)}")
        assert emulator.faults_pending(SECONDARY, "peek", queue) == 0 and fired == 1, mode
    every = [message for batch in originals.values() for message in batch]
    _check_exactly_once(_arrivals(emulator), every, "peek empty and short")
    assert summary.drained, summary.remaining
    assert _remaining(emulator) == 0 and _dead_letters(emulator) == 0
    _check_audit(_audit(spark, config), every)


# --- 3. a deleted streaming checkpoint (invariant 10) -------------------------------------------

@pytest.mark.timeout(600)
def test_a_deleted_streaming_checkpoint_restarts_with_a_new_identity(spark, emulator, tmp_path):
    from backlog_syphon.run.syphon import run_syphon

    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 3, "run.max_messages_per_trigger": 30})
    first = _originals("before", 90)
    _write(config, {index: first[index::3] for index in range(3)})
    summary = run_syphon(spark, config)
    batches = len([point for point in summary.progress if point.stats is not None])
    assert summary.drained and batches >= 3, (summary.remaining, batches)
    first_arrivals = _arrivals(emulator)
    _check_exactly_once(first_arrivals, first, "deleted checkpoint: first run")

    shutil.rmtree(config.storage.checkpoint_location)
    second = _originals("after", 100)
    _write(config, {index: second[index::3] for index in range(3)})
    summary = run_syphon(spark, config)
    second_arrivals = _arrivals(emulator)
    resent = {key for key in second_arrivals if key[1].startswith("before-")}
    print(f"[deleted checkpoint] second run re-sent {len(resent)} of the first 90")
    assert not resent, f"re-sent after the checkpoint was deleted: {sorted(resent)[:10]}"
    _check_exactly_once(second_arrivals, second, "deleted checkpoint: second run")
    assert summary.drained, summary.remaining
    assert _remaining(emulator) == 0 and _dead_letters(emulator) == 0
    rows = _check_audit(_audit(spark, config), first + second)
    assert {rows[message.message_id]["run_id"] for message in second} == {summary.run_id}


# --- 4. a failed purge round (invariant 11) -----------------------------------------------------

@pytest.mark.timeout(600)
def test_failed_purge_receives_and_settlements_are_retried_and_resend_nothing(spark, emulator, tmp_path, caplog):
    """One run, two faults on two backlog queues: on the first, as many receive failures as the SDK's own
    retries (retry_total 3) and one more, so that queue's purge round fails (the next round retries it);
    on the second, the round's bulk completion is refused once for a lost lock (it is split in two and
    each half completed in one request: never one message at a time)."""
    from backlog_syphon.run.syphon import run_syphon

    caplog.set_level(logging.INFO, logger="backlog_syphon")

    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 3, "run.max_messages_per_trigger": 30})
    originals = _originals("purge", 90)
    _write(config, {index: originals[index::3] for index in range(3)})
    faults = {"receive": (_queue(0), 4, "purge round failed"),
              "settle": (_queue(1), 1, "refused for a lost lock: split and tried again")}
    for operation, (queue, count, _) in faults.items():
        emulator.inject_fault(SECONDARY, operation, entity=queue, count=count)

    summary = run_syphon(spark, config)
    batches = len([point for point in summary.progress if point.stats is not None])
    messages = [record.getMessage() for record in caplog.records]
    for operation, (queue, count, expected) in faults.items():
        fired = sum(entry["ops"].get(f"fault_{operation}", 0) for entry in _backlog(emulator).values())
        print(f"[purge {operation}] {batches} batches; fault fired {fired} time(s), injected on {queue}")
        assert emulator.faults_pending(SECONDARY, operation) == 0 and fired == count
        assert any(expected in message for message in messages), [m for m in messages if "purge" in m][:5]
    assert batches >= 3
    _check_exactly_once(_arrivals(emulator), originals, "purge faults")
    assert summary.drained, summary.remaining
    assert _remaining(emulator) == 0 and _dead_letters(emulator) == 0
    for path, entry in _backlog(emulator).items():
        assert entry["ops"].get("abandon", 0) == 0, (path, entry["ops"])
    # Every completion went in bulk: the refused one and its two halves, then one per purge page.
    settled = _backlog(emulator)[_queue(1)]["ops"]
    assert settled.get("update_disposition", 0) <= batches + 3 and settled["complete"] == len(originals) // 3
    _check_audit(_audit(spark, config), originals)


# --- 5. a destination full or disabled (invariant 11, 3) ----------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["quota-exceeded", "disabled"])
def test_a_full_or_disabled_destination_waits_without_holding_others(spark, emulator, tmp_path, mode):
    from backlog_syphon.run.syphon import start_syphon

    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 2, "sink.outage_wait_seconds": 120,
                                                "sink.retry_backoff_seconds": 0.2,
                                                "sink.max_retry_backoff_seconds": 1})
    originals = _originals(f"full-{mode}", 60)
    _write(config, {0: originals[0::2], 1: originals[1::2]})
    small = sum(1 for message in originals if message.destination == "small")
    emulator.set_unavailable(PRIMARY, "payments", mode=mode)
    run = start_syphon(spark, config)
    try:
        assert wait_for(lambda: _arrived(emulator, "small") >= small or not run.query.isActive, 240), \
            f"only {_arrived(emulator, 'small')} of {small} reached 'small' ({run.query.exception()})"
        time.sleep(2)  # a moment more of the outage: 'payments' still waits, 'small' got everything
        assert run.query.isActive, f"the run ended during the outage: {run.query.exception()}"
        assert _arrived(emulator, "payments") == 0
        assert _arrived(emulator, "small") == small
        print(f"[{mode}] small={_arrived(emulator, 'small')} payments=0 while the switch was on")
        emulator.set_available(PRIMARY, "payments")
        assert wait_for(lambda: not run.query.isActive, 240), "the run did not end after 'payments' came back"
    finally:
        emulator.set_available(PRIMARY, "payments")
        run.finish(spark)
    assert run.query.exception() is None, run.query.exception()
    _check_exactly_once(_arrivals(emulator), originals, mode)
    assert _remaining(emulator) == 0 and _dead_letters(emulator) == 0
    _check_audit(_audit(spark, config), originals)


@pytest.mark.timeout(600)
def test_a_destination_unavailable_past_the_wait_fails_the_batch_and_the_replay_resends_nothing(
        spark, emulator, tmp_path):
    from backlog_syphon.run.syphon import run_syphon

    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 2, "sink.outage_wait_seconds": 3,
                                                "sink.retry_backoff_seconds": 0.2,
                                                "sink.max_retry_backoff_seconds": 1})
    originals = _originals("past-wait", 60)
    _write(config, {0: originals[0::2], 1: originals[1::2]})
    small = sum(1 for message in originals if message.destination == "small")
    payments = len(originals) - small
    emulator.set_unavailable(PRIMARY, "payments", mode="quota-exceeded")
    try:
        with pytest.raises(Exception) as failed:
            run_syphon(spark, config)
    finally:
        emulator.set_available(PRIMARY, "payments")
    print(f"[past wait] {type(failed.value).__name__} exit_code={getattr(failed.value, 'exit_code', None)}: "
          f"{str(failed.value)[:400]}")
    exit_code = getattr(failed.value, "exit_code", None)  # checked last: the replay is checked whatever it is
    assert "payments" in str(failed.value)
    assert _arrived(emulator, "small") == small and _arrived(emulator, "payments") == 0
    assert _remaining(emulator) >= payments, "messages left unsent were removed from the backlog"

    summary = run_syphon(spark, config)
    print(f"[past wait] replay: small={_arrived(emulator, 'small')} payments={_arrived(emulator, 'payments')}")
    assert _arrived(emulator, "small") == small, "the replay sent 'small' messages again"
    assert _arrived(emulator, "payments") == payments
    _check_exactly_once(_arrivals(emulator), originals, "past wait")
    assert summary.drained, summary.remaining
    assert _remaining(emulator) == 0 and _dead_letters(emulator) == 0
    _check_audit(_audit(spark, config), originals)
    assert exit_code == 1, f"the error run_syphon raised carries no exit code: {type(failed.value).__name__}"


# --- 6. the lease under starvation (invariant 7, the fence): a job on local[1] and a run waiting ----

def _log_time(line: str) -> float:
    """Epoch seconds of a job's log line (``%(asctime)s``: local time, milliseconds after a comma)."""
    import datetime as dt

    return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


STARVATION_LEASE_SECONDS = 16
STARVATION_OUTAGE_SECONDS = 1.5 * STARVATION_LEASE_SECONDS


@pytest.mark.timeout(1500)
def test_lease_under_starvation_never_lets_two_runs_deliver_at_once(spark, emulator, tmp_path):
    """Job A (a process of its own on ``local[1]``) holds the lease while its send tasks wait for a
    server-busy primary, holding the only task slot that a lease extension (a Delta commit) needs; run
    B (in this process: all it needs is to want the same lease) waits for the lease
    (``run.wait_for_lease``). The primary stays down for longer than the lease (16 s).

    The primary goes down once A holds the lease and B waits for it, both past their pre-flights, so
    the fence is exercised whatever the pre-flight makes of a busy primary. (A run started while the
    primary is down waits for it: ``test_outage_and_continuous.py``.) A pauses on its driver before its
    first send until then (``before_send``: no task slot held, so its lease goes on being extended): a fast
    machine's A would otherwise drain all before B got to the lease, and B would take a free one."""
    from backlog_syphon.errors import LeaseLostError
    from backlog_syphon.run.syphon import run_syphon

    settings = {"backlog.queue_count": 3, "run.lease_seconds": STARVATION_LEASE_SECONDS,
                "run.max_messages_per_trigger": 30, "sink.outage_wait_seconds": 300,
                "sink.retry_backoff_seconds": 0.2, "sink.max_retry_backoff_seconds": 1}
    config = make_config(emulator, tmp_path, **settings)
    originals = _originals("starved", 150, destinations=("payments",))
    _write(config, {index: originals[index::3] for index in range(3)})
    marker = tmp_path / "a-paused"
    env = job_env(emulator, {"PYSPARK_SUBMIT_ARGS": f"--master local[1] {JOB_SUBMIT_ARGS}",
                             "SYPHON_SPARK_MASTER": "local[1]", "SYPHON_FAULT_PAUSE_AT": "before_send",
                             "SYPHON_FAULT_PAUSE_SECONDS": "600", "SYPHON_FAULT_MARKER": str(marker)})
    log_a = tmp_path / "job-a.log"
    progress_b: list[str] = []
    ended_b: dict[str, object] = {}
    started_b: list = []  # run B's handle, to stop it if the test fails first

    def run_b() -> None:
        try:
            ended_b["summary"] = run_syphon(spark, config.with_overrides({"run.wait_for_lease": "true"}),
                                            on_progress=progress_b.append, on_start=started_b.append)
        except BaseException as exc:  # noqa: BLE001 - judged by the test below
            ended_b["error"] = exc

    started = time.monotonic()
    job_a = start_job(job_command(tmp_path, **{key.replace(".", "__"): value for key, value in settings.items()}),
                      env, log_a)
    runner_b = threading.Thread(target=run_b, name="run-b", daemon=True)
    try:
        assert wait_for(lambda: marker.exists() or job_a.poll() is not None, 300), tail(log_a)
        assert job_a.poll() is None, f"job A ended (exit {job_a.poll()}) before its first send:\n{tail(log_a)}"
        runner_b.start()
        assert wait_for(lambda: any(line.startswith("waiting for the lease") for line in progress_b)
                        or not runner_b.is_alive(), 300), f"run B: {ended_b} {progress_b}"
        assert runner_b.is_alive(), f"run B ended instead of waiting: {ended_b} {progress_b}"
        emulator.set_unavailable(PRIMARY, mode="server-busy")
        down_since = time.monotonic()
        marker.unlink()  # A goes on, into the busy primary
        # Down for half as long again as the lease: job A's send tasks hold the only task slot
        # meanwhile, past the lease's expiry.
        time.sleep(STARVATION_OUTAGE_SECONDS)
        emulator.set_available(PRIMARY)
        back = time.monotonic()
        code_a = finish_job(job_a, 600)
        runner_b.join(600)
        assert not runner_b.is_alive(), "run B did not end within 600 s of the primary's return"
    finally:
        emulator.set_available(PRIMARY)
        if job_a.poll() is None:
            finish_job(job_a, 1)
        if runner_b.is_alive():  # the session is this worker's: no run may outlive its test
            for run in started_b:
                run.request_stop()
            runner_b.join(120)
    output_a = log_a.read_text(errors="replace")
    arrivals = _arrivals(emulator, ("payments",))
    twice = {key: n for key, n in arrivals.items() if n > 1}
    events_a = [line[:220] for line in output_a.splitlines() if line[:4].isdigit() and any(
        word in line for word in ("took the lease", "round", "batch_id=", "LeaseLost", "could not extend"))]
    error_b = ended_b.get("error")
    outcome_b = f"raised {error_b!r}" if error_b is not None else f"drained={ended_b['summary'].drained}"
    print(f"[starvation] job A exit {code_a}, run B {outcome_b}; primary down {back - down_since:.0f} s, back "
          f"{back - started:.0f} s after start; arrived {len(arrivals)} of {len(originals)}, duplicates "
          f"{len(twice)}, remaining {_remaining(emulator)}")
    print("[starvation] job A:\n  " + "\n  ".join(events_a[:30]))
    print("[starvation] run B:\n  " + "\n  ".join(progress_b[:30]))
    detail = f"--- job A (exit {code_a}) ---\n{output_a[-5000:]}\n--- run B ({outcome_b}) ---\n" + "\n".join(progress_b)
    assert not twice, f"{len(twice)} message(s) delivered twice: {sorted(twice.items())[:10]}\n{detail}"
    # Each run either drained (A exits 0) or stopped sending because it could not keep the lease (A
    # exits 1 on a LeaseLostError; B raises it): on a starved machine both may stop, which is safe.
    # What is left then is delivered by the next run, and nothing either run delivered is sent again.
    assert code_a in (0, 1), detail
    assert code_a == 0 or "LeaseLostError" in output_a, detail
    assert isinstance(error_b, LeaseLostError) if error_b is not None else ended_b["summary"].drained, detail
    if code_a != 0 and error_b is not None:
        assert run_syphon(spark, config).drained
        arrivals.update(_arrivals(emulator, ("payments",)))
    _check_exactly_once(arrivals, originals, "starvation")
    assert _remaining(emulator) == 0 and _dead_letters(emulator) == 0, detail
    _check_audit(_audit(spark, config), originals)


# --- 7. --timeout inside a send (invariant 9, 2) and a missing backlog queue (11), as a job -----

TIMEOUT_SECONDS = 20  # from the query's start: the first send comes 5 to 35 s later on 2 busy cores
# The send task pauses after its first send, so that the timeout falls inside: at most this long, and
# the test ends the pause once the stop has been requested.
PAUSE_SECONDS = 30


@pytest.mark.timeout(900)
def test_timeout_during_a_send_stops_at_the_batch_boundary_and_a_missing_queue_is_skipped_with_one_warning(
        spark, emulator, tmp_path):
    """The job's ``--timeout`` falls inside its first batch's send: it stops at that batch's boundary,
    exits 0 and leaves nothing for the next run to send again. One of its four backlog queues does not
    exist: one line of the job's output says so, and the run goes on without it."""
    from backlog_syphon.run.syphon import run_syphon

    config = make_config(emulator, tmp_path)
    emulator.delete_queue(SECONDARY, _queue(3))
    originals = _originals("timeout", 60, destinations=("payments",))
    _write(config, {index: originals[index::3] for index in range(3)})
    marker = tmp_path / "marker"
    command = job_command(tmp_path, backlog__queue_count=4, run__trigger="2 seconds") + [
        "--timeout", str(TIMEOUT_SECONDS)]
    env = job_env(emulator, {"SYPHON_FAULT_PAUSE_AT": "mid_send", "SYPHON_FAULT_PAUSE_SECONDS": str(PAUSE_SECONDS),
                             "SYPHON_FAULT_MARKER": str(marker)})
    job = start_job(command, env, tmp_path / "job.log")
    paused_at: list[float] = []

    def stop_time() -> float:
        """When the job's --timeout is due: TIMEOUT_SECONDS after the query started (its log says when);
        never, before the query has started."""
        logged = [line for line in tail(tmp_path / "job.log", 200000).splitlines() if "started run_id=" in line]
        return _log_time(logged[0]) + TIMEOUT_SECONDS if logged else float("inf")

    def watch() -> None:
        if wait_for(lambda: marker.exists() or job.poll() is not None, 600, interval=0.1) and marker.exists():
            paused_at.append(time.time())
            # The pause is there for the timeout to fall into: once the stop has surely been requested
            # (the run checks its timeout once a second; 2 s more of margin), removing the marker lets
            # the send go on rather than wait out the pause.
            wait_for(lambda: job.poll() is not None or stop_time() + 3 <= time.time(), 600)
            marker.unlink(missing_ok=True)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    code = finish_job(job, 600)
    watcher.join(5)
    output = tail(tmp_path / "job.log", 200000)
    lines = output.splitlines()
    started = [_log_time(line) for line in lines if "started run_id=" in line]
    batches = [(_log_time(line), line.split()[4]) for line in lines
               if "backlog_syphon.sink.foreach_batch: batch_id=" in line]
    stop_at = started[0] + TIMEOUT_SECONDS if started else None
    if stop_at is not None and paused_at:
        print(f"[timeout] exit {code}; the stop was requested {stop_at - paused_at[0]:+.1f} s after the send "
              f"paused (inside the send: {paused_at[0] <= stop_at <= paused_at[0] + PAUSE_SECONDS}); batches "
              f"recorded {[(round(at - stop_at, 1), batch) for at, batch in batches]} s after the stop")
    assert code == 0, output[-5000:]
    missing = [line for line in lines if _queue(3) in line and "does not exist" in line]
    print(f"[missing] lines naming the missing queue: {missing}")
    assert len(missing) == 1, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    assert paused_at, "the batch never reached its send"
    assert started and batches and stop_at < batches[0][0], \
        f"the timeout did not fall inside the first batch: {started}, {batches}"
    assert [batch for _, batch in batches] == ["batch_id=0"], f"the run went on past the batch in flight: {batches}"
    _check_exactly_once(_arrivals(emulator, ("payments",)), originals, "timeout: first run")
    assert _remaining(emulator) == 0, "the batch in flight was not purged before the run exited"
    _check_audit(_audit(spark, config), originals)

    # The next run, in this process: what matters is what the stopped one left behind.
    assert run_syphon(spark, config.with_overrides({"backlog.queue_count": "4"})).drained
    second = _arrivals(emulator, ("payments",))
    print(f"[timeout] second run sent {sum(second.values())}")
    assert not second, f"the second run sent again: {sorted(second)[:10]}"
    assert _remaining(emulator) == 0 and _dead_letters(emulator) == 0
    _check_audit(_audit(spark, config), originals)
