"""Azure AD on a namespace, with the unmodified SDK: tokens signed with the test key, role assignments per
namespace or entity, ``local_auth: false``, and the service's answers (401 on put-token for a bad or
expired token or a SAS token where local auth is off; ``amqp:unauthorized-access`` with "'<right>'
claim(s) are required" on attach) mapped by the SDK to ``ServiceBusAuthenticationError`` and
``ServiceBusAuthorizationError``."""
import time
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError
from proton import Delivery, Message
from proton.utils import BlockingConnection, SendException

from servicebus_emulator import ConfigError, Emulator, EmulatorConfig
from servicebus_emulator.aad import AUDIENCE, EmulatorCredential, sign_token, verify_token, TokenRefused

KEY = "test-signing-key"
SENDER, RECEIVER, OWNER = ("Azure Service Bus Data Sender", "Azure Service Bus Data Receiver",
                           "Azure Service Bus Data Owner")


def namespace(name, *, local_auth=False, roles=()):
    return {"name": name, "port": 0, "local_auth": local_auth, "sas_keys": {"Root": "sas-key"},
            "azure_ad": {"signing_key": KEY, "role_assignments": [
                {"principal": principal, "role": role, "scope": scope} for principal, role, scope in roles]},
            "queues": [{"name": "a"}, {"name": "b"}, {"name": "contoso/x-servicebus-transfer/3"}]}


CONFIG = {"namespaces": [
    namespace("aad-only", roles=[("writer", SENDER, "a"), ("reader", RECEIVER, ""), ("owner", OWNER, ""),
                                 ("dlq-reader", RECEIVER, "contoso/x-servicebus-transfer/3")]),
    namespace("both", local_auth=True, roles=[("reader", RECEIVER, "")]),
]}


@pytest.fixture(scope="module")
def emulator():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emu:
        yield emu


def client(emulator, principal, *, ns="aad-only", key=KEY, lifetime=3600):
    return ServiceBusClient(f"127.0.0.1:{emulator.port(ns)}", EmulatorCredential(key, principal,
                                                                                  lifetime_seconds=lifetime),
                            use_tls=False, retry_total=0)


def test_roles_grant_send_and_listen_per_entity_or_namespace(emulator):
    before = emulator.auth_stats("aad-only").get("jwt", 0)
    with client(emulator, "writer") as writer, writer.get_queue_sender("a") as sender:
        sender.send_messages(ServiceBusMessage("hello"))
    with client(emulator, "reader") as reader, reader.get_queue_receiver("a", max_wait_time=2) as receiver:
        [message] = receiver.receive_messages(max_message_count=5, max_wait_time=2)
        assert str(message) == "hello"
        receiver.complete_message(message)
    assert emulator.auth_stats("aad-only")["jwt"] >= before + 2  # one put-token per link at least


def test_a_missing_right_is_refused_on_attach_with_the_services_claim_answer(emulator):
    with client(emulator, "writer") as writer:
        with pytest.raises(ServiceBusAuthorizationError) as refused:
            with writer.get_queue_sender("b") as sender:
                sender.send_messages(ServiceBusMessage("no"))
        text = str(refused.value)
        assert ("Unauthorized access. 'Send' claim(s) are required to perform this operation. Resource: "
                f"'sb://127.0.0.1:{emulator.port('aad-only')}/b'.") in text
        with pytest.raises(ServiceBusAuthorizationError, match=r"'Listen' claim\(s\) are required"):
            with writer.get_queue_receiver("a") as receiver:
                receiver.peek_messages(1)
    with client(emulator, "reader") as reader:
        with pytest.raises(ServiceBusAuthorizationError, match=r"'Send' claim\(s\) are required"):
            with reader.get_queue_sender("a"):
                pass


def test_a_role_on_a_queue_covers_its_dead_letter_queue_and_nothing_else(emulator):
    queue = "contoso/x-servicebus-transfer/3"
    with client(emulator, "owner") as owner:
        with owner.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("dead"))
        with owner.get_queue_receiver(queue, max_wait_time=2) as receiver:
            [message] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            receiver.dead_letter_message(message, reason="test")
    with client(emulator, "dlq-reader") as reader:
        with reader.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            assert [str(m) for m in receiver.peek_messages(5)] == ["dead"]
        with pytest.raises(ServiceBusAuthorizationError):
            with reader.get_queue_receiver("a") as receiver:
                receiver.peek_messages(1)


@pytest.mark.parametrize("case, description", [
    ("wrong key", "InvalidSignature: The token has an invalid signature."),
    ("expired", "ExpiredToken: The token is expired."),
])
def test_a_bad_or_expired_token_is_refused_on_put_token_with_401(emulator, case, description):
    kwargs = {"key": "not-the-key"} if case == "wrong key" else {"lifetime": -5}
    refused_before = emulator.auth_stats("aad-only").get("refused", 0)
    with client(emulator, "reader", **kwargs) as reader:
        with pytest.raises(ServiceBusAuthenticationError) as refused:
            with reader.get_queue_receiver("a") as receiver:
                receiver.peek_messages(1)
    inner = refused.value.inner_exception  # the SDK's TokenAuthFailure keeps the service's answer
    assert inner.status_code == 401 and inner.status_description.decode().startswith(description)
    assert emulator.auth_stats("aad-only")["refused"] > refused_before


def test_shared_access_signatures_are_refused_where_local_auth_is_off(emulator):
    with ServiceBusClient.from_connection_string(emulator.connection_string("aad-only", "Root", "sas-key"),
                                                 retry_total=0) as sas:
        with pytest.raises(ServiceBusAuthenticationError) as refused:
            with sas.get_queue_receiver("a") as receiver:
                receiver.peek_messages(1)
    description = refused.value.inner_exception.status_description.decode()
    assert description.startswith("LocalAuthDisabled: Authorization failed because SAS authentication has been "
                                  "disabled for the namespace.")
    # where local auth stays on, a key still works (with every right), next to Azure AD
    with ServiceBusClient.from_connection_string(emulator.connection_string("both", "Root", "sas-key"),
                                                 retry_total=0) as sas, sas.get_queue_sender("a") as sender:
        sender.send_messages(ServiceBusMessage("by key"))
    with client(emulator, "reader", ns="both") as reader, reader.get_queue_receiver("a") as receiver:
        assert [str(m) for m in receiver.peek_messages(5)] == ["by key"]


def test_a_role_assigned_at_run_time_applies_to_new_links(emulator):
    with client(emulator, "late") as late:
        with pytest.raises(ServiceBusAuthorizationError):
            with late.get_queue_sender("b"):
                pass
        emulator.assign_role("aad-only", "late", SENDER, "b")
        with late.get_queue_sender("b") as sender:
            sender.send_messages(ServiceBusMessage("granted"))


def test_a_link_whose_token_expired_is_refused_until_a_new_token_is_put():
    """The SDK renews tokens before they expire; a client that does not has its sends refused (checked
    with a raw AMQP client, which puts one short-lived token and keeps using the link)."""
    with Emulator(EmulatorConfig.from_dict({"namespaces": [namespace("raw", roles=[("writer", SENDER, "")])]})) as emu:
        connection = BlockingConnection(f"amqp://127.0.0.1:{emu.port('raw')}", allowed_mechs="ANONYMOUS")
        try:
            cbs_in = connection.create_receiver("$cbs", credit=10)
            cbs_out = connection.create_sender("$cbs")

            def put_token(lifetime: float) -> int:
                token = sign_token(KEY, "writer", lifetime_seconds=lifetime)
                request_id = str(uuid.uuid4())
                cbs_out.send(Message(id=request_id, body=token.token, properties={
                    "operation": "put-token", "type": "jwt", "name": f"sb://127.0.0.1:{emu.port('raw')}/a"}))
                reply = cbs_in.receive(timeout=10)
                assert reply.correlation_id == request_id
                return reply.properties["status-code"]

            assert put_token(2) == 200
            sender = connection.create_sender("a")
            sender.send(Message(body="in time"))
            time.sleep(2.5)
            with pytest.raises(SendException) as refused:
                sender.send(Message(body="too late"), timeout=10)
            assert refused.value.state == Delivery.REJECTED
            assert put_token(60) == 200
            sender.send(Message(body="renewed"))  # the same link, with the new token
        finally:
            connection.close()
        assert emu.stats("raw")["a"]["in"] == 2


def test_tokens_are_checked_for_signature_audience_and_expiry():
    token = sign_token(KEY, "p", lifetime_seconds=60, now=1000)
    assert verify_token(KEY, token.token, now=1030).principal == "p"
    for key, now, audience, answer in [("other", 1030, AUDIENCE, "InvalidSignature"),
                                       (KEY, 1061, AUDIENCE, "ExpiredToken"),
                                       (KEY, 1030, "https://storage.azure.com", "InvalidAudience")]:
        candidate = sign_token(KEY, "p", lifetime_seconds=60, now=1000, audience=audience).token
        with pytest.raises(TokenRefused, match=answer):
            verify_token(key, candidate, now=now)


def test_azure_ad_settings_are_validated_and_the_key_masked():
    with pytest.raises(ConfigError, match=r"namespaces\[0\].local_auth: false needs an azure_ad section"):
        EmulatorConfig.from_dict({"namespaces": [{"name": "x", "local_auth": False}]})
    with pytest.raises(ConfigError, match=r"role_assignments\[0\].role: must be one of"):
        EmulatorConfig.from_dict({"namespaces": [{"name": "x", "azure_ad": {
            "signing_key": KEY, "role_assignments": [{"principal": "p", "role": "Owner"}]}}]})
    config = EmulatorConfig.from_dict(CONFIG)
    assert KEY not in repr(config) and KEY not in repr(EmulatorCredential(KEY, "p"))
