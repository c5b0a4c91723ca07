"""The suite's own order (``tests/conftest.py``): every test that needs Spark dealt to one of the lanes,
balanced by their seconds, whatever the selection, and the others to none."""

import pytest

from tests.conftest import lanes


@pytest.mark.parametrize("seconds, count", [
    ([50, 40, 30, 20, 10] + [0] * 10, 3), ([5, 5, 5, 5, 5], 3), ([8], 3), ([0] * 4, 3), ([9] * 7 + [0] * 13, 2),
    ([3, 2, 0, 0], 1)])
def test_every_test_with_seconds_gets_one_lane_and_the_others_none(seconds, count):
    dealt = lanes(seconds, count)
    assert len(dealt) == len(seconds)
    assert all((lane is None) == (value == 0) for lane, value in zip(dealt, seconds))
    assert {lane for lane in dealt if lane is not None} <= set(range(count))


def test_the_lanes_hold_about_equal_seconds_longest_first():
    # Longest first, each to the lane with the fewest seconds (the first of equals): 100 | 60 + 30 + 5 | 50 + 40.
    assert lanes([60, 5, 0, 100, 40, 0, 50, 30], 3) == [1, 1, None, 0, 2, None, 2, 1]


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
