"""The suite's own order (``tests/conftest.py``, ``dealt_out``): every test kept once, and each worker's
share starting with its turn of the integration tests, whatever the selection."""

import pytest

from tests.conftest import dealt_out


def _items(integration: int, others: int) -> list[str]:
    return [f"long-{n}" for n in range(integration)] + [f"short-{n}" for n in range(others)]


@pytest.mark.parametrize("integration, others, workers", [(5, 10, 3), (5, 0, 3), (1, 0, 3), (0, 4, 3), (7, 13, 2)])
def test_every_test_is_kept_once(integration, others, workers):
    items = _items(integration, others)
    assert sorted(dealt_out(items, [item.startswith("long") for item in items], workers)) == sorted(items)


def test_each_share_starts_with_its_turn_of_the_long_tests():
    items = _items(5, 10)  # three shares of five, as worksteal sizes them
    assert dealt_out(items, [item.startswith("long") for item in items], 3) == [
        "long-0", "long-3", "short-0", "short-1", "short-2",
        "long-1", "long-4", "short-3", "short-4", "short-5",
        "long-2", "short-6", "short-7", "short-8", "short-9"]
