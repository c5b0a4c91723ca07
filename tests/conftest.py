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


# The suite runs on two pytest-xdist workers (``make test``: ``--dist worksteal``), which take tests
# in collection order and steal from each other's tail. The tests that start Spark jobs go first,
# the longest (as measured in a ``--durations`` run) at the very front, so that the run ends on
# short tests instead of one long test keeping one worker busy while the other idles.
LONGEST_FIRST = (
    "test_spark_connect.py::",
    "test_lease_under_starvation",
    "test_timeout_during_a_send",
    "test_documented_spark_submit_line",
    "test_many_small_batches",
    "test_recreated_backlog_queues",
    "test_documented_walkthrough",
    "test_a_kill_in_the_middle_of_the_sends",
    "test_a_deleted_streaming_checkpoint",
    "test_sigterm_during_a_send",
    "test_notebook_replays",
    "test_a_redrive_killed_after_recording",
    "test_dead_letters_are_redriven",
    "test_two_runs_at_once",
    "test_a_renamed_destination",
    "test_a_lost_send_task",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        for index, name in enumerate(LONGEST_FIRST):
            if name in item.nodeid:
                return index
        return len(LONGEST_FIRST) + (0 if "integration" in item.path.parts else 1)

    items.sort(key=rank)  # stable: the rest keep their order
