"""The whole job over Spark Connect: a local Connect server with Delta, started in this process, and
``jobs/syphon.py --remote`` as a client process that has no JVM of its own.

The same backlog is drained once by a classic run and once over Connect; both must record the
same outcome for every message and deliver the same messages.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.servicebus.peek import peek_counts
from backlog_syphon.storage import checkpoint_table, delta, runs_table
from tools import backlog_writer
from tools.testing import expected_arrivals, received_counts

from .conftest import PRIMARY, make_config
from .helpers import read_with_deltalake, finish_job, job_command, job_env, start_job, tail


@pytest.fixture
def connect_server(spark):
    """``sc://127.0.0.1:PORT`` of a Connect server that lives for one test.

    Spark's own Connect service, started in this process's Spark (the project's session: Delta's
    JARs, UTC), as the Connect plugin would start it in a server of its own: the job under test is the
    client process, which has no JVM, and a second server JVM would only add its cold start. Its
    Python workers import this checkout's library (conftest sets PYTHONPATH), as any Connect server's
    must (a Databricks environment installs the wheel)."""
    jvm = spark._jvm
    conf = jvm.org.apache.spark.SparkEnv.get().conf()  # the service reads its address from the live conf
    conf.set("spark.connect.grpc.binding.address", "127.0.0.1")
    conf.set("spark.connect.grpc.binding.port", "0")  # any free port: read back below
    service = getattr(jvm.org.apache.spark.sql.connect.service, "SparkConnectService$").__getattr__("MODULE$")
    service.start(spark.sparkContext._jsc.sc())
    try:
        yield f"sc://127.0.0.1:{service.localPort()}"
    finally:
        unset = jvm.scala.Option.apply(None)
        service.stop(unset, unset)


def _outcomes(spark, audit_table, prefix: str = "") -> set[tuple]:
    return {(row.message_id and row.message_id.removeprefix(prefix), row.destination, row.outcome, row.reason_code)
            for row in delta.read_table(spark, audit_table).collect()}


@pytest.mark.timeout(900)
def test_the_job_over_spark_connect_records_what_a_classic_run_records(emulator, tmp_path, spark, connect_server):
    originals = (backlog_writer.realistic_backlog(100, seed=21, body_size=100)
                 + [message for message, _ in backlog_writer.poison_backlog(seed=2)])
    expected = expected_arrivals([m for m in originals if m.message_id and not m.message_id.startswith("poison")])

    classic = make_config(emulator, tmp_path / "classic", **{"run.max_messages_per_trigger": 100})
    written = backlog_writer.write_backlog(classic.secondary, PRIMARY, originals, queue_count=10, seed=4)
    summary = run_syphon(spark, classic)
    assert summary.drained
    classic_arrivals = received_counts(emulator.connection_string(PRIMARY), sorted(expected), settle_seconds=0.5)

    # The same backlog again, under new message ids: destinations with duplicate detection would drop repeats.
    again = [dataclasses.replace(m, message_id=m.message_id and f"again-{m.message_id}") for m in originals]
    backlog_writer.write_backlog(classic.secondary, PRIMARY, again, queue_count=10, seed=4)
    state = tmp_path / "connect"
    state.mkdir()
    # With a cap (high enough not to slow this run down): over Connect the sink cannot see the cluster's
    # slots and no accumulator reaches it; the cap is shared among backlog.queue_count tasks instead.
    command = job_command(state, run__max_messages_per_trigger=100, sink__max_messages_per_second=2000) + [
        "--remote", connect_server]
    job = start_job(command, job_env(emulator), state / "job.log")
    assert finish_job(job, 600) == 0, tail(state / "job.log")
    output = tail(state / "job.log", 100000)

    connect_arrivals = received_counts(emulator.connection_string(PRIMARY), sorted(expected), settle_seconds=0.5)
    assert connect_arrivals == classic_arrivals
    assert peek_counts(classic.secondary, written) == {queue: 0 for queue in written}  # settled
    connect_audit = str(state / "audit")
    assert _outcomes(spark, connect_audit, "again-") == _outcomes(spark, classic.storage.audit_table)
    assert len(delta.read_table(spark, connect_audit).collect()) == len(originals)
    # Tables first written over Connect: any Delta reader reads them, with plain column types.
    for name in ("audit", "checkpoint", "checkpoint_lease", "checkpoint_runs"):
        assert "collate" not in " ".join(read_with_deltalake(state / name).values()).lower()
    # The run's row: what it moved, read from the audit there; the send tasks' throttling stays on the server.
    [row] = runs_table.read_runs(spark, str(state / "checkpoint_runs"), 5)
    assert (row.exit_code, row.delivered + row.dead_lettered, row.remaining_total, row.throttled_seconds) == (
        0, len(originals), 0, None)
    checkpoint = checkpoint_table.read_checkpoint(spark, str(state / "checkpoint"))
    assert sum(row.delivered_count + row.dead_lettered_count for row in checkpoint.values()) == len(originals)

    # The client read its progress and summary from the query's progress and the audit table.
    progress = [line for line in output.splitlines() if re.match(r"batch \d+: delivered \d+", line)]
    assert len(progress) >= 2, output[-3000:]
    delivered = sum(1 for row in delta.read_table(spark, connect_audit).collect() if row.outcome == "delivered")
    assert sum(int(re.search(r"delivered (\d+)", line).group(1)) for line in progress) == delivered
    assert re.search(r"remaining 0$", progress[-1])
    # ... and its lines show the batch's average rate only (the send tasks' reports stay on the server)
    assert all(re.search(r"; send rate \d+ msg/s; remaining", line) for line in progress), progress
    for destination, counts in summary.per_destination.items():
        assert re.search(rf"^  {re.escape(destination)}\s+{counts['delivered']}\s+{counts['dead_lettered']}\s+"
                         rf"{counts['skipped_ping']}$", output, re.M), (destination, output[-3000:])

    # The backlog queues recreated (they number from 1 again, so a reader going on from its old offsets
    # would skip them all), the same state: over Connect too, every new message is delivered once and
    # the queues end empty.
    for index in range(10):
        emulator.recreate_queue("contoso-secondary", f"{PRIMARY}/x-servicebus-transfer/{index}")
    third = [dataclasses.replace(m, message_id=m.message_id and f"third-{m.message_id}")
             for m in originals if not (m.message_id or "").startswith("poison")]
    rewritten = backlog_writer.write_backlog(classic.secondary, PRIMARY, third, queue_count=10, seed=4)
    job = start_job(command, job_env(emulator), state / "job-recreated.log")
    assert finish_job(job, 600) == 0, tail(state / "job-recreated.log")
    recreated_arrivals = received_counts(emulator.connection_string(PRIMARY), sorted(expected), settle_seconds=0.5)
    assert recreated_arrivals == expected_arrivals(third)
    assert peek_counts(classic.secondary, written) == {queue: 0 for queue in written}
    checkpoint = checkpoint_table.read_checkpoint(spark, str(state / "checkpoint"))
    assert {queue: checkpoint[queue].incarnation for queue in set(rewritten) & set(written)} == \
        {queue: 2 for queue in set(rewritten) & set(written)}
