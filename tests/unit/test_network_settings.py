"""The way to a namespace, on plain values: ``transport``, ``custom_endpoint_address``, ``proxy_*`` and ``ca_file``
read and checked (the proxy's password never from a file or the command line), carried to the executors in the
source's options, turned into the SDK's keywords, and the one line for each way a connection fails."""

from __future__ import annotations

import pickle
import ssl
import textwrap

import pytest

from backlog_syphon.config import ConfigError, NamespaceConfig, Secret, load_config, parse_overrides
from backlog_syphon.model import NetworkFailure, Transport
from backlog_syphon.servicebus.network import NetworkProblem, network_line, network_problem_of
from backlog_syphon.source.options import PROXY_SECRET_OPTION, SourceOptions

KEYS = "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=TopSecretKey123="
PASSWORD = "Pr0xy-Passw0rd"
ENV = {"PRIMARY_CS": KEYS, "SECONDARY_CS": KEYS.replace("contoso.", "contoso-dr."), "EGRESS_PW": PASSWORD}
BASE = """
primary:
  namespace: contoso
  connection_string: {env: PRIMARY_CS}
secondary:
  connection_string: {env: SECONDARY_CS}
  transport: amqp-websockets
  proxy_host: egress.corp.example
  proxy_port: 3128
  proxy_user: svc-syphon
  proxy_password: {env: EGRESS_PW}
storage:
  audit_table: /tmp/t/audit
  checkpoint_table: /tmp/t/checkpoint
  checkpoint_location: /tmp/t/cp
"""


def write(tmp_path, text):
    path = tmp_path / "syphon.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_websockets_through_a_proxy_read_from_yaml_the_environment_and_a_secret_scope(tmp_path):
    config = load_config(write(tmp_path, BASE), environ=ENV)
    secondary = config.secondary
    assert (secondary.transport_kind, secondary.proxy_address, secondary.proxy_user) == (
        Transport.AMQP_WEBSOCKETS, "egress.corp.example:3128", "svc-syphon")
    assert secondary.proxy_password.reveal() == PASSWORD and PASSWORD not in repr(secondary)
    assert PASSWORD not in repr(pickle.loads(pickle.dumps(secondary)))
    assert secondary.connect_endpoint == "contoso-dr.servicebus.windows.net:443"
    assert config.primary.transport_kind is Transport.AMQP and config.primary.connect_endpoint.endswith(":5671")
    environ = {**ENV, "SYPHON__PRIMARY__TRANSPORT": "amqp-websockets", "SYPHON__PRIMARY__PROXY_HOST": "10.1.2.3",
               "SYPHON__PRIMARY__PROXY_PORT": "8080", "SYPHON__PRIMARY__PROXY_USER": "u",
               "SYPHON__PRIMARY__PROXY_PASSWORD": PASSWORD}  # the password itself, from the environment
    primary = load_config(write(tmp_path, BASE), environ=environ).primary
    assert (primary.proxy_port, primary.proxy_password.reveal(), primary.proxy_password.source) == (
        8080, PASSWORD, "environment variable SYPHON__PRIMARY__PROXY_PASSWORD")
    scoped = load_config(write(tmp_path, BASE.replace("{env: EGRESS_PW}", "{secret: syphon/proxy}")), environ=ENV,
                         secret_reader=lambda scope, key: PASSWORD if (scope, key) == ("syphon", "proxy") else "")
    assert scoped.secondary.proxy_password.reveal() == PASSWORD
    by_reference = load_config(write(tmp_path, BASE), environ=ENV,
                               overrides=parse_overrides(["secondary.proxy_password=env:EGRESS_PW"]))
    assert by_reference.secondary.proxy_password.reveal() == PASSWORD
    assert config.with_overrides({"run.trigger": "5 seconds"}).secondary == secondary


@pytest.mark.parametrize("overrides, message", [
    ({"secondary.proxy_password": PASSWORD}, "a password is never written in the configuration or on the command "
                                             "line: give {env: VAR} or {secret: scope/key}"),
    ({"secondary.transport": "amqp-tls"}, "'secondary.transport' must be one of amqp, amqp-websockets"),
    ({"secondary.transport": "amqp"}, "'secondary.proxy_host' and the other proxy settings need "
                                      "'secondary.transport: amqp-websockets'"),
    ({"secondary.proxy_port": "null"}, "a proxy needs both 'secondary.proxy_host' and 'secondary.proxy_port'"),
    ({"secondary.proxy_host": "http://egress:3128"}, "'secondary.proxy_host' is a host name or address without a "
                                                     "scheme or port"),
    ({"secondary.proxy_port": "70000"}, "'secondary.proxy_port' must be a port number"),
    ({"secondary.proxy_user": "null"}, "'secondary.proxy_user' and 'secondary.proxy_password' together"),
    ({"secondary.custom_endpoint_address": "https://gw/path"}, "'secondary.custom_endpoint_address' is "
                                                              "sb://host[:port]"),
    ({"secondary.ca_file": "/no/such.pem"}, "'secondary.ca_file' names '/no/such.pem', which is not a readable file"),
])
def test_wrong_network_settings_name_the_key_and_never_the_password(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, BASE), environ=ENV, overrides=overrides)
    assert message in str(error.value)
    assert PASSWORD not in str(error.value)


def test_a_password_written_in_the_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="never written in the configuration") as error:
        load_config(write(tmp_path, BASE.replace("{env: EGRESS_PW}", PASSWORD)), environ=ENV)
    assert PASSWORD not in str(error.value)


def test_websockets_need_tls_which_a_development_emulator_connection_string_turns_off(tmp_path):
    emulator = "Endpoint=sb://127.0.0.1:5673;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true"
    with pytest.raises(ConfigError, match="amqp-websockets needs TLS"):
        load_config(write(tmp_path, BASE), environ={**ENV, "SECONDARY_CS": emulator})
    plain = load_config(write(tmp_path, BASE), environ={**ENV, "PRIMARY_CS": emulator}).primary
    assert plain.plain_amqp and plain.connect_endpoint == "127.0.0.1:5673"


def test_every_network_setting_reaches_the_executors_in_the_source_options(tmp_path, monkeypatch):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = load_config(write(tmp_path, BASE), environ=ENV, overrides={
        "secondary.custom_endpoint_address": "sb://gw.corp.example:8443", "secondary.ca_file": str(ca)})
    options = SourceOptions.from_config(config)
    spark_options = options.to_spark()
    assert spark_options[PROXY_SECRET_OPTION] == PASSWORD and "secret" in PROXY_SECRET_OPTION  # Spark redacts it
    assert PASSWORD not in {value for name, value in spark_options.items() if name != PROXY_SECRET_OPTION}
    read = SourceOptions.from_spark(spark_options)
    assert read == options and read.secondary.connect_endpoint == "gw.corp.example:8443"


def test_the_sdks_keywords_for_each_way():
    from azure.servicebus import TransportType

    from backlog_syphon.servicebus.clients import network_options
    from backlog_syphon.servicebus.peek import proxy_url

    tls = NamespaceConfig(connection_string=Secret(KEYS, "test"))
    assert network_options(tls) == {"transport_type": TransportType.Amqp}
    websockets = NamespaceConfig(connection_string=Secret(KEYS, "test"), transport="amqp-websockets",
                                 custom_endpoint_address="sb://gw:443", ca_file="/etc/ca.pem", proxy_host="egress",
                                 proxy_port=3128, proxy_user="svc@corp", proxy_password=Secret("p:w/d", "test"))
    assert network_options(websockets) == {
        "transport_type": TransportType.AmqpOverWebsocket, "custom_endpoint_address": "sb://gw:443",
        "connection_verify": "/etc/ca.pem",
        "http_proxy": {"proxy_hostname": "egress", "proxy_port": 3128, "username": "svc@corp", "password": "p:w/d"}}
    assert proxy_url(websockets) == "http://svc%40corp:p%3Aw%2Fd@egress:3128"


NAMESPACE = NamespaceConfig(connection_string=Secret(KEYS, "test"), transport="amqp-websockets", proxy_host="egress",
                            proxy_port=3128, proxy_user="svc", proxy_password=Secret(PASSWORD, "test"))


def _chain(*errors):
    """``errors[0]`` raised from ``errors[1]`` raised from ..., as the SDK wraps them."""
    for outer, inner in zip(errors, errors[1:]):
        outer.__cause__ = inner
    return errors[0]


def _verification(message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}")
    error.verify_message = message
    return error


class WebSocketProxyException(Exception):
    """Stands in for websocket-client's (the classification goes by the name and the words)."""


@pytest.mark.parametrize("error, failure, detail", [
    (_chain(ConnectionError("Failed to initiate"), _verification("unable to get local issuer certificate")),
     NetworkFailure.CERTIFICATE_UNTRUSTED, "unable to get local issuer certificate"),
    (_verification("Hostname mismatch, certificate is not valid for 'gw'."), NetworkFailure.CERTIFICATE_NAME_MISMATCH,
     "Hostname mismatch, certificate is not valid for 'gw'."),
    (WebSocketProxyException("failed CONNECT via proxy status: 407"), NetworkFailure.PROXY_AUTHENTICATION, "HTTP 407"),
    (WebSocketProxyException("failed CONNECT via proxy status: 403"), NetworkFailure.PROXY_REFUSED, "HTTP 403"),
    (_chain(RuntimeError("socket-error"), ConnectionRefusedError(111, "Connection refused")),
     NetworkFailure.PROXY_UNREACHABLE, "[Errno 111] Connection refused"),
    (TimeoutError("timed out"), NetworkFailure.PROXY_UNREACHABLE, "no answer"),
])
def test_what_a_connection_error_says_about_the_way(error, failure, detail):
    assert network_problem_of(error, through_proxy=True) == NetworkProblem(failure, detail)


def test_without_a_proxy_a_refused_or_silent_port_is_the_namespaces_and_other_errors_are_not_the_networks():
    assert network_problem_of(ConnectionRefusedError(111, "refused")).failure is NetworkFailure.REFUSED
    assert network_problem_of(TimeoutError()).failure is NetworkFailure.UNANSWERED
    assert network_problem_of(ssl.SSLEOFError(8, "EOF")).failure is NetworkFailure.TLS_FAILED
    assert network_problem_of(ValueError("bad key")) is None


def test_each_line_names_the_namespace_the_transport_the_endpoint_and_the_setting_never_the_password():
    lines = {failure: network_line(NetworkProblem(failure, "why"), NAMESPACE, "secondary") for failure in NetworkFailure}
    for failure, line in lines.items():
        assert line.startswith("cannot reach the secondary namespace contoso.servicebus.windows.net over "
                               "amqp-websockets at contoso.servicebus.windows.net:443 through the proxy egress:3128: "), line
        assert "secondary." in line and PASSWORD not in line and "SharedAccessKey" not in line, line
    assert "the proxy refused the credentials of secondary.proxy_user 'svc'" in lines[NetworkFailure.PROXY_AUTHENTICATION]
    tls = NamespaceConfig(connection_string=Secret(KEYS, "test"))
    blocked = network_line(NetworkProblem(NetworkFailure.UNANSWERED, "no answer"), tls, "primary")
    assert blocked == ("cannot reach the primary namespace contoso.servicebus.windows.net over amqp at "
                       "contoso.servicebus.windows.net:5671: TCP port 5671 did not answer (blocked on the way, or "
                       "nothing listens there): let this machine reach contoso.servicebus.windows.net:5671, or check "
                       "the Endpoint in primary.connection_string, or set primary.transport: amqp-websockets to go "
                       "over 443 where only that is open")
    executors = network_line(NetworkProblem(NetworkFailure.REFUSED, "refused"), tls, "primary", on_executors=True)
    assert executors.startswith("executors cannot reach the primary namespace") and "serverless network policy" in executors
