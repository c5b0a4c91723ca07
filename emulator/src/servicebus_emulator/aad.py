"""Azure AD for the emulator: the tokens a namespace with an ``azure_ad`` section accepts, the rights
its role assignments grant, and a credential that signs such tokens for clients.

Service Bus takes Microsoft Entra ID (Azure AD) access tokens for the audience
``https://servicebus.azure.net`` (what a credential returns for the scope
``https://servicebus.azure.net/.default``) through the ``$cbs`` put-token, and decides what the token's
principal may do from Azure role assignments: *Azure Service Bus Data Owner* (Send, Listen, Manage),
*Data Sender* (Send) and *Data Receiver* (Listen), each on the namespace or on one entity.

The emulator cannot check Microsoft's signatures, so it checks a test key instead: tokens are JWTs
signed with HMAC-SHA256 (``HS256``) and the namespace's ``signing_key``. The principal is the token's
``oid`` claim (``sub`` without one), as for a real token. Role assignments are the emulator's
configuration, not claims in the token, as in Azure. Pure: nothing but the standard library.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from collections import namedtuple
from dataclasses import dataclass
from typing import Optional

AUDIENCE = "https://servicebus.azure.net"
# What a client asks a credential for. azure-servicebus 7.15.0 asks for ".../" + "/.default" (its
# JWT_TOKEN_SCOPE), which Azure AD reads as the same resource.
SCOPES = (AUDIENCE + "/.default", AUDIENCE + "//.default")

SEND, LISTEN, MANAGE = "Send", "Listen", "Manage"
ALL_RIGHTS = frozenset({SEND, LISTEN, MANAGE})
ROLES = {
    "Azure Service Bus Data Owner": ALL_RIGHTS,
    "Azure Service Bus Data Sender": frozenset({SEND}),
    "Azure Service Bus Data Receiver": frozenset({LISTEN}),
}

# What a credential's get_token returns (azure-core's AccessToken has these two fields).
AccessToken = namedtuple("AccessToken", "token expires_on")


class TokenRefused(ValueError):
    """A token the namespace does not accept; the message is the service's status description."""


@dataclass(frozen=True)
class Claims:
    principal: str
    expires_on: int  # seconds since the epoch


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(key: str, signed: str) -> str:
    return _b64(hmac.new(key.encode(), signed.encode(), hashlib.sha256).digest())


def sign_token(key: str, principal: str, *, lifetime_seconds: float = 3600, audience: str = AUDIENCE,
               now: Optional[float] = None) -> AccessToken:
    """An access token for ``principal`` signed with ``key``, valid for ``lifetime_seconds`` from ``now``."""
    issued = int(time.time() if now is None else now)
    expires_on = issued + int(lifetime_seconds)
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps({"aud": audience, "oid": principal, "sub": principal, "iat": issued, "nbf": issued,
                               "exp": expires_on}, separators=(",", ":")).encode())
    signed = f"{header}.{payload}"
    return AccessToken(f"{signed}.{_signature(key, signed)}", expires_on)


def verify_token(key: str, token: str, *, now: Optional[float] = None) -> Claims:
    """The token's principal and expiry; ``TokenRefused`` with the service's answer when it is not acceptable."""
    now = time.time() if now is None else now
    parts = token.split(".")
    try:
        header = json.loads(_unb64(parts[0]))
        payload = json.loads(_unb64(parts[1]))
    except (IndexError, ValueError):
        raise TokenRefused("InvalidSignature: The token has an invalid signature.") from None
    if len(parts) != 3 or header.get("alg") != "HS256" or not hmac.compare_digest(
            _signature(key, f"{parts[0]}.{parts[1]}"), parts[2]):
        raise TokenRefused("InvalidSignature: The token has an invalid signature.")
    if payload.get("aud") != AUDIENCE:
        raise TokenRefused("InvalidAudience: The authorization header contains a token with a wrong audience.")
    expires_on = payload.get("exp")
    if not isinstance(expires_on, (int, float)) or expires_on <= now:
        raise TokenRefused("ExpiredToken: The token is expired.")
    if payload.get("nbf", 0) > now:
        raise TokenRefused("InvalidToken: The token is not valid yet.")
    principal = payload.get("oid") or payload.get("sub")
    if not isinstance(principal, str) or not principal:
        raise TokenRefused("InvalidToken: The token names no principal (oid).")
    return Claims(principal, int(expires_on))


class EmulatorCredential:
    """A token credential (``get_token(*scopes)``) that signs tokens for an emulator namespace with ``azure_ad``.

    ``issued_log``: a file that gets one line per token signed, ``<pid> <time>``, so a test can count
    the token requests of each process.
    """

    def __init__(self, signing_key: str, principal: str, *, lifetime_seconds: float = 3600,
                 issued_log: Optional[str] = None):
        self._key = signing_key
        self.principal = principal
        self.lifetime_seconds = lifetime_seconds
        self.issued_log = issued_log

    def get_token(self, *scopes: str, **_kwargs) -> AccessToken:
        if len(scopes) != 1 or scopes[0] not in SCOPES:
            raise ValueError(f"the emulator issues tokens for {SCOPES[0]} only, not {', '.join(scopes)}")
        token = sign_token(self._key, self.principal, lifetime_seconds=self.lifetime_seconds)
        if self.issued_log:
            with open(self.issued_log, "a", encoding="utf-8") as log:
                log.write(f"{os.getpid()} {time.time():.3f}\n")
        return token

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"EmulatorCredential(principal={self.principal!r}, signing key masked)"


def credential(secret: str, principal: str, lifetime_seconds: float = 3600,
               issued_log: Optional[str] = None) -> EmulatorCredential:
    """A factory for clients that build credentials from settings (the backlog syphon's ``custom``
    credential kind): ``secret`` is the namespace's ``signing_key``."""
    return EmulatorCredential(secret, principal, lifetime_seconds=float(lifetime_seconds), issued_log=issued_log)
