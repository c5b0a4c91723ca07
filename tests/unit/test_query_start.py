"""The streaming query's start is tried again only when Spark's Python process did not connect back in time."""

import pytest

from backlog_syphon.run.syphon import PYTHON_CONNECT_BACK_FAILURE, start_query


def starts(*outcomes):
    """A ``start`` that raises or returns each outcome in turn, counting its calls."""
    calls = []

    def start():
        outcome = outcomes[len(calls)]
        calls.append(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return start, calls


def test_a_start_whose_python_worker_did_not_connect_back_is_tried_again_after_a_pause():
    busy = RuntimeError(f"SparkException: {PYTHON_CONNECT_BACK_FAILURE}.")
    start, calls = starts(busy, busy, "query")
    pauses = []
    assert start_query(start, sleep=pauses.append) == "query"
    assert len(calls) == 3 and pauses == [2.0, 4.0]


def test_any_other_start_failure_and_the_last_attempt_are_raised_at_once():
    start, calls = starts(ValueError("checkpointLocation is not writable"), "query")
    with pytest.raises(ValueError, match="not writable"):
        start_query(start, sleep=lambda seconds: None)
    assert len(calls) == 1

    busy = RuntimeError(PYTHON_CONNECT_BACK_FAILURE)
    start, calls = starts(busy, busy, busy, "query")
    with pytest.raises(RuntimeError, match=PYTHON_CONNECT_BACK_FAILURE):
        start_query(start, sleep=lambda seconds: None)
    assert len(calls) == 3
