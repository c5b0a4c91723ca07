"""The official emulator's Config.json: settings mapped, rules filtering, what is refused and why."""
import json
import pathlib

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from servicebus_emulator import ConfigError, Emulator, EmulatorConfig, load_config
from servicebus_emulator.official_config import parse_duration

SAMPLE_JSON = pathlib.Path(__file__).resolve().parents[1] / "examples" / "Config.json"
DOCUMENTED_CONNECTION_STRING = ("Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;"
                                "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;")


def _sample():
    return json.loads(SAMPLE_JSON.read_text())


def _error(doc) -> str:
    with pytest.raises(ConfigError) as info:
        EmulatorConfig.from_dict(doc)
    return str(info.value)


def test_sample_namespace_port_and_key():
    (ns,) = load_config(SAMPLE_JSON).namespaces
    assert (ns.name, ns.host, ns.port, ns.latency_ms) == ("sbemulatorns", "127.0.0.1", 5672, 0)
    assert dict(ns.sas_keys) == {"RootManageSharedAccessKey": "SAS_KEY_VALUE"}


def test_queue_settings_are_mapped():
    ns = load_config(SAMPLE_JSON).namespace("sbemulatorns")
    plain, sessions = ns.queues
    assert (plain.name, plain.lock_duration_seconds, plain.max_delivery_count, plain.requires_session,
            plain.duplicate_detection_window_seconds, plain.default_message_ttl_seconds,
            plain.dead_lettering_on_message_expiration) == ("queue.1", 60, 3, False, 0, 3600, False)
    assert (sessions.name, sessions.lock_duration_seconds, sessions.max_delivery_count, sessions.requires_session,
            sessions.duplicate_detection_window_seconds, sessions.default_message_ttl_seconds,
            sessions.dead_lettering_on_message_expiration) == ("queue.sessions", 30, 10, True, 300, 86400, True)


def test_missing_properties_take_the_official_defaults():
    doc = {"UserConfig": {"Namespaces": [{"Name": "ns", "Queues": [{"Name": "q"}],
                                          "Topics": [{"Name": "t", "Subscriptions": [{"Name": "s"}]}]}]}}
    ns = EmulatorConfig.from_dict(doc).namespace("ns")
    for entity in (ns.queues[0], ns.topics[0].subscriptions[0]):
        assert (entity.lock_duration_seconds, entity.max_delivery_count, entity.default_message_ttl_seconds,
                entity.duplicate_detection_window_seconds, entity.requires_session,
                entity.dead_lettering_on_message_expiration) == (60, 3, 3600, 0, False, False)
    assert [r.correlation_filter for r in ns.topics[0].subscriptions[0].rules] == [None]


def test_topic_settings_and_rules_are_mapped():
    (topic,) = load_config(SAMPLE_JSON).namespace("sbemulatorns").topics
    assert topic.name == "topic.1" and topic.duplicate_detection_window_seconds == 0
    rules = {s.name: [(r.name, r.correlation_filter) for r in s.rules] for s in topic.subscriptions}
    assert rules == {
        "subscription.1": [("app-prop-filter-1", {
            "content_type": "application/text", "correlation_id": "id1", "label": "subject1",
            "message_id": "msgid1", "reply_to": "someQueue", "reply_to_session_id": "sessionId",
            "session_id": "session1", "to": "xyz"})],
        # empty fields are not part of the filter
        "subscription.2": [("user-prop-filter-1", {"properties": {"prop3": "value3"}}),
                           ("label-filter", {"label": "urgent"})],
        "subscription.3": [("$Default", None)],
        "subscription.4": [("everything", None)],        # SQL "1=1": a true filter
    }


def test_topic_ttl_caps_its_subscriptions():
    doc = {"UserConfig": {"Namespaces": [{"Name": "ns", "Topics": [{
        "Name": "t", "Properties": {"DefaultMessageTimeToLive": "PT10M"},
        "Subscriptions": [{"Name": "short", "Properties": {"DefaultMessageTimeToLive": "PT5M"}},
                          {"Name": "long", "Properties": {"DefaultMessageTimeToLive": "P1D"}}]}]}]}}
    (topic,) = EmulatorConfig.from_dict(doc).namespace("ns").topics
    assert [s.default_message_ttl_seconds for s in topic.subscriptions] == [300, 600]


def test_namespaces_after_the_first_take_the_following_ports():
    doc = {"UserConfig": {"Namespaces": [{"Name": "one"}, {"Name": "two"}, {"Name": "three"}]},
           "Logging": {"Type": "Console"}}
    assert [ns.port for ns in EmulatorConfig.from_dict(doc).namespaces] == [5672, 5673, 5674]


@pytest.mark.parametrize("text, seconds", [
    ("PT1M", 60), ("PT20S", 20), ("PT1H", 3600), ("P1D", 86400), ("P1DT2H30M", 95400), ("PT0.5S", 0.5),
    ("P1M", 30 * 86400), ("P1Y", 365 * 86400), ("PT1H1M1S", 3661),
])
def test_iso_durations(text, seconds):
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize("bad", ["1 minute", "PT", "P", "pt1m", "PT1M30", "60", "-PT1M", "P1DT", "PT-1M"])
def test_bad_duration_is_refused_with_its_path(bad):
    doc = _sample()
    doc["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"]["LockDuration"] = bad
    message = _error(doc)
    assert message.startswith("UserConfig.Namespaces[0].Queues[0].Properties.LockDuration: ")
    assert repr(bad) in message and "ISO-8601" in message and '"PT30S"' in message


def test_number_where_a_duration_belongs_is_refused():
    doc = _sample()
    doc["UserConfig"]["Namespaces"][0]["Queues"][1]["Properties"]["DefaultMessageTimeToLive"] = 3600
    assert _error(doc).startswith("UserConfig.Namespaces[0].Queues[1].Properties.DefaultMessageTimeToLive: 3600 "
                                  "is not an ISO-8601 duration")


def test_sql_rule_is_refused_naming_the_rule():
    doc = _sample()
    sub = doc["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"][0]
    sub["Rules"].append({"Name": "big-orders", "Properties": {
        "FilterType": "Sql", "SqlFilter": {"SqlExpression": "amount > 100"}}})
    message = _error(doc)
    assert message.startswith("UserConfig.Namespaces[0].Topics[0].Subscriptions[0].Rules[1].Properties.SqlFilter: "
                              "rule 'big-orders' has a SQL filter ('amount > 100')")
    assert 'use "FilterType": "Correlation" with a CorrelationFilter' in message


def test_sql_action_is_refused():
    doc = _sample()
    rule = doc["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"][3]["Rules"][0]
    rule["Properties"]["Action"] = {"SqlExpression": "SET sys.Label = 'x'"}
    assert "rule 'everything' has a SQL action" in _error(doc)


@pytest.mark.parametrize("key", ["ForwardTo", "ForwardDeadLetteredMessagesTo"])
def test_forwarding_is_refused(key):
    doc = _sample()
    doc["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"][key] = "queue.sessions"
    message = _error(doc)
    assert message.startswith(f"UserConfig.Namespaces[0].Queues[0].Properties.{key}: auto-forwarding "
                              f"(to 'queue.sessions') is not supported")


@pytest.mark.parametrize("where, key", [
    (lambda d: d, "Extra"),
    (lambda d: d["UserConfig"], "Entities"),
    (lambda d: d["UserConfig"]["Namespaces"][0], "Port"),
    (lambda d: d["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"], "LockDurationSeconds"),
    (lambda d: d["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"][1]["Rules"][0]["Properties"]
     ["CorrelationFilter"], "Subject"),
    (lambda d: d["UserConfig"]["Logging"], "Level"),
])
def test_unknown_key_is_refused_with_its_path(where, key):
    doc = _sample()
    where(doc)[key] = "x"
    paths = {"Extra": "Extra", "Entities": "UserConfig.Entities", "Port": "UserConfig.Namespaces[0].Port",
             "LockDurationSeconds": "UserConfig.Namespaces[0].Queues[0].Properties.LockDurationSeconds",
             "Subject": "UserConfig.Namespaces[0].Topics[0].Subscriptions[1].Rules[0].Properties."
                        "CorrelationFilter.Subject",
             "Level": "UserConfig.Logging.Level"}
    assert _error(doc).startswith(f"{paths[key]}: unknown key (allowed here: ")


@pytest.mark.parametrize("change, expected", [
    (lambda q: q["Properties"].__setitem__("MaxDeliveryCount", 0),
     "UserConfig.Namespaces[0].Queues[0].Properties.MaxDeliveryCount: must be in 1.."),
    (lambda q: q["Properties"].__setitem__("RequiresSession", "yes"),
     "UserConfig.Namespaces[0].Queues[0].Properties.RequiresSession: expected a JSON boolean"),
    (lambda q: q["Properties"].__setitem__("LockDuration", "PT0S"),
     "UserConfig.Namespaces[0].Queues[0].Properties.LockDuration: must be longer than zero"),
    (lambda q: q.__setitem__("Name", ""), "UserConfig.Namespaces[0].Queues[0].Name: required"),
    (lambda q: q.__setitem__("Name", "QUEUE.SESSIONS"),
     "UserConfig.Namespaces[0]: queue and topic names: 'queue.sessions' appears twice"),
])
def test_bad_queue_values_are_refused(change, expected):
    doc = _sample()
    change(doc["UserConfig"]["Namespaces"][0]["Queues"][0])
    assert _error(doc).startswith(expected)


def test_empty_correlation_filter_is_refused():
    doc = _sample()
    rule = doc["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"][1]["Rules"][1]
    rule["Properties"]["CorrelationFilter"]["Label"] = ""
    assert "rule 'label-filter' has an empty correlation filter" in _error(doc)


def test_json_file_detected_by_content_and_errors_located(tmp_path):
    as_conf = tmp_path / "emulator-settings.conf"          # not named .json: recognised by its "{"
    as_conf.write_text("\ufeff" + SAMPLE_JSON.read_text(), encoding="utf-8")   # with a BOM, as Windows saves it
    assert load_config(as_conf).namespace("sbemulatorns").queues[0].name == "queue.1"
    broken = tmp_path / "Config.json"
    broken.write_text('{"UserConfig": {"Namespaces": [}}\n')
    with pytest.raises(ConfigError, match=r"Config\.json: invalid JSON: .* at line 1 column 32"):
        load_config(broken)


def test_source_file_prefixes_the_error(tmp_path):
    doc = _sample()
    doc["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"]["LockDuration"] = "soon"
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=rf"^{path}: UserConfig\.Namespaces\[0\]\.Queues\[0\]\.Properties\."
                                          rf"LockDuration: 'soon' is not an ISO-8601 duration"):
        load_config(path)


# ---- against the SDK ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def official():
    with Emulator(load_config(SAMPLE_JSON), ports={"sbemulatorns": 0}) as emu:
        yield emu


def test_documented_connection_string_works_with_the_port(official):
    assert official.connection_string("sbemulatorns") == (
        f"Endpoint=sb://127.0.0.1:{official.port('sbemulatorns')};SharedAccessKeyName=RootManageSharedAccessKey;"
        f"SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true")
    conn = DOCUMENTED_CONNECTION_STRING.replace("sb://localhost;", f"sb://localhost:{official.port('sbemulatorns')};")
    with ServiceBusClient.from_connection_string(conn, retry_total=0) as client:
        with client.get_queue_sender("queue.1") as sender:
            sender.send_messages(ServiceBusMessage("hello"))
        with client.get_queue_receiver("queue.1") as receiver:
            (m,) = receiver.receive_messages(max_wait_time=5)
            assert str(m) == "hello"
            receiver.complete_message(m)


def test_session_queue_from_config_json_requires_sessions(official):
    with ServiceBusClient.from_connection_string(official.connection_string("sbemulatorns"), retry_total=0) as c:
        with c.get_queue_sender("queue.sessions") as sender:
            with pytest.raises(ServiceBusError):
                sender.send_messages(ServiceBusMessage("no session"))
            sender.send_messages(ServiceBusMessage("in a session", session_id="s-1"))
        with c.get_queue_receiver("queue.sessions", session_id="s-1") as receiver:
            (m,) = receiver.receive_messages(max_wait_time=5)
            assert str(m) == "in a session"
            receiver.complete_message(m)


def test_topic_rules_filter_the_subscriptions(official):
    every_field = dict(content_type="application/text", correlation_id="id1", subject="subject1",
                       message_id="msgid1", reply_to="someQueue", reply_to_session_id="sessionId",
                       session_id="session1", to="xyz")
    almost = {**every_field, "to": "abc"}                                 # one field off: no match
    messages = [
        ServiceBusMessage("all-fields", **every_field),
        ServiceBusMessage("almost", **almost),
        ServiceBusMessage("prop3", application_properties={"prop3": "value3"}),
        ServiceBusMessage("prop3-other", application_properties={"prop3": "other"}),
        ServiceBusMessage("urgent", subject="urgent"),
    ]
    with ServiceBusClient.from_connection_string(official.connection_string("sbemulatorns"), retry_total=0) as c:
        with c.get_topic_sender("topic.1") as sender:
            sender.send_messages(messages)
        got = {}
        for sub in ("subscription.1", "subscription.2", "subscription.3", "subscription.4"):
            with c.get_subscription_receiver("topic.1", sub) as receiver:
                got[sub] = [str(m) for m in receiver.peek_messages(max_message_count=10)]
    everything = ["all-fields", "almost", "prop3", "prop3-other", "urgent"]
    assert got == {"subscription.1": ["all-fields"],
                   "subscription.2": ["prop3", "urgent"],            # either rule
                   "subscription.3": everything,                     # no rules: $Default
                   "subscription.4": everything}                     # SQL 1=1
