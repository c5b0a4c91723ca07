"""A long life in short: what keeps a continuous syphon's state bounded and its record exact, shown in a few
batches; the long run itself (2,000 batches, its per-tenth costs, memory and table files) is ``make soak``
(``bench/soak.py``).

- The audit table's data files stay bounded: auto compaction (a table property) gathers each day's small
  files once ``spark.databricks.delta.autoCompact.minNumFiles`` of them are there. The job keeps Delta's
  50; here it is 3, so that the bound is passed several times in a few batches. Its history says how many
  files the table held at every version, so the bound is checked at every commit, not at a sample of them.
- An audit append replayed across compactions and a log checkpoint (a batch Spark runs again after a
  crash) appends nothing: Delta keeps the append's transaction identifier through them.
- A continuous run of about 20 batches (a trickle of new backlog messages from one open client, a
  0.1-second trigger), in-process: every message is recorded once (one audit row, outcome ``delivered``)
  and arrives once, across the compactions; ``--maintain``'s OPTIMIZE and VACUUM, run while the syphon
  appends, lose nothing and fail no batch; a second start finds every property as wanted and commits
  nothing; ``--status``'s read of the audit is pruned to the days from its oldest purge mark on.
"""

from __future__ import annotations

import collections
import datetime as dt
import re
import threading
import time
from pathlib import Path

import pytest

from tools.backlog_writer import OriginalMessage, legacy_backlog_bytes

from .conftest import PRIMARY, make_config
from .helpers import drain_destinations, wait_for

AUTO_COMPACT_MIN_FILES = "spark.databricks.delta.autoCompact.minNumFiles"
MIN_NUM_FILES = 3  # for these tests (Delta's default, which the job keeps: 50)
# A partition (a day) holds fewer than minNumFiles small files plus what they were compacted into; a batch's
# append adds one file per task with rows (a run across midnight, UTC, has two partitions).
FILES_BOUND = MIN_NUM_FILES + 2


def _files(spark, path) -> int:
    """The data files of the Delta table at ``path``, as its log says."""
    return spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"]


def _version(spark, path) -> int:
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"]


def _files_per_version(spark, path) -> tuple[list[int], int]:
    """The data files the table held after each of its versions, from its history (every append adds its
    files, every OPTIMIZE, auto or not, removes some and adds others), and how many of its commits were
    auto compactions. The last count is checked against the table's own."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    held, counts, compactions = 0, [], 0
    for row in history:
        metrics = row["operationMetrics"] or {}
        if row["operation"] == "WRITE":
            held += int(metrics["numFiles"])
        elif row["operation"] == "OPTIMIZE":
            held += int(metrics["numAddedFiles"]) - int(metrics["numRemovedFiles"])
            compactions += (row["operationParameters"] or {}).get("auto") == "true"
        counts.append(held)
    assert counts[-1] == _files(spark, path), (counts, [row["operation"] for row in history])
    return counts, compactions


@pytest.fixture
def small_compactions(spark):
    """Auto compaction at ``MIN_NUM_FILES`` for this test's appends (a query's session copies it at its start)."""
    spark.conf.set(AUTO_COMPACT_MIN_FILES, str(MIN_NUM_FILES))
    yield
    spark.conf.unset(AUTO_COMPACT_MIN_FILES)


# --- the table alone: the bound, and a replayed append -----------------------------------------

APPENDS = 8  # auto compaction's bound passed three times, and a log checkpoint (every 10 commits) written


def test_the_audits_files_stay_bounded_and_a_replayed_append_adds_nothing_across_compactions(spark, tmp_path,
                                                                                             small_compactions):
    from backlog_syphon.rows import OUTCOME_ROW_SCHEMA
    from backlog_syphon.storage import audit_table, state_tables

    audit, checkpoint, lease = (str(tmp_path / name) for name in ("audit", "checkpoint", "lease"))
    state_tables.create_tables(spark, audit, checkpoint, lease)  # the audit with its upkeep properties, as a run does
    now = dt.datetime.now(dt.timezone.utc)

    def batch(version: int):
        """A batch's outcome rows: one a backlog queue."""
        columns = [field.name for field in OUTCOME_ROW_SCHEMA.fields]  # by name: the audit gains columns
        rows = [{**dict.fromkeys(columns), "run_id": "r", "batch_id": version, "backlog_queue": f"q{task}",
                 "sequence_number": version, "message_id": f"m-{version}-{task}", "destination": "orders",
                 "outcome": "delivered", "body_size": 10, "enqueued_time": now, "outcome_time": now, "attempts": 1}
                for task in range(2)]
        return spark.createDataFrame([tuple(row[column] for column in columns) for row in rows], OUTCOME_ROW_SCHEMA)

    for version in range(APPENDS):
        audit_table.append_audit(audit, batch(version), "app", version)
    counts, compactions = _files_per_version(spark, audit)
    assert compactions >= 3, f"{compactions} auto compactions in {APPENDS} appends"
    assert max(counts) <= FILES_BOUND, f"the audit's data files reached {max(counts)}: {counts}"
    log = Path(audit) / "_delta_log"
    assert list(log.glob("*.checkpoint.parquet")), "no log checkpoint was written"  # every 10 commits

    # A batch replayed after the compactions (the first, and the last) by a reader that starts from the log
    # checkpoint, as a restarted job's does: nothing is appended, nothing committed.
    before = _version(spark, audit)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    for replayed in (0, APPENDS - 1):
        audit_table.append_audit(audit, batch(replayed), "app", replayed)
    assert _version(spark, audit) == before
    ids = collections.Counter(row["message_id"] for row in spark.read.format("delta").load(audit).collect())
    assert ids == {f"m-{appended}-{task}": 1 for appended in range(APPENDS) for task in range(2)}


# --- a continuous run of about 20 batches ----------------------------------------------------

DESTINATIONS = ("orders", "payments")
QUEUES = 2
BATCHES = 20  # batches with messages: auto compaction's bound is passed some six times
MAX_WRITING_SECONDS = 600  # a bound for a run that stopped making batches, not a measure


def _arrived(emulator) -> int:
    stats = emulator.stats(PRIMARY)
    return sum(stats[destination]["in"] for destination in DESTINATIONS)


class Trickle:
    """Writes new backlog messages from a thread, two at a time (one to each backlog queue), through one client
    and its senders, opened once: the next two once the last are recorded (``recorded()``: how many the
    run's batches delivered), so that each batch carries a few messages however fast the machine is."""

    def __init__(self, config, recorded):
        self.config, self.recorded, self.written, self.error = config, recorded, [], None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._write, name="trickle", daemon=True)

    def _write(self) -> None:
        from backlog_syphon.restore.queue_names import backlog_queue_name
        from backlog_syphon.servicebus.clients import open_client
        from backlog_syphon.servicebus.sdk_internals import prompt
        from backlog_syphon.servicebus.send import send_encoded
        from backlog_syphon.sink.delivery import Outgoing

        try:
            with open_client(self.config.secondary, role="secondary") as client:
                senders = [prompt(client.get_queue_sender(backlog_queue_name(PRIMARY, queue)))
                           for queue in range(QUEUES)]
                try:
                    while not self.stop.is_set():
                        for sender in senders:
                            index = len(self.written)
                            message = OriginalMessage(DESTINATIONS[index % 2], f"trickle body {index}".encode(),
                                                      message_id=f"trickle-{index:05d}")
                            for _ in send_encoded(sender, [Outgoing(legacy_backlog_bytes(message), message.message_id,
                                                                    None, None)]):
                                pass
                            self.written.append(message)
                        while self.recorded() < len(self.written) and not self.stop.wait(0.1):
                            pass
                finally:
                    for sender in senders:
                        sender.close()
        except BaseException as exc:  # noqa: BLE001 - the test fails on it
            self.error = exc


@pytest.mark.timeout(MAX_WRITING_SECONDS + 300)
def test_a_continuous_run_keeps_the_audits_files_bounded_and_records_every_message_once(spark, emulator, tmp_path,
                                                                                       small_compactions):
    from backlog_syphon.run.maintain import maintain
    from backlog_syphon.run.status_report import audit_read_floor
    from backlog_syphon.run.syphon import start_syphon
    from backlog_syphon.storage import audit_table, checkpoint_table, delta, state_tables, upkeep

    config = make_config(emulator, tmp_path, **{"run.trigger": "0.1 seconds", "run.idle_probe_max_seconds": 1,
                                                "backlog.queue_count": QUEUES})
    audit, checkpoint = str(tmp_path / "audit"), str(tmp_path / "checkpoint")
    run = start_syphon(spark, config)
    query = run.query
    maintained = []

    def delivered_points() -> list:
        return [point for point in run.listener.points if point.stats is not None and point.stats.delivered]

    def recorded() -> int:
        return sum(point.stats.delivered for point in delivered_points())

    trickle = Trickle(config, recorded)

    maintenance = threading.Thread(target=lambda: maintained.append(maintain(spark, config)), name="maintain")
    started = time.monotonic()
    try:
        trickle.thread.start()
        # OPTIMIZE and VACUUM half-way, while the syphon goes on appending
        assert wait_for(lambda: len(delivered_points()) >= BATCHES // 2 or not query.isActive, MAX_WRITING_SECONDS)
        maintenance.start()
        assert wait_for(lambda: len(delivered_points()) >= BATCHES or not query.isActive,
                        MAX_WRITING_SECONDS - (time.monotonic() - started)), \
            f"only {len(delivered_points())} batches carried messages in {MAX_WRITING_SECONDS} s"
        trickle.stop.set()
        trickle.thread.join(30)
        assert trickle.error is None, trickle.error
        maintenance.join(180)
        written = len(trickle.written)
        # Stop only once the batch that sent the last ones has its audit rows (its progress point comes after
        # its foreachBatch), so that the stop never lands inside it (a stop mid-batch fails that batch).
        assert wait_for(lambda: recorded() >= written or not query.isActive, 120), "the last batch was not recorded"
        assert query.isActive and query.exception() is None, f"a batch failed: {query.exception()}"
    finally:
        trickle.stop.set()
        run.finish(spark)
    batches = len(delivered_points())
    assert _arrived(emulator) == written

    # Bounded, at every commit of the run, across its compactions.
    counts, compactions = _files_per_version(spark, audit)
    assert compactions >= 2, f"{compactions} auto compactions in {batches} batches"
    assert max(counts) <= FILES_BOUND, f"the audit's data files reached {max(counts)}: {counts}"
    print(f"\n[long life] {batches} batches, {written} messages, {compactions} auto compactions, audit files at most "
          f"{max(counts)}, now {counts[-1]}, {time.monotonic() - started:.0f} s")

    # The maintenance ran beside the appends, and failed no batch (the query stayed up, above).
    [report] = maintained
    assert not report.failed and {table.table for table in report.tables if table.exists} >= {audit, checkpoint}, \
        report.lines()

    # Once: one delivered row per message, and one arrival each.
    rows = spark.read.format("delta").load(audit).collect()
    outcomes = collections.Counter((row["message_id"], row["outcome"]) for row in rows)
    assert outcomes == {(message.message_id, "delivered"): 1 for message in trickle.written}
    received = collections.Counter(message.message_id for messages in drain_destinations(emulator, DESTINATIONS)
                                   .values() for message in messages)
    assert received == {message.message_id: 1 for message in trickle.written}

    # A second start finds every property as wanted: no commit.
    properties = upkeep.table_properties(spark, delta.sql_name(audit))
    assert upkeep.properties_to_set(properties, upkeep.with_retention(audit_table.AUDIT_TABLE_PROPERTIES,
                                                                       config.storage.table_retention_days)) == {}
    versions = [_version(spark, path) for path in (audit, checkpoint)]
    state_tables.create_tables(spark, audit, checkpoint, config.storage.resolved_lease_table)
    state_tables.set_upkeep_properties(spark, audit, checkpoint, config.storage.resolved_lease_table)
    assert [_version(spark, path) for path in (audit, checkpoint)] == versions

    # --status reads the audit from the oldest purge mark's day on: Delta prunes the partitions before it.
    marks = checkpoint_table.read_checkpoint(spark, checkpoint)
    since = audit_read_floor(marks, marks)
    assert since is not None
    pruned = audit_table.recorded_unsettled(spark, audit, marks, since)
    plan = pruned._jdf.queryExecution().executedPlan().toString()
    [partition_filters] = re.findall(r"PartitionFilters: \[([^\]]*)\]", plan)
    assert re.search(r"outcome_date#\d+ >= ", partition_filters), plan
    assert pruned.count() == audit_table.recorded_unsettled(spark, audit, marks).count() == 0  # all purged
