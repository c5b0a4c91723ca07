"""The project's session builder starts Spark with Delta from the pre-fetched JARs."""

from backlog_syphon.local_setup import delta_jars

from backlog_syphon.storage import audit_table, checkpoint_table, delta, lease_table, state_tables, upkeep
from backlog_syphon.run.lease import new_lease


def test_delta_round_trip_through_the_session_builder(spark, tmp_path):
    # One local JVM: Delta's JARs sit on the driver's class path, where the class archive covers them.
    class_path = spark.conf.get("spark.driver.extraClassPath", "")
    assert "delta-spark_" in class_path and all(j in class_path for j in delta_jars.fetched_jars())
    loader = spark._jvm.java.lang.Class.forName("io.delta.sql.DeltaSparkSessionExtension").getClassLoader()
    assert loader.equals(spark._jvm.java.lang.ClassLoader.getSystemClassLoader())
    # Streaming checkpoint files are renamed through the FileSystem API (no process per file); the
    # class sits in another package from Spark 4.1 on, and a wrong name would only fail the query.
    manager = spark.conf.get("spark.sql.streaming.checkpointFileManagerClass")
    assert manager.endswith(".FileSystemBasedCheckpointFileManager")
    spark._jvm.java.lang.Class.forName(manager)
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.adaptive.enabled") == "false"  # small plans: one job each
    path = str(tmp_path / "table")
    spark.range(5).write.format("delta").save(path)
    # Local commits go through Delta's LocalLogStore (no `readlink` process per rename), as the table's
    # log resolves it for its own path: a misspelt setting would be ignored silently.
    jvm = spark._jvm
    store = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path).store()
    delegate = store.getDelegate(jvm.org.apache.hadoop.fs.Path(tmp_path.as_uri()))
    assert delegate.logStoreImpl().getClass().getName() == "io.delta.storage.LocalLogStore"
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT 7 AS id) s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *")
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [0, 1, 2, 3, 4, 7]
    assert spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["format"] == "delta"


def test_the_local_driver_jvm_maps_the_class_archive_built_by_the_set_up(spark):
    """``make setup`` built the class archive for this JVM and class path, the session builder passed it,
    and the JVM mapped it: thousands of classes came from it (the JDK's own archive alone holds about
    1,300). A JVM that could not use it starts normally, slower, which only this count shows."""
    import subprocess
    from pathlib import Path

    from backlog_syphon.local_setup import jvm_options

    archive = jvm_options.archive_file()
    assert archive is not None and archive.is_file(), f"no class archive: run `make setup` ({archive})"
    jvm = spark._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in arguments
    jcmd = Path(jvm.java.lang.System.getProperty("java.home"), "bin", "jcmd")
    counters = subprocess.run([str(jcmd), str(jvm.java.lang.ProcessHandle.current().pid()), "PerfCounter.print"],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    shared = int(next(line for line in counters.splitlines()
                      if line.startswith("java.cls.sharedLoadedClasses=")).split("=")[1])
    assert shared > 5000, f"only {shared} classes came from a shared archive"


def test_tables_are_created_by_their_first_write_with_stable_schemas(spark, tmp_path):
    import datetime as dt

    from backlog_syphon.rows import OUTCOME_ROW_SCHEMA
    from backlog_syphon.model import CheckpointRow

    audit, checkpoint, lease = str(tmp_path / "audit"), str(tmp_path / "checkpoint"), str(tmp_path / "lease")
    assert checkpoint_table.read_checkpoint(spark, checkpoint) == {}  # nothing recorded before the first write
    assert audit_table.recorded_unsettled(spark, audit, {}) is None
    now = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)
    now_ms = int(now.timestamp() * 1000)
    outcome = ("r", 0, "q0", 5, "m-5", "orders", None, "delivered", None, None, 10, now, None, None, now, 1, None, None,
               None, None)
    for version in (0, 0, 1):  # the repeat of version 0 appends nothing
        audit_table.append_audit(audit, spark.createDataFrame([outcome], OUTCOME_ROW_SCHEMA), "app", version)
    rows = [CheckpointRow("q0", 1, 5, now_ms, 0, None, 1, "r", now, 1, 0, 0)]
    checkpoint_table.write_checkpoint(spark, checkpoint, rows, app_id="app", version=1)
    assert lease_table.read_lease(spark, lease) is None  # before the first lease
    first = new_lease("ns/contoso", "run-a", "host", 1, now, 60)
    assert lease_table.write_lease(spark, lease, first)

    assert spark.read.format("delta").load(audit).schema.fieldNames() == audit_table.AUDIT_SCHEMA.fieldNames()
    assert spark.read.format("delta").load(audit).count() == 2
    assert checkpoint_table.read_checkpoint(spark, checkpoint) == {"q0": rows[0]}

    def above(purged_through, purged_enqueued_ms):
        mark = CheckpointRow("q0", 1, 5, now_ms, purged_through, purged_enqueued_ms, 1, "r", now, 1, 0, 0)
        return audit_table.recorded_unsettled(spark, audit, {"q0": mark}).count()

    assert above(4, None) == 2 and above(5, None) == 0  # a mark an older version wrote: by sequence number
    assert above(5, now_ms - 1) == 2 and above(5, now_ms) == 0  # by the enqueue time of the message it names
    assert spark.read.format("delta").load(lease).schema.fieldNames() == lease_table.LEASE_SCHEMA.fieldNames()
    assert lease_table.read_lease(spark, lease) == first
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{audit}`").first()
    assert detail["partitionColumns"] == ["outcome_date"]


def test_a_checkpoint_table_of_an_older_version_reads_and_is_rewritten_with_todays_columns(spark, tmp_path):
    import datetime as dt

    from backlog_syphon.model import CheckpointRow

    checkpoint = str(tmp_path / "checkpoint")
    now = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)
    old = spark.createDataFrame([("q0", 9, 4, 3, "r", now, 9, 0, 0)],
                                "backlog_queue string, delivered_through long, purged_through long, last_batch_id long, "
                                "last_run_id string, updated_at timestamp, delivered_count long, "
                                "dead_lettered_count long, skipped_count long")
    old.write.format("delta").save(checkpoint)
    read = checkpoint_table.read_checkpoint(spark, checkpoint)
    assert read == {"q0": CheckpointRow("q0", 1, 9, None, 4, None, 3, "r", now, 9, 0, 0)}
    audit, lease = str(tmp_path / "audit"), str(tmp_path / "lease")
    # creates the other two, and adds to the older checkpoint table the columns it lacks
    assert state_tables.create_tables(spark, audit, checkpoint, lease) == {audit, lease}
    assert set(spark.read.format("delta").load(checkpoint).schema.fieldNames()) == set(
        checkpoint_table.CHECKPOINT_SCHEMA.fieldNames())
    newer = {"q0": CheckpointRow("q0", 2, 3, 1700000000000, 1, 1699999999000, 4, "r2", now, 12, 1, 0)}
    checkpoint_table.write_checkpoint(spark, checkpoint, list(newer.values()), app_id="app", version=4)
    assert checkpoint_table.read_checkpoint(spark, checkpoint) == newer  # columns matched by name, whatever their order
    assert state_tables.create_tables(spark, audit, checkpoint, lease) == set()  # all there now


def test_of_two_runs_creating_the_tables_at_once_each_table_is_created_by_exactly_one(spark, tmp_path):
    """What makes a run skip reading back its new state tables (``create_tables``): only the run whose
    CREATE made a table says it created it, however the two runs' creations interleave."""
    from concurrent.futures import ThreadPoolExecutor

    names = [str(tmp_path / name) for name in ("audit", "checkpoint", "lease")]
    with ThreadPoolExecutor(2) as pool:
        created = list(pool.map(lambda _: state_tables.create_tables(spark, *names), range(2)))
    assert sorted(len(each) for each in created) in ([0, 3], [1, 2])  # each table by exactly one run
    assert created[0] | created[1] == set(names) and not created[0] & created[1]
    for name in names:
        assert delta.table_exists(spark, name)


# The audit columns appended since the first version, in their order (the re-drive's, the rename's, then the
# migration mode's).
NEW_AUDIT_COLUMNS = ("dead_letter_reason", "dead_letter_error_description", "original_destination", "message_state")


def test_an_audit_table_of_an_older_version_gets_original_destination_and_takes_todays_rows(spark, tmp_path):
    """``original_destination`` (restore.destination_map) is appended to an existing audit table when a run
    starts (``create_tables``'s ALTER TABLE ADD COLUMNS); old rows read it as null, new rows fill it."""
    import datetime as dt

    from pyspark.sql.types import StructType

    from backlog_syphon.rows import OUTCOME_ROW_SCHEMA

    audit = str(tmp_path / "audit")
    now = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)
    older = [f for f in audit_table.AUDIT_SCHEMA.fields if f.name not in NEW_AUDIT_COLUMNS]  # as written before
    old_row = ("r0", 0, "q0", 4, "m-4", "orders", None, "delivered", None, None, 10, now, None, None, now, 1,
               now.date())
    spark.createDataFrame([old_row], StructType(older)).write.format("delta").partitionBy("outcome_date").save(audit)
    state_tables.create_tables(spark, audit, str(tmp_path / "checkpoint"), str(tmp_path / "lease"))
    columns = spark.read.format("delta").load(audit).schema.fieldNames()
    assert columns[-len(NEW_AUDIT_COLUMNS):] == list(NEW_AUDIT_COLUMNS)
    renamed = ("r1", 0, "q0", 5, "m-5", "orders", None, "delivered", None, None, 10, now, None, None, now, 1,
               None, None, "orders-v1", None)
    audit_table.append_audit(audit, spark.createDataFrame([renamed], OUTCOME_ROW_SCHEMA), "app", 0)
    rows = {r["message_id"]: r for r in spark.read.format("delta").load(audit).collect()}
    assert (rows["m-4"]["original_destination"], rows["m-5"]["original_destination"]) == (None, "orders-v1")
    assert (rows["m-5"]["destination"], rows["m-5"]["outcome_date"]) == ("orders", now.date())


def test_the_lease_is_a_compare_and_set_even_when_two_runs_create_its_table_at_once(spark, tmp_path):
    import datetime as dt
    from concurrent.futures import ThreadPoolExecutor

    lease = str(tmp_path / "lease")
    now = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)
    racers = [new_lease("ns/contoso", f"run-{n}", "host", n, now, 60) for n in range(2)]
    with ThreadPoolExecutor(2) as pool:
        won = list(pool.map(lambda candidate: lease_table.write_lease(spark, lease, candidate), racers))

    assert sorted(won) == [False, True]
    holder = lease_table.read_lease(spark, lease)
    assert holder == racers[won.index(True)]
    loser = racers[won.index(False)]
    stale = new_lease("ns/contoso", loser.run_id, "host", 9, now, 60)  # epoch 1 again: already taken
    assert not lease_table.write_lease(spark, lease, stale)
    following = new_lease("ns/contoso", loser.run_id, "host", 9, now, 60, holder)  # over the row read
    assert following.epoch == 2 and lease_table.write_lease(spark, lease, following)
    assert lease_table.read_lease(spark, lease) == following


def test_the_tables_are_created_with_their_upkeep_and_an_older_table_gets_it_at_the_next_start(spark, tmp_path):
    names = [str(tmp_path / name) for name in ("audit", "checkpoint", "lease")]
    state_tables.create_tables(spark, *names)

    def properties(table):
        return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{table}`").collect()}

    # The audit is appended to (a log checkpoint every 10 commits, auto compaction); the others are
    # rewritten whole (every 50, one live file each); all keep a 1-day window by default.
    assert [properties(table).get("delta.checkpointInterval") for table in names] == ["10", "50", "50"]
    assert [properties(table).get("delta.autoOptimize.autoCompact") for table in names] == ["true", None, None]
    assert all(properties(table)["delta.logRetentionDuration"] == "interval 1 days"
               and properties(table)["delta.deletedFileRetentionDuration"] == "interval 1 days" for table in names)

    # A table an older version made (Delta's defaults) gets its columns when a run starts, and its
    # properties once the run holds the lease, in one commit; the start after that commits nothing.
    older = str(tmp_path / "older_checkpoint")
    spark.sql(f"CREATE TABLE delta.`{older}` (backlog_queue STRING) USING DELTA")
    wanted = upkeep.with_retention(state_tables.REWRITTEN_TABLE_PROPERTIES, 3)
    for _ in range(2):
        assert not delta.create_table(spark, older, checkpoint_table.CHECKPOINT_SCHEMA, (), wanted)
        state_tables.set_upkeep_properties(spark, names[0], older, names[2], retention_days=3)
    assert upkeep.properties_to_set(properties(older), wanted) == {}
    operations = [row["operation"] for row in spark.sql(f"DESCRIBE HISTORY delta.`{older}`").collect()]
    assert operations.count("SET TBLPROPERTIES") == 1, operations
    # The 1-day tables that start named moved to the 3-day window in it (one commit each), Delta's rule
    # kept: the log's window is never shorter than the files'. The checkpoint table it did not name keeps 1.
    assert [properties(table)["delta.logRetentionDuration"] for table in names] == [
        "interval 3 days", "interval 1 days", "interval 3 days"]
    assert [properties(table)["delta.deletedFileRetentionDuration"] for table in names] == [
        "interval 3 days", "interval 1 days", "interval 3 days"]


def test_an_audit_table_an_older_version_wrote_gets_the_redrive_columns(spark, tmp_path):
    """``dead_letter_reason`` and ``dead_letter_error_description`` were appended to the audit rows for the
    re-drive: a table written before them gets them (nullable, null in its old rows) when a run creates
    its tables, and takes the new rows."""
    import datetime as dt

    from pyspark.sql.types import StructType

    from backlog_syphon.rows import OUTCOME_ROW_SCHEMA

    audit = str(tmp_path / "audit")
    old_schema = StructType([f for f in audit_table.AUDIT_SCHEMA.fields if f.name not in NEW_AUDIT_COLUMNS])
    now = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)
    old_row = ("r", 0, "q0", 5, "m-5", "orders", None, "dead_lettered", "destination_not_found", "gone", 10, now,
               None, None, now, 1, now.date())
    spark.createDataFrame([old_row], old_schema).write.format("delta").partitionBy("outcome_date").save(audit)

    delta.create_table(spark, audit, audit_table.AUDIT_SCHEMA, ("outcome_date",))
    new_row = ("r2", 0, "q0/$DeadLetterQueue", 5, "m-5", "orders", None, "delivered", None, None, 10, now, None, None,
               now, 1, "destination_not_found", "gone", None, None)
    audit_table.append_audit(audit, spark.createDataFrame([new_row], OUTCOME_ROW_SCHEMA), "app", 0)

    table = spark.read.format("delta").load(audit)
    assert set(table.schema.fieldNames()) == set(audit_table.AUDIT_SCHEMA.fieldNames())
    assert sorted((row["run_id"], row["dead_letter_reason"]) for row in table.collect()) == [
        ("r", None), ("r2", "destination_not_found")]
