"""The administration API's pure parts: routes, durations, documents, shared access signatures, port
resolution, and what is read from broker entities (real ``Entity``/``Topic`` objects, no server)."""
import time
import xml.etree.ElementTree as ET

import pytest

from servicebus_emulator import ConfigError, EmulatorConfig
from servicebus_emulator.__main__ import resolve_admin_ports as cli_admin_ports, resolve_ports
from servicebus_emulator.admin_atom import (ATOM_NS, CONNECT_NS, COUNTS_NS, NEVER, entry_document, feed_document,
                                            iso_duration, not_found_document)
from servicebus_emulator.admin_auth import Unauthenticated, authenticate
from servicebus_emulator.admin_routes import BadRequest, Route, RouteKind, route
from servicebus_emulator.admin_views import EntityKind, queue_view, subscription_view, topic_view
from servicebus_emulator.broker import Entity, Topic
from servicebus_emulator.config import QueueConfig, SubscriptionConfig, TopicConfig
from servicebus_emulator.emulator import resolve_admin_ports
from servicebus_emulator.message import Content
from servicebus_emulator.official_config import native_from_official
from servicebus_emulator import sas

from proton import Message


@pytest.mark.parametrize("target, expected", [
    ("/orders?enrich=false&api-version=2024-05", Route(RouteKind.GET_ENTITY, entity="orders")),
    ("/contoso%2Fx-servicebus-transfer%2F0?api-version=2024-05",
     Route(RouteKind.GET_ENTITY, entity="contoso/x-servicebus-transfer/0")),
    ("/contoso/x-servicebus-transfer/0", Route(RouteKind.GET_ENTITY, entity="contoso/x-servicebus-transfer/0")),
    ("/$Resources/queues?$skip=100&$top=100&api-version=2024-05",
     Route(RouteKind.LIST_ENTITIES, list_kind=EntityKind.QUEUE, skip=100, top=100)),
    ("/$Resources/Topics", Route(RouteKind.LIST_ENTITIES, list_kind=EntityKind.TOPIC)),
    ("/events/subscriptions/eu%20west?enrich=false",
     Route(RouteKind.GET_SUBSCRIPTION, entity="events", subscription="eu west")),
    ("/events/Subscriptions?%24skip=2&%24top=1",
     Route(RouteKind.LIST_SUBSCRIPTIONS, entity="events", skip=2, top=1)),
])
def test_routes_of_the_sdks_paths(target, expected):
    assert route("GET", target) == expected


@pytest.mark.parametrize("method, target, what", [
    ("PUT", "/orders", "creating or updating entities and rules (PUT)"),
    ("DELETE", "/events/subscriptions/all", "deleting subscriptions, rules and namespace resources (DELETE)"),
    ("DELETE", "/$Resources/queues", "deleting subscriptions, rules and namespace resources (DELETE)"),
    ("GET", "/$namespaceinfo", "namespace properties ($namespaceinfo)"),
    ("GET", "/events/subscriptions/all/rules/$Default", "one subscription rule (list them instead)"),
    ("GET", "/$Resources/eventhubs", "listing eventhubs (only $Resources/queues and $Resources/topics)"),
    ("POST", "/orders", "the method POST"),
])
def test_what_is_not_served_is_named(method, target, what):
    assert route(method, target) == Route(RouteKind.UNSUPPORTED, unsupported=what)


def test_a_delete_of_one_entity_names_it_decoded():
    assert route("DELETE", "/contoso%2Fx-servicebus-transfer%2F0?api-version=2021-05") == Route(
        RouteKind.DELETE_ENTITY, entity="contoso/x-servicebus-transfer/0")


def test_a_bad_page_or_no_entity_is_a_bad_request():
    with pytest.raises(BadRequest, match=r"\$top: expected a non-negative integer, got 'ten'"):
        route("GET", "/$Resources/queues?$top=ten")
    with pytest.raises(BadRequest, match=r"\$skip: expected a non-negative integer, got '-1'"):
        route("GET", "/events/subscriptions?$skip=-1")
    with pytest.raises(BadRequest, match="names no entity"):
        route("GET", "/?api-version=2024-05")


@pytest.mark.parametrize("seconds, text", [
    (0, "PT0S"), (30, "PT30S"), (60, "PT1M"), (0.5, "PT0.5S"), (600, "PT10M"), (3600, "PT1H"),
    (86400, "P1D"), (129600, "P1DT12H"), (90061.25, "P1DT1H1M1.25S"), (604800, "P7D"),
])
def test_durations_are_written_as_dotnet_writes_a_timespan(seconds, text):
    assert iso_duration(seconds) == text


def test_entry_and_feed_documents_have_the_services_shape():
    queue = Entity("orders", QueueConfig("orders", lock_duration_seconds=45, duplicate_detection_window_seconds=0))
    doc = ET.fromstring(entry_document(queue_view(queue), "https://127.0.0.1:5300", "contoso"))
    assert doc.tag == f"{{{ATOM_NS}}}entry"
    assert doc.find(f"{{{ATOM_NS}}}title").text == "orders"
    description = doc.find(f"{{{ATOM_NS}}}content/{{{CONNECT_NS}}}QueueDescription")
    texts = {child.tag.split("}")[1]: child.text for child in description}
    assert [tag for tag in texts][:6] == ["LockDuration", "MaxSizeInMegabytes", "RequiresDuplicateDetection",
                                          "RequiresSession", "DefaultMessageTimeToLive",
                                          "DeadLetteringOnMessageExpiration"]
    assert (texts["LockDuration"], texts["RequiresDuplicateDetection"], texts["DuplicateDetectionHistoryTimeWindow"],
            texts["DefaultMessageTimeToLive"], texts["Status"]) == ("PT45S", "false", "PT10M", NEVER, "Active")
    counts = description.find(f"{{{CONNECT_NS}}}CountDetails")
    assert [c.tag for c in counts] == [f"{{{COUNTS_NS}}}{name}" for name in (
        "ActiveMessageCount", "DeadLetterMessageCount", "ScheduledMessageCount", "TransferMessageCount",
        "TransferDeadLetterMessageCount")]
    feed = ET.fromstring(feed_document(EntityKind.QUEUE, [queue_view(queue)], "https://h/$Resources/Queues?a",
                                       "https://h/$Resources/Queues?b", "https://h", "contoso", 0))
    assert [(link.get("rel"), link.get("href")) for link in feed.findall(f"{{{ATOM_NS}}}link")] == [
        ("self", "https://h/$Resources/Queues?a"), ("next", "https://h/$Resources/Queues?b")]
    assert len(feed.findall(f"{{{ATOM_NS}}}entry")) == 1
    missing = ET.fromstring(not_found_document("https://h/nope", 0))
    assert missing.find(f"{{{ATOM_NS}}}title").text == "Publicly Listed Services"
    assert missing.find(f"{{{ATOM_NS}}}entry") is None


def test_names_are_escaped_in_documents():
    queue = Entity("a&b<c>", QueueConfig("a&b<c>"))
    doc = ET.fromstring(entry_document(queue_view(queue), "https://h", "ns&co"))
    assert doc.find(f"{{{ATOM_NS}}}title").text == "a&b<c>"


def _content(body: bytes, **fields) -> Content:
    return Content.parse(Message(body=body, **fields).encode())


def test_views_count_states_and_bytes_and_read_a_status_attribute():
    queue = Entity("q", QueueConfig("q", lock_duration_seconds=30))
    now = int(time.time() * 1000)
    contents = [_content(b"x" * n) for n in (10, 20, 30, 40)]
    msgs = [queue.enqueue(c, seq, now) for seq, c in enumerate(contents, 1)]
    queue.lock(msgs[0], owner=None, now=now)
    queue.defer(queue.locked(queue.lock(msgs[1], owner=None, now=now)))
    queue.dead_letter(msgs[2], "Poison", "bad")
    scheduled = Content.parse(Message(body=b"later", annotations={"x-opt-scheduled-enqueue-time": now + 3600_000})
                              .encode())
    queue.enqueue(scheduled, 5, now)
    view = queue_view(queue)
    assert (view.counts.active, view.counts.dead_letter, view.counts.scheduled, view.counts.total) == (3, 1, 1, 5)
    assert view.size_in_bytes == sum(c.size for c in contents) + scheduled.size
    assert (view.status, view.enable_partitioning) == ("Active", False)
    queue.status = "SendDisabled"         # how an entity that carries a status reports it
    assert queue_view(queue).status == "SendDisabled"


def test_a_topic_counts_each_message_once_and_its_subscriptions_no_scheduled_ones():
    subs = [Entity(f"t/Subscriptions/{n}", SubscriptionConfig(n)) for n in ("a", "b")]
    topic = Topic(TopicConfig("t", subscriptions=tuple(s.settings for s in subs)), subs, {},
                  held_settings=SubscriptionConfig("t"))
    now = int(time.time() * 1000)
    content = _content(b"fan-out")
    later = Content.parse(Message(body=b"later", annotations={"x-opt-scheduled-enqueue-time": now + 3600_000})
                          .encode())
    for sub in subs:
        sub.enqueue(content, 1, now)
    topic.held.enqueue(later, 2, now)  # a scheduled message is in the topic's own log, in no subscription
    view = topic_view(topic)
    assert (view.size_in_bytes, view.counts.scheduled, view.subscription_count) == (content.size + later.size, 1, 2)
    sub_view = subscription_view(topic, subs[0])
    assert (sub_view.name, sub_view.topic, sub_view.path) == ("a", "t", "t/subscriptions/a")
    assert (sub_view.counts.active, sub_view.counts.scheduled, sub_view.counts.total) == (1, 0, 1)


def _signed(key_name: str, key: str, uri="https://127.0.0.1:5300", expiry=None) -> str:
    from azure.servicebus._pyamqp.utils import generate_sas_token
    return generate_sas_token(uri, key_name, key, int(expiry or time.time() + 600))


def test_sas_tokens_are_checked_against_the_keys():
    keys = {"Root": "k1", "ListenOnly": "k2"}
    assert sas.verify(keys, _signed("ListenOnly", "k2")).key_name == "ListenOnly"
    with pytest.raises(sas.SasRefused, match="signature does not match"):
        sas.verify(keys, _signed("Root", "wrong"))
    with pytest.raises(sas.SasRefused, match="unknown SharedAccessKeyName 'Other'"):
        sas.verify(keys, _signed("Other", "k1"))
    with pytest.raises(sas.SasRefused, match="has expired"):
        sas.verify(keys, _signed("Root", "k1", expiry=time.time() - 5))
    assert sas.verify({}, _signed("Anyone", "any")).key_name == "Anyone"


def test_the_caller_is_a_key_with_its_rights_or_a_principal():
    cfg = EmulatorConfig.from_dict({"namespaces": [{"name": "n", "sas_keys": {"Root": "k", "L": "l"},
                                                    "sas_key_rights": {"L": ["Listen"]}}]}).namespaces[0]
    assert authenticate(cfg, _signed("L", "l")).key_rights == {"Listen"}
    assert authenticate(cfg, _signed("Root", "k")).key_rights == {"Send", "Listen", "Manage"}
    with pytest.raises(Unauthenticated, match="missing WRAP authorization credentials"):
        authenticate(cfg, None)
    with pytest.raises(Unauthenticated, match="takes no Azure AD tokens"):
        authenticate(cfg, "Bearer abc")


@pytest.mark.parametrize("rights, message", [
    ({"Other": ["Listen"]}, r"sas_key_rights.Other: not a key of sas_keys \(keys: Root\)"),
    ({"Root": ["Read"]}, r"sas_key_rights.Root: rights must be a non-empty list of Listen, Manage, Send"),
    ({"Root": []}, r"sas_key_rights.Root: rights must be a non-empty list"),
    ({"Root": ["Manage", "Listen"]}, r"sas_key_rights.Root: Manage needs Send and Listen too"),
])
def test_bad_key_rights_name_the_key(rights, message):
    with pytest.raises(ConfigError, match=r"namespaces\[0\]\." + message):
        EmulatorConfig.from_dict({"namespaces": [{"name": "n", "sas_keys": {"Root": "k"}, "sas_key_rights": rights}]})


def test_admin_port_is_validated_and_config_json_takes_5300():
    with pytest.raises(ConfigError, match=r"namespaces\[0\]\.admin_port: must be in 0..65535"):
        EmulatorConfig.from_dict({"namespaces": [{"name": "n", "admin_port": 70000}]})
    doc = {"UserConfig": {"Namespaces": [{"Name": "a"}, {"Name": "b"}]}}
    assert [ns["admin_port"] for ns in native_from_official(doc)["namespaces"]] == [5300, 5301]


def test_admin_ports_follow_the_overrides():
    cfg = EmulatorConfig.from_dict({"namespaces": [{"name": "a", "port": 5672, "admin_port": 5300},
                                                   {"name": "b", "port": 5673, "admin_port": 5301}]})
    assert resolve_admin_ports(cfg, None, None) == {"a": 5300, "b": 5301}
    # a namespace given a free AMQP port gets a free administration port too, unless told otherwise
    assert resolve_admin_ports(cfg, {"a": 0}, None) == {"a": 0, "b": 5301}
    assert resolve_admin_ports(cfg, {"a": 0}, {"a": 6300}) == {"a": 6300, "b": 5301}
    with pytest.raises(KeyError, match="admin_ports: unknown namespace 'c'"):
        resolve_admin_ports(cfg, None, {"c": 1})
    ports = resolve_ports(cfg, 100, environ={"SB_EMULATOR_PORT_B": "0"})
    assert cli_admin_ports(cfg, ports, 100, environ={}) == {"a": 5400, "b": 0}
    assert cli_admin_ports(cfg, ports, 100, environ={"SB_EMULATOR_ADMIN_PORT_A": "7000"})["a"] == 7000
    with pytest.raises(ConfigError, match="SB_EMULATOR_ADMIN_PORT_A: expected a port number, got 'x'"):
        cli_admin_ports(cfg, ports, 0, environ={"SB_EMULATOR_ADMIN_PORT_A": "x"})
