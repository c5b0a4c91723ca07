"""The syphon's errors: one family, each saying what the command line needs (exit code, one line,
whether running again helps). Pure: nothing but the standard library.

Operators get plain answers: every error here has a message of one line that names what is wrong
and what to do, never a secret. SDK and Delta errors are mapped into this family where they are met
(``servicebus``, ``storage``), so nothing above those packages inspects a foreign exception.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_BATCH_FAILED = 1  # a micro-batch failed; the next run resumes safely from the tables
EXIT_SETTINGS = 2  # a setting is wrong: configuration, credentials, endpoint or rights
EXIT_LEASE_HELD = 3  # another run is delivering from this backlog
EXIT_NOT_DRAINED = 4  # the run ended with messages still in the backlog
EXIT_DEAD_LETTERS = 5  # the status command: the backlog is drained, its dead-letter sub-queues are not


class SyphonError(Exception):
    """Root of the syphon's errors. ``exit_code``: what the command line exits with; ``retryable``: the
    next run (with nothing changed) may succeed."""

    exit_code = EXIT_BATCH_FAILED
    retryable = True


class SettingsError(SyphonError):
    """A setting is wrong (configuration, credentials, endpoint, rights): running again will not help."""

    exit_code = EXIT_SETTINGS
    retryable = False


class LeaseHeldError(SyphonError):
    """Another run holds the backlog's lease: this run must not send."""

    exit_code = EXIT_LEASE_HELD


class LeaseLostError(SyphonError):
    """This run's lease expired or was taken over while it ran: it stops sending, recording and purging."""


class DestinationUnavailableError(SyphonError):
    """Destinations refused or could not be reached for all of ``sink.outage_wait_seconds``."""


class BacklogQueueMissingError(SyphonError):
    """A backlog queue does not exist (never created, or deleted): it is skipped, the others drain."""


class PeekTimedOutError(SyphonError):
    """A peek got no answer in any of its attempts (``servicebus.peek.PeekTimeouts``): the read, plan or
    count that needed it fails, and the next run reads on from where the tables say."""


def describe(exc: BaseException) -> str:
    """The cause of a failure in one line: our own errors say it all, also where one was raised in another
    process (a Spark task's error arrives as the text of a foreign exception, the traceback's last line
    naming ours: that line is the cause), others by type and first line."""
    if isinstance(exc, SyphonError):
        return str(exc)
    ours = {cls.__name__ for cls in _subclasses(SyphonError)}
    for line in reversed(str(exc).splitlines()):
        name, _, message = line.strip().partition(": ")
        if name.rsplit(".", 1)[-1] in ours and message:
            return message
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


BATCH_FAILED_MARK = "syphon batch failed:"


class BatchFailedError(SyphonError):
    """A micro-batch failed. Its message is one line: ``syphon batch failed: batch N, step S: cause``."""

    def __init__(self, batch_id: int, step: str, cause: BaseException):
        self.batch_id, self.step, self.cause = batch_id, step, cause
        self.exit_code = getattr(cause, "exit_code", EXIT_BATCH_FAILED)
        super().__init__(f"{BATCH_FAILED_MARK} batch {batch_id}, step {step}: {describe(cause)}")
