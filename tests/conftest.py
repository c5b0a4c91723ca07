"""Shared fixtures: one Spark session (with Delta) for the whole run."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Spark's Python workers unpickle the syphon's functions and classes by module path: they must
# import this checkout's library (not another copy installed in the environment), like this process.
_LIB = str(Path(__file__).resolve().parents[1] / "lib")
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != _LIB:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_LIB, os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def spark():
    from backlog_syphon.run.spark_session import build_spark_session

    session = build_spark_session("backlog-syphon-tests", extra_conf={"spark.ui.enabled": "false"})
    yield session
    session.stop()
