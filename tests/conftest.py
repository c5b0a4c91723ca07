"""Shared fixtures: one Spark session (with Delta) for the whole run."""

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    from backlog_syphon.spark_session import build_spark_session

    # Speed only: many short Spark jobs on 2 cores start faster with the C1 compiler and serial GC.
    session = build_spark_session("backlog-syphon-tests", extra_conf={
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.ui.enabled": "false",
    })
    yield session
    session.stop()
