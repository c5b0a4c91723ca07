"""Removing the backlog queues once they are drained (``--decommission --confirm``), through the secondary
namespace's administration API (``ServiceBusAdministrationClient``).

That API needs Manage: a key whose rule has it, or, with Azure AD, *Azure Service Bus Data Owner* on the
namespace (or on each queue). Without it the service answers 401 (or 403), and the decommission ends with
one line naming the role to grant (exit code 2) before anything is removed: ``require_manage`` lists the
queues first. Deleting a queue deletes its dead-letter sub-queue and every message in both; the legacy client
that created the queues never deletes them (their AutoDeleteOnIdle is "never"). Each request is a management
operation of ten credits, paced as the syphon's other reads are; a busy answer (503: the namespace's credits are
spent) is waited out and asked again (``throttling.paced``), within ``sink.outage_wait_seconds``.
"""

from __future__ import annotations

import logging

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.errors import SettingsError
from backlog_syphon.model import AccessRight, CreditKind
from backlog_syphon.restore.queue_names import is_backlog_queue_name
from backlog_syphon.servicebus.access import AccessFailure, Refusal, discovery_refused, refusal_line
from backlog_syphon.servicebus.peek import administration_client
from backlog_syphon.servicebus.throttling import ADMINISTRATION_CREDITS, NamespaceThrottledError, list_pages, paced

logger = logging.getLogger(__name__)


class ManageRefusedError(SettingsError):
    """The secondary namespace's administration API refused the identity (it lacks Manage), or cannot be
    reached as configured; the message is one line naming the role or the setting."""


def require_manage(namespace: NamespaceConfig, primary_namespace: str) -> list[str]:
    """The backlog queues of ``primary_namespace`` the administration API lists (which takes Manage, as their
    removal does); ``ManageRefusedError`` when it refuses or cannot be reached."""
    def read() -> list:
        with administration_client(namespace) as admin:
            return list(admin.list_queues())

    try:
        queues = paced(namespace, CreditKind.ADMINISTRATION, read,
                       cost=lambda listed: ADMINISTRATION_CREDITS * max(1, list_pages(listed)))
    except NamespaceThrottledError:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted into the one line an operator acts on
        raise _refusal(exc, namespace, f"{primary_namespace}/x-servicebus-transfer/*") from exc
    return sorted(queue.name for queue in queues if is_backlog_queue_name(queue.name, primary_namespace))


def delete_queue(namespace: NamespaceConfig, name: str) -> bool:
    """Delete one queue (with its dead-letter sub-queue); False when it was already gone."""
    from azure.core.exceptions import ResourceNotFoundError

    def delete() -> None:
        with administration_client(namespace) as admin:
            admin.delete_queue(name)

    try:
        paced(namespace, CreditKind.ADMINISTRATION, delete, cost=lambda _: ADMINISTRATION_CREDITS)
    except ResourceNotFoundError:
        logger.info("%s was already removed", name)
        return False
    except Exception as exc:  # noqa: BLE001 - a refusal is a setting; anything else fails the command as it is
        if discovery_refused(getattr(exc, "status_code", None)):
            raise _refusal(exc, namespace, name) from exc
        raise
    logger.info("removed the backlog queue %s", name)
    return True


def _refusal(exc: BaseException, namespace: NamespaceConfig, entity: str) -> ManageRefusedError:
    status = getattr(exc, "status_code", None)
    if discovery_refused(status):
        detail = getattr(exc, "message", None) or str(exc)
        return ManageRefusedError(refusal_line(Refusal(AccessFailure.MISSING_RIGHT, detail), namespace, "secondary",
                                               AccessRight.MANAGE, [entity]) + " (removing backlog queues takes Manage)")
    return ManageRefusedError(
        f"the secondary namespace's administration API ({namespace.administration_host}) did not answer "
        f"({type(exc).__name__}{f' {status}' if status else ''}): check secondary.administration_endpoint (and "
        f"secondary.ca_file); removing backlog queues goes through it")
