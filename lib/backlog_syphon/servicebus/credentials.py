"""Azure AD credentials for the namespaces: built from the settings once per process, their tokens
taken once per process and renewed before they expire.

Every SDK sender and receiver opens its own connection and asks its credential for a token when it
opens and again when 90% of that token's life has passed; the administration client asks per request.
Handing them the credential as azure-identity builds it would make a token request (to Azure AD, or
Databricks) per link. So each process keeps one ``CachingCredential`` per credential setting (keyed
by the settings that are not secret and a hash of the secret), shared by every client of that
process: executors' Python workers take a token once, not once per task or message, and the driver
once for its pre-flight and planning. When to renew is ``access.token_needs_renewal``'s decision.

Errors never carry a secret or a token: a credential's failure becomes ``NoTokenError`` with the
exception's type and first line (azure-identity's messages name tenants and client ids, never secrets).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from typing import Any, Callable

from backlog_syphon.config import CredentialConfig
from backlog_syphon.errors import SettingsError
from backlog_syphon.model import CredentialKind
from backlog_syphon.servicebus.access import token_needs_renewal

logger = logging.getLogger(__name__)


class NoTokenError(SettingsError):
    """A credential could not give an Azure AD token (not configured here, refused by Azure AD, unreachable)."""


class CachingCredential:
    """A token credential (``get_token``) that hands out the same token until it nears its expiry.

    The credential behind it is built at the first request (so an executor that never needs it never
    builds it); ``clock`` is passed in for tests. Thread-safe: links opening at once wait for one request.
    """

    def __init__(self, settings: CredentialConfig, *, build: Callable[[CredentialConfig], Any] | None = None,
                 clock: Callable[[], float] = time.time):
        self._settings = settings
        self._build = build or build_credential
        self._clock = clock
        self._lock = threading.Lock()
        self._inner: Any = None
        self._tokens: dict[tuple[str, ...], tuple[Any, float]] = {}  # scopes -> (token, taken at)
        self.requests = 0  # tokens this process took from the credential behind

    def get_token(self, *scopes: str, **kwargs):
        with self._lock:
            cached = self._tokens.get(scopes)
            now = self._clock()
            if cached is not None and not token_needs_renewal(cached[0].expires_on, cached[1], now):
                return cached[0]
            try:
                if self._inner is None:
                    self._inner = self._build(self._settings)
                token = self._inner.get_token(*scopes, **kwargs)
            except NoTokenError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported by type and first line, never a secret
                raise NoTokenError(_cause(exc)) from None
            self.requests += 1
            self._tokens[scopes] = (token, now)
            logger.info("Azure AD token %d of this process from %s; valid for %.0f s", self.requests,
                        self._settings.describe(), token.expires_on - now)
            return token

    def __repr__(self) -> str:
        return f"CachingCredential({self._settings.describe()})"


_CREDENTIALS: dict[tuple[str, str], CachingCredential] = {}
_CREDENTIALS_LOCK = threading.Lock()


def credential_for(settings: CredentialConfig) -> CachingCredential:
    """This process's credential for ``settings``: the same object (and so the same tokens) for every client."""
    key = settings.cache_key
    with _CREDENTIALS_LOCK:
        credential = _CREDENTIALS.get(key)
        if credential is None:
            credential = _CREDENTIALS[key] = CachingCredential(settings)
        return credential


def build_credential(settings: CredentialConfig):
    """The token credential a setting names (azure-identity's, Databricks', or the ``custom`` factory's)."""
    kind = settings.kind
    if kind == CredentialKind.DATABRICKS_SERVICE_CREDENTIAL:
        return _databricks_service_credential(settings.name)
    if kind == CredentialKind.CUSTOM:
        return _custom_credential(settings)
    try:
        import azure.identity as identity
    except ImportError:
        raise NoTokenError("azure-identity is not installed: pip install 'backlog-syphon[azure-ad]'") from None
    if kind == CredentialKind.SERVICE_PRINCIPAL:
        return identity.ClientSecretCredential(settings.tenant_id, settings.client_id, settings.client_secret.reveal())
    if kind == CredentialKind.MANAGED_IDENTITY:
        return identity.ManagedIdentityCredential(client_id=settings.client_id)
    if kind == CredentialKind.WORKLOAD_IDENTITY:
        given = {"tenant_id": settings.tenant_id, "client_id": settings.client_id,
                 "token_file_path": settings.token_file}
        return identity.WorkloadIdentityCredential(**{key: value for key, value in given.items() if value})
    return identity.DefaultAzureCredential()


def _databricks_service_credential(name: str):
    """A Unity Catalog service credential's token provider. Databricks documents two ways in: inside
    code that runs on executors (a UDF) ``databricks.service_credentials.getServiceCredentialsProvider``,
    and in a notebook or job's driver ``dbutils.credentials.getServiceCredentialsProvider``; each is tried."""
    failures = []
    try:
        from databricks.service_credentials import getServiceCredentialsProvider

        return getServiceCredentialsProvider(name)
    except Exception as exc:  # noqa: BLE001 - not in this runtime, or not here: try the other way
        failures.append(type(exc).__name__)
    try:
        from databricks.sdk.runtime import dbutils

        return dbutils.credentials.getServiceCredentialsProvider(name)
    except Exception as exc:  # noqa: BLE001 - reported by name below
        failures.append(type(exc).__name__)
    raise NoTokenError(f"no Databricks service credential '{name}' in this process ({', '.join(failures)})")


def _custom_credential(settings: CredentialConfig):
    module_name, _, attribute = settings.factory.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise NoTokenError(f"cannot load the factory {settings.factory} ({type(exc).__name__})") from None
    extra = {"secret": settings.secret.reveal()} if settings.secret is not None else {}
    return factory(**settings.options, **extra)


def _cause(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
