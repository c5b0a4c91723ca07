"""Access to a namespace on plain values: the refusals and the one line each gives an operator (what to
grant, where), the SDK's errors sorted into them, and the per-process token cache renewing before expiry
(the credential behind it and the clock passed in)."""

from __future__ import annotations

from collections import namedtuple

import pytest
from azure.servicebus._pyamqp.error import TokenAuthFailure
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError, ServiceBusError

from backlog_syphon.config import CredentialConfig, NamespaceConfig, Secret
from backlog_syphon.model import AccessRight
from backlog_syphon.servicebus.access import (
    AccessFailure,
    Refusal,
    discovery_refused,
    discovery_skipped_line,
    is_missing_claim,
    refusal_line,
    token_needs_renewal,
)
from backlog_syphon.servicebus.credentials import CachingCredential, NoTokenError, credential_for
from backlog_syphon.servicebus.preflight import refusal_of

Token = namedtuple("Token", "token expires_on")
SAS = NamespaceConfig(connection_string=Secret("Endpoint=sb://contoso-dr.servicebus.windows.net/;"
                                               "SharedAccessKeyName=k;SharedAccessKey=v", "test"))
AAD = NamespaceConfig(fully_qualified_namespace="contoso-dr.servicebus.windows.net",
                      credential=CredentialConfig("databricks_service_credential", name="sb-syphon"))
QUEUE_3 = "contoso/x-servicebus-transfer/3"
MISSING_LISTEN = (f"Unauthorized access. 'Listen' claim(s) are required to perform this operation. Resource: "
                  f"'sb://contoso-dr.servicebus.windows.net/{QUEUE_3}'. TrackingId:abc, SystemTracker:x, Timestamp:t")


def test_a_missing_right_names_the_entity_and_the_narrowest_role():
    line = refusal_line(Refusal(AccessFailure.MISSING_RIGHT), AAD, "secondary", AccessRight.LISTEN, [QUEUE_3])
    assert line.startswith(f"the secondary namespace refused Listen on {QUEUE_3}: grant Azure Service Bus Data "
                           f"Receiver (on it, or on the namespace) to the identity of secondary.credential "
                           f"(databricks_service_credential 'sb-syphon')")
    line = refusal_line(Refusal(AccessFailure.MISSING_RIGHT), AAD, "primary", AccessRight.SEND, ["a", "b"])
    assert "refused Send on a, b: grant Azure Service Bus Data Sender (on them, or on the namespace)" in line
    line = refusal_line(Refusal(AccessFailure.MISSING_RIGHT), SAS, "secondary", AccessRight.LISTEN, [QUEUE_3])
    assert line == (f"the secondary namespace refused Listen on {QUEUE_3}: use a key with the Listen right in "
                    f"secondary.connection_string")
    assert [right.role for right in AccessRight] == ["Azure Service Bus Data Sender", "Azure Service Bus Data Receiver",
                                                     "Azure Service Bus Data Owner"]


def test_a_connection_string_where_local_auth_is_off_says_to_use_azure_ad():
    line = refusal_line(Refusal(AccessFailure.LOCAL_AUTH_DISABLED, "LocalAuthDisabled: ... TrackingId:1"), SAS,
                        "secondary", AccessRight.LISTEN, [QUEUE_3])
    assert line == ("local authentication is disabled on contoso-dr.servicebus.windows.net: use Azure AD "
                    "(secondary.fully_qualified_namespace and secondary.credential) instead of "
                    "secondary.connection_string")


def test_refused_tokens_and_failed_credentials_keep_the_services_words_without_tracking_ids():
    line = refusal_line(Refusal(AccessFailure.TOKEN_REFUSED, "ExpiredToken: The token is expired. TrackingId:9, "
                                                             "SystemTracker:x, Timestamp:t"),
                        AAD, "secondary", AccessRight.LISTEN, [QUEUE_3])
    assert "refused the Azure AD token of secondary.credential (databricks_service_credential 'sb-syphon') " \
           "(ExpiredToken: The token is expired.)" in line and "TrackingId" not in line
    line = refusal_line(Refusal(AccessFailure.NO_TOKEN, "no Databricks service credential 'sb-syphon' in this "
                                                        "process (ImportError, ImportError)"),
                        AAD, "secondary", AccessRight.SEND, ["probe"], on_executors=True)
    assert line.startswith("secondary.credential (databricks_service_credential 'sb-syphon') could not get an Azure "
                           "AD token on executors (no Databricks service credential")
    assert "Databricks Runtime 16.2+" in line


def test_the_sdks_errors_are_sorted_into_refusals():
    local = ServiceBusAuthenticationError(message="x", error=TokenAuthFailure(
        401, b"LocalAuthDisabled: Authorization failed because SAS authentication has been disabled for the "
             b"namespace. TrackingId:1"))
    assert refusal_of(local).failure is AccessFailure.LOCAL_AUTH_DISABLED
    expired = ServiceBusAuthenticationError(message="x", error=TokenAuthFailure(401, b"ExpiredToken: The token "
                                                                                     b"is expired."))
    assert refusal_of(expired) == Refusal(AccessFailure.TOKEN_REFUSED, "ExpiredToken: The token is expired.")
    assert refusal_of(ServiceBusAuthorizationError(message=MISSING_LISTEN)).failure is AccessFailure.MISSING_RIGHT
    no_token = ServiceBusError("Handler failed", error=NoTokenError("ClientAuthenticationError: AADSTS7000215"))
    assert refusal_of(no_token) == Refusal(AccessFailure.NO_TOKEN, "ClientAuthenticationError: AADSTS7000215")
    assert refusal_of(ServiceBusError("connection reset")) is None
    assert is_missing_claim(MISSING_LISTEN) and not is_missing_claim("Unauthorized access. The token has expired.")


def test_discovery_without_manage_is_skipped_with_a_line_naming_the_role():
    assert discovery_refused(401) and discovery_refused(403) and not discovery_refused(None)
    assert not discovery_refused(503)
    line = discovery_skipped_line(AAD, "secondary")
    assert "needs Manage, granted by Azure Service Bus Data Owner" in line and "backlog.discover: false" in line


@pytest.mark.parametrize("taken_at, expires_on, now, renew", [
    (0, 3600, 3299, False), (0, 3600, 3300, True),  # a one-hour token: 5 minutes before it expires
    (0, 60, 29, False), (0, 60, 30, True),  # a one-minute token: half-way
    (1000, 1240, 1119, False), (1000, 1240, 1120, True),  # one handed out with 4 minutes left: half of those
    (0, 60, 61, True),
])
def test_a_token_is_renewed_well_before_it_expires(taken_at, expires_on, now, renew):
    assert token_needs_renewal(expires_on, taken_at, now) is renew


class FakeCredential:
    def __init__(self, lifetime: float, clock):
        self.lifetime, self.clock, self.calls = lifetime, clock, []

    def get_token(self, *scopes, **kwargs):
        self.calls.append(scopes)
        return Token(f"token-{len(self.calls)}", self.clock() + self.lifetime)


def test_the_process_cache_takes_one_token_per_lifetime_however_many_links_ask():
    now = [1000.0]
    fake = FakeCredential(60, lambda: now[0])
    cache = CachingCredential(CredentialConfig("custom", factory="m:f"), build=lambda settings: fake,
                              clock=lambda: now[0])
    scope = "https://servicebus.azure.net//.default"
    tokens = []
    for _ in range(240):  # a link asking every half second for two minutes
        tokens.append(cache.get_token(scope).token)
        now[0] += 0.5
    assert cache.requests == len(fake.calls) == 4  # renewed every 30 s
    assert tokens[0] == "token-1" and tokens[59] == "token-1" and tokens[60] == "token-2"
    assert all(scopes == (scope,) for scopes in fake.calls)


def test_a_credential_that_fails_gives_a_no_token_error_without_its_secret():
    class Refusing:
        def get_token(self, *scopes, **kwargs):
            raise RuntimeError("AADSTS7000215: Invalid client secret provided.\nsecond line with details")

    cache = CachingCredential(CredentialConfig("service_principal", tenant_id="t", client_id="c",
                                               client_secret=Secret("sp-secret-value", "t")),
                              build=lambda settings: Refusing())
    with pytest.raises(NoTokenError) as failed:
        cache.get_token("scope")
    assert str(failed.value) == "RuntimeError: AADSTS7000215: Invalid client secret provided."
    assert cache.requests == 0


def test_a_process_builds_one_credential_per_setting():
    settings = CredentialConfig("custom", factory="m:f", secret=Secret("a", "t"))
    assert credential_for(settings) is credential_for(CredentialConfig("custom", factory="m:f",
                                                                       secret=Secret("a", "other source")))
    assert credential_for(settings) is not credential_for(CredentialConfig("custom", factory="m:f",
                                                                           secret=Secret("b", "t")))


def test_each_kind_builds_azure_identitys_credential_without_a_request():
    import azure.identity as identity

    from backlog_syphon.servicebus.credentials import build_credential

    built = {kind: build_credential(settings) for kind, settings in {
        "default": CredentialConfig(),
        "service_principal": CredentialConfig("service_principal", tenant_id="00000000-0000-0000-0000-000000000001",
                                              client_id="c", client_secret=Secret("s", "t")),
        "managed_identity": CredentialConfig("managed_identity", client_id="mi"),
        "workload_identity": CredentialConfig("workload_identity", tenant_id="t", client_id="c",
                                              token_file="/var/run/secrets/azure/tokens/azure-identity-token"),
    }.items()}
    assert isinstance(built["default"], identity.DefaultAzureCredential)
    assert isinstance(built["service_principal"], identity.ClientSecretCredential)
    assert isinstance(built["managed_identity"], identity.ManagedIdentityCredential)
    assert isinstance(built["workload_identity"], identity.WorkloadIdentityCredential)


def test_kinds_that_cannot_be_built_here_say_why():
    from backlog_syphon.servicebus.credentials import build_credential

    with pytest.raises(NoTokenError, match="no Databricks service credential 'sb-syphon' in this process"):
        build_credential(CredentialConfig("databricks_service_credential", name="sb-syphon"))
    with pytest.raises(NoTokenError, match=r"cannot load the factory no_such_module:make \(ModuleNotFoundError\)"):
        build_credential(CredentialConfig("custom", factory="no_such_module:make"))
    made = build_credential(CredentialConfig("custom", factory="servicebus_emulator.aad:credential",
                                             options={"principal": "p"}, secret=Secret("key", "t")))
    assert made.principal == "p"
