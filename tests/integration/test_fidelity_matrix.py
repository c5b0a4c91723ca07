"""Every body kind and AMQP value arrives exactly as the legacy sender wrote it.

The backlog is written by python-qpid-proton (an independent AMQP implementation, not the syphon's
writer) the way the legacy .NET client (WindowsAzure.ServiceBus over AMQP) writes it: a Data body of
two sections; AMQP value bodies of every .NET type it maps (string, long, int, char, decimal128,
uuid, timestamp, binary, map, list, array, and the described ``com.microsoft:uri``,
``com.microsoft:datetime-offset`` and ``com.microsoft:timespan``); an AmqpSequence body of two
sections; and application properties of every type. After the syphon ran, a proton receiver at the
destination reads each message's raw bytes, and every section is compared with what was sent
(after the ``x-ms-*`` rewrite; broker annotations aside), type by type at every level: different
encodings of one type (str8/str32) are equal, different types are not.

A message holding a char is also purged (completed) after delivery, through the SDK's receive path
that needed the decoder fix, and one that cannot be decoded is dead-lettered with a reason.
"""

from __future__ import annotations

import uuid

import proton
import pytest
from proton import Data, Described, symbol
from proton.handlers import MessagingHandler
from proton.utils import BlockingConnection

from ..unit.amqp_values import tagged
from .conftest import PRIMARY, SECONDARY

BACKLOG_QUEUE = f"{PRIMARY}/x-servicebus-transfer/3"
DESTINATION = "payments"
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = range(0x70, 0x75)
DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = range(0x75, 0x79)
BROKER_SECTIONS = {HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS}  # the broker's and the hop's, not the sender's
DECIMAL_ONE = proton.decimal128(bytes.fromhex("30400000000000000000000000000001"))  # 1 in decimal128 (BID)

# Application properties of every type the legacy client writes (one message carries them all).
EVERY_PROPERTY_TYPE = {
    "bool": True, "ubyte": proton.ubyte(255), "byte": proton.byte(-128), "ushort": proton.ushort(65535),
    "short": proton.short(-32768), "uint": proton.uint(2**32 - 1), "int": proton.int32(-7), "ulong": proton.ulong(2**64 - 1),
    "long": 5, "big-long": 2**40, "float": proton.float32(0.5), "double": 1.25, "decimal": DECIMAL_ONE,
    "char": proton.char("é"), "datetime": proton.timestamp(-86_400_000), "guid": uuid.UUID(int=7), "bytes": b"\x00\xff",
    "string": "héllo 🌍", "uri": Described(symbol("com.microsoft:uri"), "https://contoso.example/a?b=1"),
    "datetime-offset": Described(symbol("com.microsoft:datetime-offset"), 638_000_000_000_000_000),
    "timespan": Described(symbol("com.microsoft:timespan"), 36_000_000_000),
}

VALUE_BODIES = {
    "string": "plain string value",
    "long": 2**40,
    "small-long": 7,  # a long whose value fits in an int stays a long
    "int": proton.int32(42),
    "char": proton.char("☃"),
    "decimal128": DECIMAL_ONE,
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "timestamp": proton.timestamp(1_700_000_000_000),
    "binary": b"\x01\x02\x03",
    "map": {"name": "contoso", "count": proton.int32(3), "nested": {"k": [1, "two"]}},
    "list": [1, "two", proton.int32(3), [proton.ulong(4)]],
    "array": proton.Array(proton.UNDESCRIBED, Data.INT, 1, 2, 3),
    "symbol-array": proton.Array(proton.UNDESCRIBED, Data.SYMBOL, symbol("a"), symbol("b")),
    "uri": Described(symbol("com.microsoft:uri"), "https://contoso.example/"),
    "datetime-offset": Described(symbol("com.microsoft:datetime-offset"), 638_000_000_000_000_000),
    "timespan": Described(symbol("com.microsoft:timespan"), 6_000_000_000),
}


def section(code: int, value) -> bytes:
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(code)
    data.put_object(value)
    data.exit()
    return bytes(data.encode())


def properties_section(message_id: str) -> bytes:
    return section(PROPERTIES, [message_id, None, None, "legacy-label", None, f"corr-{message_id}",
                                symbol("application/x-legacy")])


def legacy_message(message_id: str, body_sections: list[bytes], application_properties: dict,
                   destination: str = DESTINATION) -> tuple[bytes, list]:
    """(what the legacy client put in the backlog, the sections the destination must receive)."""
    legacy = {"x-ms-path": destination,
              "x-ms-timetolive": Described(symbol("com.microsoft:timespan"), 36_000_000_000)}
    sent = [properties_section(message_id), section(APPLICATION_PROPERTIES, {**application_properties, **legacy}),
            *body_sections]
    expected = [properties_section(message_id)]
    if application_properties:
        expected.append(section(APPLICATION_PROPERTIES, application_properties))
    return b"".join(sent), expected + body_sections


def matrix(destination: str = DESTINATION) -> dict[str, tuple[bytes, list]]:
    messages = {
        "data-two-sections": legacy_message("data-2", [section(DATA, b"first part "), section(DATA, b"second part")],
                                            {"kind": "data"}, destination),
        "sequence-two-sections": legacy_message(
            "seq-2", [section(AMQP_SEQUENCE, [1, "a", proton.int32(2)]), section(AMQP_SEQUENCE, [b"b", [3.5]])], {},
            destination),
        "every-property-type": legacy_message("props", [section(DATA, b"properties")], EVERY_PROPERTY_TYPE,
                                              destination),
    }
    for name, value in VALUE_BODIES.items():
        messages[f"value-{name}"] = legacy_message(f"value-{name}", [section(AMQP_VALUE, value)], {"kind": name},
                                                   destination)
    return messages


def message_id_of(sections: list[tuple[int, tuple]]) -> str:
    """The message id of a message's decoded sections (``sections_of``): its properties' first field."""
    return sections[0][1][1][0][1]  # properties -> its list's items -> message id -> the string


def arrived_sections(raw_messages: list[bytes]) -> dict[str, list]:
    """Each received message's sections but the broker's and the hop's, by message id."""
    arrived = {}
    for raw in raw_messages:
        sections = [(code, value) for code, value in sections_of(raw) if code not in BROKER_SECTIONS]
        arrived[message_id_of(sections)] = sections
    return arrived


def expected_sections(messages: dict[str, tuple[bytes, list]]) -> dict[str, list]:
    """What each matrix message must arrive as, by message id."""
    return {message_id_of(sections_of(expected[0])): [value for raw in expected for value in sections_of(raw)]
            for _, expected in messages.values()}


def sections_of(raw: bytes) -> list[tuple[int, tuple]]:
    """Each section as (code, type-tagged value), decoded by proton."""
    out, view, offset = [], memoryview(raw), 0
    while offset < len(raw):
        data = Data()
        consumed = data.decode(view[offset:])
        data.rewind()
        data.next()
        described = data.get_object()
        out.append((int(described.descriptor), tagged(_owned(described.value))))
        offset += consumed
    return out


def _owned(value):
    """Copy proton's values out of its C memory (binaries are views into it)."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, list):
        return [_owned(v) for v in value]
    if isinstance(value, dict):
        return {_owned(k): _owned(v) for k, v in value.items()}
    if isinstance(value, Described):
        return Described(_owned(value.descriptor), _owned(value.value))
    if isinstance(value, proton.Array):
        return proton.Array(value.descriptor, value.type, *[_owned(v) for v in value.elements])
    return value


class _RawSender:
    def __init__(self, url: str, address: str):
        self.connection = BlockingConnection(url, allowed_mechs="ANONYMOUS")
        self.sender = self.connection.create_sender(address)

    def send(self, raw: bytes) -> None:
        link = self.sender.link
        self.connection.wait(lambda: link.credit > 0, timeout=10)
        delivery = link.delivery(uuid.uuid4().bytes)
        link.send(raw)
        link.advance()
        self.connection.wait(lambda: delivery.settled or delivery.remote_state, timeout=10)
        assert delivery.remote_state == proton.Delivery.ACCEPTED, delivery.remote_state
        delivery.settle()

    def close(self) -> None:
        self.connection.close()


class _RawCollector(MessagingHandler):
    """Keeps each delivery's bytes as they came (proton's Message would merge body sections)."""

    def __init__(self):
        super().__init__(prefetch=0, auto_accept=False)
        self.received: list[bytes] = []

    def on_delivery(self, event):
        delivery = event.delivery
        if delivery.readable and not delivery.partial:
            self.received.append(bytes(event.link.recv(delivery.pending)))
            delivery.update(proton.Delivery.ACCEPTED)
            delivery.settle()


def receive_raw(url: str, address: str, count: int) -> list[bytes]:
    connection = BlockingConnection(url, allowed_mechs="ANONYMOUS")
    collector = _RawCollector()
    try:
        receiver = connection.create_receiver(address, handler=collector)
        receiver.link.flow(count)
        connection.wait(lambda: len(collector.received) >= count, timeout=30)
        receiver.close()
    finally:
        connection.close()
    return collector.received


def url(emulator, namespace: str) -> str:
    return f"amqp://127.0.0.1:{emulator.port(namespace)}"


@pytest.mark.timeout(600)
def test_every_body_kind_and_value_arrives_as_the_legacy_sender_wrote_it(emulator, syphon_config, spark):
    from backlog_syphon.storage import delta
    from backlog_syphon.run.syphon import run_syphon

    messages = matrix()
    undecodable = properties_section("undecodable") + section(APPLICATION_PROPERTIES, {"x-ms-path": DESTINATION}) \
        + bytes.fromhex("005377a1") + b"\x03\xff\xfe\xfd"  # a value body: a str8 that is not UTF-8
    sender = _RawSender(url(emulator, SECONDARY), BACKLOG_QUEUE)
    try:
        for raw, _ in messages.values():
            sender.send(raw)
        sender.send(undecodable)
    finally:
        sender.close()

    summary = run_syphon(spark, syphon_config)
    assert summary.drained
    assert summary.per_destination[DESTINATION] == {"delivered": len(messages), "dead_lettered": 0, "skipped_ping": 0,
                                                 "held": 0, "not_selected": 0, "expired": 0, "covered": 0}
    assert summary.per_destination["(no destination)"]["dead_lettered"] == 1  # undecodable: no destination was read

    arrived = {}
    for raw in receive_raw(url(emulator, PRIMARY), DESTINATION, len(messages)):
        sections = [(code, value) for code, value in sections_of(raw) if code not in BROKER_SECTIONS]
        message_id = sections[0][1][1][0][1]  # properties -> its list's items -> message id -> the string
        arrived[message_id] = sections
    assert len(arrived) == len(messages)
    for name, (_, expected) in messages.items():
        message_id = sections_of(expected[0])[0][1][1][0][1]
        assert arrived[message_id] == [value for raw in expected for value in sections_of(raw)], name

    audit = delta.read_table(spark, syphon_config.storage.audit_table).collect()
    [dead] = [row for row in audit if row["outcome"] == "dead_lettered"]
    assert (dead["backlog_queue"], dead["reason_code"]) == (BACKLOG_QUEUE, "undecodable_message")
    assert "UTF-8" in dead["reason"]
    assert sorted(row["message_id"] for row in audit if row["outcome"] == "delivered") == sorted(
        sections_of(expected[0])[0][1][1][0][1] for _, expected in messages.values())
    backlog = emulator.stats(SECONDARY)[BACKLOG_QUEUE]
    assert backlog["total"] == 0 and backlog["dead_letter_count"] == 1
    assert backlog["ops"].get("complete", 0) >= 1  # the char messages were received and completed
