"""Write a backlog exactly as the legacy .NET paired-namespace sender did, to rehearse a replay.

Each original message is rewritten like ``SendAvailabilityPairedNamespaceMessageSender`` did:
``x-ms-path`` (destination), ``x-ms-sessionid`` (string), ``x-ms-timetolive``
(``com.microsoft:timespan`` ticks) and ``x-ms-scheduledenqueuetimeutc`` (AMQP timestamp); the
originals cleared. As with the legacy client, one simulated sender picks a random backlog queue
and keeps it, so messages for many destinations mix in one queue and a session's messages stay
together.

Command (from the repository root): ``python -m tools.backlog_writer --config conf/local.yaml --count 5000``
writes a realistic mix. A development tool: not part of the wheel.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import random
import sys
import uuid
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from backlog_syphon.model import ReasonCode
from backlog_syphon.restore.amqp.message import DecodedMessage, MessageProperties
from backlog_syphon.restore.amqp.values import Described, Symbol, Timestamp
from backlog_syphon.restore.queue_names import backlog_queue_name
from backlog_syphon.sink.delivery import Outgoing

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OriginalMessage:
    """What an application meant to send to the primary namespace."""

    destination: str | None  # None: no x-ms-path at all (a poison message)
    body: bytes
    message_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str | None = None
    time_to_live: dt.timedelta | None = None
    scheduled_enqueue_time: dt.datetime | None = None
    correlation_id: str | None = None
    subject: str | None = None
    content_type: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    to: str | None = None
    partition_key: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)  # values typed as in restore.amqp.values
    legacy_overrides: dict[str, Any] = field(default_factory=dict)  # raw x-ms-* values, to forge poison messages


TIMESPAN_DESCRIPTOR = Symbol("com.microsoft:timespan")
_TICKS_PER_MS = 10_000


def legacy_backlog_bytes(original: OriginalMessage) -> bytes:
    """The backlog copy the legacy .NET client made of ``original``, as AMQP bytes.

    Session id, TTL and schedule move into ``x-ms-*`` properties with the .NET wire encodings
    (string, ``com.microsoft:timespan``-described long of ticks, timestamp); the destination goes
    into ``x-ms-path``; the originals are cleared so the copy is visible at once and never expires.
    """
    properties = dict(original.application_properties)
    if original.destination is not None:
        properties["x-ms-path"] = original.destination
    if original.session_id is not None:
        properties["x-ms-sessionid"] = original.session_id
    if original.time_to_live is not None:
        ticks = int(original.time_to_live / dt.timedelta(milliseconds=1)) * _TICKS_PER_MS
        properties["x-ms-timetolive"] = Described(TIMESPAN_DESCRIPTOR, ticks)
    if original.scheduled_enqueue_time is not None:
        properties["x-ms-scheduledenqueuetimeutc"] = Timestamp.from_datetime(original.scheduled_enqueue_time)
    properties.update(original.legacy_overrides)
    return DecodedMessage(
        properties=MessageProperties(
            message_id=original.message_id, correlation_id=original.correlation_id, subject=original.subject,
            content_type=original.content_type, reply_to=original.reply_to,
            reply_to_group_id=original.reply_to_session_id, to=original.to),
        application_properties=properties,
        message_annotations={"x-opt-partition-key": original.partition_key} if original.partition_key else {},
        body=(original.body,),
    ).encode()


def send_legacy_backlog(secondary, per_queue: dict[str, list[OriginalMessage]], *, singly: bool = False) -> None:
    """Send each queue's originals, in order, as legacy backlog copies (batched; ``singly``: one transfer
    each, as the legacy client sends them, so that keyless copies go round a partitioned queue's
    partitions where a batch lands in one); the queues at once (``tools.testing.each_at_once``)."""
    from backlog_syphon.servicebus.clients import open_client
    from backlog_syphon.servicebus.sdk_internals import prompt
    from backlog_syphon.servicebus.send import send_encoded
    from tools.testing import each_at_once

    def send(queue: str) -> None:
        with open_client(secondary, role="secondary") as client, prompt(client.get_queue_sender(queue)) as sender:
            outgoing = [Outgoing(legacy_backlog_bytes(o), o.message_id, None, o.partition_key) for o in per_queue[queue]]
            for sends in ([[one] for one in outgoing] if singly else [outgoing]):
                for _ in send_encoded(sender, sends):
                    pass

    each_at_once(per_queue, send, name="write-backlog")


def write_backlog(secondary, primary_namespace: str, messages: Iterable[OriginalMessage], *, queue_count: int = 10,
                  senders: int = 40, seed: int = 0, raw_overrides: dict | None = None,
                  first_queue_share: float | None = None, singly: bool = False) -> dict[str, int]:
    """Send ``messages`` to the backlog queues as legacy clients would; returns count per queue.

    A message's sender is chosen by its destination and session (so a session stays in one queue)
    or, without a session, by its position in chunks; each sender sticks to one random queue.
    ``first_queue_share``: about that share of the senders' messages go to queue 0 instead (a skewed
    backlog, as when one busy sender kept writing through the outage).
    ``singly``: one transfer per message (``send_legacy_backlog``).
    """
    rng = random.Random(seed)
    sender_queue = [backlog_queue_name(primary_namespace, rng.randrange(queue_count)) for _ in range(senders)]
    per_queue: dict[str, list[OriginalMessage]] = defaultdict(list)
    for index, message in enumerate(messages):
        key = (message.destination, message.session_id) if message.session_id else index // 50
        digest = zlib.crc32(str(key).encode())
        if first_queue_share is not None and (digest >> 8) % 1000 < first_queue_share * 1000:
            per_queue[backlog_queue_name(primary_namespace, 0)].append(message)
        else:
            per_queue[sender_queue[digest % senders]].append(message)
    send_legacy_backlog(secondary, per_queue, singly=singly)
    return {queue: len(batch) for queue, batch in sorted(per_queue.items())}


def realistic_backlog(count: int, *, seed: int = 0, body_size: int = 512, now: dt.datetime | None = None,
                      sessions: int = 20, session_share: float | None = None) -> list[OriginalMessage]:
    """A mix like a real outage leaves: plain queues, a session queue, a topic, TTLs and schedules.

    Destinations are those of ``conf/emulator.yaml``'s primary namespace. A fifth of the messages go
    to the session queue (``session_share`` otherwise), over ``sessions`` sessions, interleaved; the
    other destinations keep their proportions among the rest.
    """
    rng = random.Random(seed)
    now = now or dt.datetime.now(dt.timezone.utc)
    result = []
    for index in range(count):
        roll = rng.random()
        if session_share is not None:  # the same mix with the session queue's share (0.65..0.85 below) changed
            if roll < session_share:
                roll = 0.65 + 0.2 * roll / session_share
            else:
                spread = (roll - session_share) / (1 - session_share) * 0.8
                roll = spread if spread < 0.65 else spread + 0.2
        body = bytes(rng.getrandbits(8) for _ in range(8)) + (f"message {index} ".encode() * body_size)[:body_size]
        common = dict(body=body, message_id=f"msg-{seed}-{index}", content_type="application/octet-stream",
                      application_properties={"index": index, "source": "backlog-writer"})
        if roll < 0.45:
            result.append(OriginalMessage("orders", correlation_id=f"corr-{index % 97}", subject="order", **common))
        elif roll < 0.65:
            result.append(OriginalMessage("payments", time_to_live=dt.timedelta(days=1), **common))
        elif roll < 0.85:
            result.append(OriginalMessage("sessions-orders", session_id=f"customer-{rng.randrange(sessions)}",
                                          **common))
        elif roll < 0.97:
            region = rng.choice(["eu", "us"])
            common["application_properties"] = {**common["application_properties"], "region": region}
            result.append(OriginalMessage("events", subject="event", **common))
        else:
            result.append(OriginalMessage("orders", scheduled_enqueue_time=now + dt.timedelta(seconds=2), **common))
    return result


def poison_backlog(*, seed: int = 0) -> list[tuple[OriginalMessage, ReasonCode]]:
    """Messages the syphon must dead-letter, each with the reason code it must give.

    (Pings are not among them: Service Bus, and the emulator, never let a ping reach a queue.)
    """
    def body(tag: str) -> bytes:
        return f"poison {tag} {seed}".encode()

    return [
        (OriginalMessage(None, body("no-path"), message_id=f"poison-{seed}-missing-path"), ReasonCode.MISSING_PATH),
        (OriginalMessage("orders", body("typed"), message_id=f"poison-{seed}-session-type",
                         legacy_overrides={"x-ms-sessionid": 42}), ReasonCode.INVALID_LEGACY_PROPERTY),
        (OriginalMessage("orders", body("ttl"), message_id=f"poison-{seed}-ttl-type",
                         legacy_overrides={"x-ms-timetolive": "soon"}), ReasonCode.INVALID_LEGACY_PROPERTY),
        (OriginalMessage("no-such-queue", body("unknown"), message_id=f"poison-{seed}-unknown"),
         ReasonCode.DESTINATION_NOT_FOUND),
        (OriginalMessage("small", b"L" * (96 * 1024), message_id=f"poison-{seed}-too-large"),
         ReasonCode.MESSAGE_TOO_LARGE),
        # sent before its queue required sessions: Service Bus refuses it for good (amqp:not-allowed)
        (OriginalMessage("sessions-orders", body("sessionless"), message_id=f"poison-{seed}-no-session"),
         ReasonCode.SESSION_REQUIRED),
        # a SessionId and a PartitionKey that differ: refused on any entity
        (OriginalMessage("orders", body("keys"), message_id=f"poison-{seed}-keys-differ", session_id="customer-1",
                         partition_key="customer-2"), ReasonCode.SESSION_ID_NOT_PARTITION_KEY),
    ]


def main(argv: list[str] | None = None) -> int:
    from backlog_syphon.config import ConfigError, load_config, parse_overrides

    parser = argparse.ArgumentParser(description="Write a legacy-format backlog to rehearse a replay.")
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--body-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    try:
        config = load_config(args.config, overrides=parse_overrides(args.set))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    written = write_backlog(config.secondary, config.primary.namespace,
                            realistic_backlog(args.count, seed=args.seed, body_size=args.body_size),
                            queue_count=config.backlog.queue_count, seed=args.seed)
    for queue, count in written.items():
        print(f"{queue}: {count}")
    print(f"total: {sum(written.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
