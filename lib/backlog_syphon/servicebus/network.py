"""The way to a namespace over the network, decided on plain values: what a failure to get there was (a
certificate, a host name, a proxy, a blocked port) and the one line that tells an operator which setting
to change. Pure: errors are sorted by their types and words, the SDK is not imported (``probes`` meets
its exceptions; ``clients`` turns the settings into its keywords).

What the SDK (azure-servicebus 7.15.0) does with the settings, which the lines below take for granted:
- ``amqp``: TLS to the namespace's host on 5671, or to ``custom_endpoint_address``'s host and port; the
  certificate is checked against the host connected to (SNI is that host too), trusting ``ca_file`` or
  else certifi's authorities;
- ``amqp-websockets``: ``wss://<host>:443/$servicebus/websocket`` (subprotocol ``AMQPWSB10``), or the custom
  endpoint's host and port, through the HTTP proxy with CONNECT when one is set (basic credentials when a
  user is given); the same certificate checks.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.model import NetworkFailure, Transport


@dataclass(frozen=True)
class NetworkProblem:
    """Why a namespace could not be reached, and the words of whatever said so (never a secret: the TLS
    library's verdict, a proxy's status)."""

    failure: NetworkFailure
    detail: str = ""


_PROXY_STATUS = re.compile(r"via proxy status: (\d{3})")
_HANDSHAKE_STATUS = re.compile(r"Handshake status (\d{3})")


def causes(exc: BaseException) -> list[BaseException]:
    """The error and what it wraps: the SDK keeps the cause as ``inner_exception`` (or ``error``), Python as
    ``__cause__`` and ``__context__``."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 12:
        current = todo.pop()
        if not isinstance(current, BaseException) or any(current is known for known in seen):
            continue
        seen.append(current)
        todo += [getattr(current, "error", None), current.__context__, current.__cause__,
                 getattr(current, "inner_exception", None)]
    return seen


def network_problem_of(exc: BaseException, *, through_proxy: bool = False) -> NetworkProblem | None:
    """What a client's error says about the way to the namespace (None: it is about something else, such as
    credentials). ``through_proxy``: the namespace is reached through an HTTP proxy, so a refused or
    unanswered connection is the proxy's."""
    chain = causes(exc)
    for cause in chain:
        name = type(cause).__name__
        if isinstance(cause, ssl.SSLCertVerificationError):
            verdict = cause.verify_message or str(cause)
            failure = NetworkFailure.CERTIFICATE_NAME_MISMATCH if "mismatch" in verdict.lower() else \
                NetworkFailure.CERTIFICATE_UNTRUSTED
            return NetworkProblem(failure, verdict)
        if name == "WebSocketProxyException":
            status = _PROXY_STATUS.search(str(cause))
            code = status.group(1) if status else "?"
            failure = NetworkFailure.PROXY_AUTHENTICATION if code == "407" else NetworkFailure.PROXY_REFUSED
            return NetworkProblem(failure, f"HTTP {code}")
        if name == "WebSocketBadStatusException":
            status = _HANDSHAKE_STATUS.search(str(cause))
            return NetworkProblem(NetworkFailure.WEBSOCKET_REFUSED, f"HTTP {status.group(1) if status else '?'}")
        if name in ("gaierror", "WebSocketAddressException"):  # socket's: a name that does not resolve
            return NetworkProblem(NetworkFailure.UNKNOWN_HOST, _first_line(cause))
    for cause in chain:
        if isinstance(cause, ConnectionRefusedError):
            return NetworkProblem(NetworkFailure.PROXY_UNREACHABLE if through_proxy else NetworkFailure.REFUSED,
                                  _first_line(cause))
        if isinstance(cause, ssl.SSLError):
            return NetworkProblem(NetworkFailure.TLS_FAILED, getattr(cause, "reason", None) or _first_line(cause))
        if isinstance(cause, TimeoutError) or type(cause).__name__ == "WebSocketTimeoutException":
            return NetworkProblem(NetworkFailure.PROXY_UNREACHABLE if through_proxy else NetworkFailure.UNANSWERED,
                                  "no answer")
    return None


def network_line(problem: NetworkProblem, namespace: NamespaceConfig, role: str, *, on_executors: bool = False) -> str:
    """One line naming the namespace, the transport, where the syphon connected (and through which proxy),
    what went wrong and the setting to change. Never a secret: no password, key or connection string.
    ``on_executors``: the executors met it (the driver may not have)."""
    line = _network_line(problem, namespace, role, "executors cannot" if on_executors else "cannot")
    if on_executors:
        line += ("; on Databricks serverless, the workspace's serverless network policy must allow it, elsewhere the "
                 "cluster's workers must reach it")
    return line


def _network_line(problem: NetworkProblem, namespace: NamespaceConfig, role: str, who: str) -> str:
    transport = namespace.transport_kind
    target = namespace.connect_endpoint
    host, _, port = target.rpartition(":")
    via = f" through the proxy {namespace.proxy_address}" if namespace.proxy_address else ""
    plain = " (plain, no TLS)" if namespace.plain_amqp else ""
    where = f"{who} reach the {role} namespace {namespace.endpoint} over {transport}{plain} at {target}{via}"
    endpoint_setting = (f"{role}.custom_endpoint_address" if namespace.custom_endpoint_address
                        else address_setting(namespace, role))
    failure, detail = problem.failure, problem.detail
    if failure is NetworkFailure.CERTIFICATE_UNTRUSTED:
        trusted = f"the authorities in {role}.ca_file" if namespace.ca_file else "the system's authorities"
        return (f"{where}: its TLS certificate is not trusted ({detail}) by {trusted}: set {role}.ca_file to the PEM "
                f"file of the authority that signed it (a TLS-inspecting proxy's or a private one)")
    if failure is NetworkFailure.CERTIFICATE_NAME_MISMATCH:
        return (f"{where}: its TLS certificate does not name {host} ({detail}): set {endpoint_setting} to a host "
                f"name the certificate names")
    if failure is NetworkFailure.TLS_FAILED:
        return (f"{where}: no TLS handshake ({detail}): port {port} does not speak TLS, or something on the way cut "
                f"it off: check {endpoint_setting} and {role}.transport")
    if failure in (NetworkFailure.REFUSED, NetworkFailure.UNANSWERED):
        how = "refused the connection" if failure is NetworkFailure.REFUSED else "did not answer"
        hint = (f", or set {role}.transport: amqp-websockets to go over 443 where only that is open"
                if transport is Transport.AMQP and not namespace.plain_amqp else "")
        return (f"{where}: TCP port {port} {how} (blocked on the way, or nothing listens there): let this machine "
                f"reach {target}, or check {endpoint_setting}{hint}")
    if failure is NetworkFailure.PROXY_UNREACHABLE:
        return (f"{where}: the proxy {'refused the connection' if 'no answer' not in detail else 'did not answer'}: "
                f"check {role}.proxy_host and {role}.proxy_port")
    if failure is NetworkFailure.PROXY_AUTHENTICATION:
        if namespace.proxy_user:
            return (f"{where}: the proxy refused the credentials of {role}.proxy_user '{namespace.proxy_user}' "
                    f"({detail}): check {role}.proxy_user and {role}.proxy_password")
        return (f"{where}: the proxy asks for credentials ({detail}): set {role}.proxy_user and "
                f"{role}.proxy_password ({{env: VAR}} or {{secret: scope/key}})")
    if failure is NetworkFailure.PROXY_REFUSED:
        return (f"{where}: the proxy refused the tunnel ({detail}): have it allow CONNECT to {target}, or check "
                f"{role}.proxy_host and {role}.proxy_port")
    if failure is NetworkFailure.WEBSOCKET_REFUSED:
        return (f"{where}: the WebSocket upgrade was answered {detail}, not by Service Bus: check {endpoint_setting} "
                f"and {role}.transport")
    return f"{where}: {host} is not a known host name ({detail}): check {endpoint_setting}"


def address_setting(namespace: NamespaceConfig, role: str) -> str:
    """The setting that names the namespace's host."""
    if namespace.connection_string is not None:
        return f"the Endpoint in {role}.connection_string"
    return f"{role}.fully_qualified_namespace"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
