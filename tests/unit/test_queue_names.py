"""Backlog queue names: ``<primary>/x-servicebus-transfer/<index>``."""

import pytest

from backlog_syphon.restore.queue_names import (
    backlog_queue_name,
    backlog_queue_names,
    is_backlog_queue_name,
)


def test_backlog_queue_names():
    assert backlog_queue_name("contoso", 0) == "contoso/x-servicebus-transfer/0"
    assert backlog_queue_names("contoso", 2) == ["contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"]
    assert is_backlog_queue_name("contoso/x-servicebus-transfer/12")
    assert is_backlog_queue_name("contoso/X-SERVICEBUS-TRANSFER/3")
    for name in ["contoso/x-servicebus-transfer/", "contoso/x-servicebus-transfer/01",
                 "contoso/x-servicebus-transfer/a", "x-servicebus-transfer/1", "a/b/x-servicebus-transfer/1",
                 "contoso/x-servicebus-transfer/1/x", "orders"]:
        assert not is_backlog_queue_name(name), name


def test_is_backlog_queue_name():
    assert is_backlog_queue_name("contoso/x-servicebus-transfer/9")
    assert is_backlog_queue_name("contoso/x-servicebus-transfer/9", "Contoso")
    assert not is_backlog_queue_name("contoso/x-servicebus-transfer/9", "fabrikam")
    assert not is_backlog_queue_name("orders")


@pytest.mark.parametrize("namespace, index", [
    ("", 0), ("a/b", 0), ("contoso", -1), ("contoso", True), ("contoso", "1"),
])
def test_backlog_queue_name_rejects_bad_input(namespace, index):
    with pytest.raises(ValueError):
        backlog_queue_name(namespace, index)


def test_discovery_keeps_only_backlog_queues_of_the_primary():
    """What ``servicebus.peek.list_backlog_queues`` keeps of a namespace's queue list."""
    listed = ["contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/17", "Contoso/X-ServiceBus-Transfer/3",
              "contoso/x-servicebus-transfer/01", "contoso/x-servicebus-transfer/", "contoso/x-servicebus-transfer/dlq",
              "contoso/x-servicebus-transfer/1/x", "contosox/x-servicebus-transfer/2",
              "fabrikam/x-servicebus-transfer/0", "orders"]
    assert [name for name in listed if is_backlog_queue_name(name, "contoso")] == [
        "contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/17", "Contoso/X-ServiceBus-Transfer/3"]
