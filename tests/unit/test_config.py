"""Config loading, overrides, validation and secret masking."""

import pickle
import re
import textwrap

import pytest

from backlog_syphon.config import ConfigError, Secret, load_config, parse_overrides, trigger_options

SECRET = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=Root;SharedAccessKey=TopSecretKey123=;UseDevelopmentEmulator=true"
ENV = {"PRIMARY_CS": SECRET, "SECONDARY_CS": SECRET.replace("5672", "5673")}
BASE = """
primary:
  namespace: contoso
  connection_string: {env: PRIMARY_CS}
secondary:
  connection_string: {env: SECONDARY_CS}
storage:
  audit_table: /tmp/t/audit
  checkpoint_table: /tmp/t/checkpoint
  checkpoint_location: /tmp/t/cp
"""


def write(tmp_path, text, name="syphon.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_loads_yaml_with_defaults(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV)
    assert config.primary.namespace == "contoso"
    assert config.primary.connection_string.reveal() == SECRET
    assert config.primary.connection_string.source == "env PRIMARY_CS"
    assert config.backlog.queue_count == 10
    assert config.run.trigger == "available_now"
    assert config.run.max_messages_per_trigger == 10000
    assert config.restore.ttl_policy == "remaining"


def test_environment_then_cli_override_yaml(tmp_path):
    environ = {**ENV, "SYPHON__BACKLOG__QUEUE_COUNT": "12", "SYPHON__RUN__TRIGGER": "30 seconds"}
    config = load_config(write(tmp_path, BASE), environ=environ,
                         overrides=parse_overrides(["run.trigger=10 seconds", "backlog.discover=false"]))
    assert config.backlog.queue_count == 12  # env wins over YAML default
    assert config.run.trigger == "10 seconds"  # CLI wins over env
    assert config.backlog.discover is False
    assert trigger_options(config.run.trigger) == {"processingTime": "10 seconds"}
    assert trigger_options("available_now") == {"availableNow": True}


def test_with_overrides_keeps_secrets(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV)
    changed = config.with_overrides({"run.max_messages_per_trigger": "50"})
    assert changed.run.max_messages_per_trigger == 50
    assert changed.secondary.connection_string == config.secondary.connection_string


@pytest.mark.parametrize("extra, message", [
    ("backlog:\n  queue_cuont: 3\n", "unknown key 'backlog.queue_cuont'"),
    ("backlogs:\n  queue_count: 3\n", "unknown section 'backlogs'"),
    ("backlog:\n  queue_count: ten\n", "backlog.queue_count in"),
    ("backlog:\n  queue_count: 0\n", "backlog.queue_count must be at least 1"),
    ("run:\n  trigger: sometimes\n", "run.trigger must be 'available_now' or an interval"),
    ("restore:\n  ttl_policy: forever\n", "restore.ttl_policy must be one of remaining, restart"),
    ("backlog:\n  discover: 3\n", "expected true or false"),
    ("sink:\n  max_messages_per_second: -5\n", "sink.max_messages_per_second must be 0 (no cap) or more, got -5"),
    ("sink:\n  max_messages_per_second: fast\n", "sink.max_messages_per_second in"),
    ("sink:\n  throttle_recovery_seconds: 0\n", "sink.throttle_recovery_seconds must be more than 0, got 0"),
    ("run:\n  log_format: xml\n", "run.log_format must be one of text, json, got 'xml'"),
])
def test_bad_values_name_the_key_and_file(tmp_path, extra, message):
    path = write(tmp_path, BASE + extra)
    with pytest.raises(ConfigError) as error:
        load_config(path, environ=ENV)
    assert message in str(error.value)
    assert str(path) in str(error.value)


def test_pacing_keys_default_to_no_cap_and_read_from_yaml_and_environment(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV)
    assert (config.sink.max_messages_per_second, config.sink.throttle_recovery_seconds) == (0.0, 30.0)
    config = load_config(write(tmp_path, BASE + "sink:\n  max_messages_per_second: 500\n"),
                         environ={**ENV, "SYPHON__SINK__THROTTLE_RECOVERY_SECONDS": "12.5"})
    assert (config.sink.max_messages_per_second, config.sink.throttle_recovery_seconds) == (500.0, 12.5)


def test_the_runs_and_lease_tables_sit_next_to_the_checkpoint_table_unless_named(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV)
    assert (config.storage.resolved_lease_table, config.storage.resolved_runs_table) == (
        "/tmp/t/checkpoint_lease", "/tmp/t/checkpoint_runs")
    assert config.run.log_format == "text"
    named = load_config(write(tmp_path, BASE), environ={**ENV, "SYPHON__STORAGE__RUNS_TABLE": "main.ops.runs",
                                                       "SYPHON__RUN__LOG_FORMAT": "json"})
    assert (named.storage.resolved_runs_table, named.run.log_format) == ("main.ops.runs", "json")


def test_the_state_tables_keep_a_day_of_log_unless_told_otherwise(tmp_path):
    assert load_config(write(tmp_path, BASE), environ=ENV).storage.table_retention_days == 1
    config = load_config(write(tmp_path, BASE), environ={**ENV, "SYPHON__STORAGE__TABLE_RETENTION_DAYS": "7"})
    assert config.storage.table_retention_days == 7
    for value, message in (("0", "storage.table_retention_days must be at least 1"),
                           ("a week", "storage.table_retention_days in")):
        with pytest.raises(ConfigError, match=message):
            load_config(write(tmp_path, BASE), environ={**ENV, "SYPHON__STORAGE__TABLE_RETENTION_DAYS": value})


def test_missing_required_key(tmp_path):
    with pytest.raises(ConfigError, match="'primary.namespace' is required"):
        load_config(write(tmp_path, BASE.replace("namespace: contoso", "namespace: ''")), environ=ENV)


def test_bad_env_override_names_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="environment variable SYPHON__RUN__NOPE: unknown key 'run.nope'"):
        load_config(write(tmp_path, BASE), environ={**ENV, "SYPHON__RUN__NOPE": "1"})


def test_invalid_yaml_reports_line(tmp_path):
    with pytest.raises(ConfigError, match="at line"):
        load_config(write(tmp_path, "primary:\n  namespace: [oops\n"), environ=ENV)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml", environ=ENV)


def test_unset_environment_variable(tmp_path):
    with pytest.raises(ConfigError, match="environment variable SECONDARY_CS is not set"):
        load_config(write(tmp_path, BASE), environ={"PRIMARY_CS": SECRET})


def test_secret_scope_reference_uses_reader(tmp_path):
    text = BASE.replace("{env: PRIMARY_CS}", "{secret: syphon/primary}")
    config = load_config(write(tmp_path, text), environ=ENV,
                         secret_reader=lambda scope, key: SECRET if (scope, key) == ("syphon", "primary") else "")
    assert config.primary.connection_string.reveal() == SECRET
    assert config.primary.connection_string.source == "secret syphon/primary"


def test_secret_scope_without_databricks_is_a_clear_error(tmp_path):
    text = BASE.replace("{env: PRIMARY_CS}", "{secret: syphon/primary}")
    with pytest.raises(ConfigError, match="need Databricks"):
        load_config(write(tmp_path, text), environ=ENV)


def test_the_host_loader_reads_secret_scopes_only_on_databricks(tmp_path):
    from backlog_syphon.run.databricks_host import load_config as load_config_on_host

    text = BASE.replace("{env: PRIMARY_CS}", "{secret: syphon/primary}")
    with pytest.raises(ConfigError, match="need Databricks"):
        load_config_on_host(write(tmp_path, text), environ=ENV)
    config = load_config_on_host(write(tmp_path, text), environ=ENV, secret_reader=lambda scope, key: SECRET)
    assert config.primary.connection_string.reveal() == SECRET


def test_azure_ad_alternative(tmp_path):
    text = BASE.replace("connection_string: {env: PRIMARY_CS}", "fully_qualified_namespace: contoso.servicebus.windows.net")
    config = load_config(write(tmp_path, text), environ=ENV)
    assert config.primary.connection_string is None
    assert config.primary.fully_qualified_namespace == "contoso.servicebus.windows.net"


@pytest.mark.parametrize("bad", [
    "not a connection string " + "SharedAccessKey=TopSecretKey123=",
    "Endpoint=http://x;SharedAccessKeyName=a;SharedAccessKey=TopSecretKey123=",
    "Endpoint=sb://x;SharedAccessKey=TopSecretKey123=",
])
def test_bad_connection_string_is_described_never_echoed(tmp_path, bad):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, BASE), environ={**ENV, "PRIMARY_CS": bad})
    text = str(error.value) + repr(error.value)
    assert "primary.connection_string" in text and "env PRIMARY_CS" in text
    assert "TopSecretKey123" not in text


def test_secrets_never_appear_in_reprs_or_errors(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV)
    assert "TopSecretKey123" not in repr(config)
    assert "TopSecretKey123" not in str(config.primary)
    assert "masked" in repr(config.primary.connection_string)
    with pytest.raises(ConfigError) as error:
        config.with_overrides({"run.trigger": "whenever"})
    assert "TopSecretKey123" not in str(error.value)
    copy = pickle.loads(pickle.dumps(config))  # shipped to executors intact
    assert copy.primary.connection_string.reveal() == SECRET


def test_literal_connection_string_is_masked_too(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV,
                         overrides={"primary.connection_string": SECRET})
    assert isinstance(config.primary.connection_string, Secret)
    assert "TopSecretKey123" not in repr(config)


def test_parse_overrides_rejects_missing_equals():
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_overrides(["run.trigger"])


def test_shipped_configs_load(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    local = load_config(root / "conf/local.yaml", environ={"SYPHON_PRIMARY_CONNECTION_STRING": SECRET,
                                                           "SYPHON_SECONDARY_CONNECTION_STRING": SECRET})
    assert local.primary.namespace == "contoso"
    azure = load_config(root / "conf/example-azure.yaml", environ={}, secret_reader=lambda scope, key: SECRET)
    assert azure.storage.audit_table == "main.syphon.audit"


def test_connection_string_overrides_can_be_references(tmp_path):
    environ = {**ENV, "OTHER_CS": SECRET.replace("5672", "6000")}
    config = load_config(write(tmp_path, BASE), environ=environ,
                         overrides={"primary.connection_string": "env:OTHER_CS",
                                    "secondary.connection_string": "secret:syphon/secondary"},
                         secret_reader=lambda scope, key: SECRET if (scope, key) == ("syphon", "secondary") else "")
    assert config.primary.connection_string.reveal() == environ["OTHER_CS"]
    assert config.primary.connection_string.source == "env OTHER_CS"
    assert config.secondary.connection_string.source == "secret syphon/secondary"
    literal = load_config(write(tmp_path, BASE), environ=ENV, overrides={"primary.connection_string": SECRET})
    assert literal.primary.connection_string.reveal() == SECRET  # a real connection string stays a literal


def test_destination_map_and_skip_destinations_from_yaml_environment_and_set(tmp_path):
    path = write(tmp_path, BASE + """
restore:
  destination_map: {orders-v1: orders, Legacy/Payments: payments}
  skip_destinations: [events]
""")
    config = load_config(path, environ=ENV)
    assert config.restore.destination_map == {"orders-v1": "orders", "Legacy/Payments": "payments"}
    assert config.restore.skip_destinations == ("events",)
    env = {**ENV, "SYPHON__RESTORE__SKIP_DESTINATIONS": "[Events, audit-log]"}
    assert load_config(path, environ=env).restore.skip_destinations == ("Events", "audit-log")
    single = load_config(path, environ=ENV, overrides={"restore.skip_destinations": "payments",
                                                        "restore.destination_map": "{a: b}"})
    assert single.restore.skip_destinations == ("payments",) and single.restore.destination_map == {"a": "b"}
    assert load_config(write(tmp_path, BASE, "plain.yaml"), environ=ENV).restore.destination_map == {}
    assert single.with_overrides({"run.trigger": "10 seconds"}).restore.destination_map == {"a": "b"}
    pickle.loads(pickle.dumps(single))  # executors get the config


@pytest.mark.parametrize("overrides, message", [
    ({"restore.destination_map": "[a, b]"}, "restore.destination_map in .*: expected a mapping of names"),
    ({"restore.skip_destinations": "{a: b}"}, "restore.skip_destinations in .*: expected a list of texts"),
    ({"restore.destination_map": "{orders: Orders}"}, "maps 'orders' to itself; remove that entry"),
    ({"restore.destination_map": "{a: b, A: c}"}, "names 'a' and 'A', the same entity .*keep one entry"),
    ({"restore.destination_map": "{a: b, B: c}"},
     "maps 'a' to 'b' and 'b' on to 'c'; the map is applied once, not in a chain: map 'a' straight"),
    ({"restore.destination_map": "{'x-servicebus-transfer/0': b}"}, "names a backlog queue"),
    ({"restore.destination_map": "{a: 'sb://host/b'}"}, "'sb://host/b' must be relative to the namespace"),
    ({"restore.destination_map": "{a: 'orders/$DeadLetterQueue'}"}, "names a sub-queue"),
    ({"restore.skip_destinations": "['bad name']"}, "restore.skip_destinations: 'bad name' contains characters"),
    ({"restore.destination_map": "{orders-v1: orders}", "restore.skip_destinations": "[Orders-V1]"},
     "names 'Orders-V1', which restore.destination_map renames to 'orders'; .* list 'orders'"),
])
def test_routing_settings_are_refused_with_the_key_and_what_to_do(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, BASE), environ=ENV, overrides=overrides)


# --- Azure AD credentials -------------------------------------------------------------------------

SP_SECRET = "sp-Secret~Value.123"
AAD = """
primary:
  namespace: contoso
  fully_qualified_namespace: contoso.servicebus.windows.net
  credential: {credential}
secondary:
  fully_qualified_namespace: contoso-dr.servicebus.windows.net
  credential: {{kind: databricks_service_credential, name: servicebus-syphon}}
storage:
  audit_table: /tmp/t/audit
  checkpoint_table: /tmp/t/checkpoint
  checkpoint_location: /tmp/t/cp
"""


def aad(tmp_path, credential: str, **kwargs):
    return load_config(write(tmp_path, AAD.format(credential=credential)), environ={"SP": SP_SECRET}, **kwargs)


@pytest.mark.parametrize("credential, expected", [
    ("{kind: default}", {"kind": "default"}),
    ("{kind: service_principal, tenant_id: t-1, client_id: c-1, client_secret: {env: SP}}",
     {"kind": "service_principal", "tenant_id": "t-1", "client_id": "c-1"}),
    ("{kind: managed_identity}", {"kind": "managed_identity"}),
    ("{kind: managed_identity, client_id: mi-1}", {"kind": "managed_identity", "client_id": "mi-1"}),
    ("{kind: workload_identity, token_file: /var/run/token}", {"kind": "workload_identity",
                                                              "token_file": "/var/run/token"}),
    ("{kind: custom, factory: 'pkg.mod:make', options: {principal: p, lifetime_seconds: 60}, secret: {env: SP}}",
     {"kind": "custom", "factory": "pkg.mod:make", "options": {"principal": "p", "lifetime_seconds": 60}}),
])
def test_each_credential_kind_loads_with_its_settings(tmp_path, credential, expected):
    config = aad(tmp_path, credential)
    assert config.primary.credential.public == expected
    assert config.primary.azure_ad == config.primary.credential
    assert config.secondary.credential.describe() == "databricks_service_credential 'servicebus-syphon'"


def test_a_credentials_secret_is_masked_everywhere_also_pickled_for_executors(tmp_path):
    config = aad(tmp_path, "{kind: service_principal, tenant_id: t, client_id: c, client_secret: {env: SP}}")
    assert config.primary.credential.client_secret.reveal() == SP_SECRET
    shipped = pickle.loads(pickle.dumps(config))  # what the sink's closures carry to executors
    assert shipped.primary.credential.client_secret.reveal() == SP_SECRET
    for text in (repr(config), str(config), repr(shipped), config.primary.credential.describe(),
                 str(config.primary.credential.cache_key)):
        assert SP_SECRET not in text
    rotated = aad(tmp_path, "{kind: service_principal, tenant_id: t, client_id: c, client_secret: rotated}")
    assert rotated.primary.credential.cache_key != config.primary.credential.cache_key
    assert config.with_overrides({"run.trigger": "5 seconds"}).primary.credential == config.primary.credential


def test_without_a_credential_azure_ad_uses_the_default_kind(tmp_path):
    text = BASE.replace("connection_string: {env: PRIMARY_CS}", "fully_qualified_namespace: contoso.servicebus.windows.net")
    config = load_config(write(tmp_path, text), environ=ENV)
    assert config.primary.credential is None and config.primary.azure_ad.kind == "default"
    assert config.secondary.azure_ad is None  # a connection string


def test_a_credential_can_be_set_from_the_command_line_and_the_environment(tmp_path):
    config = aad(tmp_path, "{kind: default}", overrides={"primary.credential": "managed_identity"})
    assert config.primary.credential.public == {"kind": "managed_identity"}
    environ = {"SP": SP_SECRET, "SYPHON__PRIMARY__CREDENTIAL": "{kind: managed_identity, client_id: mi-2}"}
    config = load_config(write(tmp_path, AAD.format(credential="{kind: default}")), environ=environ)
    assert config.primary.credential.client_id == "mi-2"


@pytest.mark.parametrize("credential, message", [
    ("{kind: certificate}", "primary.credential.kind in .*: must be one of default, service_principal, "
                            "managed_identity, workload_identity, databricks_service_credential, custom"),
    ("{kind: service_principal, tenant_id: t, client_id: c}",
     "primary.credential.client_secret in .*: a service_principal credential needs it"),
    ("{kind: service_principal, tenant_id: t, client_id: c, client_secret: {env: NOT_SET}}",
     "primary.credential.client_secret in .*: environment variable NOT_SET is not set"),
    ("{kind: managed_identity, tenant_id: t}",
     "primary.credential.tenant_id in .*: not a setting of a managed_identity credential; it takes client_id"),
    ("{kind: databricks_service_credential}", "primary.credential.name in .*: a databricks_service_credential "
                                              "credential needs it"),
    ("{kind: custom, factory: not-a-factory}", "primary.credential.factory in .*: expected 'module.path:callable'"),
    ("{kind: custom, factory: 'a:b', options: {key: [1]}}", "primary.credential.options in .*: expected a mapping"),
    ("managed_identity", "primary.credential in .*: expected a mapping such as {kind: managed_identity}"),
])
def test_bad_credentials_name_the_key_and_what_to_write(tmp_path, credential, message):
    with pytest.raises(ConfigError, match=message):
        aad(tmp_path, credential)


@pytest.mark.parametrize("change, message", [
    (("fully_qualified_namespace: contoso.servicebus.windows.net", "connection_string: {env: SP}"),
     "'primary' has connection_string and Azure AD settings"),
    (("  fully_qualified_namespace: contoso.servicebus.windows.net\n", ""),
     "'primary.credential' goes with 'primary.fully_qualified_namespace'"),
    (("contoso.servicebus.windows.net", "sb://contoso.servicebus.windows.net"),
     "'primary.fully_qualified_namespace' is a host name"),
])
def test_azure_ad_settings_that_do_not_go_together_are_refused(tmp_path, change, message):
    text = AAD.format(credential="{kind: default}").replace(*change)
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), environ={"SP": "Endpoint=sb://x;SharedAccessKeyName=k;SharedAccessKey=v"})


def test_use_development_emulator_goes_with_azure_ad_only(tmp_path):
    config = aad(tmp_path, "{kind: default}", overrides={"primary.use_development_emulator": "true"})
    assert config.primary.use_development_emulator is True
    with pytest.raises(ConfigError, match="'primary.use_development_emulator' applies to Azure AD"):
        load_config(write(tmp_path, BASE), environ=ENV, overrides={"primary.use_development_emulator": "true"})


@pytest.mark.parametrize("overrides, message", [
    ({"secondary.idle_link_seconds": "900"}, "'secondary.idle_link_seconds' must be above 0 and below 600 (Service "
                                             "Bus detaches a link idle for 10 minutes), got 900"),
    ({"primary.administration_endpoint": "https://127.0.0.1:5300"}, "'primary.administration_endpoint' is a host "
                                                                    "name and port, such as 127.0.0.1:5300"),
    ({"primary.ca_file": "/no/such/ca.pem"}, "'primary.ca_file' names "
                                                            "'/no/such/ca.pem', which is not a readable file"),
])
def test_link_and_administration_settings_are_checked(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, BASE), environ=ENV, overrides=overrides)
    assert message in str(error.value)


def test_the_administration_api_is_the_namespaces_host_unless_named(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV, overrides={"secondary.administration_endpoint":
                                                                         "127.0.0.1:5301"})
    assert config.primary.administration_host == config.primary.endpoint.split(":")[0]
    assert config.secondary.administration_host == "127.0.0.1:5301"
    assert config.primary.idle_link_seconds == 480
    rewritten = config.secondary.connection_string_with_endpoint("127.0.0.1:5301")
    assert rewritten.startswith("Endpoint=sb://127.0.0.1:5301/;") and "SharedAccessKey=" in rewritten


def test_exported_dead_letters_name_backlog_queues_with_their_counts(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV, overrides=parse_overrides(
        ["backlog.exported_dead_letters={contoso/x-servicebus-transfer/3: 2}"]))
    assert config.backlog.exported_dead_letters == {"contoso/x-servicebus-transfer/3": 2}
    assert load_config(write(tmp_path, BASE), environ=ENV).backlog.exported_dead_letters == {}
    for value, error in (("{contoso/x-servicebus-transfer/3/$DeadLetterQueue: 2}", "not a backlog queue of 'contoso'"),
                         ("{orders: 1}", "not a backlog queue"), ("{contoso/x-servicebus-transfer/3: -1}",
                                                                  "whole numbers of 0 or more")):
        with pytest.raises(ConfigError, match=error):
            load_config(write(tmp_path, BASE), environ=ENV, overrides={"backlog.exported_dead_letters": value})


def test_the_migration_section_selects_routes_and_is_checked_with_its_run_source(tmp_path):
    migration = ("run:\n  source: migration\nmigration:\n  entities: [orders, 'events/Subscriptions/*']\n"
                 "  subscriptions: {'events/*': property}\n  destination_map: {orders: orders-v2}\n")
    config = load_config(write(tmp_path, BASE + migration), environ=ENV)
    assert config.migrating and not config.redriving
    assert (config.migration.entities, config.migration.subscriptions, config.migration.provenance) == (
        ("orders", "events/Subscriptions/*"), {"events/*": "property"}, None)
    redrive = load_config(write(tmp_path, BASE + migration.replace("migration\n", "dead_letters\n", 1)), environ=ENV)
    assert redrive.migrating and redrive.redriving  # a re-drive of what the migration dead-lettered
    assert load_config(write(tmp_path, BASE), environ={**ENV, "SYPHON__RUN__SOURCE": "migration",
                                                        "SYPHON__MIGRATION__ENTITIES": "a,b"}).migration.entities == (
        "a", "b")


@pytest.mark.parametrize("extra, message", [
    ("run:\n  source: migration\n", "run.source: migration needs migration.entities"),
    ("migration:\n  entities: [orders]\n", "the migration section applies to run.source: migration"),
    ("migration:\n  provenance: true\n", "migration.* settings need migration.entities"),
    ("run:\n  source: migration\n  trigger: 10 seconds\nmigration:\n  entities: [orders]\n",
     "run.trigger must be 'available_now'"),
    ("run:\n  source: migration\nmigration:\n  entities: [orders]\n  subscriptions: {'a/*': fan_out}\n",
     "must be one of topic, queue, property"),
    ("run:\n  source: migration\nmigration:\n  entities: [orders]\n  message_rules: verbatim\n",
     "migration.message_rules must be one of copy, restore"),
    ("run:\n  source: migration\nmigration:\n  entities: [orders]\n  destination_map: {orders: 'sb://x/orders'}\n",
     "migration.destination_map: 'sb://x/orders' (for 'orders')"),
])
def test_a_migration_setting_that_cannot_work_names_the_key(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(write(tmp_path, BASE + extra), environ=ENV)
