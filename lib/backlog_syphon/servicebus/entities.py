"""What the primary namespace's queues and topics take, and the secondary's backlog queues' settings (partitioned
or not, their lock durations), read from the administration API once per run.

The send's shape should fit the destination before the first refusal (``restore.destination_fit``): a
session-enabled queue refuses a message without SessionId, a partitioned entity with duplicate detection
refuses batches of distinct MessageIds. Where the administration API answers (a key with Manage, or Azure
AD with *Azure Service Bus Data Owner*), every queue and topic is listed once, with the subscriptions of
each topic; elsewhere nothing is known up front and the first refusal teaches the sender
(``sink.delivery``). Reading changes nothing.
"""

from __future__ import annotations

import logging

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.model import DestinationShape, EntityKind, QueueSettings
from backlog_syphon.restore.queue_names import owning_queue
from backlog_syphon.restore.destination_fit import by_name
from backlog_syphon.servicebus.access import discovery_refused, shapes_unread_line
from backlog_syphon.servicebus.peek import administration_client
from backlog_syphon.servicebus.throttling import administration, list_pages

logger = logging.getLogger(__name__)


def destination_shapes(namespace: NamespaceConfig) -> dict[str, DestinationShape]:
    """Every queue and topic of ``namespace`` with what it takes, by lower-case name; {} where the
    administration API does not answer (said once, as a warning when the identity lacks Manage)."""
    def read():
        with administration_client(namespace) as admin:
            queues = [DestinationShape(queue.name, EntityKind.QUEUE, bool(queue.requires_session),
                                       bool(queue.enable_partitioning), bool(queue.requires_duplicate_detection),
                                       _bytes(queue.max_message_size_in_kilobytes))
                      for queue in admin.list_queues()]
            topics = list(admin.list_topics())
            # One listing per topic, one after the other: the primary is near, and the client is not made for threads.
            sessions = {topic.name: tuple(sorted(subscription.name for subscription in admin.list_subscriptions(topic.name)
                                                 if subscription.requires_session))
                        for topic in topics}
            return queues, topics, sessions

    try:
        queues, topics, sessions = administration(
            namespace, read, requests=lambda got: list_pages(got[0]) + list_pages(got[1]) + len(got[1]))
        shapes = queues + [DestinationShape(topic.name, EntityKind.TOPIC, False, bool(topic.enable_partitioning),
                                            bool(topic.requires_duplicate_detection),
                                            _bytes(topic.max_message_size_in_kilobytes), sessions[topic.name])
                           for topic in topics]
    except Exception as exc:  # noqa: BLE001 - best effort: refusals teach the senders instead
        if discovery_refused(getattr(exc, "status_code", None)):
            logger.warning(shapes_unread_line(namespace, "primary"))
        else:
            logger.info("destination settings unavailable from the administration API (%s); a destination's "
                        "refusal teaches the sender instead", type(exc).__name__)
        return {}
    logger.info("destination settings read for %d queue(s) and %d topic(s)", len(queues), len(topics))
    return by_name(shapes)


def _bytes(kilobytes: int | None) -> int | None:
    return None if not kilobytes else int(kilobytes) * 1024


def queue_settings(namespace: NamespaceConfig) -> QueueSettings:
    """``namespace``'s queues as the administration API describes them (one listing); empty where it does not
    answer: the partition bits of the sequence numbers seen tell then, and the locks the purge sees."""
    def read() -> list:
        with administration_client(namespace) as admin:
            return list(admin.list_queues())

    try:
        queues = administration(namespace, read, requests=list_pages)
    except Exception as exc:  # noqa: BLE001 - best effort: the sequence numbers and the locks seen tell as well
        logger.info("backlog queues' settings unavailable from the administration API (%s); the partition bits of "
                    "their sequence numbers and the locks the purge sees tell instead", type(exc).__name__)
        return QueueSettings()
    return QueueSettings(frozenset(queue.name.lower() for queue in queues if queue.enable_partitioning),
                         {queue.name.lower(): queue.lock_duration.total_seconds() for queue in queues
                          if queue.lock_duration is not None})


def partitioned_queue_names(namespace: NamespaceConfig) -> frozenset[str]:
    """The lower-case names of ``namespace``'s queues the administration API calls partitioned
    (``enable_partitioning``); empty where it does not answer: the partition bits of the sequence numbers
    seen then tell."""
    return queue_settings(namespace).partitioned


def partitioned_queues(namespace: NamespaceConfig, queues) -> set[str]:
    """Which of ``queues`` (backlog queues, or their dead-letter sub-queues, which are partitioned as their
    queue is) the administration API calls partitioned; empty where it does not answer."""
    queues = list(queues)
    if not queues:
        return set()
    partitioned = partitioned_queue_names(namespace)
    return {queue for queue in queues if owning_queue(queue).lower() in partitioned}
