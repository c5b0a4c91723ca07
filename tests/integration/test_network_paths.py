"""The network a deployment has, end to end (emulator, the unmodified SDK, real Spark and Delta): AMQP over
WebSockets on the emulator's "443" through a real HTTP CONNECT proxy (proxy.py, with basic credentials) with
Azure AD, and AMQP over TLS on its "5671" with keys; certificates checked against the emulator's authority
(``ca_file``), every connection on the transport configured.

- Over WebSockets through the proxy, Azure AD: the dry run names a destination the job may not send to and
  no secret shows (the proxy's password neither); one available-now run drains a realistic backlog
  (sessions, a topic), a partitioned destination and poison messages (dead-lettered by the purge's bulk
  settlement on ``$management``), and dead-letters the refused destination's messages naming the role; once
  Send is granted, a re-drive delivers them. Every connection of the syphon went through the proxy, none to
  a plain or TLS port; the administration reads (HTTPS) too.
- Over TLS with keys: a run drains a backlog with sessions, every connection on the TLS port.

The kill and rerun over WebSockets is ``test_crash_replay``'s (its job runs over WebSockets); what an operator
sees when a certificate, a host name, a proxy or a port is wrong is ``test_network_failures``'.
"""

from __future__ import annotations

import collections
import re

from backlog_syphon.config import load_config
from backlog_syphon.model import Outcome, ReasonCode
from backlog_syphon.run.dry_run import dry_run
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.servicebus.peek import peek_counts
from backlog_syphon.source.data_source import SOURCE_NAME, BacklogDataSource, backlog_source_options
from backlog_syphon.storage import delta
from tools.backlog_writer import OriginalMessage, poison_backlog, realistic_backlog, send_legacy_backlog
from tools.http_proxy import HttpProxy
from tools.testing import backlog_dead_letters, drain_destinations, expected_arrivals

from .conftest import PRIMARY, ROOT, SECONDARY, make_config
from .test_azure_ad import SENDER, SIGNING_KEY, SYPHON, aad_emulator, assert_no_secret, tooling

BACKLOG = [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(10)]
DESTINATIONS = ["orders", "payments", "sessions-orders", "events/all", "events/eu"]
PARTITIONED = "partitioned-orders"
WEBSOCKETS = "amqp-websockets"
PROXY_USER, PROXY_PASSWORD = "syphon-egress", "proxy-password-4-tests"


def websocket_config(emulator, proxy, tmp_path, **overrides):
    """conf/local-azure-ad.yaml over WebSockets through ``proxy``: the namespaces by their host (as on Azure),
    the emulator's WebSocket port as the custom endpoint, its authority trusted; the proxy's password from the
    environment."""
    settings = {"storage.audit_table": str(tmp_path / "audit"), "storage.checkpoint_table": str(tmp_path / "checkpoint"),
                "storage.checkpoint_location": str(tmp_path / "checkpoint-stream")}
    environ = {"SB_EMULATOR_SIGNING_KEY": SIGNING_KEY, "EGRESS_PROXY_PASSWORD": PROXY_PASSWORD}
    for role, namespace in (("primary", PRIMARY), ("secondary", SECONDARY)):
        settings.update({f"{role}.fully_qualified_namespace": "127.0.0.1", f"{role}.use_development_emulator": "false",
                         f"{role}.transport": WEBSOCKETS,
                         f"{role}.custom_endpoint_address": emulator.endpoint(namespace, WEBSOCKETS),
                         f"{role}.proxy_host": proxy.host, f"{role}.proxy_port": str(proxy.port),
                         f"{role}.proxy_user": PROXY_USER, f"{role}.proxy_password": "env:EGRESS_PROXY_PASSWORD",
                         f"{role}.administration_endpoint": emulator.admin_endpoint(namespace),
                         f"{role}.ca_file": emulator.ca_file})
    settings.update(overrides)
    return load_config(ROOT / "conf/local-azure-ad.yaml", environ=environ, overrides=settings)


def partitioned_and_poison() -> dict[str, list[OriginalMessage]]:
    """Per backlog queue 0 and 1: sessions and partition keys for the partitioned destination, then poison."""
    poison = [original for original, _ in poison_backlog(seed=5)]
    per_queue = {}
    for index, queue in enumerate(BACKLOG[:2]):
        per_queue[queue] = [OriginalMessage(PARTITIONED, f"p{index}-{n}".encode(), message_id=f"p{index}-{n}",
                                            session_id=f"s{index}-{n % 3}" if n % 2 else None,
                                            partition_key=None if n % 2 else f"k{n % 4}")
                            for n in range(30)] + poison[index::2]
    return per_queue


def test_websockets_through_a_proxy_with_azure_ad_drain_sessions_partitions_and_poison_then_redrive(tmp_path, spark):
    granted = [(SENDER, name) for name in ("orders", "sessions-orders", "events", "small", "no-such-queue",
                                            PARTITIONED)]  # not payments
    with aad_emulator(primary=granted) as emulator, HttpProxy(user=PROXY_USER, password=PROXY_PASSWORD) as proxy:
        originals = realistic_backlog(120, seed=61, body_size=100)
        per_queue = {queue: originals[index::10] for index, queue in enumerate(BACKLOG)}
        extra = partitioned_and_poison()
        for queue, messages in extra.items():
            per_queue[queue] = per_queue[queue] + messages
        send_legacy_backlog(tooling(emulator, SECONDARY), per_queue)
        poison = {original.message_id: reason for original, reason in poison_backlog(seed=5)}
        config = websocket_config(emulator, proxy, tmp_path)

        # The dry run and the source's plan: the denial shows, no secret does (the proxy's password neither).
        plan = "\n".join(dry_run(spark, config).lines())
        assert re.search(r"^  payments +\d+ .*", plan, re.M), plan
        assert "refused Send on 'payments': grant Azure Service Bus Data Sender" in plan
        spark.dataSource.register(BacklogDataSource)
        frame = spark.readStream.format(SOURCE_NAME).options(**backlog_source_options(config)).load()
        for text, where in ((plan, "the dry run"), (frame._jdf.queryExecution().toString(), "the source's plan")):
            assert_no_secret(text, where)
            assert PROXY_PASSWORD not in text, where

        summary, connections = _counting_connections(emulator, lambda: run_syphon(spark, config))

        assert summary.drained, summary.remaining
        payments = sum(1 for message in originals if message.destination == "payments")
        assert summary.per_destination["payments"]["dead_lettered"] == payments > 0
        arrived = drain_destinations(tooling(emulator, PRIMARY), [*DESTINATIONS, PARTITIONED],
                                     session_entities=["sessions-orders"])
        expected = {**expected_arrivals(originals), "payments": 0,
                    PARTITIONED: sum(m.destination == PARTITIONED for messages in extra.values() for m in messages)}
        assert {entity: len(messages) for entity, messages in arrived.items()} == expected
        for entity, messages in arrived.items():  # each once, each session's in order
            ids = [str(message.message_id) for message in messages]
            assert len(ids) == len(set(ids)), entity
            by_session = collections.defaultdict(list)
            for message in messages:
                by_session[message.session_id].append(str(message.message_id))
            for session, in_order in by_session.items():
                if session is not None and entity == PARTITIONED:
                    assert in_order == sorted(in_order, key=lambda mid: int(mid.split("-")[1])), session
        # The poison and the refused destination's messages were dead-lettered in their backlog queues (the
        # purge's bulk settlement over the proxy); nothing else is left in the backlog.
        dead = backlog_dead_letters(tooling(emulator, SECONDARY), BACKLOG)
        by_id = {str(message.message_id): message for message in dead}
        assert {mid: by_id[mid].dead_letter_reason for mid in poison} == poison
        assert len(dead) == len(poison) + payments
        assert peek_counts(tooling(emulator, SECONDARY), BACKLOG) == dict.fromkeys(BACKLOG, 0)

        # Granted, a re-drive of what was refused delivers it, over the same way.
        emulator.assign_role(PRIMARY, SYPHON, SENDER, "payments")
        redrive = websocket_config(emulator, proxy, tmp_path, **{
            "run.source": "dead_letters", "redrive.reason_codes": ReasonCode.UNAUTHORIZED.value})
        again, redrive_connections = _counting_connections(emulator, lambda: run_syphon(spark, redrive))
        assert again.per_destination["payments"]["delivered"] == payments
        assert len(drain_destinations(tooling(emulator, PRIMARY), ["payments"])["payments"]) == payments
        assert len(backlog_dead_letters(tooling(emulator, SECONDARY), BACKLOG)) == len(poison)

        admin_ports = tuple(f":{emulator.admin_port(namespace)}" for namespace in (PRIMARY, SECONDARY))
        websocket_targets = {emulator.endpoint(namespace, WEBSOCKETS)[len("sb://"):] for namespace in (PRIMARY, SECONDARY)}
        tunnels = collections.Counter(proxy.tunnels())
    # Every connection of the syphon's runs went over WebSockets (none plain or TLS), each through the proxy;
    # the administration reads (HTTPS) too.
    for counted in (connections, redrive_connections):
        assert counted["amqp"] == counted["amqps"] == 0 and counted[WEBSOCKETS] > 0, counted
    admin = sum(count for target, count in tunnels.items() if target.endswith(admin_ports))
    assert admin > 0 and set(tunnels) >= websocket_targets, tunnels
    # (proxy.py logs a tunnel as it closes: the links the runs keep pooled are not among them yet)
    assert 0 < sum(tunnels.values()) - admin <= connections[WEBSOCKETS] + redrive_connections[WEBSOCKETS]
    print(f"\nover WebSockets through the proxy: {connections[WEBSOCKETS]} + {redrive_connections[WEBSOCKETS]} "
          f"connections (run, re-drive), {admin} administration tunnels")

    audit = [row.asDict() for row in delta.read_table(spark, config.storage.audit_table).collect()]
    outcomes = collections.Counter(row["outcome"] for row in audit)
    assert outcomes[Outcome.DEAD_LETTERED] == len(poison) + payments
    assert_no_secret(str(audit), "the audit")
    assert PROXY_PASSWORD not in str(audit) and PROXY_PASSWORD not in str(config)


def test_tls_with_keys_drains_a_backlog_with_sessions_on_the_tls_port_only(emulator, tmp_path, spark):
    config = make_config(emulator, tmp_path, transport="amqps")
    assert (config.primary.transport, config.primary.custom_endpoint_address) == (
        "amqp", emulator.endpoint(PRIMARY, "amqps"))
    originals = realistic_backlog(60, seed=62, body_size=200)
    send_legacy_backlog(make_config(emulator, tmp_path).secondary,
                        {queue: originals[index::10] for index, queue in enumerate(BACKLOG)})

    summary, connections = _counting_connections(emulator, lambda: run_syphon(spark, config))

    assert summary.drained, summary.remaining
    arrived = drain_destinations(emulator.connection_string(PRIMARY), DESTINATIONS,
                                 session_entities=["sessions-orders"])
    assert collections.Counter({entity: len(messages) for entity, messages in arrived.items()}) == \
        expected_arrivals(originals)
    assert connections["amqp"] == connections[WEBSOCKETS] == 0 and connections["amqps"] > 0, connections
    assert {entry["total"] for path, entry in emulator.stats(SECONDARY).items() if path in BACKLOG} == {0}


def _counting_connections(emulator, run):
    """``run()``'s result, and the connections both namespaces took meanwhile, per transport."""
    def taken() -> collections.Counter:
        return sum((collections.Counter(emulator.connection_stats(namespace)) for namespace in (PRIMARY, SECONDARY)),
                   collections.Counter())

    before = taken()
    result = run()
    after = taken()
    return result, {transport: after[transport] - before[transport] for transport in ("amqp", "amqps", WEBSOCKETS)}
