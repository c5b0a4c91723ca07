"""Who calls the administration API, and the service's answers when the caller may not. Pure.

The header is ``Authorization: SharedAccessSignature sr=...&sig=...&se=...&skn=...`` (the SDK's
``ServiceBusSharedKeyCredentialPolicy`` signs the https URL of the namespace) or ``Authorization: Bearer
<jwt>`` (an Azure AD token for https://servicebus.azure.net). Reading entities needs the Manage right: a
key whose rule has Manage, or a principal with *Azure Service Bus Data Owner* on the namespace (for lists)
or on the entity.

Invariants:
- a caller is authenticated (signature, expiry, local auth allowed) before anything is looked up, and
  every refusal is a 401 whose text names no secret;
- the refusal texts are the service's: ``Manage,EntityRead claims required for this operation`` in the
  ``<Error>`` body for queues and topics; ``SubCode=40100: Unauthorized : Unauthorized access for
  '<operation>' operation on endpoint '<url>'`` as the status line's reason, with an empty body, for
  subscriptions (both as azure-sdk-for-go's tests against real namespaces pin them).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import FrozenSet, Optional

from . import aad, sas

BEARER = "Bearer "
MANAGE_CLAIMS_REQUIRED = "Manage,EntityRead claims required for this operation."
MISSING_CREDENTIALS = ("MalformedToken: Invalid authorization header: The request is missing WRAP authorization "
                       "credentials.")


class Unauthenticated(Exception):
    """The header carries no credential the namespace takes; the message is the 401's detail."""


@dataclass(frozen=True)
class Caller:
    """A shared access key (``key_name``, with ``key_rights``) or an Azure AD ``principal`` (whose rights come
    from the namespace's role assignments, which only the broker's thread reads)."""
    key_name: Optional[str] = None
    key_rights: FrozenSet[str] = frozenset()
    principal: Optional[str] = None


def authenticate(cfg, header: Optional[str], *, now: Optional[float] = None) -> Caller:
    """The caller named by the ``Authorization`` header; ``Unauthenticated`` when the namespace ``cfg``
    does not take it."""
    header = (header or "").strip()
    if sas.is_sas(header):
        if not cfg.local_auth:
            raise Unauthenticated("LocalAuthDisabled: Authorization failed because SAS authentication has been "
                                  "disabled for the namespace.")
        try:
            signed = sas.verify(cfg.sas_keys, header, now=now)
        except sas.SasRefused as exc:
            raise Unauthenticated(str(exc)) from None
        return Caller(key_name=signed.key_name, key_rights=cfg.key_rights(signed.key_name))
    if header.startswith(BEARER):
        if cfg.azure_ad is None:
            raise Unauthenticated("Unauthorized: this namespace takes no Azure AD tokens (it has no azure_ad "
                                  "section); sign requests with one of its shared access keys.")
        try:
            claims = aad.verify_token(cfg.azure_ad.signing_key, header[len(BEARER):].strip(), now=now)
        except aad.TokenRefused as exc:
            raise Unauthenticated(str(exc)) from None
        return Caller(principal=claims.principal)
    raise Unauthenticated(MISSING_CREDENTIALS)


def subscription_refusal(operation: str, endpoint: str) -> str:
    """The status line's reason the service gives a caller without Manage on a subscription request
    (``operation``: ``GetSubscription`` or ``EnumerateSubscriptions``)."""
    return (f"SubCode=40100: Unauthorized : Unauthorized access for '{operation}' operation on endpoint "
            f"'{endpoint}'. Tracking Id: {uuid.uuid4()}_G0")
