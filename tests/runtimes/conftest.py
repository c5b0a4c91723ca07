"""The runtime scenario's fixtures: the integration tests' emulator, and a closing note per run.

``tests/runtimes`` is left out of the main suite (``testpaths`` in setup.cfg): ``make test-runtimes``
runs it in one virtualenv per Spark line, and ``python -m pytest tests/runtimes`` on the pinned one.
"""

import pytest

from tests.integration.conftest import emulator

__all__ = ["emulator"]  # the integration tests' fixture, used here as it is

_NOTES = pytest.StashKey[list]()


@pytest.fixture
def runtime_note(request):
    """Append a line to the closing note (printed after the test summary, captured or not)."""
    return request.config.stash.setdefault(_NOTES, []).append


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    notes = config.stash.get(_NOTES, [])
    if notes:
        terminalreporter.section("runtime scenario")
        for line in notes:
            terminalreporter.write_line(line)
