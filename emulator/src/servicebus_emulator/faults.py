"""Injected faults: counted, one-shot failures of chosen requests, for testing a client's error paths.

A fault names an operation and an entity (or every entity of its namespace) and fires on the next
``count`` matching requests, then is spent. Where it fired is counted in that entity's ``ops`` as
``fault_<operation>``, so a test can assert that the path it meant to exercise really ran.

A fault changes nothing but the answer: the request is refused as if the broker had failed it, and
the messages, locks and links it concerned stay as they were (a retry can succeed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .broker import BrokerError

PEEK_MODES = ("empty", "short")
# the condition each operation fails with unless told otherwise. A receive fault detaches the link,
# and the SDK recovers (re-attaches on the next receive) only from conditions whose exception shuts
# its handler down: detach-forced does (ServiceBusConnectionError); lock-lost or server-busy would
# leave that receiver raising the same error on every later receive.
DEFAULT_CONDITIONS = {
    "receive": "amqp:link:detach-forced",
    "settle": "com.microsoft:message-lock-lost",
    "management": "com.microsoft:server-busy",
    # an update-disposition of several lock tokens finds its last token's lock lost (as if it had expired): the
    # request is then answered as the namespace's multi_token_disposition says
    "lose_lock": "com.microsoft:message-lock-lost",
}
OPERATIONS = tuple(DEFAULT_CONDITIONS)

# management answers carry a status code beside the condition; the SDK maps the condition, the code
# is what a real namespace sends with it
STATUS_BY_CONDITION = {
    "com.microsoft:message-lock-lost": 410,
    "com.microsoft:session-lock-lost": 410,
    "com.microsoft:message-not-found": 404,
    "amqp:not-found": 404,
    "com.microsoft:server-busy": 503,
    "com.microsoft:timeout": 408,
    "amqp:resource-limit-exceeded": 403,
    "amqp:unauthorized-access": 401,
}


@dataclass
class Fault:
    operation: str                  # one of OPERATIONS, or "peek"
    entity: Optional[str]           # lower-case entity path; None = every entity of the namespace
    remaining: int
    condition: str = ""             # peek faults have none: they answer with fewer messages
    mode: str = ""                  # peek faults: "empty" or "short"
    min_message_count: int = 0      # peek faults: only pages asking for at least this many messages
    min_from_sequence: int = 0      # peek faults: only pages starting at this sequence number or later

    def matches(self, operation: str, path: str, message_count: int, from_sequence: int) -> bool:
        return (self.operation == operation and self.entity in (None, path.lower())
                and message_count >= self.min_message_count and from_sequence >= self.min_from_sequence)

    def error(self) -> BrokerError:
        return BrokerError(self.condition, f"Injected fault: {self.operation} failed with {self.condition}.",
                           STATUS_BY_CONDITION.get(self.condition, 500))


class Faults:
    """The pending faults of one namespace, in the order they were injected."""

    def __init__(self):
        self.pending: List[Fault] = []

    def add(self, fault: Fault) -> None:
        if fault.remaining < 1:
            raise ValueError(f"count must be >= 1, got {fault.remaining}")
        self.pending.append(fault)

    def take(self, operation: str, target, *, message_count: int = 0, from_sequence: int = 0) -> Optional[Fault]:
        """The first pending fault matching this request, now fired once (and counted on ``target``)."""
        for fault in self.pending:
            if fault.matches(operation, target.path, message_count, from_sequence):
                fault.remaining -= 1
                if not fault.remaining:
                    self.pending.remove(fault)
                target.ops[f"fault_{operation}"] += 1
                return fault
        return None

    def count(self, operation: Optional[str], entity: Optional[str]) -> int:
        """Firings left, of faults of ``operation`` injected for ``entity`` (None: of any)."""
        return sum(f.remaining for f in self.pending
                   if operation in (None, f.operation) and (entity is None or f.entity == entity.lower()))

    def clear(self) -> int:
        left = self.count(None, None)
        self.pending.clear()
        return left
