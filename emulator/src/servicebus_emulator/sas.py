"""Shared access signatures: a ``SharedAccessSignature sr=...&sig=...&se=...&skn=...`` token checked against a
namespace's keys, as the ``$cbs`` put-token (AMQP) and the administration API (HTTPS) both take them.

The signature is HMAC-SHA256 with the key over ``<url-encoded sr>\\n<se>``, base64, as the SDKs sign it
(azure-servicebus' ``generate_sas_token``). Pure: nothing but the standard library.

Invariants:
- a namespace without keys takes any well-formed token (the emulator's open mode), with the token's key name;
- the audience (``sr``) is not compared with the resource the token is used for;
- refusal texts never contain the key or the signature.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import parse_qs, quote_plus, unquote

PREFIX = "SharedAccessSignature "


class SasRefused(ValueError):
    """A token the namespace does not take; the message says why (it names no secret)."""


@dataclass(frozen=True)
class SignedToken:
    key_name: str
    expires_on: int          # seconds since the epoch


def is_sas(token: str) -> bool:
    return token.startswith(PREFIX)


def verify(keys: Mapping[str, str], token: str, *, now: Optional[float] = None) -> SignedToken:
    """The key name and expiry of a valid token; ``SasRefused`` otherwise."""
    fields = {k: v[0] for k, v in parse_qs(token[len(PREFIX):]).items()}
    try:
        expires_on = int(fields.get("se", "0"))
    except ValueError:
        raise SasRefused("Unauthorized: malformed expiry") from None
    name = unquote(fields.get("skn", ""))
    if not keys:
        return SignedToken(name, expires_on)
    key = keys.get(name)
    if key is None:
        raise SasRefused(f"Unauthorized: unknown SharedAccessKeyName '{name}'")
    expected = base64.b64encode(hmac.new(key.encode(), f"{quote_plus(fields.get('sr', ''))}\n{expires_on}".encode(),
                                         hashlib.sha256).digest()).decode()
    if not hmac.compare_digest(expected, fields.get("sig", "")):
        raise SasRefused("Unauthorized: the SAS signature does not match the configured key")
    if expires_on < (time.time() if now is None else now):
        raise SasRefused("Unauthorized: the SAS token has expired")
    return SignedToken(name, expires_on)
