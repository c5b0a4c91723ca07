"""A long life in short: a continuous run of many small batches (a trickle of new backlog messages, a
0.1-second trigger), in-process, with the state tables' upkeep (``storage.upkeep``).

- The audit table's data files stay bounded: auto compaction (a table property) gathers each day's small
  files once ``spark.databricks.delta.autoCompact.minNumFiles`` of them are there. The job keeps Delta's
  50; here it is 10, so that its bound is passed some twelve times in the run's 120 batches (a batch costs a
  2-core machine about a second where it is quiet, some four where it is loaded to 10: the run is bounded
  by its batches, not by time, so a busy machine makes it slower, never weaker).
- Every message is recorded once (one audit row, outcome ``delivered``) and arrives once, across the
  compactions.
- ``--maintain``'s OPTIMIZE and VACUUM, run while the syphon appends, lose nothing and fail no batch.
- A second start finds every property as wanted and commits nothing; ``--status``'s read of the audit is
  pruned to the days from its oldest purge mark on.
"""

from __future__ import annotations

import collections
import re
import threading
import time

import pytest

from tools.backlog_writer import OriginalMessage, write_backlog

from .conftest import PRIMARY, make_config
from .helpers import drain_destinations, wait_for

DESTINATIONS = ("orders", "payments")
QUEUES = 2
BATCHES = 120  # batches with messages: the audit passes auto compaction's threshold some twelve times
MAX_WRITING_SECONDS = 1200  # a bound for a run that stopped making batches, not a measure (a 2-core machine
# running the whole suite made 103 batches in 900 s)
MIN_NUM_FILES = 10  # spark.databricks.delta.autoCompact.minNumFiles for this test (Delta's default: 50)
AUTO_COMPACT_MIN_FILES = "spark.databricks.delta.autoCompact.minNumFiles"


def _files(spark, path) -> int:
    """The data files of the Delta table at ``path``, as its log says."""
    return spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"]


def _version(spark, path) -> int:
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"]


def _arrived(emulator) -> int:
    stats = emulator.stats(PRIMARY)
    return sum(stats[destination]["in"] for destination in DESTINATIONS)


class Trickle:
    """Writes two new backlog messages every few tenths of a second, on a thread, until stopped."""

    def __init__(self, config):
        self.config, self.written, self.stop = config, [], threading.Event()
        self.thread = threading.Thread(target=self._write, name="trickle", daemon=True)

    def _write(self) -> None:
        index = 0
        while not self.stop.is_set():
            messages = [OriginalMessage(DESTINATIONS[i % 2], f"trickle body {i}".encode(), message_id=f"trickle-{i:05d}")
                        for i in range(index, index + 2)]
            write_backlog(self.config.secondary, PRIMARY, messages, queue_count=QUEUES, senders=1, seed=index)
            self.written.extend(messages)
            index += 2
            self.stop.wait(0.3)


@pytest.mark.timeout(MAX_WRITING_SECONDS + 300)
def test_a_long_continuous_run_keeps_the_audits_files_bounded_and_records_every_message_once(spark, emulator, tmp_path):
    from backlog_syphon.run.maintain import maintain_table
    from backlog_syphon.run.status_report import audit_read_floor
    from backlog_syphon.run.syphon import start_syphon
    from backlog_syphon.storage import tables, upkeep

    config = make_config(emulator, tmp_path, **{"run.trigger": "0.1 seconds", "run.idle_probe_max_seconds": 1,
                                                "backlog.queue_count": QUEUES})
    audit, checkpoint = str(tmp_path / "audit"), str(tmp_path / "checkpoint")
    spark.conf.set(AUTO_COMPACT_MIN_FILES, str(MIN_NUM_FILES))  # the query's session copies it at its start
    try:
        run = start_syphon(spark, config)
    finally:
        spark.conf.unset(AUTO_COMPACT_MIN_FILES)
    query = run.query
    trickle = Trickle(config)
    files_seen, maintained = [], {}

    def data_batches() -> int:
        return len([point for point in run.listener.points if point.stats is not None and point.stats.delivered])

    def maintain_meanwhile() -> None:
        for table in (audit, checkpoint):
            maintained[table] = maintain_table(spark, table)

    maintenance = threading.Thread(target=maintain_meanwhile, name="maintain")
    started = time.monotonic()
    try:
        trickle.thread.start()
        while data_batches() < BATCHES and time.monotonic() - started < MAX_WRITING_SECONDS and query.isActive:
            if tables.table_exists(spark, audit):
                files_seen.append(_files(spark, audit))
            if not maintenance.is_alive() and not maintained and data_batches() >= BATCHES // 2:
                maintenance.start()  # OPTIMIZE and VACUUM while the syphon goes on appending
            time.sleep(3.0)
        trickle.stop.set()
        trickle.thread.join(30)
        maintenance.join(180) if maintenance.ident else None
        written = len(trickle.written)
        assert wait_for(lambda: _arrived(emulator) >= written or not query.isActive, 120), \
            f"only {_arrived(emulator)} of {written} arrived ({query.exception()})"
        # Arrived is not recorded: stop only once the batch that sent the last ones has its audit rows, so
        # that the stop never lands inside it (a stop mid-batch fails that batch, and it replays next run).
        assert wait_for(lambda: not query.isActive or spark.read.format("delta").load(audit)
                        .where("outcome = 'delivered'").count() >= written, 120), "the last batch was not recorded"
        assert query.isActive and query.exception() is None, f"a batch failed: {query.exception()}"
    finally:
        trickle.stop.set()
        run.finish(spark)
    batches = data_batches()
    assert batches >= BATCHES, f"only {batches} batches carried messages in {MAX_WRITING_SECONDS} s"

    # Bounded: a partition (a day) holds fewer than minNumFiles small files plus what they were compacted
    # into; a run across midnight (UTC) has two partitions.
    files = _files(spark, audit)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{audit}`").collect()
    compactions = [row for row in history if row["operation"] == "OPTIMIZE"]
    assert len(compactions) >= 2, f"{len(compactions)} compactions in {batches} batches"
    assert max(files_seen + [files]) <= MIN_NUM_FILES + 2, f"audit data files reached {max(files_seen)}"
    print(f"\n[long life] {batches} batches, {written} messages, {len(compactions)} compactions, audit files "
          f"at most {max(files_seen + [files])}, now {files}, {time.monotonic() - started:.0f} s")

    # The maintenance ran beside the appends, and failed no batch (the query stayed up, above).
    assert set(maintained) == {audit, checkpoint}
    assert all(result.exists and result.error is None for result in maintained.values()), maintained

    # Once: one delivered row per message, and one arrival each.
    rows = spark.read.format("delta").load(audit).collect()
    outcomes = collections.Counter((row["message_id"], row["outcome"]) for row in rows)
    assert outcomes == {(message.message_id, "delivered"): 1 for message in trickle.written}
    received = collections.Counter(message.message_id for messages in drain_destinations(emulator, DESTINATIONS).values()
                                   for message in messages)
    assert received == {message.message_id: 1 for message in trickle.written}

    # A second start finds every property as wanted: no commit.
    properties = upkeep.table_properties(spark, tables.sql_name(audit))
    assert upkeep.properties_to_set(properties, tables.with_retention(tables.AUDIT_TABLE_PROPERTIES,
                                                                       config.storage.table_retention_days)) == {}
    versions = [_version(spark, path) for path in (audit, checkpoint)]
    tables.create_tables(spark, audit, checkpoint, config.storage.resolved_lease_table)
    tables.set_upkeep_properties(spark, audit, checkpoint, config.storage.resolved_lease_table)
    assert [_version(spark, path) for path in (audit, checkpoint)] == versions

    # --status reads the audit from the oldest purge mark's day on: Delta prunes the partitions before it.
    marks = tables.read_checkpoint(spark, checkpoint)
    since = audit_read_floor(marks, marks)
    assert since is not None
    pruned = tables.recorded_unsettled(spark, audit, marks, since)
    plan = pruned._jdf.queryExecution().executedPlan().toString()
    [partition_filters] = re.findall(r"PartitionFilters: \[([^\]]*)\]", plan)
    assert re.search(r"outcome_date#\d+ >= ", partition_filters), plan
    assert pruned.count() == tables.recorded_unsettled(spark, audit, marks).count() == 0  # all purged
