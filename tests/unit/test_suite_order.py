"""The suite's own order (``tests/conftest.py``, ``dealt_out``): every test kept once, and each worker's
share starting with its part of the timed (integration) tests, balanced by their seconds, whatever
the selection."""

import pytest

from tests.conftest import dealt_out


def _items(timed: list[float], others: int) -> tuple[list[str], list[float]]:
    names = [f"long-{n}" for n in range(len(timed))] + [f"short-{n}" for n in range(others)]
    return names, list(timed) + [0] * others


@pytest.mark.parametrize("timed, others, workers", [
    ([50, 40, 30, 20, 10], 10, 3), ([5, 5, 5, 5, 5], 0, 3), ([8], 0, 3), ([], 4, 3), ([9] * 7, 13, 2), ([3, 2], 5, 1)])
def test_every_test_is_kept_once(timed, others, workers):
    names, seconds = _items(timed, others)
    assert sorted(dealt_out(names, seconds, workers)) == sorted(names)


def test_each_share_starts_with_long_tests_of_about_equal_seconds():
    # Longest first, each to the share with the fewest seconds (the first of equals): 100 | 60 + 30 + 5 | 50 + 40.
    names, seconds = _items([60, 5, 100, 40, 50, 30], 9)  # three shares of five, as worksteal sizes them
    assert dealt_out(names, seconds, 3) == [
        "long-2", "short-0", "short-1", "short-2", "short-3",
        "long-0", "long-5", "long-1", "short-4", "short-5",
        "long-4", "long-3", "short-6", "short-7", "short-8"]


def test_measured_seconds_naming_a_test_that_does_not_exist_is_found_once_all_of_integration_is_collected():
    from types import SimpleNamespace

    from tests.conftest import INTEGRATION, MEASURED_SECONDS, unmeasured_entries

    def item(path, name):
        return SimpleNamespace(path=path, name=f"{name}[case]", originalname=name)

    files = sorted(INTEGRATION.glob("test_*.py"))
    listed = sorted(MEASURED_SECONDS)
    # One item per file, and one per measured test (their files do not matter here), but the first.
    items = [item(path, "test_x") for path in files] + [item(files[0], name) for name in listed[1:]]
    assert unmeasured_entries(items) == [listed[0]]
    # A file not collected: a selection of the suite, which cannot tell.
    assert unmeasured_entries([i for i in items if i.path != files[-1]]) == []
    assert unmeasured_entries(items + [item(files[0], listed[0])]) == []
