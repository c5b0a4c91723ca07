"""Messages per second of the pure-Python AMQP codec against python-qpid-proton's, on the same messages.

    cd <repo> && PYTHONPATH=lib .venv/bin/python bench/bench_codec.py [--quick]

Three kinds of message, each measured with both libraries in the same run (ratio = ours / proton,
above 1 means ours is faster):

- data: a backlog copy as the legacy client and the broker leave it, 1 KB data body, the four
  ``x-ms-*`` properties, two application properties, broker annotations and a lock token;
- value: the same envelope around an amqp-value body of the legacy .NET types (map, list, array,
  decimal128, char, uuid, timestamp, the ``com.microsoft`` described values);
- restore: ``restore_message_bytes`` (splicing the raw sections) against what a proton-based
  restore has to do, a full decode, the same changes, and a full encode.

proton's side decodes with ``Message.decode`` (its C codec, then proton's conversion of every
section to Python values, which is what a caller reads) and encodes with ``Message.encode``. The
two sides take turns, five timed rounds each, and each figure is the side's best round (the machine
may be shared, and the best round is the least disturbed one).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

import proton
from proton import Message

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from backlog_syphon.restore.amqp.message import DecodedMessage, MessageHeader, MessageProperties  # noqa: E402
from backlog_syphon.restore.amqp.message_decoding import decode_envelope, decode_message  # noqa: E402
from backlog_syphon.restore.restored_message import restore_message_bytes  # noqa: E402
from backlog_syphon.restore.amqp.sections import sequence_number  # noqa: E402
from backlog_syphon.restore.amqp.values import (  # noqa: E402
    Array,
    Char,
    Decimal128,
    Described,
    Int,
    Symbol,
    Timestamp,
    UInt,
)

ENQUEUED_MS = 1_714_560_000_000
LEGACY_KEYS = ("x-ms-path", "x-ms-sessionid", "x-ms-timetolive", "x-ms-scheduledenqueuetimeutc")


def backlog_message(body_kind: str, body) -> bytes:
    """A backlog copy like ``backlog_writer`` sends and the broker then stores."""
    return DecodedMessage(
        header=MessageHeader(durable=True, delivery_count=UInt(1)),
        delivery_annotations={Symbol("x-opt-lock-token"): uuid.UUID(int=7)},
        message_annotations={
            Symbol("x-opt-sequence-number"): 4242,
            Symbol("x-opt-enqueued-time"): Timestamp(ENQUEUED_MS),
            Symbol("x-opt-locked-until"): Timestamp(ENQUEUED_MS + 60_000),
            Symbol("x-opt-partition-key"): "customer-7",
        },
        properties=MessageProperties(message_id="msg-0-4242", correlation_id="corr-17", subject="order",
                                     content_type=Symbol("application/octet-stream")),
        application_properties={
            "index": 4242,
            "source": "backlog-writer",
            "x-ms-path": "sessions-orders",
            "x-ms-sessionid": "customer-7",
            "x-ms-timetolive": Described(Symbol("com.microsoft:timespan"), 864_000_000_000),
            "x-ms-scheduledenqueuetimeutc": Timestamp(ENQUEUED_MS + 5_000),
        },
        body_kind=body_kind,
        body=body,
    ).encode()


DOTNET_VALUE = {
    "amount": Decimal128.from_decimal(Decimal("1234.50")),
    "grade": Char("A"),
    "lines": [Int(1), "two", 3.5, True],
    "codes": Array("int", [1, 2, 3, 4]),
    "tags": Array("string", ["red", "green"]),
    "id": uuid.UUID(int=12345),
    "when": Timestamp(ENQUEUED_MS),
    "link": Described(Symbol("com.microsoft:uri"), "https://example.com/orders/1"),
    "at": Described(Symbol("com.microsoft:datetime-offset"), 638_500_000_000_000_000),
    "wait": Described(Symbol("com.microsoft:timespan"), 600_000_000),
}


# --- proton's side ---------------------------------------------------------------------------------

def proton_decode(raw: bytes) -> Message:
    message = Message()
    message.decode(raw)  # also converts every section to Python values
    return message


def proton_message(raw: bytes) -> Message:
    """A proton Message equal to ``raw``, built the way a caller would (for the encode figure)."""
    decoded = proton_decode(raw)
    message = Message(body=decoded.body, inferred=decoded.inferred, properties=dict(decoded.properties),
                      annotations=dict(decoded.annotations), instructions=dict(decoded.instructions))
    for name in ("id", "correlation_id", "subject", "content_type", "durable", "delivery_count"):
        setattr(message, name, getattr(decoded, name))
    return message


def proton_restore(raw: bytes, ttl_ms: int) -> bytes:
    """The restore, done the proton way: decode everything, change it, encode everything."""
    message = proton_decode(raw)
    properties = message.properties
    session_id = properties.get("x-ms-sessionid")
    scheduled = properties.get("x-ms-scheduledenqueuetimeutc")
    message.properties = {key: value for key, value in properties.items() if key not in LEGACY_KEYS}
    annotations = {key: value for key, value in message.annotations.items()
                   if key not in ("x-opt-sequence-number", "x-opt-enqueued-time", "x-opt-locked-until")}
    annotations[proton.symbol("x-opt-scheduled-enqueue-time")] = proton.timestamp(scheduled)
    message.annotations = annotations
    message.instructions = None
    message.group_id = session_id
    message.ttl = ttl_ms / 1000
    message.delivery_count = 0
    return bytes(message.encode())


# --- timing ----------------------------------------------------------------------------------------

def compare(ours, our_argument, theirs, their_argument, count: int, rounds: int = 5) -> tuple[float, float]:
    """Calls per second of each side, the sides taking turns; each side's best round."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for side, (operation, argument) in enumerate(((ours, our_argument), (theirs, their_argument))):
            start = time.perf_counter()
            for _ in range(count):
                operation(argument)
            best[side] = min(best[side], time.perf_counter() - start)
    return count / best[0], count / best[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (about a second in all)")
    args = parser.parse_args(argv)
    count = 200 if args.quick else 1000

    payload = bytes(range(256)) * 4  # 1 KB
    data_raw = backlog_message("data", (payload,))
    value_raw = backlog_message("value", DOTNET_VALUE)
    for raw in (data_raw, value_raw):  # both libraries must read these messages, and agree on the body
        assert decode_message(raw).application_properties["x-ms-path"] == proton_decode(raw).properties["x-ms-path"]
    data_proton, value_proton = proton_message(data_raw), proton_message(value_raw)
    data_ours, value_ours = decode_message(data_raw), decode_message(value_raw)

    def restore(raw):
        return restore_message_bytes(raw, 600_000)

    def restore_with_proton(raw):
        return proton_restore(raw, 600_000)

    cases = [
        ("data: decode", decode_message, proton_decode, data_raw, data_raw),
        ("data: decode, body not copied (backlog rows)", decode_envelope, proton_decode, data_raw, data_raw),
        ("data: sequence number only (probes)", sequence_number, proton_decode, data_raw, data_raw),
        ("data: encode", DecodedMessage.encode, Message.encode, data_ours, data_proton),
        ("value: decode", decode_message, proton_decode, value_raw, value_raw),
        ("value: encode", DecodedMessage.encode, Message.encode, value_ours, value_proton),
        ("data: restore (splice vs decode+encode)", restore, restore_with_proton, data_raw, data_raw),
        ("value: restore (splice vs decode+encode)", restore, restore_with_proton, value_raw, value_raw),
    ]
    print(f"messages: data {len(data_raw)} bytes, value {len(value_raw)} bytes; {count} per round, best of 5")
    print(f"{'case':<48} {'ours msg/s':>12} {'proton msg/s':>13} {'ratio':>7}")
    for name, ours, theirs, our_argument, their_argument in cases:
        our_rate, their_rate = compare(ours, our_argument, theirs, their_argument, count)
        print(f"{name:<48} {our_rate:>12,.0f} {their_rate:>13,.0f} {our_rate / their_rate:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
