"""Checks that send, lock and settle nothing: the pre-flight of both namespaces before a run, and the
dry run's destination checks.

Both attach links without using them: attaching is what fails for wrong credentials, a missing
entity or a missing right, and an attached sender tells the largest message its destination takes.
Failures become one plain line naming the setting to fix (``PreflightError``) or a ``SendFailure``
per destination; connection strings never appear in them.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Iterable

from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusServerBusyError,
)

from backlog_syphon.config import NamespaceConfig, SyphonConfig
from backlog_syphon.errors import BacklogQueueMissingError, SettingsError
from backlog_syphon.restore.amqp_message import decode_message
from backlog_syphon.restore.legacy_properties import decode_legacy_properties
from backlog_syphon.restore.queue_names import backlog_queue_name
from backlog_syphon.servicebus.clients import ServiceBusAccessError, open_client
from backlog_syphon.servicebus.peek import peek_raw
from backlog_syphon.servicebus.sdk_internals import attach, prompt
from backlog_syphon.servicebus.send import classify_send_error
from backlog_syphon.model import SendFailure

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DestinationCheck:
    max_message_size: int | None  # what the destination's link accepts; None when it cannot be used
    failure: SendFailure | None


def check_destinations(namespace: NamespaceConfig, destinations: Iterable[str]) -> dict[str, DestinationCheck]:
    """Attach a sender to each destination without sending anything (for the dry run).

    Attaching is what fails for a missing entity or a missing Send right, and the attached link
    tells the largest message the destination takes.
    """
    checks = {}
    with open_client(namespace, role="primary", retry_total=0) as client:
        for destination in sorted(set(destinations)):
            try:
                with prompt(client.get_queue_sender(destination)) as sender:
                    checks[destination] = DestinationCheck(sender.create_message_batch().max_size_in_bytes, None)
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the dry run changes nothing
                checks[destination] = DestinationCheck(None, classify_send_error(exc, destination))
    return checks


PREFLIGHT_TIMEOUT_SECONDS = 20.0
PREFLIGHT_PROBE_ENTITY = "backlog-syphon-preflight"  # a sender attach to it proves auth even when absent


class PreflightError(SettingsError):
    """A namespace cannot be used as configured; the message is one line naming the setting to fix."""


def preflight(config: SyphonConfig, *, timeout_seconds: float = PREFLIGHT_TIMEOUT_SECONDS,
              primary: bool = True) -> None:
    """Check both namespaces before the stream starts; raise ``PreflightError`` with what to fix.

    Authenticates to the secondary namespace and peeks one message of a backlog queue (a peek locks
    nothing), then (unless ``primary`` is False: the status command reads the secondary only)
    authenticates to the primary namespace and attaches a sender link to a destination (the first
    backlog message's, when there is one), without sending. Nothing is sent, locked or settled.
    Bounded in time: a namespace that does not answer is reported, not waited for.
    """
    queue_names = [backlog_queue_name(config.primary.namespace, index) for index in range(config.backlog.queue_count)]
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
    stage = ["secondary"]

    def check() -> None:
        destination = _preflight_secondary(config.secondary, queue_names)
        if not primary:
            return
        stage[0] = "primary"
        _preflight_primary(config.primary, destination or PREFLIGHT_PROBE_ENTITY)

    try:
        pool.submit(check).result(timeout=timeout_seconds)
    except FutureTimeout:
        namespace = getattr(config, stage[0])
        raise PreflightError(
            f"the {stage[0]} namespace ({namespace.endpoint}) did not answer within {timeout_seconds:.0f} s: check the "
            f"Endpoint in {_setting(namespace, stage[0])} and that this machine can reach it (AMQP, TCP port "
            f"5671)") from None
    finally:
        pool.shutdown(wait=False)


def _setting(namespace: NamespaceConfig, role: str) -> str:
    return f"{role}.connection_string" if namespace.connection_string is not None else \
        f"{role}.fully_qualified_namespace"


def _preflight_failure(exc: BaseException, namespace: NamespaceConfig, role: str, entity: str, right: str
                       ) -> PreflightError:
    setting = _setting(namespace, role)
    where = f"the {role} namespace ({namespace.endpoint})"
    name = type(exc).__name__
    if isinstance(exc, ServiceBusAuthenticationError):
        return PreflightError(f"{where} refused the credentials ({name}): check SharedAccessKeyName and "
                              f"SharedAccessKey in {setting}")
    if isinstance(exc, ServiceBusAuthorizationError):
        return PreflightError(f"{where} does not allow '{right}' on '{entity}' ({name}): give the key in "
                              f"{setting} the {right} right")
    if isinstance(exc, MessagingEntityNotFoundError):
        return PreflightError(f"{where} has none of the backlog queues '{entity}'..: check primary.namespace (the "
                              f"backlog queues are <primary.namespace>/x-servicebus-transfer/<N>) and {setting}")
    if isinstance(exc, ServiceBusAccessError):
        return PreflightError(str(exc))
    return PreflightError(f"cannot reach {where} ({name}): check the Endpoint in {setting} and that this "
                          f"machine can reach it")


def _preflight_secondary(namespace: NamespaceConfig, queue_names: list[str]) -> str | None:
    """Authenticate and peek one message of the first backlog queue that exists; return its destination
    (x-ms-path) if it has a readable one. Missing queues are the run's to skip; all of them missing
    means the backlog is configured wrong."""
    page = None
    try:
        with open_client(namespace, role="secondary", retry_total=0) as client:
            for queue_name in queue_names:
                try:
                    with prompt(client.get_queue_receiver(queue_name)) as receiver:
                        page = peek_raw(receiver, 1, 1)
                    break
                except BacklogQueueMissingError:
                    continue
            else:
                raise MessagingEntityNotFoundError(message="no backlog queue exists")
    except Exception as exc:  # noqa: BLE001 - every failure becomes one plain line
        logger.debug("pre-flight of the secondary namespace failed", exc_info=True)
        raise _preflight_failure(exc, namespace, "secondary", queue_names[0], "Listen") from None
    if not page:
        return None
    try:
        return decode_legacy_properties(decode_message(page[0]).application_properties).destination
    except ValueError:
        return None  # a message the run will dead-letter; it says nothing about access


def _preflight_primary(namespace: NamespaceConfig, destination: str) -> None:
    try:
        with open_client(namespace, role="primary", retry_total=0) as client:
            with prompt(client.get_queue_sender(destination)) as sender:
                attach(sender)  # attaching the link is the check; nothing is sent
    except (MessagingEntityNotFoundError, ServiceBusServerBusyError):
        return  # authenticated; a missing destination is its messages' problem, a busy primary is waited for
    except Exception as exc:  # noqa: BLE001 - every failure becomes one plain line
        logger.debug("pre-flight of the primary namespace failed", exc_info=True)
        raise _preflight_failure(exc, namespace, "primary", destination, "Send") from None


EXECUTOR_PROBE_SCHEMA = "role string, endpoint string, problem string"


def executor_preflight(spark, config: SyphonConfig, *, timeout_seconds: float = PREFLIGHT_TIMEOUT_SECONDS) -> None:
    """Check from an executor, not only from the driver, that both namespaces can be reached: one tiny
    Spark task attaches a sender link to each (nothing is sent). Raise ``PreflightError`` naming the
    namespace an executor cannot reach.

    On Databricks serverless, code on executors (the source's reads, the sends) may reach the internet
    only where the workspace's serverless network policy allows it, which the driver cannot see.
    """
    namespaces = (("primary", config.primary), ("secondary", config.secondary))

    def probe(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        rows = [{"role": role, "endpoint": namespace.endpoint,
                 "problem": _attach_problem(namespace, role, timeout_seconds)} for role, namespace in namespaces]
        yield pa.RecordBatch.from_pylist(rows)

    for row in spark.range(1).mapInArrow(probe, EXECUTOR_PROBE_SCHEMA).collect():
        if row["problem"]:
            raise PreflightError(
                f"executors cannot reach the {row['role']} namespace {row['endpoint']} ({row['problem']}): on "
                f"Databricks serverless, allow it in the workspace's serverless network policy; elsewhere, let the "
                f"cluster's workers reach it (AMQP, TCP port 5671)")


def _attach_problem(namespace: NamespaceConfig, role: str, timeout_seconds: float) -> str | None:
    """None when a sender link attaches (or the probe entity is simply not there); else what went wrong."""
    def attach_probe() -> None:
        try:
            with open_client(namespace, role=role, retry_total=0) as client:
                with prompt(client.get_queue_sender(PREFLIGHT_PROBE_ENTITY)) as sender:
                    attach(sender)
        except (MessagingEntityNotFoundError, ServiceBusServerBusyError):
            return  # reached and authenticated; the probe entity need not exist, a busy namespace is waited for

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-probe")
    try:
        pool.submit(attach_probe).result(timeout=timeout_seconds)
        return None
    except FutureTimeout:
        return f"no answer within {timeout_seconds:.0f} s"
    except Exception as exc:  # noqa: BLE001 - reported by name only: never the connection string
        return type(exc).__name__
    finally:
        pool.shutdown(wait=False)
