"""Access to a namespace, decided on plain values: why a namespace refused the syphon and the one line
that tells an operator what to grant or change, and when a cached Azure AD token must be renewed.
Pure: the SDK's exceptions are sorted into ``AccessFailure`` where they are met (``probes``).

The roles are Azure's built-in ones, each the narrowest that has the right: Listen (peek, receive,
complete, dead-letter) is *Azure Service Bus Data Receiver*, Send is *Data Sender*, and Manage (the
administration API's queue listing) only comes with *Data Owner*.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.model import AccessRight, CredentialKind

# The service's answer when a token or key lacks a right ("Unauthorized access. 'Send' claim(s) are
# required to perform this operation. Resource: 'sb://...'"): a role to grant, not a passing state.
MISSING_CLAIM_MARK = "claim(s) are required"
# How Service Bus refuses a SAS token on a namespace whose local (shared key) authentication is off.
LOCAL_AUTH_DISABLED_MARK = "LocalAuthDisabled"
# An Azure AD token is renewed this long before it expires (or, for a short-lived one, half-way through its life).
TOKEN_REFRESH_MARGIN_SECONDS = 300.0


class AccessFailure(StrEnum):
    """Why a namespace could not be used, as far as access goes."""

    LOCAL_AUTH_DISABLED = "local_auth_disabled"  # a connection string on a namespace that takes Azure AD only
    TOKEN_REFUSED = "token_refused"  # the namespace refused the SAS key or the Azure AD token
    NO_TOKEN = "no_token"  # the credential could not get an Azure AD token at all
    MISSING_RIGHT = "missing_right"  # authenticated, but without Send, Listen or Manage there


@dataclass(frozen=True)
class Refusal:
    """What a namespace refused: ``failure``, and ``detail``: the service's or the credential's own words
    (never a secret: descriptions and exception messages, no tokens or keys)."""

    failure: AccessFailure
    detail: str = ""


def is_missing_claim(description: str) -> bool:
    """Whether an authorization error is the service saying a right is missing (else, for example, a
    token that expired on a link: the link is opened again with a new one)."""
    return MISSING_CLAIM_MARK in description


def setting_of(namespace: NamespaceConfig, role: str) -> str:
    """The setting that decides how the syphon gets into a namespace, for operators' lines."""
    if namespace.azure_ad is None:
        return f"{role}.connection_string"
    return f"{role}.credential ({namespace.azure_ad.describe()})"


def refusal_line(refusal: Refusal, namespace: NamespaceConfig, role: str, right: AccessRight,
                 entities: list[str], *, on_executors: bool = False) -> str:
    """One line naming what the ``role`` namespace refused, where, and what to grant or change."""
    where = f"the {role} namespace ({namespace.endpoint})"
    setting = setting_of(namespace, role)
    failure, detail = refusal.failure, _first_sentence(refusal.detail)
    if failure is AccessFailure.LOCAL_AUTH_DISABLED:
        return (f"local authentication is disabled on {namespace.endpoint}: use Azure AD "
                f"({role}.fully_qualified_namespace and {role}.credential) instead of {role}.connection_string")
    if failure is AccessFailure.TOKEN_REFUSED:
        if namespace.azure_ad is None:
            return (f"{where} refused the credentials ({detail or 'unauthorized'}): check SharedAccessKeyName and "
                    f"SharedAccessKey in {setting}")
        return (f"{where} refused the Azure AD token of {setting} ({detail or 'unauthorized'}): check the "
                f"credential's tenant and that it is for this namespace's Azure AD")
    if failure is AccessFailure.NO_TOKEN:
        place = " on executors" if on_executors else ""
        return f"{setting} could not get an Azure AD token{place} ({detail}): {_credential_hint(namespace, role)}"
    named = ", ".join(entities)
    if namespace.azure_ad is None:
        return (f"the {role} namespace refused {right} on {named}: use a key with the {right} right in "
                f"{setting}")
    scope = "on them" if len(entities) > 1 else "on it"
    return (f"the {role} namespace refused {right} on {named}: grant {right.role} ({scope}, or on the namespace) "
            f"to the identity of {setting}")


def _credential_hint(namespace: NamespaceConfig, role: str) -> str:
    kind = namespace.azure_ad.kind
    return {
        CredentialKind.DEFAULT: "DefaultAzureCredential found no identity here; choose the kind that names one",
        CredentialKind.SERVICE_PRINCIPAL: "check tenant_id, client_id and client_secret (expired or rotated?)",
        CredentialKind.MANAGED_IDENTITY: "this machine has no such managed identity (client_id) or no identity "
                                         "endpoint",
        CredentialKind.WORKLOAD_IDENTITY: "set token_file (or AZURE_FEDERATED_TOKEN_FILE), client_id and tenant_id",
        CredentialKind.DATABRICKS_SERVICE_CREDENTIAL: "it needs Databricks Runtime 16.2+ with Unity Catalog and the "
                                                      "ACCESS privilege on the service credential (see "
                                                      "docs/running/azure-ad.md)",
        CredentialKind.CUSTOM: f"check {role}.credential.factory and its options",
    }[kind]


def discovery_refused(status_code: int | None) -> bool:
    """Whether the administration API's answer means the identity lacks Manage (401 or 403)."""
    return status_code in (401, 403)


def discovery_skipped_line(namespace: NamespaceConfig, role: str) -> str:
    return (f"backlog queue discovery skipped: the {role} namespace ({namespace.endpoint}) did not let "
            f"{setting_of(namespace, role)} list its queues (that needs {AccessRight.MANAGE}, granted by "
            f"{AccessRight.MANAGE.role}); reading backlog.queue_count queues. Set backlog.discover: false to go "
            f"without discovery")


def shapes_unread_line(namespace: NamespaceConfig, role: str) -> str:
    return (f"destination settings not read: the {role} namespace ({namespace.endpoint}) did not let "
            f"{setting_of(namespace, role)} read its queues and topics (that needs {AccessRight.MANAGE}, granted by "
            f"{AccessRight.MANAGE.role}); a message its destination cannot take (no SessionId for a session "
            f"queue) is found by the destination's refusal instead of before it is sent")


def token_needs_renewal(expires_on: float, taken_at: float, now: float) -> bool:
    """Whether a cached token must be replaced before it is handed out again.

    The SDK renews a link's token once 90% of the lifetime it had when the link got it has passed,
    so a token handed out must still have a good part of its life: it is replaced
    ``TOKEN_REFRESH_MARGIN_SECONDS`` before it expires, or half-way for a short-lived one.
    """
    margin = min(TOKEN_REFRESH_MARGIN_SECONDS, max(0.0, expires_on - taken_at) / 2)
    return now >= expires_on - margin


def _first_sentence(text: str) -> str:
    """The service's description without its tracking suffix ("... TrackingId:..., Timestamp:...")."""
    text = " ".join(text.split())
    cut = text.find(" TrackingId:")
    return (text[:cut] if cut >= 0 else text)[:300]
