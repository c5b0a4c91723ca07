"""The project's session builder starts Spark with Delta from the pre-fetched JARs."""

from backlog_syphon import delta_jars, delta_tables


def test_delta_round_trip_through_the_session_builder(spark, tmp_path):
    jars = spark.conf.get("spark.jars", "")
    assert "delta-spark_" in jars and all(j in jars for j in delta_jars.fetched_jars())
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    path = str(tmp_path / "table")
    spark.range(5).write.format("delta").save(path)
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT 7 AS id) s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *")
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [0, 1, 2, 3, 4, 7]
    assert spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["format"] == "delta"


def test_tables_are_created_by_their_first_write_with_stable_schemas(spark, tmp_path):
    import datetime as dt

    from backlog_syphon.backlog_rows import OUTCOME_ROW_SCHEMA
    from backlog_syphon.model import CheckpointRow

    audit, checkpoint, lease = str(tmp_path / "audit"), str(tmp_path / "checkpoint"), str(tmp_path / "lease")
    assert delta_tables.read_checkpoint(spark, checkpoint) == {}  # nothing recorded before the first write
    assert delta_tables.recorded_above(spark, audit, {}) is None
    now = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)
    outcome = ("r", 0, "q0", 5, "m-5", "orders", None, "delivered", None, None, 10, now, None, None, now, 1)
    for batch_id in (0, 0, 1):  # the replay of batch 0 appends nothing
        delta_tables.append_audit(audit, spark.createDataFrame([outcome], OUTCOME_ROW_SCHEMA), "app", batch_id)
    rows = [CheckpointRow("q0", 5, 0, 1, "r", now, 1, 0, 0)]
    delta_tables.write_checkpoint(spark, checkpoint, rows, app_id="app", batch_id=1)
    delta_tables.ensure_lease_table(spark, lease)
    delta_tables.ensure_lease_table(spark, lease)  # idempotent

    assert spark.read.format("delta").load(audit).schema.fieldNames() == delta_tables.AUDIT_SCHEMA.fieldNames()
    assert spark.read.format("delta").load(audit).count() == 2
    assert delta_tables.read_checkpoint(spark, checkpoint) == {"q0": rows[0]}
    assert delta_tables.recorded_above(spark, audit, {"q0": 4}).count() == 2
    assert delta_tables.recorded_above(spark, audit, {"q0": 5}).count() == 0
    assert spark.read.format("delta").load(lease).schema.fieldNames() == delta_tables.LEASE_SCHEMA.fieldNames()
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{audit}`").first()
    assert detail["partitionColumns"] == ["outcome_date"]
