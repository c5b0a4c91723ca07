"""Operating the syphon unattended, against the emulator with real Spark and Delta: the status command
in each state a backlog can be in, the runs table after runs that drained, left messages and failed,
the bundle's alerts and dashboard queries on the tables those runs wrote, and JSON logs.

One backlog lives through six runs (in one test, so that no worker of the suite repeats them), and
after each the status, the runs table and the alerts are read:
1. a drained backlog: status ``drained`` (0), every alert quiet;
2. messages held for a skipped destination: status ``drained`` with them (0) under the skip, ``waiting``
   (4) without it; the stalled-backlog alert quiet (they wait on purpose);
3. messages written while a run ran, left behind: the run exits 4; status ``waiting`` (4); the stalled
   alert fires once its minutes have passed, the last-run alert fires;
4. a destination refusing past ``sink.outage_wait_seconds``: the run fails at its batch (1), its row says
   so; the last-run alert fires;
5. a poison message: dead-lettered; status ``dead-letters`` (5); the dead-letter alert fires, the others
   are quiet again;
6. a live run: status ``lease held`` (3) naming it.
The alerts' and dashboard's SQL is the bundle's own (resources/), with the table names substituted.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from backlog_syphon.cli import main as cli_main
from backlog_syphon.model import BacklogState, JobIds
from backlog_syphon.run.status import status
from backlog_syphon.run.syphon import run_syphon, start_syphon
from backlog_syphon.storage import runs_table
from tools.testing import emulator_environment
from tools.backlog_writer import OriginalMessage, write_backlog

from .conftest import PRIMARY, ROOT, SECONDARY, make_config
from .helpers import read_with_deltalake

QUEUES = 2
MONITORING = yaml.safe_load((ROOT / "resources/backlog_syphon_monitoring.yml").read_text())["resources"]
ALERTS = {key: alert["query_text"] for key, alert in MONITORING["alerts"].items()}
DASHBOARD = json.loads((ROOT / "resources/backlog_syphon_dashboard.lvdash.json").read_text())
BUNDLE_TABLE = re.compile(r"\$\{var\.catalog\}\.\$\{var\.schema\}\.(\w+)")


def _messages(tag: str, destination: str | None, count: int) -> list[OriginalMessage]:
    return [OriginalMessage(destination, f"{tag} {index}".encode(), message_id=f"{tag}-{index}")
            for index in range(count)]


class Tables:
    """The alerts' and the dashboard's SQL, run in Spark SQL on the tables of ``config``."""

    def __init__(self, spark, config):
        storage = config.storage
        self.spark = spark
        self.paths = {"audit": storage.audit_table, "checkpoint": storage.checkpoint_table,
                      "checkpoint_runs": storage.resolved_runs_table}

    def table(self, name: str) -> str:
        return f"delta.`{self.paths[name]}`"

    def alert(self, key: str, stalled_minutes: int = 0) -> list:
        sql = BUNDLE_TABLE.sub(lambda match: self.table(match.group(1)), ALERTS[key])
        sql = sql.replace("${var.alert_stalled_minutes}", str(stalled_minutes))
        assert "${" not in sql, sql
        return self.spark.sql(sql).collect()

    def fired(self, stalled_minutes: int = 0) -> set[str]:
        return {key for key in ALERTS if self.alert(key, stalled_minutes)}

    def dataset(self, name: str):
        [sql] = ["".join(dataset["queryLines"]) for dataset in DASHBOARD["datasets"] if dataset["name"] == name]
        return self.spark.sql(re.sub(r"\b(FROM|JOIN)\s+(\w+)", lambda m: f"{m.group(1)} {self.table(m.group(2))}", sql))


def _check_the_dashboard(sql: Tables) -> dict[str, list]:
    """Every dataset runs, and has the columns its widgets ask for; returns each one's rows."""
    rows = {}
    for dataset in DASHBOARD["datasets"]:
        frame = sql.dataset(dataset["name"])
        rows[dataset["name"]] = frame.collect()
        for page in DASHBOARD["pages"]:
            for item in page["layout"]:
                for query in item["widget"]["queries"]:
                    if query["query"]["datasetName"] == dataset["name"]:
                        wanted = {column for field in query["query"]["fields"]
                                  for column in re.findall(r"`(\w+)`", field["expression"])}
                        assert wanted <= set(frame.columns), (item["widget"]["name"], wanted, frame.columns)
    return rows


class BacklogLife:
    """One backlog's state through a life of runs: its config, its tables, and what the runs table says."""

    def __init__(self, spark, emulator, tmp_path):
        self.spark = spark
        self.config = make_config(emulator, tmp_path, **{
            "backlog.queue_count": QUEUES, "sink.outage_wait_seconds": 3, "sink.retry_backoff_seconds": 0.2,
            "sink.max_retry_backoff_seconds": 1})
        self.sql = Tables(spark, self.config)

    def write(self, messages, seed) -> None:
        write_backlog(self.config.secondary, PRIMARY, messages, queue_count=QUEUES, seed=seed)

    def runs(self) -> list:
        return list(reversed(runs_table.read_runs(self.spark, self.config.storage.resolved_runs_table, 20)))


# A backlog's life in two tests of about two minutes each (one was 244 s in the suite): the first drains it,
# holds messages on purpose and leaves some; the second fails a run, dead-letters a poison message, reads the
# dashboard and looks at a live run.

@pytest.mark.timeout(900)
def test_status_runs_table_and_alerts_through_a_backlogs_life(spark, emulator, tmp_path):
    life = BacklogLife(spark, emulator, tmp_path)
    config, sql, write, runs = life.config, life.sql, life.write, life.runs
    skipping = config.with_overrides({"restore.skip_destinations": "payments"})
    job = JobIds("job-7", "job-run-42")

    # Before anything ran: nothing waits, nothing is recorded, and looking creates no table.
    empty = status(spark, config)
    assert (empty.verdict.state, empty.verdict.exit_code, empty.lease, empty.runs) == (
        BacklogState.DRAINED, 0, None, ())
    # every backlog queue the namespace has, as its administration API lists them (10 in conf/emulator.yaml)
    assert [q.queue for q in empty.backlog] == [f"{PRIMARY}/x-servicebus-transfer/{i}" for i in range(10)]
    assert "administration API" in empty.counted_by
    assert not any(path.exists() for path in tmp_path.iterdir()), "the status command created something"

    # 1. A backlog, drained.
    write(_messages("first", "orders", 10) + _messages("first-pay", "payments", 10), seed=1)
    waiting = status(spark, config)
    assert (waiting.verdict.state, waiting.verdict.line) == (BacklogState.WAITING, "20 waiting, last progress never")
    assert all(q.count.exact and q.count.oldest_enqueued is not None for q in waiting.backlog if q.count.messages)
    assert run_syphon(spark, config, job=job).drained
    drained = status(spark, config)
    assert (drained.verdict.state, drained.verdict.exit_code, drained.verdict.line) == (
        BacklogState.DRAINED, 0, "drained")
    # Given back with the run's last commit: the checkpoint rows name the run as ended.
    assert drained.lease is not None and drained.ended_run_id == drained.lease.run_id
    assert "lease: free (given back by run " in "\n".join(drained.lines())
    assert sum(q.checkpoint.delivered_count for q in drained.backlog if q.checkpoint) == 20
    [first] = runs()
    assert (first.exit_code, first.closing_line, first.delivered, first.remaining_total, first.job_id,
            first.job_run_id, first.source, first.trigger) == (0, "drained", 20, 0, "job-7", "job-run-42", "backlog",
                                                               "available_now")
    assert first.started_at < first.ended_at and first.batches >= 1 and first.throttled_seconds == 0
    assert first.remaining == {q.queue: 0 for q in drained.backlog}
    assert sql.fired() == set(), "an alert fired on a drained backlog"
    columns = read_with_deltalake(config.storage.resolved_runs_table)  # any Delta reader reads it
    assert list(columns) == runs_table.RUNS_SCHEMA.fieldNames() and columns["remaining"].startswith("MapType")

    # 2. Messages held for a skipped destination wait on purpose.
    write(_messages("held", "payments", 6) + _messages("second", "orders", 4), seed=2)
    assert run_syphon(spark, skipping).drained
    held = status(spark, skipping)
    assert held.held == {"payments": 6}
    assert (held.verdict.state, held.verdict.exit_code, held.verdict.line) == (
        BacklogState.DRAINED, 0, "drained; 6 message(s) held for restore.skip_destinations")
    unskipped = status(spark, config)
    assert (unskipped.verdict.state, unskipped.verdict.exit_code) == (BacklogState.WAITING, 4)
    assert re.fullmatch(r"6 waiting, last progress \d+ s ago", unskipped.verdict.line), unskipped.verdict.line
    second = runs()[-1]
    assert (second.exit_code, second.held, second.delivered, second.remaining_total) == (0, 6, 4, 6)
    assert sql.fired() == set(), "an alert fired on messages held on purpose"

    # 3. A run that leaves messages (written after it fixed its target): exit code 4.
    written_late = []

    def write_late(line: str) -> None:
        if not written_late:
            written_late.append(line)
            write(_messages("late", "orders", 5), seed=3)

    left = run_syphon(spark, config, on_progress=write_late)
    assert written_late and not left.drained and sum(left.remaining.values()) == 5
    third = runs()[-1]
    assert (third.exit_code, third.delivered, third.remaining_total) == (4, 6, 5)
    assert third.closing_line == "5 message(s) remain in the backlog (see 'remaining'): run again, or look at why"
    assert status(spark, config).verdict.exit_code == 4
    assert sql.fired() == {"backlog_syphon_stalled", "backlog_syphon_last_run"}
    assert sql.fired(stalled_minutes=600) == {"backlog_syphon_last_run"}, "stalled before its minutes passed"
    [stalled] = sql.alert("backlog_syphon_stalled")
    assert (stalled["run_id"], stalled["waiting"]) == (third.run_id, 5)



@pytest.mark.timeout(900)
def test_status_runs_table_alerts_and_dashboard_after_a_failed_run_and_a_poison_message(spark, emulator, tmp_path):
    life = BacklogLife(spark, emulator, tmp_path)
    config, sql, write, runs = life.config, life.sql, life.write, life.runs

    # 4. A destination that refuses past the wait: the run fails at its batch, with exit code 1, and its
    # row counts what the batch delivered to the others before it failed.
    write(_messages("late", "orders", 5) + _messages("fourth", "payments", 3), seed=4)
    emulator.set_unavailable(PRIMARY, "orders", mode="quota-exceeded")
    try:
        with pytest.raises(Exception) as failed:
            run_syphon(spark, config)
    finally:
        emulator.set_available(PRIMARY, "orders")
    fourth = runs()[-1]
    assert "orders" in str(failed.value)
    assert (fourth.exit_code, fourth.delivered, fourth.remaining, fourth.remaining_total) == (1, 3, None, None)
    assert fourth.closing_line.startswith("batch ") and "Nothing was lost" in fourth.closing_line
    [last] = sql.alert("backlog_syphon_last_run")
    assert (last["run_id"], last["exit_code"]) == (fourth.run_id, 1)

    # 5. A poison message: dead-lettered; the rest delivered.
    write(_messages("poison", None, 1), seed=5)
    assert run_syphon(spark, config).drained
    dead = status(spark, config)
    assert (dead.verdict.state, dead.verdict.exit_code, dead.verdict.line) == (
        BacklogState.DEAD_LETTERS, 5, "dead-letters: 1 (missing_path 1)")
    fifth = runs()[-1]
    assert (fifth.exit_code, fifth.delivered, fifth.dead_lettered, fifth.remaining_total) == (0, 5, 1, 0)
    assert sql.fired() == {"backlog_syphon_dead_letters"}
    assert [(row["reason_code"], row["messages"]) for row in sql.alert("backlog_syphon_dead_letters")] == [
        ("missing_path", 1)]
    assert [row.exit_code for row in runs()] == [1, 0]

    dashboard = _check_the_dashboard(sql)
    assert len(dashboard["runs"]) == 2 and sorted(row["exit_code"] for row in dashboard["runs"]) == [0, 1]
    assert {row["backlog_queue"]: row["messages_left"] for row in dashboard["remaining"]} == fifth.remaining
    assert [(row["reason_code"], row["messages"]) for row in dashboard["dead_letter_reasons"]] == [("missing_path", 1)]
    assert sum(row["messages"] for row in dashboard["moved"] if row["outcome"] == "delivered") == 3 + 5
    assert dashboard["oldest_age"] and {row["backlog_queue"] for row in dashboard["progress"]} <= set(fifth.remaining)

    # 6. A live run holds the lease: the status says who, since when, and touches nothing.
    live = start_syphon(spark, config.with_overrides({"run.trigger": "2 seconds"}))
    try:
        held_now = status(spark, config)
    finally:
        live.finish(spark)
    assert (held_now.verdict.state, held_now.verdict.exit_code) == (BacklogState.LEASE_HELD, 3)
    assert held_now.verdict.line.startswith(f"lease held by run {live.sink.run_id} on ")
    assert len(runs()) == 2  # a run started without run_syphon records nothing
    assert emulator.stats(SECONDARY)[f"{PRIMARY}/x-servicebus-transfer/0"]["ops"].get("abandon", 0) == 0


def test_json_logs_carry_the_ids_and_the_status_command_exits_with_its_verdict(emulator, tmp_path, spark, capsys,
                                                                                monkeypatch, command_line):
    for name, value in emulator_environment(emulator, PRIMARY, SECONDARY).items():
        monkeypatch.setenv(name, value)
    storage = ["--set", f"storage.audit_table={tmp_path / 'audit'}",
               "--set", f"storage.checkpoint_table={tmp_path / 'checkpoint'}",
               "--set", f"storage.checkpoint_location={tmp_path / 'stream'}", "--set", f"backlog.queue_count={QUEUES}"]
    command = ["--config", str(ROOT / "conf/local.yaml"), *storage]
    write_backlog(make_config(emulator, tmp_path).secondary, PRIMARY, _messages("json", "orders", 8),
                  queue_count=QUEUES, seed=5)

    code = cli_main(command + ["--log-format", "json", "--job-id", "11", "--job-run-id", "22",
                               "--log-file", str(tmp_path / "run.log")])
    out, err = capsys.readouterr()
    assert (code, out) == (0, ""), err[-3000:]
    lines = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    [run_id] = {line["run_id"] for line in lines}
    assert {(line["job_id"], line["job_run_id"]) for line in lines} == {("11", "22")}
    [batch] = [line for line in lines if line.get("event") == "batch" and not line.get("idle")]
    assert (batch["batch_id"], batch["delivered"], batch["remaining_total"]) == (0, 8, 0)
    assert batch["message"].startswith("batch 0: delivered 8")
    assert any(line["batch_id"] == 0 and line["logger"] == "backlog_syphon.sink.foreach_batch" for line in lines)
    [summary] = [line for line in lines if line.get("event") == "run_summary"]
    assert (summary["exit_code"], summary["closing_line"], summary["per_destination"]["orders"]["delivered"]) == (
        0, "drained", 8)
    logged = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines()]
    assert logged and {line["run_id"] for line in logged} == {run_id}
    assert "local-emulator-key" not in err + (tmp_path / "run.log").read_text()
    [row] = runs_table.read_runs(spark, str(tmp_path / "checkpoint_runs"), 5)
    assert (row.run_id, row.job_id, row.job_run_id, row.exit_code) == (run_id, "11", "22", 0)

    assert cli_main(command + ["--status", "--log-format", "json"]) == 0
    out, err = capsys.readouterr()
    [report] = [json.loads(line) for line in err.splitlines() if '"event": "status"' in line]
    assert (out, report["state"], report["exit_code"], report["runs"][0]["run_id"]) == ("", "drained", 0, run_id)
    assert cli_main(command + ["--status"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "verdict: drained"
