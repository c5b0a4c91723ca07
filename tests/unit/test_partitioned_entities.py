"""Which backlog queues the administration API calls partitioned (a fake client: no I/O)."""

import contextlib
from types import SimpleNamespace

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.servicebus import entities


def test_partitioned_queues_and_their_dead_letter_sub_queues_are_named(monkeypatch):
    listed = [SimpleNamespace(name="ns/x-servicebus-transfer/0", enable_partitioning=True),
              SimpleNamespace(name="ns/x-servicebus-transfer/1", enable_partitioning=False)]

    @contextlib.contextmanager
    def admin(namespace):
        yield SimpleNamespace(list_queues=lambda: listed)

    monkeypatch.setattr(entities, "administration_client", admin)
    queues = ["ns/x-servicebus-transfer/0", "ns/x-servicebus-transfer/1", "ns/x-servicebus-transfer/0/$DeadLetterQueue"]
    assert entities.partitioned_queues(NamespaceConfig(), queues) == {"ns/x-servicebus-transfer/0",
                                                         "ns/x-servicebus-transfer/0/$DeadLetterQueue"}


def test_an_administration_api_that_does_not_answer_knows_of_none(monkeypatch):
    @contextlib.contextmanager
    def refused(namespace):
        raise PermissionError("no Manage right")
        yield

    monkeypatch.setattr(entities, "administration_client", refused)
    assert entities.partitioned_queues(NamespaceConfig(), ["q"]) == set()
