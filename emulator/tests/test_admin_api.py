"""The administration API with the unmodified ``ServiceBusAdministrationClient`` over HTTPS: properties and
runtime counts of queues, topics and subscriptions against messages sent, dead-lettered, deferred and
scheduled with the AMQP SDK; paging; missing entities; the service's 401 for a key without Manage or a
principal without Data Owner; per-key rights on AMQP; the certificate trusted through ``connection_verify``."""
import datetime
import http.client
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid

import pytest
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError, \
    ServiceRequestError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus._base_handler import ServiceBusSharedKeyCredential
from azure.servicebus.exceptions import ServiceBusAuthorizationError
from azure.servicebus.management import ServiceBusAdministrationClient
from proton import Message
from proton.utils import BlockingConnection

from servicebus_emulator import Emulator, EmulatorConfig
from servicebus_emulator.aad import EmulatorCredential

ROOT, ROOT_KEY = "RootManageSharedAccessKey", "admin-test-key"
SIGNING_KEY = "admin-test-signing-key"
OWNER, SENDER, RECEIVER = ("Azure Service Bus Data Owner", "Azure Service Bus Data Sender",
                           "Azure Service Bus Data Receiver")
MANAGE_CLAIMS = "Manage,EntityRead claims required for this operation."
NEVER = datetime.timedelta(days=10675199, seconds=10085, microseconds=477581)   # TimeSpan.MaxValue, as parsed

CONFIG = {"namespaces": [
    {"name": "contoso", "port": 0,
     "sas_keys": {ROOT: ROOT_KEY, "ListenOnly": "listen-key", "SendOnly": "send-key"},
     "sas_key_rights": {"ListenOnly": ["Listen"], "SendOnly": ["Send"]},
     "queues": [
         {"name": "orders", "lock_duration_seconds": 45, "max_delivery_count": 7,
          "duplicate_detection_window_seconds": 600, "default_message_ttl_seconds": 3600,
          "dead_lettering_on_message_expiration": True, "max_message_size_kb": 1024},
         {"name": "plain"},
         {"name": "sessions-orders", "requires_session": True},
         {"name": "contoso/x-servicebus-transfer/0"}],
     "topics": [{"name": "events", "max_message_size_kb": 512, "duplicate_detection_window_seconds": 120,
                 "subscriptions": [
                     {"name": "all", "lock_duration_seconds": 20, "max_delivery_count": 4,
                      "default_message_ttl_seconds": 86400, "dead_lettering_on_message_expiration": True},
                     {"name": "eu", "correlation_filter": {"properties": {"region": "eu"}},
                      "requires_session": True}]}]},
    {"name": "paging", "port": 0, "sas_keys": {ROOT: ROOT_KEY},
     "topics": [{"name": f"topic-{i}", "subscriptions": [{"name": "s1"}, {"name": "s2"}, {"name": "s3"}]}
                for i in (2, 0, 1)]},
    {"name": "open", "port": 0, "queues": [{"name": "sizes"}]},           # no keys: raw AMQP clients may send
    {"name": "aad", "port": 0, "local_auth": False, "sas_keys": {ROOT: ROOT_KEY},
     "azure_ad": {"signing_key": SIGNING_KEY, "role_assignments": [
         {"principal": "owner", "role": OWNER},
         {"principal": "orders-owner", "role": OWNER, "scope": "orders"},
         {"principal": "events-owner", "role": OWNER, "scope": "events"},
         {"principal": "reader", "role": RECEIVER},
         {"principal": "writer", "role": SENDER}]},
     "queues": [{"name": "orders"}, {"name": "payments"}],
     "topics": [{"name": "events", "subscriptions": [{"name": "all"}]}]},
]}


@pytest.fixture(scope="module")
def emulator():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emu:
        yield emu


def admin_client(emu, namespace="contoso", key_name=ROOT, key=ROOT_KEY):
    # retry_total=0: a refusal surfaces at once instead of after azure-core's retries
    return ServiceBusAdministrationClient.from_connection_string(
        emu.admin_connection_string(namespace, key_name, key), connection_verify=emu.ca_file, retry_total=0)


@pytest.fixture(scope="module")
def admin(emulator):
    with admin_client(emulator) as client:
        yield client


@pytest.fixture(scope="module")
def client(emulator):
    with ServiceBusClient.from_connection_string(emulator.connection_string("contoso"), retry_total=0) as c:
        yield c


def new_queue(emulator, **settings):
    name = f"q-{uuid.uuid4().hex[:8]}"
    emulator.add_queue("contoso", name, **settings)
    return name


def test_queue_properties_are_the_configured_settings(admin):
    orders = admin.get_queue("orders")
    assert (orders.name, orders.lock_duration, orders.max_delivery_count) == (
        "orders", datetime.timedelta(seconds=45), 7)
    assert (orders.requires_duplicate_detection, orders.duplicate_detection_history_time_window) == (
        True, datetime.timedelta(minutes=10))
    assert (orders.default_message_time_to_live, orders.dead_lettering_on_message_expiration) == (
        datetime.timedelta(hours=1), True)
    assert (orders.max_message_size_in_kilobytes, orders.max_size_in_megabytes, orders.enable_partitioning) == (
        1024, 1024, False)
    assert (orders.status, orders.availability_status, orders.requires_session) == ("Active", "Available", False)
    plain = admin.get_queue("plain")      # the defaults, as the service reports an entity that has them
    assert (plain.lock_duration, plain.max_delivery_count, plain.requires_duplicate_detection,
            plain.duplicate_detection_history_time_window, plain.default_message_time_to_live,
            plain.auto_delete_on_idle, plain.max_message_size_in_kilobytes) == (
        datetime.timedelta(minutes=1), 10, False, datetime.timedelta(minutes=10), NEVER, NEVER, 256)
    assert admin.get_queue("sessions-orders").requires_session is True
    assert admin.get_queue("contoso/x-servicebus-transfer/0").name == "contoso/x-servicebus-transfer/0"


def test_runtime_counts_follow_sends_locks_deferrals_dead_letters_and_schedules(emulator, admin, client):
    queue = new_queue(emulator, lock_duration_seconds=30)
    before = admin.get_queue_runtime_properties(queue)
    assert (before.active_message_count, before.total_message_count, before.size_in_bytes) == (0, 0, 0)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
        sender.schedule_messages([ServiceBusMessage("later-1"), ServiceBusMessage("later-2")],
                                 datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    with client.get_queue_receiver(queue) as receiver:
        first, second, third = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        receiver.dead_letter_message(first, reason="Poison", error_description="bad")
        receiver.defer_message(second)
        held = admin.get_queue_runtime_properties(queue)        # `third` is still locked: it counts as active
        assert (held.active_message_count, held.dead_letter_message_count, held.scheduled_message_count,
                held.transfer_message_count, held.transfer_dead_letter_message_count,
                held.total_message_count) == (5, 1, 2, 0, 0, 8)
        receiver.complete_message(third)
    after = admin.get_queue_runtime_properties(queue)
    assert (after.active_message_count, after.dead_letter_message_count, after.scheduled_message_count,
            after.total_message_count) == (4, 1, 2, 7)
    assert after.size_in_bytes > 0 and after.created_at_utc == before.created_at_utc
    assert before.created_at_utc <= before.accessed_at_utc < after.accessed_at_utc
    assert after.updated_at_utc == after.created_at_utc
    (listed,) = [q for q in admin.list_queues_runtime_properties() if q.name == queue]
    assert (listed.active_message_count, listed.dead_letter_message_count, listed.total_message_count) == (4, 1, 7)


def test_size_in_bytes_is_the_messages_as_sent(emulator):
    bodies = [Message(body=b"x" * n, id=f"m{n}") for n in (100, 2000, 30000)]
    conn = BlockingConnection(f"amqp://127.0.0.1:{emulator.port('open')}", allowed_mechs="ANONYMOUS", timeout=10)
    try:
        sender = conn.create_sender("sizes")
        for message in bodies:
            sender.send(message)
    finally:
        conn.close()
    with admin_client(emulator, "open", "anyone", "any-key") as admin:    # a namespace without keys takes any
        sizes = admin.get_queue_runtime_properties("sizes")
        assert (sizes.active_message_count, sizes.size_in_bytes) == (3, sum(len(m.encode()) for m in bodies))
        with ServiceBusClient.from_connection_string(emulator.connection_string("open"), retry_total=0) as c, \
                c.get_queue_receiver("sizes") as receiver:
            (smallest,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.complete_message(smallest)
        assert admin.get_queue_runtime_properties("sizes").size_in_bytes == sum(len(m.encode()) for m in bodies[1:])


def test_lists_page_with_skip_and_top_in_name_order(emulator):
    names = [f"page-{i:03d}" for i in range(105)]
    for name in reversed(names):
        emulator.add_queue("paging", name)
    with admin_client(emulator, "paging") as admin:
        pages = [[q.name for q in page] for page in admin.list_queues().by_page()]     # the SDK's 100 a page
        assert [len(p) for p in pages] == [100, 5] and sum(pages, []) == names
        pages = [[q.name for q in page] for page in admin.list_queues_runtime_properties(max_page_size=40).by_page()]
        assert [len(p) for p in pages] == [40, 40, 25] and sum(pages, []) == names
        pages = [[t.name for t in page] for page in admin.list_topics(max_page_size=2).by_page()]
        assert pages == [["topic-0", "topic-1"], ["topic-2"]]
        assert [t.subscription_count for t in admin.list_topics_runtime_properties()] == [3, 3, 3]
        pages = [[s.name for s in page] for page in admin.list_subscriptions("topic-1", max_page_size=2).by_page()]
        assert pages == [["s1", "s2"], ["s3"]]
        assert [s.name for s in admin.list_subscriptions_runtime_properties("topic-2")] == ["s1", "s2", "s3"]


def test_topic_and_subscription_properties_and_counts(admin, client):
    topic = admin.get_topic("events")
    assert (topic.name, topic.max_message_size_in_kilobytes, topic.requires_duplicate_detection,
            topic.duplicate_detection_history_time_window, topic.enable_partitioning, topic.status,
            topic.default_message_time_to_live) == ("events", 512, True, datetime.timedelta(minutes=2), False,
                                                    "Active", NEVER)
    all_ = admin.get_subscription("events", "all")
    assert (all_.name, all_.lock_duration, all_.max_delivery_count, all_.default_message_time_to_live,
            all_.dead_lettering_on_message_expiration, all_.requires_session, all_.status) == (
        "all", datetime.timedelta(seconds=20), 4, datetime.timedelta(days=1), True, False, "Active")
    assert admin.get_subscription("events", "eu").requires_session is True
    assert [s.name for s in admin.list_subscriptions("events")] == ["all", "eu"]
    with client.get_topic_sender("events") as sender:
        sender.send_messages([ServiceBusMessage("eu-1", application_properties={"region": "eu"}, session_id="s"),
                              ServiceBusMessage("us-1", application_properties={"region": "us"})])
        sender.schedule_messages(ServiceBusMessage("later", application_properties={"region": "eu"}, session_id="s"),
                                 datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    with client.get_subscription_receiver("events", "all") as receiver:
        (us,) = [m for m in receiver.receive_messages(max_message_count=2, max_wait_time=5) if str(m) == "us-1"]
        receiver.dead_letter_message(us, reason="NotForUs")
    all_counts = admin.get_subscription_runtime_properties("events", "all")
    assert (all_counts.active_message_count, all_counts.dead_letter_message_count,
            all_counts.total_message_count) == (1, 1, 2)      # the lock on eu-1 ended with its receiver
    eu_counts = admin.get_subscription_runtime_properties("events", "eu")
    assert (eu_counts.active_message_count, eu_counts.dead_letter_message_count, eu_counts.total_message_count) == (
        1, 0, 1)
    events = admin.get_topic_runtime_properties("events")
    assert (events.subscription_count, events.scheduled_message_count) == (2, 1)   # each message once
    assert events.size_in_bytes > 0 and events.accessed_at_utc >= events.created_at_utc


def test_a_missing_entity_is_not_found(admin):
    for call in (lambda: admin.get_queue("nope"), lambda: admin.get_queue_runtime_properties("nope"),
                 lambda: admin.get_topic("nope"), lambda: admin.get_topic_runtime_properties("nope"),
                 lambda: admin.get_subscription("events", "nope"), lambda: admin.get_subscription("nope", "all"),
                 lambda: admin.get_subscription_runtime_properties("events", "nope")):
        with pytest.raises(ResourceNotFoundError, match="does not exist"):
            call()
    assert list(admin.list_subscriptions("nope")) == []


@pytest.mark.parametrize("key_name, key", [("ListenOnly", "listen-key"), ("SendOnly", "send-key")])
def test_a_key_without_manage_gets_the_services_401(emulator, key_name, key):
    port = emulator.admin_port("contoso")
    with admin_client(emulator, "contoso", key_name, key) as admin:
        for call in (lambda: admin.get_queue("orders"), lambda: admin.get_queue_runtime_properties("orders"),
                     lambda: list(admin.list_queues()), lambda: admin.get_topic("events"),
                     lambda: list(admin.list_topics_runtime_properties())):
            with pytest.raises(ClientAuthenticationError) as refused:
                call()
            assert refused.value.status_code == 401 and MANAGE_CLAIMS in refused.value.response.text()
        with pytest.raises(ClientAuthenticationError) as refused:
            admin.get_subscription("events", "all")
        assert refused.value.status_code == 401 and refused.value.reason.startswith(
            "SubCode=40100: Unauthorized : Unauthorized access for 'GetSubscription' operation on endpoint "
            f"'sb://127.0.0.1:{port}/events/subscriptions/all?")
        with pytest.raises(ClientAuthenticationError) as refused:
            list(admin.list_subscriptions("events"))
        assert "Unauthorized access for 'EnumerateSubscriptions' operation" in refused.value.reason
        # as on Azure: a queue or topic that does not exist is not found whatever the key may do
        with pytest.raises(ResourceNotFoundError):
            admin.get_queue("nope")


def test_a_wrong_key_or_no_credential_is_refused(emulator):
    for key_name, key, text in ((ROOT, "wrong", "the SAS signature does not match the configured key"),
                                ("Nobody", ROOT_KEY, "unknown SharedAccessKeyName 'Nobody'")):
        with admin_client(emulator, "contoso", key_name, key) as admin, \
                pytest.raises(ClientAuthenticationError) as refused:
            admin.get_queue("orders")
        assert refused.value.status_code == 401 and text in refused.value.response.text()
    https = http.client.HTTPSConnection("127.0.0.1", emulator.admin_port("contoso"), timeout=10,
                                        context=ssl.create_default_context(cafile=emulator.ca_file))
    try:
        https.request("GET", "/orders?api-version=2024-05")
        answer = https.getresponse()
        body = answer.read().decode()
    finally:
        https.close()
    assert answer.status == 401 and body.startswith("<Error><Code>401</Code><Detail>MalformedToken: Invalid "
                                                    "authorization header: The request is missing WRAP")


def test_key_rights_hold_on_amqp_too(emulator):
    queue = new_queue(emulator)
    with ServiceBusClient.from_connection_string(emulator.connection_string("contoso", "ListenOnly", "listen-key"),
                                                 retry_total=0) as listen_only:
        with pytest.raises(ServiceBusAuthorizationError, match=r"'Send' claim\(s\) are required to perform this "
                                                               r"operation"):
            with listen_only.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage("no"))
        with ServiceBusClient.from_connection_string(
                emulator.connection_string("contoso", "SendOnly", "send-key"), retry_total=0) as send_only:
            with send_only.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage("yes"))
            with pytest.raises(ServiceBusAuthorizationError, match=r"'Listen' claim\(s\) are required"):
                with send_only.get_queue_receiver(queue) as receiver:
                    receiver.peek_messages(1)
        with listen_only.get_queue_receiver(queue) as receiver:
            assert [str(m) for m in receiver.peek_messages(5)] == ["yes"]


def aad_admin(emu, principal, lifetime=3600):
    return ServiceBusAdministrationClient(emu.admin_endpoint("aad"),
                                          EmulatorCredential(SIGNING_KEY, principal, lifetime_seconds=lifetime),
                                          connection_verify=emu.ca_file, retry_total=0)


def test_azure_ad_data_owner_reads_entities_and_other_roles_are_refused(emulator):
    with aad_admin(emulator, "owner") as owner:
        assert [q.name for q in owner.list_queues()] == ["orders", "payments"]
        assert owner.get_queue_runtime_properties("payments").total_message_count == 0
        assert owner.get_subscription("events", "all").name == "all"
    with aad_admin(emulator, "orders-owner") as orders_owner:
        assert orders_owner.get_queue("orders").name == "orders"      # Data Owner of that queue only
        for call in (lambda: orders_owner.get_queue("payments"), lambda: list(orders_owner.list_queues())):
            with pytest.raises(ClientAuthenticationError) as refused:
                call()
            assert refused.value.status_code == 401 and MANAGE_CLAIMS in refused.value.response.text()
    with aad_admin(emulator, "events-owner") as events_owner:    # a topic's role covers its subscriptions
        assert [s.name for s in events_owner.list_subscriptions("events")] == ["all"]
    for principal in ("reader", "writer", "stranger"):
        with aad_admin(emulator, principal) as other, pytest.raises(ClientAuthenticationError) as refused:
            other.get_queue("orders")
        assert refused.value.status_code == 401
    emulator.assign_role("aad", "stranger", OWNER)                # az role assignment create, at run time
    with aad_admin(emulator, "stranger") as stranger:
        assert stranger.get_topic("events").name == "events"
    with aad_admin(emulator, "owner", lifetime=-10) as expired, pytest.raises(ClientAuthenticationError) as refused:
        expired.get_queue("orders")
    assert "ExpiredToken: The token is expired." in refused.value.response.text()
    with admin_client(emulator, "aad") as keyed, pytest.raises(ClientAuthenticationError) as refused:
        keyed.get_queue("orders")                                  # local_auth: false refuses keys
    assert "LocalAuthDisabled" in refused.value.response.text()


def test_the_certificate_is_trusted_through_connection_verify(emulator):
    endpoint = emulator.admin_endpoint("contoso")
    credential = ServiceBusSharedKeyCredential(ROOT, ROOT_KEY)
    with ServiceBusAdministrationClient(endpoint, credential, retry_total=0) as untrusting, \
            pytest.raises(ServiceRequestError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusting.get_queue("orders")
    with ServiceBusAdministrationClient(endpoint, credential, connection_verify=emulator.ca_file,
                                        retry_total=0) as trusting:          # the constructor form
        assert trusting.get_queue("orders").name == "orders"
    localhost = f"localhost:{emulator.admin_port('contoso')}"          # a DNS name of the certificate too
    with ServiceBusAdministrationClient(localhost, credential, connection_verify=emulator.ca_file,
                                        retry_total=0) as by_name:
        assert by_name.get_topic("events").name == "events"
    context = ssl.create_default_context(cafile=emulator.ca_file)
    with context.wrap_socket(socket.create_connection(("127.0.0.1", emulator.admin_port("contoso"))),
                             server_hostname="127.0.0.1") as tls:
        names = tls.getpeercert()["subjectAltName"]
    assert {("IP Address", "127.0.0.1"), ("DNS", "localhost")} <= set(names)


def test_a_subscriptions_rules_are_listed_with_their_correlation_filters_or_a_true_filter(admin):
    """``list_rules`` reads each rule's filter: a correlation filter with its properties (and their types) and
    system fields, or a true filter (1=1) for a subscription without one; the migration mode reads them to check
    that the target subscriptions select on a property before it sends by property."""
    from azure.servicebus.management import CorrelationRuleFilter, TrueRuleFilter

    (default,) = admin.list_rules("events", "all")
    assert (default.name, type(default.filter), default.filter.sql_expression) == ("$Default", TrueRuleFilter, "1=1")
    (eu,) = admin.list_rules("events", "eu")
    assert isinstance(eu.filter, CorrelationRuleFilter) and dict(eu.filter.properties) == {"region": "eu"}
    assert list(admin.list_rules("events", "nope")) == []  # a subscription that does not exist: an empty feed


def test_what_is_not_served_answers_501_naming_it(admin):
    for call, what in ((lambda: admin.create_queue("new-queue"), "creating or updating entities and rules (PUT)"),
                       (lambda: admin.delete_subscription("events", "all"),
                        "deleting subscriptions, rules and namespace resources (DELETE)"),
                       (lambda: admin.delete_topic("events"), "deleting topics"),
                       (lambda: admin.get_namespace_properties(), "namespace properties ($namespaceinfo)"),
                       (lambda: admin.get_rule("events", "all", "$Default"),
                        "one subscription rule (list them instead)")):
        with pytest.raises(HttpResponseError) as refused:
            call()
        assert refused.value.status_code == 501
        assert f"The emulator's administration API does not serve {what}." in str(refused.value)
    assert admin.get_queue("orders").name == "orders"


def test_deleting_a_queue_takes_manage_and_removes_it_with_its_dead_letters():
    """As on Azure: a key with Manage, or Data Owner on the namespace or the queue, may delete it (with its
    dead-letter queue and messages); a Listen or Send key, Data Receiver or a Data Owner of another queue gets
    the 401 and nothing changes; a queue that is not there is a 404."""
    config = EmulatorConfig.from_dict({"namespaces": [
        {"name": "keys", "port": 0, "sas_keys": {ROOT: ROOT_KEY, "ListenOnly": "listen-key"},
         "sas_key_rights": {"ListenOnly": ["Listen"]}, "queues": [{"name": "q0"}, {"name": "q1"}]},
        {"name": "aad", "port": 0, "local_auth": False, "azure_ad": {"signing_key": SIGNING_KEY, "role_assignments": [
            {"principal": "reader", "role": RECEIVER}, {"principal": "q1-owner", "role": OWNER, "scope": "q1"},
            {"principal": "owner", "role": OWNER}]},
         "queues": [{"name": "q0"}, {"name": "q1"}]}]})
    with Emulator(config) as emu:
        with ServiceBusClient.from_connection_string(emu.connection_string("keys", ROOT, ROOT_KEY)) as client:
            with client.get_queue_sender("q0") as sender:
                sender.send_messages([ServiceBusMessage(b"kept"), ServiceBusMessage(b"dead")])
            with client.get_queue_receiver("q0", max_wait_time=5) as receiver:
                [first] = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                receiver.dead_letter_message(first, reason="test")
        with admin_client(emu, "keys", "ListenOnly", "listen-key") as listen_only, \
                pytest.raises(ClientAuthenticationError) as refused:
            listen_only.delete_queue("q0")
        assert refused.value.status_code == 401 and MANAGE_CLAIMS in refused.value.response.text()
        with admin_client(emu, "keys") as root:
            counts = root.get_queue_runtime_properties("q0")
            assert (counts.active_message_count, counts.dead_letter_message_count) == (1, 1)
            root.delete_queue("q0")
            assert [q.name for q in root.list_queues()] == ["q1"]
            with pytest.raises(ResourceNotFoundError):
                root.delete_queue("q0")
        for principal in ("reader", "q1-owner"):
            with aad_admin(emu, principal) as other, pytest.raises(ClientAuthenticationError) as refused:
                other.delete_queue("q0")
            assert refused.value.status_code == 401
        with aad_admin(emu, "q1-owner") as q1_owner:
            q1_owner.delete_queue("q1")                               # Data Owner of that queue only
        with aad_admin(emu, "owner") as owner:
            assert [q.name for q in owner.list_queues()] == ["q0"]
            owner.delete_queue("q0")
            assert list(owner.list_queues()) == []


def test_each_answer_takes_the_namespaces_round_trip():
    config = EmulatorConfig.from_dict({"namespaces": [{"name": "far", "port": 0, "queues": [{"name": "q"}]}]})
    with Emulator(config, latency_ms=150) as emu, admin_client(emu, "far", "k", "v") as admin:
        admin.get_queue("q")                                   # the connection and TLS handshake, once
        started = time.monotonic()
        assert admin.get_queue("q").name == "q"
        assert time.monotonic() - started >= 0.15


def test_cli_serves_the_administration_api_with_its_certificate(tmp_path):
    sample = pathlib.Path(__file__).resolve().parents[1] / "examples" / "emulator.yaml"
    ready, tls_dir = tmp_path / "ready.json", tmp_path / "tls"
    env = dict(os.environ, PYTHONPATH=str(sample.parents[1] / "src"),
               SB_EMULATOR_PORT_CONTOSO="0", SB_EMULATOR_PORT_CONTOSO_DR="0")   # free ports, admin ones too
    proc = subprocess.Popen([sys.executable, "-m", "servicebus_emulator", "--config", str(sample), "--ready-file",
                             str(ready), "--tls-dir", str(tls_dir)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ready.exists()
        banner = [proc.stdout.readline().strip() for _ in range(7)]    # printed before the ready file
        admin_lines = [line for line in banner if " administration API on https://127.0.0.1:" in line]
        assert [line.split()[2] for line in admin_lines] == ["contoso", "contoso-dr"]
        tls_lines = [line for line in banner if " AMQP over TLS on sb://127.0.0.1:" in line]
        assert [line.split()[2] for line in tls_lines] == ["contoso", "contoso-dr"]
        assert banner[-1] == (f"servicebus-emulator: certificate authority {tls_dir / 'ca.pem'} (of the administration "
                              f"API and AMQP over TLS and WebSockets: a client passes it as connection_verify)")
        endpoint = admin_lines[0].rsplit("https://", 1)[1]
        assert endpoint.split(":")[1] not in ("5300", "5301")
        with ServiceBusAdministrationClient(endpoint, ServiceBusSharedKeyCredential(ROOT, "local-emulator-key"),
                                            connection_verify=str(tls_dir / "ca.pem"), retry_total=0) as admin:
            assert [q.name for q in admin.list_queues()] == ["orders", "sessions-orders"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert oct((tls_dir / "server-key.pem").stat().st_mode & 0o777) == "0o600"
