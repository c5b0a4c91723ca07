"""Which Delta JAR each supported Spark line gets (pure: no Maven, no network, no Spark)."""

import sys
import types

import pytest

from backlog_syphon.local_setup import delta_jars, jvm_options
from backlog_syphon.local_setup.delta_jars import UnsupportedRuntimeError, delta_artifact
from backlog_syphon.run import spark_session


@pytest.mark.parametrize("spark, delta, artifact", [
    # Delta 4.0.x: one JAR per Scala version, built for Spark 4.0 (no Spark version in the name).
    ("4.0.1", "4.0.1", "delta-spark_2.13"),
    ("4.0.0", "4.0.0", "delta-spark_2.13"),
    # From Delta 4.1 on, every artifact names its Spark line, also for Spark 4.0.
    ("4.0.1", "4.4.0", "delta-spark_4.0_2.13"),
    ("4.1.0", "4.3.1", "delta-spark_4.1_2.13"),
    ("4.1.1", "4.4.0", "delta-spark_4.1_2.13"),
    ("4.2.0", "4.4.0", "delta-spark_4.2_2.13"),
])
def test_artifact_per_supported_spark_line(spark, delta, artifact):
    assert delta_artifact(spark, delta) == artifact


def test_a_local_or_vendor_suffix_of_pyspark_does_not_matter():
    assert delta_artifact("4.1.0.dev0", "4.3.1") == "delta-spark_4.1_2.13"
    assert delta_artifact("4.0.1+local", "4.0.1") == "delta-spark_2.13"


@pytest.mark.parametrize("spark", ["3.5.7", "4.3.0", "5.0.0"])
def test_an_unsupported_pyspark_is_refused_naming_the_supported_ones(spark):
    with pytest.raises(UnsupportedRuntimeError) as raised:
        delta_artifact(spark, "4.4.0")
    message = str(raised.value)
    assert f"pyspark {spark} is not supported" in message
    assert "Spark 4.0, 4.1, 4.2" in message
    assert "pyspark 4.0.x with delta-spark 4.0.x" in message and "pyspark 4.2.x with delta-spark 4.4.x" in message


@pytest.mark.parametrize("spark, delta, wanted", [
    ("4.1.0", "4.0.1", "4.1.x or 4.2.x or 4.3.x or 4.4.x"),  # Delta 4.0 has no JAR for Spark 4.1
    ("4.2.0", "4.3.1", "4.4.x"),  # nor Delta 4.3 for Spark 4.2
])
def test_a_delta_release_without_a_jar_for_the_spark_line_is_refused(spark, delta, wanted):
    with pytest.raises(UnsupportedRuntimeError, match=f"delta-spark {delta} has no JAR built for Spark") as raised:
        delta_artifact(spark, delta)
    assert f"install delta-spark {wanted} with it" in str(raised.value)


def test_every_supported_line_names_a_distinct_artifact():
    newest = {spark: delta_artifact(f"{spark}.0", f"{lines[-1]}.0")
              for spark, lines in delta_jars.SUPPORTED_SPARK_LINES.items()}
    assert newest == {"4.0": "delta-spark_4.0_2.13", "4.1": "delta-spark_4.1_2.13", "4.2": "delta-spark_4.2_2.13"}


def _installed(monkeypatch, spark, delta):
    """Pretend pyspark ``spark`` and delta-spark ``delta`` are installed."""
    import importlib.metadata

    monkeypatch.setitem(sys.modules, "pyspark", types.SimpleNamespace(__version__=spark))

    def version(name):
        if name == "delta-spark" and delta is not None:
            return delta
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_coordinates_and_cache_folder_follow_the_installed_packages(monkeypatch, tmp_path):
    _installed(monkeypatch, "4.0.1", "4.0.1")
    assert delta_jars.delta_coordinates() == ("delta-spark_2.13", "4.0.1")
    assert delta_jars.jar_folder(tmp_path) == tmp_path / "delta-spark_2.13-4.0.1"
    assert delta_jars.fetched_jars(tmp_path) == []
    _installed(monkeypatch, "4.1.0", "4.3.1")
    assert delta_jars.jar_folder(tmp_path) == tmp_path / "delta-spark_4.1_2.13-4.3.1"  # runtimes never share one


def test_missing_delta_spark_is_a_clear_error(monkeypatch):
    _installed(monkeypatch, "4.1.0", None)
    with pytest.raises(UnsupportedRuntimeError, match="delta-spark is not installed next to pyspark 4.1.0"):
        delta_jars.delta_coordinates()


def test_fetch_command_reports_an_unsupported_runtime(monkeypatch, tmp_path, capsys):
    _installed(monkeypatch, "3.5.7", "3.3.2")
    assert delta_jars.main(["--dest", str(tmp_path)]) == 1
    assert "error: pyspark 3.5.7 is not supported" in capsys.readouterr().err


class _RecordingBuilder:
    def __init__(self):
        self.conf = {}

    def appName(self, name):
        return self

    def master(self, master):
        return self

    def config(self, key, value):
        self.conf[key] = value
        return self

    def getOrCreate(self):
        return types.SimpleNamespace(sparkContext=types.SimpleNamespace(setLogLevel=lambda level: None))


def test_session_without_prefetched_jars_asks_spark_for_the_same_coordinates(monkeypatch):
    builder = _RecordingBuilder()
    fake_session = types.SimpleNamespace(builder=builder, getActiveSession=lambda: None)
    monkeypatch.setattr(spark_session, "SparkSession", fake_session)
    monkeypatch.setattr(delta_jars, "fetched_jars", lambda cache=None: [])
    monkeypatch.setattr(delta_jars, "delta_coordinates", lambda: ("delta-spark_2.13", "4.0.1"))
    for name in ("SPARK_REMOTE", "DATABRICKS_RUNTIME_VERSION", "PYSPARK_GATEWAY_PORT"):
        monkeypatch.delenv(name, raising=False)
    spark_session.build_spark_session()
    assert builder.conf["spark.jars.packages"] == "io.delta:delta-spark_2.13:4.0.1"
    assert "spark.jars" not in builder.conf


def _build_with_fetched_jars(monkeypatch, **kwargs) -> dict:
    builder = _RecordingBuilder()
    monkeypatch.setattr(spark_session, "SparkSession", types.SimpleNamespace(builder=builder,
                                                                             getActiveSession=lambda: None))
    monkeypatch.setattr(delta_jars, "fetched_jars", lambda cache=None: ["/c/delta-spark.jar", "/c/delta-storage.jar"])
    monkeypatch.setattr(jvm_options, "driver_java_options",
                        lambda class_path_extended=False: "extended" if class_path_extended else "archive")
    for name in ("SPARK_REMOTE", "DATABRICKS_RUNTIME_VERSION", "PYSPARK_GATEWAY_PORT", "SPARK_MASTER",
                 "SYPHON_SPARK_MASTER"):
        monkeypatch.delenv(name, raising=False)
    spark_session.build_spark_session(**kwargs)
    return builder.conf


@pytest.mark.parametrize("master", [None, "local", "local[1]", "local[2,2]", "local[*]"])
def test_a_single_jvm_session_has_the_delta_jars_on_the_drivers_class_path(monkeypatch, master):
    conf = _build_with_fetched_jars(monkeypatch, master=master)
    assert conf["spark.driver.extraClassPath"] == "/c/delta-spark.jar:/c/delta-storage.jar"
    assert "spark.jars" not in conf
    assert conf["spark.driver.extraJavaOptions"] == "archive"  # the archive covers that class path


@pytest.mark.parametrize("master", ["local-cluster[2,1,1024]", "spark://host:7077"])
def test_a_session_with_executor_jvms_ships_the_delta_jars_to_them(monkeypatch, master):
    conf = _build_with_fetched_jars(monkeypatch, master=master)
    assert conf["spark.jars"] == "/c/delta-spark.jar,/c/delta-storage.jar"
    assert "spark.driver.extraClassPath" not in conf


def test_a_callers_own_class_path_keeps_spark_jars_and_drops_the_archive(monkeypatch):
    conf = _build_with_fetched_jars(monkeypatch, extra_conf={"spark.driver.extraClassPath": "/mine.jar"})
    assert conf["spark.jars"] == "/c/delta-spark.jar,/c/delta-storage.jar"
    assert conf["spark.driver.extraClassPath"] == "/mine.jar"
    assert conf["spark.driver.extraJavaOptions"] == "extended"
