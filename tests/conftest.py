"""Shared fixtures: one Spark session (with Delta) for the whole run."""

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    from backlog_syphon.spark_session import build_spark_session

    session = build_spark_session("backlog-syphon-tests", extra_conf={"spark.ui.enabled": "false"})
    yield session
    session.stop()
