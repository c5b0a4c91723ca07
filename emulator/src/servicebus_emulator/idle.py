"""Idle timers, as Service Bus has them: links without activity are detached, connections without
links are closed.

The service detaches a link on which no call has been made for 10 minutes (``amqp:link:detach-forced``,
"IdleTimerExpired"), and closes a connection whose links have all been gone for 5 minutes, or that
opened no link within 1 minute of opening (``amqp:connection:forced``). The timers apply to links to
entities and their ``$management`` nodes; the ``$cbs`` pair, the connection's channel for tokens,
is neither detached nor counted as a link (the SDK uses it only to renew a token, about once an hour,
and waits for a detached one until its auth timeout, 60 s, on the next call: a service that detached
it would hang every long-lived sender). A link's activity is every transfer the client sends on it
(a message, a ``$management`` request: a request and its answer keep both links of the pair active),
every flow it sends (the credit a ``receive_messages`` call issues), every delivery the broker sends
on it and every settlement. No I/O: the server stamps the times (``time.monotonic``) and acts on what
this module says.

Invariants:
- a link is idle from its last activity (or its attach), a connection from the moment it has no link
  left (or its opening, if it never had one): the first timer that runs out decides;
- the texts are the service's, with the link's name and the timeout filled in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

LINK_DETACH_FORCED = "amqp:link:detach-forced"
CONNECTION_FORCED = "amqp:connection:forced"

# the service's own names for the two ends of a link, by the direction the client sends in
_PUBLISHER, _CONSUMER = ("publisher", "AmqpMessagePublisher"), ("consumer", "AmqpMessageConsumer")
CLIENT_SENDS = frozenset({"send", "mgmt-in"})
# the kinds of link the timers watch (every kind but the $cbs pair)
TIMED_KINDS = frozenset({"send", "recv", "mgmt-in", "mgmt-out"})


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass(frozen=True)
class IdleTimers:
    link_seconds: float
    connection_seconds: float
    new_connection_seconds: float

    @classmethod
    def of(cls, settings) -> "IdleTimers":
        return cls(settings.link_idle_timeout_seconds, settings.connection_idle_timeout_seconds,
                   settings.new_connection_idle_timeout_seconds)

    def link_expired(self, active_at: float, now: float) -> bool:
        return now - active_at >= self.link_seconds

    def connection_timeout(self, ever_linked: bool) -> float:
        return self.connection_seconds if ever_linked else self.new_connection_seconds

    def connection_expired(self, linkless_since: Optional[float], ever_linked: bool, now: float) -> bool:
        return linkless_since is not None and now - linkless_since >= self.connection_timeout(ever_linked)

    def link_description(self, link_name: str, link_number: int, kind: str) -> str:
        code, origin = _PUBLISHER if kind in CLIENT_SENDS else _CONSUMER
        return (f"The link '{link_name}' is force detached. Code: {code}(link{link_number}). Details: "
                f"{origin}.IdleTimerExpired: Idle timeout: {_clock(self.link_seconds)}.")

    def connection_description(self, container: str, ever_linked: bool) -> str:
        milliseconds = int(round(self.connection_timeout(ever_linked) * 1000))
        return (f"The connection was closed by container '{container}' because it did not have any active links "
                f"in the past {milliseconds} milliseconds.")
