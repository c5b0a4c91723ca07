"""How a destination's messages are cut into sends: pure, on plain values.

A partitioned entity stores each message in the partition its key names (SessionId, else PartitionKey,
else, with duplicate detection on, MessageId), and it takes a batch only when the batch names one
partition: "Batching messages with distinct SessionId or PartitionKey isn't supported on partitioned
namespaces", and with duplicate detection "Batching brokered messages with distinct SessionId,
PartitionKey, or MessageId is not supported". So:

- every destination gets batches of one session and one partition key (``SendShape.KEYED_BATCHES``):
  a partitioned one needs it, and on any other it costs nothing that can be seen (order is only
  observable per session, and a session's messages share their key);
- a partitioned destination with duplicate detection gets one message per send
  (``SendShape.SINGLE_MESSAGES``). Keyless ones (no session, no partition key: the service spreads
  them over its partitions by MessageId, so it keeps no order among them) go up to ``MAX_IN_FLIGHT``
  in flight on its link at once, so that it is not fed at one message per round trip. A session's or
  partition key's go one after the other: in flight, a transient refusal of one while the next was
  stored would put it after that one, and order per session is an invariant.

Where the administration API answers, the shape is known before the first send
(``shape_for``). Elsewhere a batch's refusal for its shape teaches the sender: it sends that batch
again as single messages and remembers the destination (``SendShapes.learn``): for the rest of the task,
for the process's later tasks, and, reported to the driver with the task's pacing, for the run's later
send rounds. Nothing is dead-lettered for the shape of a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from backlog_syphon.model import DestinationShape, SendShape

# Single-message sends in flight on one link at once: enough to hide a far primary's round trip (64 sends of
# a round trip each at 25 ms is 2,500 messages a second per link), few enough that a link that fails leaves
# little to send again.
MAX_IN_FLIGHT = 64


class Keyed(Protocol):
    """What the shape of a send looks at in a message (``model.Outgoing`` or a backlog row's values)."""

    session_id: str | None
    partition_key: str | None


def shape_for(destination: DestinationShape | None) -> SendShape:
    """The send shape of a destination as its administration API describes it (None: not described)."""
    if destination is not None and destination.partitioned and destination.duplicate_detection:
        return SendShape.SINGLE_MESSAGES
    return SendShape.KEYED_BATCHES


def batch_key(session_id: str | None, partition_key: str | None) -> tuple[str | None, str | None]:
    """What the messages of one batch share: their session and their partition key (a partitioned entity's
    partition is chosen by them)."""
    return session_id, partition_key


def next_send_size(shape: SendShape, messages: Sequence[Keyed], largest: int | None = None) -> int:
    """How many of ``messages`` (a destination's next ones, in order) go in its next send: one batch of
    the first message's key, or, for single messages, how many go in flight at once (each its own send:
    keyless ones up to ``MAX_IN_FLIGHT``, a session's or key's one).
    ``largest``: what else bounds it (the pacer, a refused send being narrowed down). At least 1 when
    there are messages."""
    if not messages:
        return 0
    # a batch is cut further by the service's limits where it is sent (``servicebus.send``: 4,500, 1 MB)
    key = batch_key(messages[0].session_id, messages[0].partition_key)
    if shape is SendShape.SINGLE_MESSAGES:
        cap = MAX_IN_FLIGHT if key == (None, None) else 1  # a session's, a key's: one at a time, in order
    else:
        cap = len(messages)
    if largest is not None:
        cap = max(1, min(cap, largest))
    count = 1
    while count < min(cap, len(messages)) and batch_key(messages[count].session_id, messages[count].partition_key) == key:
        count += 1
    return count


def plan_sends(shape: SendShape, messages: Sequence[Keyed]) -> list[list[int]]:
    """The sends of ``messages`` (one destination's, in order), as lists of their indexes: a batch per key,
    in the order of each key's first message, each key's messages in order (``sink.delivery`` groups them
    the same way); for single messages, one send per message in the same order (``MAX_IN_FLIGHT`` of
    them go at once)."""
    by_key: dict[tuple, list[int]] = {}
    for index, message in enumerate(messages):
        by_key.setdefault(batch_key(message.session_id, message.partition_key), []).append(index)
    sends: list[list[int]] = []
    for indexes in by_key.values():
        # (a batch is cut further by the service's limits where it is sent: ``servicebus.send``)
        sends.extend([[index] for index in indexes] if shape is SendShape.SINGLE_MESSAGES else [indexes])
    return sends


@dataclass
class SendShapes:
    """Each destination's send shape: what the administration API said (``known``, by lower-case name) and
    what refusals taught (``learned``; a process keeps one per namespace, so a later task starts with it)."""

    known: Mapping[str, SendShape] = field(default_factory=dict)
    learned: dict[str, SendShape] = field(default_factory=dict)
    refusals: int = 0  # batches refused for their shape (``BATCH_SHAPE_REFUSED``), each sent again singly

    def of(self, destination: str) -> SendShape:
        name = destination.lower()
        return self.learned.get(name) or self.known.get(name) or SendShape.KEYED_BATCHES

    def learn(self, destination: str) -> bool:
        """The destination refused a batch for its shape: from now on it gets single messages. True when that
        is news (the caller logs it once)."""
        if self.of(destination) is SendShape.SINGLE_MESSAGES:
            return False
        self.learned[destination.lower()] = SendShape.SINGLE_MESSAGES
        return True


def known_shapes(destinations: Mapping[str, DestinationShape]) -> dict[str, SendShape]:
    """The send shapes the administration API's descriptions decide (by lower-case name), single-message
    destinations only: every other one gets keyed batches anyway."""
    return {name.lower(): SendShape.SINGLE_MESSAGES for name, shape in destinations.items()
            if shape_for(shape) is SendShape.SINGLE_MESSAGES}
