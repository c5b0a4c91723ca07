"""The source's typed options: to Spark's strings and back, defaults from the configuration; the
stream reader closes what its driver side opened."""

from __future__ import annotations

import dataclasses

from backlog_syphon.config import BacklogConfig, NamespaceConfig, RunConfig, Secret
from backlog_syphon.source.options import SECRET_OPTION, SourceOptions

SECONDARY = NamespaceConfig(connection_string=Secret("Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v", "test"))


def test_options_survive_the_trip_through_sparks_strings():
    options = SourceOptions("contoso", SECONDARY, queue_count=3, discover=False, max_messages_per_trigger=7,
                            idle_probe_max_seconds=1.5, available_now=True, stop_file="/tmp/stop",
                            look_back=("contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/2"))
    spark_options = options.to_spark()
    assert all(isinstance(value, str) for value in spark_options.values())
    assert SECRET_OPTION in spark_options and "secret" in SECRET_OPTION  # redacted by Spark's default regex
    assert SourceOptions.from_spark(spark_options) == options
    assert options.configured_queues == [f"contoso/x-servicebus-transfer/{i}" for i in range(3)]
    # the namespace's administration API (discovery) and its links' refresh reach the source too
    emulator = dataclasses.replace(SECONDARY, administration_endpoint="127.0.0.1:5301",
                                   ca_file="/tmp/ca.pem", idle_link_seconds=30.0)
    options = dataclasses.replace(options, secondary=emulator)
    assert SourceOptions.from_spark(options.to_spark()) == options


def test_missing_options_take_the_configurations_defaults():
    read = SourceOptions.from_spark({"primaryNamespace": "contoso"})
    assert read.queue_count == BacklogConfig().queue_count
    assert read.discover == BacklogConfig().discover
    assert read.max_messages_per_trigger == RunConfig().max_messages_per_trigger
    assert read.idle_probe_max_seconds == RunConfig().idle_probe_max_seconds
    assert read.available_now is False and read.stop_file is None
    assert read.look_back == ()
    assert read.secondary == NamespaceConfig()


def test_from_config_copies_every_setting(tmp_path):
    from backlog_syphon.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("primary: {namespace: contoso, connection_string: {env: P}}\n"
                    "secondary: {connection_string: {env: S}}\n"
                    "backlog: {queue_count: 4, discover: false}\n"
                    "storage: {audit_table: a/b, checkpoint_table: c/d, checkpoint_location: e/f}\n"
                    "run: {trigger: 10 seconds, max_messages_per_trigger: 9, idle_probe_max_seconds: 30}\n"
                    "sink: {outage_wait_seconds: 40, throttle_recovery_seconds: 5}\n")
    secret = "Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKey=v"
    config = load_config(path, environ={"P": secret, "S": secret})
    options = SourceOptions.from_config(config, stop_file="stop", look_back=("q/1", "q/0"), read_slots=3)
    assert dataclasses.astuple(options)[2:] == (4, False, 9, 30.0, False, "stop", False, ("q/0", "q/1"), False,
                                                (), False, (), (), 40.0, 5.0, 3)
    assert options.secondary == config.secondary


def test_the_stream_reader_closes_its_peek_links_when_the_query_stops(monkeypatch):
    from backlog_syphon.servicebus import clients
    from backlog_syphon.source.data_source import BacklogStreamReader

    closed = []
    monkeypatch.setattr(clients, "close_peek_receivers", lambda namespace, queues: closed.append(list(queues)))
    reader = BacklogStreamReader(SourceOptions("contoso", SECONDARY).to_spark())
    reader.stop()  # nothing opened yet: nothing to close
    reader._queues = ["contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"]
    reader.stop()
    assert closed == [["contoso/x-servicebus-transfer/0", "contoso/x-servicebus-transfer/1"]]


def test_the_pool_closes_a_namespaces_client_with_its_last_link(monkeypatch):
    from backlog_syphon.servicebus import clients

    class Handle:
        def __init__(self):
            self.closed = False

        def close(self):
            self.closed = True

    client = Handle()
    monkeypatch.setattr(clients, "open_client", lambda namespace, **_: client)
    pool = clients._HandlerPool()
    peek_0 = pool.get(SECONDARY, "secondary", ("receiver", "peek", "q0"), lambda _: Handle())
    settle_0 = pool.get(SECONDARY, "secondary", ("receiver", "settle", "q0"), lambda _: Handle())
    pool.close(SECONDARY, "secondary", [("receiver", "peek", "q0")])
    assert peek_0.closed and not settle_0.closed and not client.closed  # the purge's link still uses it
    pool.close(SECONDARY, "secondary", [("receiver", "settle", "q0")])
    assert settle_0.closed and client.closed


def test_a_pooled_link_idle_past_the_brokers_idle_timer_is_replaced_before_it_is_used(monkeypatch):
    from backlog_syphon.servicebus import clients

    class Handle:
        def __init__(self):
            self.closed = False

        def close(self):
            self.closed = True

    monkeypatch.setattr(clients, "open_client", lambda namespace, **_: Handle())
    now = [1_000.0]
    pool = clients._HandlerPool(clock=lambda: now[0])
    key = ("sender", "orders")
    idle = SECONDARY.idle_link_seconds
    assert idle == 480 < 10 * 60  # by default: within the service's link idle timer
    first = pool.get(SECONDARY, "primary", key, lambda _: Handle())
    now[0] += idle - 1  # used just within the idle time: kept, and its clock starts again
    assert pool.get(SECONDARY, "primary", key, lambda _: Handle()) is first
    now[0] += idle - 1
    assert pool.get(SECONDARY, "primary", key, lambda _: Handle()) is first and not first.closed
    now[0] += idle + 1  # idle for longer: Service Bus would have detached it
    fresh = pool.get(SECONDARY, "primary", key, lambda _: Handle())
    assert fresh is not first and first.closed and not fresh.closed

    # A peek receiver's receive link never carries anything: it is replaced by age, however often it peeks.
    peeker = pool.get(SECONDARY, "secondary", ("receiver", "peek", "q0"), lambda _: Handle(), by_age=True)
    for _ in range(3):
        now[0] += idle / 3
        assert pool.get(SECONDARY, "secondary", ("receiver", "peek", "q0"), lambda _: Handle(), by_age=True) is peeker
    now[0] += 1
    renewed = pool.get(SECONDARY, "secondary", ("receiver", "peek", "q0"), lambda _: Handle(), by_age=True)
    assert renewed is not peeker and peeker.closed


def test_the_planners_start_once_per_application_and_a_failed_start_is_tried_again(monkeypatch):
    from types import SimpleNamespace

    from backlog_syphon.source import data_source

    monkeypatch.setattr(data_source, "_PLANNERS_STARTED", set())
    planned: list[str] = []

    def session(application: str, fails: bool):
        def load():
            planned.append(application)
            if fails:
                raise RuntimeError("no Python planner here")
            return SimpleNamespace(rdd=SimpleNamespace(getNumPartitions=lambda: 0))
        reader = SimpleNamespace(format=lambda name: SimpleNamespace(options=lambda **options: SimpleNamespace(
            load=load)))
        return SimpleNamespace(sparkContext=SimpleNamespace(applicationId=application), read=reader)

    data_source.start_planners(session("app-1", fails=True))  # only logged: the query starts them itself
    assert data_source._PLANNERS_STARTED == set()
    data_source.start_planners(session("app-1", fails=False))
    data_source.start_planners(session("app-1", fails=False))  # a warm session's next run: not planned again
    data_source.start_planners(session("app-2", fails=False))  # a new application plans again
    assert planned == ["app-1", "app-1", "app-2"]
    assert data_source._PLANNERS_STARTED == {"app-1", "app-2"}


def test_an_azure_ad_credential_travels_with_its_secret_only_under_a_redacted_option():
    from backlog_syphon.config import CredentialConfig

    for credential in (CredentialConfig("service_principal", tenant_id="t", client_id="c",
                                        client_secret=Secret("sp-secret-value", "test")),
                       CredentialConfig("custom", factory="m:f", options={"principal": "p", "lifetime_seconds": 60},
                                        secret=Secret("signing-key-value", "test")),
                       CredentialConfig("databricks_service_credential", name="sb")):
        secondary = NamespaceConfig(fully_qualified_namespace="127.0.0.1:5673", credential=credential,
                                    use_development_emulator=True)
        spark_options = SourceOptions("contoso", secondary).to_spark()
        secret = credential.the_secret
        shown = {key: value for key, value in spark_options.items() if "secret" not in key}
        assert secret is None or secret.reveal() not in str(shown)
        read = SourceOptions.from_spark(spark_options).secondary
        assert read == secondary and read.credential.cache_key == credential.cache_key


def test_spark_builds_the_source_from_its_options_alone():
    # What Spark's Python worker does (create_data_source): the class, called with options only.
    from backlog_syphon.rows import BACKLOG_ROW_SCHEMA
    from backlog_syphon.source.data_source import SOURCE_NAME, BacklogDataSource

    source = BacklogDataSource(options={"primaryNamespace": "contoso"})
    assert (BacklogDataSource.name(), source.schema(), source.options) == (
        SOURCE_NAME, BACKLOG_ROW_SCHEMA, {"primaryNamespace": "contoso"})
