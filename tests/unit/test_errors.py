"""The error family: what each error tells the command line (exit code, one line, whether to run again)."""

import pytest

from backlog_syphon import errors
from backlog_syphon.errors import (
    BATCH_FAILED_MARK,
    BacklogQueueMissingError,
    BatchFailedError,
    DestinationUnavailableError,
    LeaseHeldError,
    LeaseLostError,
    PeekTimedOutError,
    SettingsError,
    SyphonError,
    describe,
)


def test_exit_codes_are_the_command_lines_contract():
    assert (errors.EXIT_OK, errors.EXIT_BATCH_FAILED, errors.EXIT_SETTINGS, errors.EXIT_LEASE_HELD,
            errors.EXIT_NOT_DRAINED, errors.EXIT_DEAD_LETTERS) == (0, 1, 2, 3, 4, 5)


@pytest.mark.parametrize("error, exit_code, retryable", [
    (SyphonError("x"), 1, True),
    (SettingsError("x"), 2, False),
    (LeaseHeldError("x"), 3, True),
    (LeaseLostError("x"), 1, True),
    (DestinationUnavailableError("x"), 1, True),
    (BacklogQueueMissingError("x"), 1, True),
    (PeekTimedOutError("x"), 1, True),
])
def test_each_error_carries_its_exit_code_and_whether_running_again_helps(error, exit_code, retryable):
    assert isinstance(error, SyphonError)
    assert (error.exit_code, error.retryable) == (exit_code, retryable)


def test_the_errors_raised_elsewhere_belong_to_the_family():
    from backlog_syphon.config import ConfigError
    from backlog_syphon.run import lease

    assert issubclass(ConfigError, SettingsError) and issubclass(ConfigError, ValueError)
    assert issubclass(lease.LeaseHeldError, LeaseHeldError)
    assert issubclass(lease.LeaseTableMismatchError, SettingsError)
    assert lease.LeaseLostError is LeaseLostError


def test_a_failed_batch_takes_its_causes_exit_code_and_names_batch_step_and_cause():
    failed = BatchFailedError(7, "send", SettingsError("the key in primary.connection_string may not Send"))
    assert failed.exit_code == 2
    assert (failed.batch_id, failed.step) == (7, "send")
    assert str(failed) == ("syphon batch failed: batch 7, step send: the key in primary.connection_string "
                           "may not Send")
    assert str(failed).startswith(BATCH_FAILED_MARK)

    assert BatchFailedError(3, "record", LeaseHeldError("another run")).exit_code == 3
    assert BatchFailedError(3, "record", LeaseLostError("lost")).exit_code == 1


def test_a_failed_batch_with_a_foreign_cause_exits_with_one():
    failed = BatchFailedError(4, "record", OSError("disk full\nmore detail"))
    assert failed.exit_code == 1
    assert str(failed) == "syphon batch failed: batch 4, step record: OSError: disk full"


def test_describe_says_our_errors_whole_and_others_by_type_and_first_line():
    assert describe(SettingsError("set primary.namespace")) == "set primary.namespace"
    assert describe(ValueError("  first line\nsecond line")) == "ValueError: first line"
    assert describe(RuntimeError()) == "RuntimeError"
    assert describe(RuntimeError("   \n  ")) == "RuntimeError"
    assert describe(KeyError("x" * 400)) == "KeyError: '" + "x" * 299  # the first line, cut at 300 characters
