"""Claims-based authorization: a token put on a connection's ``$cbs`` node becomes a grant for an
audience (the namespace or an entity), and what the grants allow on a path (SAS keys' rights, Azure AD
role assignments). No I/O.

Invariants:
- a namespace without ``azure_ad`` and without ``sas_key_rights`` checks no rights: every token it takes
  allows everything;
- a grant covers its audience's path and every path below it, until the token expires.
"""
from __future__ import annotations

import time
from typing import Dict, Optional, Tuple

from . import aad, codec, sas
from .broker import BrokerError
from .namespace import entity_path


class Grant:
    """A token put on a connection for an audience: who (None for a SAS token, whose key has ``key_rights``)
    until when."""

    __slots__ = ("principal", "expires_on", "key_rights")

    def __init__(self, principal: Optional[str], expires_on: float, key_rights: frozenset = aad.ALL_RIGHTS):
        self.principal, self.expires_on, self.key_rights = principal, expires_on, key_rights


def put_token(conn, props: Dict, token) -> Tuple[int, str]:
    """Answer a put-token request on ``conn``'s ``$cbs`` node: (status code, description); a token taken
    becomes the connection's grant for its audience."""
    ns = conn.ns
    if codec.as_text(props.get("operation")) != "put-token":
        return 501, "amqp:not-implemented: only put-token is supported"
    token = codec.as_text(token) or ""
    audience = entity_path(codec.as_text(props.get("name"))).lower()
    key_rights = aad.ALL_RIGHTS
    if sas.is_sas(token):
        if not ns.cfg.local_auth:
            ns.auth_counts["refused"] += 1
            return 401, ns.described("LocalAuthDisabled: Authorization failed because SAS authentication has "
                                     "been disabled for the namespace.", audience or "$cbs")
        try:
            signed = sas.verify(ns.cfg.sas_keys, token)
            code, desc, expires_on, principal = 200, "OK", signed.expires_on, None
            key_rights = ns.cfg.key_rights(signed.key_name)
        except sas.SasRefused as exc:
            code, desc = 401, str(exc)
    elif ns.cfg.azure_ad is not None:
        try:
            claims = aad.verify_token(ns.cfg.azure_ad.signing_key, token)
            code, desc, expires_on, principal = 200, "OK", claims.expires_on, claims.principal
        except aad.TokenRefused as exc:
            code, desc = 401, ns.described(str(exc), audience or "$cbs")
    elif ns.cfg.sas_keys:
        code, desc = 401, "Unauthorized: not a SharedAccessSignature token"
    else:
        return 200, "OK"
    if code != 200:
        ns.auth_counts["refused"] += 1
        return code, desc
    ns.auth_counts["sas" if principal is None else "jwt"] += 1
    conn.grants[audience] = Grant(principal, expires_on, key_rights)
    return 200, "OK"


def rights(ns, principal: Optional[str], path: str) -> frozenset:
    """What a token's principal may do on ``path`` (lower case): a SAS token (no principal) everything,
    an Azure AD one what its role assignments on the namespace or on the entity grant."""
    if principal is None:
        return aad.ALL_RIGHTS
    granted: set = set()
    for assignment in ns.role_assignments:
        scope = assignment.scope.lower()
        if assignment.principal == principal and (not scope or path == scope or path.startswith(scope + "/")):
            granted |= aad.ROLES[assignment.role]
    return frozenset(granted)


def refusal(conn, path: str, right: str) -> Optional[BrokerError]:
    """Why ``conn`` may not use ``right`` on ``path`` now, or None. Only namespaces with ``azure_ad`` or
    ``sas_key_rights`` check rights: a token put for the entity (or an entity above it, or the namespace)
    that has not expired, whose key or principal holds the right there."""
    ns = conn.ns
    if ns.cfg.azure_ad is None and not ns.cfg.sas_key_rights:
        return None
    lower = path.lower()
    now = time.time()
    grants = [grant for audience, grant in conn.grants.items()
              if not audience or lower == audience or lower.startswith(audience + "/")]
    if grants and all(grant.expires_on <= now for grant in grants):
        return BrokerError("amqp:unauthorized-access", ns.described(
            f"Unauthorized access. The token for '{path}' has expired: put a new one on $cbs before it "
            f"expires.", lower), 401)
    if not any(right in (grant.key_rights if grant.principal is None else rights(ns, grant.principal, lower))
               for grant in grants if grant.expires_on > now):
        return BrokerError("amqp:unauthorized-access", ns.described(
            f"Unauthorized access. '{right}' claim(s) are required to perform this operation. Resource: "
            f"'sb://{ns.host}:{ns.port}/{lower}'.", lower), 401)
    return None
