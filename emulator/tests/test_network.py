"""The listeners a real namespace has, with the unmodified SDK: AMQP over TLS and AMQP over WebSockets over
TLS (through a real HTTP CONNECT proxy too), and what the SDK meets when a certificate, a host name, a path
or a proxy is wrong."""
import socket
import ssl
import time

import pytest
import websocket
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage

from servicebus_emulator import Emulator, EmulatorConfig
from tools.http_proxy import HttpProxy

from conftest import CONFIG, KEY

TRANSPORTS = ("amqps", "amqp-websockets")
USER, PASSWORD = "syphon", "proxy-password"


def client(emu, transport, *, namespace="contoso", **options):
    kwargs = {**emu.client_options(namespace, transport), **options}
    return ServiceBusClient.from_connection_string(emu.connection_string(namespace, transport=transport),
                                                   retry_total=0, **kwargs)


def chain(exc):
    """The error and what it wraps (the SDK keeps the cause as ``inner_exception``)."""
    found = []
    while exc is not None and len(found) < 10:
        found.append(exc)
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return found


def failure(emu, transport, **options):
    with pytest.raises(Exception) as raised:
        with client(emu, transport, **options) as c, c.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("never"))
    return chain(raised.value)


@pytest.fixture(scope="module")
def proxy():
    with HttpProxy(user=USER, password=PASSWORD, refused_hosts=("127.0.0.2",)) as running:
        yield running


@pytest.mark.parametrize("transport", [*TRANSPORTS, "amqp-websockets through the proxy"])
def test_messages_sessions_and_management_travel_over_tls_and_websockets(emulator, new_queue, proxy, transport):
    options = {}
    if transport.endswith("proxy"):
        transport, options = "amqp-websockets", {"http_proxy": proxy.sdk_option(user=USER, password=PASSWORD)}
    queue, sessions = new_queue(), new_queue(requires_session=True)
    big = b"\x00\xff" * 100_000                     # 200 KB: many AMQP frames and WebSocket messages
    with client(emulator, transport, **options) as c:
        with c.get_queue_sender(queue) as sender, c.get_queue_sender(sessions) as session_sender:
            sender.send_messages([ServiceBusMessage(big, message_id="big"), ServiceBusMessage("small")])
            session_sender.send_messages([ServiceBusMessage(f"s{i}", session_id="a") for i in range(3)])
        with c.get_queue_receiver(queue) as receiver:
            peeked = receiver.peek_messages(max_message_count=5)
            received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            receiver.renew_message_lock(received[0])                       # $management
            for message in received:
                receiver.complete_message(message)                         # a disposition the SDK waits for
            assert receiver.receive_messages(max_message_count=1, max_wait_time=0.2) == []
        with c.get_queue_receiver(sessions, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as session_receiver:
            in_session = session_receiver.receive_messages(max_message_count=3, max_wait_time=5)
            for message in in_session:
                session_receiver.complete_message(message)
    assert [m.sequence_number for m in peeked] == [1, 2]
    assert [b"".join(m.body) for m in received] == [big, b"small"]
    assert [str(m) for m in in_session] == ["s0", "s1", "s2"] and in_session[0].session_id == "a"


def test_connection_strings_and_options_name_each_listener(emulator):
    ports = {transport: emulator.port("contoso", transport) for transport in ("amqp", *TRANSPORTS)}
    assert len(set(ports.values())) == 3
    assert emulator.connection_string("contoso", transport="amqps") == (
        f"Endpoint=sb://127.0.0.1/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY}")
    options = emulator.client_options("contoso", "amqp-websockets")
    assert options["custom_endpoint_address"] == f"sb://127.0.0.1:{ports['amqp-websockets']}"
    assert options["connection_verify"] == emulator.ca_file
    assert emulator.client_options("contoso", "amqp") == {}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_certificate_from_an_authority_the_client_does_not_trust_is_refused(emulator, transport):
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as other:
        causes = failure(emulator, transport, connection_verify=other.ca_file)
    verdict = next(c for c in causes if isinstance(c, ssl.SSLCertVerificationError))
    assert "unable to get local issuer certificate" in verdict.verify_message


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_certificate_that_does_not_name_the_host_is_refused(transport):
    with Emulator(EmulatorConfig.from_dict(CONFIG), certificate_names=["servicebus.test"]) as emu:
        causes = failure(emu, transport)
    verdict = next(c for c in causes if isinstance(c, ssl.SSLCertVerificationError))
    assert "mismatch" in verdict.verify_message and "127.0.0.1" in verdict.verify_message


def test_the_plain_port_speaks_no_tls_and_the_tls_port_no_plain_amqp(emulator):
    causes = failure(emulator, "amqps", custom_endpoint_address=emulator.endpoint("contoso", "amqp"))
    assert any(isinstance(c, ssl.SSLError) for c in causes)
    started = time.monotonic()
    with pytest.raises(Exception):
        plain_to_tls = emulator.connection_string("contoso").replace(
            f":{emulator.port('contoso')};", f":{emulator.port('contoso', 'amqps')};")
        with ServiceBusClient.from_connection_string(plain_to_tls, retry_total=0) as c, \
                c.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("never"))
    assert time.monotonic() - started < 15


def test_websocket_upgrades_of_another_path_or_without_the_amqp_subprotocol_are_refused(emulator):
    url = f"wss://127.0.0.1:{emulator.port('contoso', 'amqp-websockets')}"
    tls = {"ca_certs": emulator.ca_file}
    with pytest.raises(websocket.WebSocketBadStatusException) as wrong_path:
        websocket.create_connection(f"{url}/somewhere", subprotocols=["AMQPWSB10"], sslopt=tls, timeout=5)
    with pytest.raises(websocket.WebSocketBadStatusException) as no_subprotocol:
        websocket.create_connection(f"{url}/$servicebus/websocket", sslopt=tls, timeout=5)
    assert (wrong_path.value.status_code, no_subprotocol.value.status_code) == (404, 400)
    accepted = websocket.create_connection(f"{url}/$servicebus/websocket", subprotocols=["AMQPWSB10"], sslopt=tls,
                                           timeout=5)
    assert accepted.getsubprotocol().upper() == "AMQPWSB10"
    accepted.send_binary(b"AMQP\x03\x01\x00\x00")                 # the SASL header: the broker answers in kind
    assert accepted.recv()[:8] == b"AMQP\x03\x01\x00\x00"
    accepted.close()


@pytest.mark.parametrize("credentials, status", [(None, "407"), ((USER, "wrong"), "407")])
def test_a_proxy_that_asks_for_credentials_refuses_the_tunnel_without_them(emulator, proxy, credentials, status):
    option = proxy.sdk_option(**dict(zip(("user", "password"), credentials or ())))
    causes = failure(emulator, "amqp-websockets", http_proxy=option)
    assert any(type(c).__name__ == "WebSocketProxyException" and f"status: {status}" in str(c) for c in causes)


def test_a_proxy_that_refuses_the_destination_and_a_proxy_that_is_not_there(emulator, proxy):
    option = proxy.sdk_option(user=USER, password=PASSWORD)
    port = emulator.port("contoso", "amqp-websockets")
    refused = failure(emulator, "amqp-websockets", http_proxy=option, custom_endpoint_address=f"sb://127.0.0.2:{port}")
    assert any(type(c).__name__ == "WebSocketProxyException" for c in refused)
    with socket.socket() as probe:                                 # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        nowhere = probe.getsockname()[1]
    absent = failure(emulator, "amqp-websockets", http_proxy={**option, "proxy_port": nowhere})
    assert any(isinstance(c, ConnectionRefusedError) for c in absent)
