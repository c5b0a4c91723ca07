"""The suite's own order (``tests/conftest.py``, ``dealt_out``): every test kept once, and each worker's
share starting with its turn of the integration tests, whatever the selection."""

import pytest

from tests.conftest import dealt_out


@pytest.mark.parametrize("integration, others, workers", [(5, 10, 3), (5, 0, 3), (1, 0, 3), (0, 4, 3), (7, 13, 2)])
def test_every_test_is_kept_once_and_each_share_starts_with_its_long_tests(integration, others, workers):
    items = [f"long-{n}" for n in range(integration)] + [f"short-{n}" for n in range(others)]
    ordered = dealt_out(items, [item.startswith("long") for item in items], workers)
    assert sorted(ordered) == sorted(items)
    if others >= integration:  # enough short tests to fill every share: worksteal's sizes hold
        remaining, start = len(items), 0
        for share in range(workers):
            size = remaining // (workers - share)
            mine = [f"long-{n}" for n in range(share, integration, workers)]
            assert ordered[start:start + len(mine)] == mine
            start, remaining = start + size, remaining - size
