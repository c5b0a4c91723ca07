"""Which backlog queues the administration API calls partitioned, and their lock durations (a fake client: no
I/O)."""

import contextlib
import datetime as dt
from types import SimpleNamespace

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.model import QueueSettings
from backlog_syphon.servicebus import entities


def test_partitioned_queues_and_their_dead_letter_sub_queues_are_named(monkeypatch):
    listed = [SimpleNamespace(name="ns/x-servicebus-transfer/0", enable_partitioning=True,
                              lock_duration=dt.timedelta(seconds=30)),
              SimpleNamespace(name="ns/X-servicebus-transfer/1", enable_partitioning=False,
                              lock_duration=dt.timedelta(minutes=1))]

    @contextlib.contextmanager
    def admin(namespace):
        yield SimpleNamespace(list_queues=lambda: listed)

    monkeypatch.setattr(entities, "administration_client", admin)
    queues = ["ns/x-servicebus-transfer/0", "ns/x-servicebus-transfer/1", "ns/x-servicebus-transfer/0/$DeadLetterQueue"]
    assert entities.partitioned_queues(NamespaceConfig(), queues) == {"ns/x-servicebus-transfer/0",
                                                         "ns/x-servicebus-transfer/0/$DeadLetterQueue"}
    # the lock each queue's purge may wait out for messages an earlier receiver left locked, by lower-case name
    assert entities.queue_settings(NamespaceConfig()).lock_seconds == {"ns/x-servicebus-transfer/0": 30.0,
                                                          "ns/x-servicebus-transfer/1": 60.0}


def test_an_administration_api_that_does_not_answer_knows_of_none(monkeypatch):
    @contextlib.contextmanager
    def refused(namespace):
        raise PermissionError("no Manage right")
        yield

    monkeypatch.setattr(entities, "administration_client", refused)
    assert entities.partitioned_queues(NamespaceConfig(), ["q"]) == set()
    assert entities.queue_settings(NamespaceConfig()) == QueueSettings()
