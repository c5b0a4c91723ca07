"""The class archive's naming and use (``local_setup.jvm_options``, ``local_setup.class_archive``): pure,
on temporary folders; the archive itself is built by ``make setup`` and checked in
tests/integration/test_spark_delta.py."""

import pytest

from backlog_syphon.local_setup import class_archive, jvm_options


@pytest.fixture
def fingerprinted(monkeypatch):
    keys = {"now": "aaaa"}
    monkeypatch.setattr(jvm_options, "fingerprint", lambda: keys["now"])
    return keys


def test_an_archive_is_named_for_the_spark_version_and_fingerprint(tmp_path, fingerprinted):
    import pyspark

    assert jvm_options.archive_file(tmp_path) == tmp_path / f"spark-{pyspark.__version__}-aaaa.jsa"


def test_only_an_archive_for_this_jvm_and_class_path_is_used(tmp_path, fingerprinted):
    assert jvm_options.java_option(tmp_path) is None  # none built
    archive = jvm_options.archive_file(tmp_path)
    archive.write_bytes(b"x")
    assert jvm_options.java_option(tmp_path) == f"-XX:SharedArchiveFile={archive}"
    fingerprinted["now"] = "bbbb"  # another Java or other JARs: that archive no longer applies
    assert jvm_options.java_option(tmp_path) is None


def test_no_jvm_library_means_no_archive(tmp_path, monkeypatch):
    monkeypatch.setattr(jvm_options, "fingerprint", lambda: None)
    assert jvm_options.java_option(tmp_path) is None
    with pytest.raises(RuntimeError, match="no JVM library found"):
        class_archive.build(tmp_path)


def test_the_fingerprint_follows_the_jars(monkeypatch):
    first = jvm_options.fingerprint()
    assert first is not None  # this machine's JVM (make setup built its archive)
    monkeypatch.setattr(jvm_options.delta_jars, "fetched_jars", lambda: ["/elsewhere/delta-spark_9.jar"])
    assert jvm_options.fingerprint() not in (None, first)


def test_the_driver_options_carry_the_archive_unless_the_class_path_is_extended(monkeypatch):
    monkeypatch.setattr(jvm_options, "java_option", lambda: "-XX:SharedArchiveFile=/a.jsa")
    monkeypatch.delenv("SPARK_CLASSPATH", raising=False)
    assert jvm_options.driver_java_options() == f"{jvm_options.DRIVER_JAVA_OPTIONS} -XX:SharedArchiveFile=/a.jsa"
    assert jvm_options.driver_java_options(class_path_extended=True) == jvm_options.DRIVER_JAVA_OPTIONS
    monkeypatch.setenv("SPARK_CLASSPATH", "/extra")
    assert jvm_options.driver_java_options() == jvm_options.DRIVER_JAVA_OPTIONS
    monkeypatch.setattr(jvm_options, "java_option", lambda: None)
    monkeypatch.delenv("SPARK_CLASSPATH")
    assert jvm_options.driver_java_options() == jvm_options.DRIVER_JAVA_OPTIONS
