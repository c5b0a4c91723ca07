"""Checks that send, lock and settle nothing: the pre-flight of both namespaces before a run, and the
dry run's destination checks.

Both attach links without using them: attaching is what fails for wrong credentials, a missing
entity or a missing right, and an attached sender tells the largest message its destination takes.
Failures become one plain line naming the setting to fix, or the role to grant and where
(``PreflightError``, lines from ``access`` and, for the way there, ``network``), or a ``SendFailure`` per
destination; connection strings, keys, tokens and passwords never appear in them.
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
from backlog_syphon.restore.amqp.message_decoding import decode_message
from backlog_syphon.restore.legacy_properties import decode_legacy_properties
from backlog_syphon.restore.queue_names import backlog_queue_names, dead_letter_queue_name
from backlog_syphon.servicebus.access import (
    LOCAL_AUTH_DISABLED_MARK,
    AccessFailure,
    Refusal,
    refusal_line,
)
from backlog_syphon.servicebus.clients import ServiceBusAccessError, each_at_once, open_client
from backlog_syphon.servicebus.credentials import NoTokenError
from backlog_syphon.servicebus.network import (
    NetworkProblem,
    address_setting,
    causes,
    network_line,
    network_problem_of,
)
from backlog_syphon.servicebus.peek import peek_raw
from backlog_syphon.servicebus.sdk_internals import (
    attach,
    link_max_message_size,
    management_handle,
    prompt,
    token_refusal,
)
from backlog_syphon.servicebus.send import classify_send_error
from backlog_syphon.model import AccessRight, MigrationPlan, NetworkFailure, SendFailure

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
                    batch_limit = sender.create_message_batch().max_size_in_bytes  # opens the link
                    checks[destination] = DestinationCheck(link_max_message_size(sender) or batch_limit, None)
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the dry run changes nothing
                checks[destination] = DestinationCheck(None, classify_send_error(exc, destination))
    return checks


PREFLIGHT_TIMEOUT_SECONDS = 20.0
PREFLIGHT_ENTITY = "backlog-syphon-preflight"  # a sender attach to it proves auth even when absent


class PreflightError(SettingsError):
    """A namespace cannot be used as configured; the message is one line naming the setting to fix."""


class NoBacklogQueuesError(PreflightError):
    """The secondary holds none of the configured backlog queues: a wrong setting, or queues that were removed
    (``--decommission``: the status tells the two apart by the runs table)."""


def refusal_of(exc: BaseException) -> Refusal | None:
    """What an SDK error says about access (None: it is about something else, such as the network)."""
    for cause in causes(exc):
        if isinstance(cause, NoTokenError):
            return Refusal(AccessFailure.NO_TOKEN, str(cause))
    if isinstance(exc, ServiceBusAuthenticationError):
        description = token_refusal(exc)
        failure = AccessFailure.LOCAL_AUTH_DISABLED if LOCAL_AUTH_DISABLED_MARK in description else \
            AccessFailure.TOKEN_REFUSED
        return Refusal(failure, description or type(exc).__name__)
    if isinstance(exc, ServiceBusAuthorizationError):
        return Refusal(AccessFailure.MISSING_RIGHT, str(exc))
    return None


def unreachable_line(exc: BaseException, namespace: NamespaceConfig, role: str, *, on_executors: bool = False) -> str:
    """The line for a namespace that could not be reached: what the network said (``network``), else the error's
    type and the address to check."""
    problem = network_problem_of(exc, through_proxy=bool(namespace.proxy_host))
    if problem is not None:
        return network_line(problem, namespace, role, on_executors=on_executors)
    who = "executors cannot" if on_executors else "cannot"
    return (f"{who} reach the {role} namespace {namespace.endpoint} over {namespace.transport} at "
            f"{namespace.connect_endpoint} ({type(exc).__name__}): check {address_setting(namespace, role)} and that "
            f"this machine can reach it")


def preflight(config: SyphonConfig, *, timeout_seconds: float = PREFLIGHT_TIMEOUT_SECONDS,
              primary: bool = True, migration: MigrationPlan | None = None) -> None:
    """Check both namespaces before the stream starts; raise ``PreflightError`` with what to fix.

    Authenticates to the secondary namespace and peeks one message of every configured backlog queue
    (at once; a peek locks nothing), so a right missing on one queue is named; then authenticates to the
    primary namespace (unless ``primary`` is False: the status command reads the secondary only) and
    attaches a sender to the destination of each queue's first message (or to a pre-flight entity when the
    backlog is empty), without sending. A destination that alone refuses Send is a warning (its
    messages will be dead-lettered with the reason); every destination refusing it is an error. Nothing is sent, locked or settled. Bounded in time: a namespace that does not answer is
    reported, not waited for.

    A migration run (``config.migrating``) peeks every source of its plan (``migration``; made here from the
    namespaces' listings when not given, so a source or route that cannot be taken is said here, exit code 2)
    and attaches a sender to every route's destination.
    """
    queues = backlog_queue_names(config.primary.namespace, config.backlog.queue_count)
    if config.redriving:
        queues = [dead_letter_queue_name(queue) for queue in queues]
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
    stage = ["secondary"]

    def check() -> None:
        if config.migrating:
            from backlog_syphon.servicebus.listing import migration_plan

            plan = migration if migration is not None else migration_plan(config)
            _preflight_secondary(config.secondary, list(plan.paths), browse=plan.browse_only)
            destinations = sorted({route.destination for route in plan.routes.values()})
        else:
            destinations = _preflight_secondary(config.secondary, queues)
        if not primary:
            return
        stage[0] = "primary"
        _preflight_primary(config.primary, destinations)

    try:
        pool.submit(check).result(timeout=timeout_seconds)
    except FutureTimeout:
        namespace = getattr(config, stage[0])
        raise PreflightError(network_line(NetworkProblem(NetworkFailure.UNANSWERED, f"{timeout_seconds:.0f} s"),
                                          namespace, stage[0])) from None
    finally:
        pool.shutdown(wait=False)


def _raise_first(failures: dict[str, BaseException], namespace: NamespaceConfig, role: str, right: AccessRight,
                 *, missing_right_is_error: bool = True) -> list[str]:
    """Raise the ``PreflightError`` the failures call for, in order of what to fix first: the way in (local
    auth, key, token), then missing rights (unless ``missing_right_is_error`` is false), then the network.
    Returns the entities that only lack ``right``."""
    refusals = {entity: refusal_of(exc) for entity, exc in failures.items()}
    for entity, refusal in refusals.items():
        if refusal is not None and refusal.failure is not AccessFailure.MISSING_RIGHT:
            logger.debug("pre-flight of the %s namespace failed on %s", role, entity, exc_info=failures[entity])
            raise PreflightError(refusal_line(refusal, namespace, role, right, [entity]))
    lacking = [entity for entity, refusal in refusals.items() if refusal is not None]
    if lacking and missing_right_is_error:
        raise PreflightError(refusal_line(Refusal(AccessFailure.MISSING_RIGHT), namespace, role, right, lacking))
    for entity, exc in failures.items():
        if refusals[entity] is None:
            logger.debug("pre-flight of the %s namespace failed on %s", role, entity, exc_info=exc)
            if isinstance(exc, ServiceBusAccessError):
                raise PreflightError(str(exc))
            raise PreflightError(unreachable_line(exc, namespace, role))
    return lacking


def _preflight_secondary(namespace: NamespaceConfig, queues: list[str], *, browse: frozenset[str] = frozenset()
                         ) -> list[str]:
    """Peek the first message of every queue at once; return the destinations (x-ms-path) of those
    messages that have a readable one. Missing queues are the run's to skip; all of them missing means
    the backlog is configured wrong. ``browse``: entities peeked through a management-only link (lower-case)."""
    try:
        with open_client(namespace, role="secondary", retry_total=0) as client:
            def peek_first(queue: str):
                try:
                    handler = (management_handle(client, queue) if queue.lower() in browse
                               else prompt(client.get_queue_receiver(queue)))
                    try:
                        return peek_raw(handler, 1, 1, namespace=namespace)
                    finally:
                        handler.close()
                except (BacklogQueueMissingError, MessagingEntityNotFoundError):
                    return None
                except Exception as exc:  # noqa: BLE001 - judged with the others' below
                    return exc

            results = each_at_once(queues, peek_first, name="preflight-link")
    except ServiceBusAccessError as exc:
        raise PreflightError(str(exc)) from None
    _raise_first({queue: r for queue, r in results.items() if isinstance(r, BaseException)}, namespace, "secondary",
                 AccessRight.LISTEN)
    pages = [page for page in results.values() if page is not None]
    if not pages:
        raise NoBacklogQueuesError(f"the secondary namespace ({namespace.endpoint}) has none of the backlog queues "
                             f"'{queues[0]}'..: check primary.namespace (the backlog queues are "
                             f"<primary.namespace>/x-servicebus-transfer/<N>) and {address_setting(namespace, 'secondary')}")
    return sorted({destination for page in pages if page for destination in [_destination(page[0])] if destination})


def _destination(raw: bytes) -> str | None:
    try:
        return decode_legacy_properties(decode_message(raw).application_properties).destination
    except ValueError:
        return None  # a message the run will dead-letter; it says nothing about access


def _preflight_primary(namespace: NamespaceConfig, destinations: list[str]) -> None:
    """Attach a sender to each destination at once (to the pre-flight entity when there is none): nothing is sent."""
    targets = destinations or [PREFLIGHT_ENTITY]
    try:
        with open_client(namespace, role="primary", retry_total=0) as client:
            def attach_sender(destination: str):
                try:
                    with prompt(client.get_queue_sender(destination)) as sender:
                        attach(sender)  # attaching the link is the check; nothing is sent
                except (MessagingEntityNotFoundError, ServiceBusServerBusyError):
                    pass  # authenticated; a missing destination is its messages' problem, a busy primary is waited for
                except Exception as exc:  # noqa: BLE001 - judged with the others' below
                    return exc
                return None

            results = each_at_once(targets, attach_sender, name="preflight-link")
    except ServiceBusAccessError as exc:
        raise PreflightError(str(exc)) from None
    failures = {destination: r for destination, r in results.items() if r is not None}
    # The pre-flight entity need not be granted anything (roles may be scoped to the destinations); some
    # destinations refusing Send is theirs alone: their messages are dead-lettered with the reason.
    lacking = _raise_first(failures, namespace, "primary", AccessRight.SEND,
                           missing_right_is_error=bool(destinations) and len(failures) == len(destinations))
    if lacking and destinations:
        logger.warning("%s; until then their messages are dead-lettered (reason unauthorized)",
                       refusal_line(Refusal(AccessFailure.MISSING_RIGHT), namespace, "primary", AccessRight.SEND,
                                    lacking))


EXECUTOR_CHECK_SCHEMA = "role string, endpoint string, problem string, refusal string"


def executor_preflight(spark, config: SyphonConfig, *, timeout_seconds: float = PREFLIGHT_TIMEOUT_SECONDS) -> None:
    """Check from an executor, not only from the driver, that both namespaces can be reached and take its
    credentials: one tiny Spark task attaches a sender link to each (nothing is sent). Raise
    ``PreflightError`` naming the namespace an executor cannot reach or get into.

    On Databricks serverless, code on executors (the source's reads, the sends) may reach the internet
    only where the workspace's serverless network policy allows it, which the driver cannot see; and
    a credential may work on the driver only (a Databricks service credential where executors cannot
    use it, a managed identity of the driver's machine).
    """
    namespaces = (("primary", config.primary), ("secondary", config.secondary))

    def check_on_an_executor(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        rows = []
        for role, namespace in namespaces:
            problem, refusal = _attach_problem(namespace, role, timeout_seconds)
            rows.append({"role": role, "endpoint": namespace.endpoint, "problem": problem, "refusal": refusal})
        yield pa.RecordBatch.from_pylist(rows)

    for row in spark.range(1).mapInArrow(check_on_an_executor, EXECUTOR_CHECK_SCHEMA).collect():
        if row["refusal"]:
            raise PreflightError(row["refusal"])
        if row["problem"]:
            raise PreflightError(row["problem"])


def _attach_problem(namespace: NamespaceConfig, role: str, timeout_seconds: float) -> tuple[str | None, str | None]:
    """(the line for a namespace the executor cannot reach, access refusal line): both None when a sender link
    attaches, the pre-flight entity is simply not there, or it is there and only the Send right is missing (the
    token or key was taken)."""
    def attach_check() -> None:
        try:
            with open_client(namespace, role=role, retry_total=0) as client:
                with prompt(client.get_queue_sender(PREFLIGHT_ENTITY)) as sender:
                    attach(sender)
        except (MessagingEntityNotFoundError, ServiceBusServerBusyError):
            return  # reached and authenticated; the pre-flight entity need not exist, a busy namespace is waited for

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-preflight")
    try:
        pool.submit(attach_check).result(timeout=timeout_seconds)
        return None, None
    except FutureTimeout:
        return network_line(NetworkProblem(NetworkFailure.UNANSWERED, f"{timeout_seconds:.0f} s"), namespace, role,
                            on_executors=True), None
    except Exception as exc:  # noqa: BLE001 - reported by kind and type only: never the connection string
        refusal = refusal_of(exc)
        if refusal is None:
            return unreachable_line(exc, namespace, role, on_executors=True), None
        if refusal.failure is AccessFailure.MISSING_RIGHT:
            return None, None
        return None, refusal_line(refusal, namespace, role, AccessRight.SEND, [PREFLIGHT_ENTITY],
                                  on_executors=True)
    finally:
        pool.shutdown(wait=False)
