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


def test_tables_are_created_once_with_stable_schemas(spark, tmp_path):
    audit, checkpoint = str(tmp_path / "audit"), str(tmp_path / "checkpoint")
    delta_tables.ensure_tables(spark, audit, checkpoint)
    delta_tables.ensure_tables(spark, audit, checkpoint)  # idempotent
    assert spark.read.format("delta").load(audit).schema.fieldNames() == delta_tables.AUDIT_SCHEMA.fieldNames()
    assert (spark.read.format("delta").load(checkpoint).schema.fieldNames()
            == delta_tables.CHECKPOINT_SCHEMA.fieldNames())
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{audit}`").first()
    assert detail["partitionColumns"] == ["outcome_date"]
