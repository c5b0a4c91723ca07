"""Shared fixtures: one Spark session (with Delta) for the whole run."""

import itertools
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


# The suite runs on pytest-xdist workers (``make test``: ``--dist worksteal``). Worksteal hands each
# worker one contiguous share of the collection at the start, in order, and a worker that runs out
# steals the second half of the longest queue. So the integration tests (most start Spark jobs) are
# dealt out one by one to the shares' fronts, the longest (as measured in a ``--durations`` run)
# first: each worker starts on long tests, and the run ends on short ones instead of one long test
# keeping one worker busy while the others idle.
LONGEST_FIRST = (
    "test_lease_under_starvation",
    "test_spark_connect.py::",
    "test_timeout_during_a_send",
    "test_documented_walkthrough",
    "test_two_runs_at_once",
    "test_documented_spark_submit_line",
    "test_sigterm_during_a_send",
    "test_a_renamed_destination",
    "test_a_redrive_killed_after_recording",
    "test_a_kill_in_the_middle_of_the_sends",
    "test_a_lost_send_task",
    "test_dead_letters_are_redriven",
    "test_recreated_backlog_queues",
    "test_a_deleted_streaming_checkpoint",
    "test_many_small_batches",
    "test_notebook_replays",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        for index, name in enumerate(LONGEST_FIRST):
            if name in item.nodeid:
                return index
        return len(LONGEST_FIRST) + (0 if "integration" in item.path.parts else 1)

    items.sort(key=rank)  # stable: the rest keep their order
    workers = getattr(config, "workerinput", {}).get("workercount", 1)  # set in each xdist worker
    if workers > 1:
        items[:] = dealt_out(items, [rank(item) <= len(LONGEST_FIRST) for item in items], workers)


def dealt_out(items: list, integration: list[bool], workers: int) -> list:
    """``items`` reordered into the ``workers`` contiguous shares worksteal hands out (as it sizes them),
    each share starting with every ``workers``-th of the integration tests (already longest first),
    then filled with the rest in order. Every worker must compute the same order, and does: it is pure."""
    long = [item for item, flag in zip(items, integration) if flag]
    rest = iter([item for item, flag in zip(items, integration) if not flag])
    ordered, remaining = [], len(items)
    for share in range(workers):
        size = remaining // (workers - share)
        mine = long[share::workers]
        ordered += mine + list(itertools.islice(rest, max(0, size - len(mine))))
        remaining -= size
    return ordered + list(rest)
