"""The project's emulator configuration (conf/emulator.yaml): the two namespaces the syphon runs against."""
from pathlib import Path

from servicebus_emulator import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_project_config_has_both_namespaces():
    cfg = load_config(ROOT / "conf" / "emulator.yaml")
    primary, secondary = cfg.namespace("contoso"), cfg.namespace("contoso-secondary")
    assert (primary.port, secondary.port) == (5672, 5673)
    assert (primary.latency_ms, secondary.latency_ms) == (0, 0)
    assert {q.name for q in primary.queues} >= {"orders", "payments", "sessions-orders", "small"}
    assert next(q for q in primary.queues if q.name == "sessions-orders").requires_session
    assert next(q for q in primary.queues if q.name == "small").max_message_size_kb == 64
    partitioned = {q.name: (q.enable_partitioning, q.duplicate_detection_window_seconds) for q in primary.queues
                   if q.enable_partitioning}
    assert partitioned == {"partitioned-orders": (True, 0), "partitioned-dedupe-orders": (True, 600)}
    (events,) = primary.topics
    assert {s.name: [r.correlation_filter for r in s.rules] for s in events.subscriptions} == {
        "all": [None], "eu": [{"properties": {"region": "eu"}}]}
    backlog = [q for q in secondary.queues if q.name.startswith("contoso/x-servicebus-transfer/")]
    assert [q.name for q in backlog] == [f"contoso/x-servicebus-transfer/{i}" for i in range(10)]
    for q in backlog:
        assert (q.lock_duration_seconds, q.max_delivery_count, q.dead_lettering_on_message_expiration,
                q.requires_session) == (60, 2147483647, True, False)


def test_the_azure_ad_config_has_the_same_entities_with_keys_refused_and_least_roles():
    plain, aad = load_config(ROOT / "conf" / "emulator.yaml"), load_config(ROOT / "conf" / "emulator-azure-ad.yaml")
    for ours, theirs in zip(aad.namespaces, plain.namespaces):
        assert (ours.name, ours.port, ours.queues, ours.topics) == (theirs.name, theirs.port, theirs.queues, theirs.topics)
        assert ours.local_auth is False and ours.azure_ad is not None
    roles = {ns.name: {(a.principal, a.role, a.scope) for a in ns.azure_ad.role_assignments} for ns in aad.namespaces}
    assert ("backlog-syphon", "Azure Service Bus Data Sender", "") in roles["contoso"]
    assert ("backlog-syphon", "Azure Service Bus Data Receiver", "") in roles["contoso-secondary"]
