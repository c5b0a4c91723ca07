"""Type fidelity on the wire, the async SDK, fault hooks and unsupported requests."""
import asyncio
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import ServiceBusError, ServiceBusServerBusyError
from proton import (UNDESCRIBED, Array, Data, Described, Message, char, decimal32, decimal64, decimal128, int32,
                    symbol, timestamp, ulong)
from proton.utils import BlockingConnection, LinkDetached

from servicebus_emulator import codec

TIMESPAN_TICKS = 36_000_000_000            # one hour in .NET ticks
UID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _typed_properties():
    return {
        "long": {TYPE: AMQPTypes.long, VALUE: 5},
        "big": {TYPE: AMQPTypes.long, VALUE: 2**40},
        "int": 7,
        "timespan": ({TYPE: AMQPTypes.symbol, VALUE: b"com.microsoft:timespan"},
                     {TYPE: AMQPTypes.long, VALUE: TIMESPAN_TICKS}),
        "ts": {TYPE: AMQPTypes.timestamp, VALUE: 1_700_000_000_123},
        "sym": {TYPE: AMQPTypes.symbol, VALUE: b"abc"},
        "ulong": {TYPE: AMQPTypes.ulong, VALUE: 2**63 + 1},
        "uuid": UID,
        "bin": {TYPE: AMQPTypes.binary, VALUE: b"\x00\x01\xff"},
        "dbl": 1.5,
        "str": "text",
    }


def _assert_types(props):
    assert type(props["long"]) is int and props["long"] == 5
    assert type(props["big"]) is int and props["big"] == 2**40
    assert isinstance(props["int"], int32) and props["int"] == 7
    assert isinstance(props["timespan"], Described)
    assert props["timespan"].descriptor == symbol("com.microsoft:timespan")
    assert type(props["timespan"].value) is int and props["timespan"].value == TIMESPAN_TICKS
    assert isinstance(props["ts"], timestamp) and props["ts"] == 1_700_000_000_123
    assert isinstance(props["sym"], symbol) and props["sym"] == "abc"
    assert isinstance(props["ulong"], ulong) and props["ulong"] == 2**63 + 1
    assert props["uuid"] == UID
    assert bytes(props["bin"]) == b"\x00\x01\xff"
    assert isinstance(props["dbl"], float) and props["dbl"] == 1.5
    assert props["str"] == "text"


def _decode(raw: bytes) -> Message:
    m = Message()
    m.decode(raw)
    return m


def _mgmt(emulator, entity, operation, body, namespace="contoso"):
    """A raw AMQP management request with proton's own client (no SDK involved)."""
    conn = BlockingConnection(f"amqp://127.0.0.1:{emulator.port(namespace)}", allowed_mechs="ANONYMOUS",
                              timeout=10)
    try:
        node = f"{entity}/$management"
        sender = conn.create_sender(node)
        receiver = conn.create_receiver(node, credit=1)
        sender.send(Message(id=str(uuid.uuid4()), reply_to=node, body=body,
                            properties={"operation": operation}))
        reply = receiver.receive(timeout=10)      # replies come pre-settled
        props = dict(reply.properties)
        body = reply.body
        if isinstance(body, dict) and "messages" in body:   # copy binaries out of proton memory
            body = {"messages": [{k: (bytes(v) if isinstance(v, memoryview) else v) for k, v in m.items()}
                                 for m in body["messages"]]}
        return props, body
    finally:
        conn.close()


def test_application_property_types_survive_peek_and_receive(client, queue, emulator):
    with client.get_queue_sender(queue) as s:
        s.send_messages(ServiceBusMessage(b"payload", application_properties=_typed_properties(),
                                          message_id="fid-1", correlation_id="c-1"))
    # peek through $management: the message binary must decode with the sender's AMQP types
    props, body = _mgmt(emulator, queue, "com.microsoft:peek-message",
                        {"from-sequence-number": 1, "message-count": int32(5)})
    assert props["statusCode"] == 200
    (item,) = body["messages"]
    peeked = _decode(item["message"])
    _assert_types(peeked.properties)
    assert peeked.id == "fid-1" and peeked.correlation_id == "c-1"
    assert peeked.annotations[symbol("x-opt-sequence-number")] == 1
    assert isinstance(peeked.annotations[symbol("x-opt-enqueued-time")], timestamp)
    # receive over a link with proton's client: same bytes for the user sections
    conn = BlockingConnection(f"amqp://127.0.0.1:{emulator.port('contoso')}", allowed_mechs="ANONYMOUS",
                              timeout=10)
    try:
        rcv = conn.create_receiver(queue, credit=1)
        received = rcv.receive(timeout=10)
        _assert_types(received.properties)
        assert received.body == b"payload"
        assert received.delivery_count == 0
        assert isinstance(received.annotations[symbol("x-opt-locked-until")], timestamp)
        rcv.accept()
    finally:
        conn.close()
    # and the SDK sees the values (it cannot keep the types, which is why the syphon uses raw bytes)
    with client.get_queue_receiver(queue) as r:
        assert r.peek_messages(max_message_count=1) == []


def test_sdk_received_values(client, queue):
    with client.get_queue_sender(queue) as s:
        s.send_messages(ServiceBusMessage("v", application_properties=_typed_properties()))
    with client.get_queue_receiver(queue) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        p = m.application_properties
        assert p[b"long"] == 5 and p[b"big"] == 2**40 and p[b"timespan"] == TIMESPAN_TICKS
        assert p[b"ulong"] == 2**63 + 1 and p[b"sym"] == b"abc"
        r.complete_message(m)


def test_unsupported_management_operation_is_not_implemented(emulator):
    props, _ = _mgmt(emulator, "orders", "com.microsoft:add-rule", {"rule-name": "r"})
    assert props["statusCode"] == 501
    assert props["errorCondition"] == "amqp:not-implemented"
    assert "add-rule" in props["statusDescription"]


def test_unsupported_node_is_refused_with_not_implemented(emulator):
    conn = BlockingConnection(f"amqp://127.0.0.1:{emulator.port('contoso')}", allowed_mechs="ANONYMOUS",
                              timeout=10)
    try:
        with pytest.raises(LinkDetached, match="not-implemented"):
            conn.create_sender("$coordinator-or-anything")
    finally:
        conn.close()


def test_server_busy_entity_then_available(client, queue, emulator):
    emulator.set_unavailable("contoso", entity=queue, mode="server-busy")
    try:
        with pytest.raises(ServiceBusServerBusyError):
            with client.get_queue_sender(queue) as s:
                s.send_messages(ServiceBusMessage("x"))
        with client.get_queue_sender("orders") as s:       # other entities are unaffected
            s.send_messages(ServiceBusMessage("fine"))
    finally:
        emulator.set_available("contoso", entity=queue)
    with client.get_queue_sender(queue) as s:
        s.send_messages(ServiceBusMessage("x"))
    assert emulator.stats("contoso")[queue]["total"] == 1


def test_namespace_busy_affects_management_and_existing_senders(client, queue, emulator):
    with client.get_queue_sender(queue) as s, client.get_queue_receiver(queue) as r:
        s.send_messages(ServiceBusMessage("before"))
        emulator.set_unavailable("contoso", mode="server-busy")
        try:
            with pytest.raises(ServiceBusServerBusyError):
                s.send_messages(ServiceBusMessage("during"))
            with pytest.raises(ServiceBusServerBusyError):
                r.peek_messages(max_message_count=1)
        finally:
            emulator.set_available("contoso")
        s.send_messages(ServiceBusMessage("after"))
        assert [str(m) for m in r.peek_messages(max_message_count=5)] == ["before", "after"]


def test_refuse_and_drop_connections(emulator):
    cs = emulator.connection_string("contoso-secondary")
    q = "contoso/x-servicebus-transfer/0"
    with ServiceBusClient.from_connection_string(cs, retry_total=3, retry_backoff_factor=0.1) as c:
        with c.get_queue_sender(q) as s:
            s.send_messages(ServiceBusMessage("one"))
            assert emulator.drop_connections("contoso-secondary") >= 1
            s.send_messages(ServiceBusMessage("two"))          # the SDK reconnects
        emulator.set_unavailable("contoso-secondary", mode="refuse")
        try:
            with ServiceBusClient.from_connection_string(cs, retry_total=0) as c2:
                with pytest.raises(ServiceBusError):
                    with c2.get_queue_sender(q) as s2:
                        s2.send_messages(ServiceBusMessage("refused"))
        finally:
            emulator.set_available("contoso-secondary")
        with c.get_queue_sender(q) as s:
            s.send_messages(ServiceBusMessage("three"))
    st = emulator.stats("contoso-secondary")[q]
    assert st["ops"]["send"] >= 3


def test_async_sdk_send_receive_settle_and_sessions(conn_str, new_queue):
    q = new_queue()

    async def run():
        async with AsyncServiceBusClient.from_connection_string(conn_str, retry_total=0) as c:
            async with c.get_queue_sender(q) as s:
                await s.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
                batch = await s.create_message_batch()
                batch.add_message(ServiceBusMessage("m5"))
                await s.send_messages(batch)
            async with c.get_queue_receiver(q) as r:
                assert len(await r.peek_messages(max_message_count=10)) == 6
                got = []
                while len(got) < 6:
                    got += await r.receive_messages(max_message_count=6, max_wait_time=2)
                await r.complete_message(got[0])
                await r.abandon_message(got[1])
                await r.defer_message(got[2])
                await r.dead_letter_message(got[3], reason="why")
                for m in got[4:]:
                    await r.complete_message(m)
                (again,) = await r.receive_messages(max_wait_time=2)
                assert str(again) == "m1" and again.delivery_count == 1
                await r.complete_message(again)
            async with c.get_queue_sender("sessions-orders") as s:
                await s.send_messages(ServiceBusMessage("s", session_id="async-1"))
            async with c.get_queue_receiver("sessions-orders", session_id="async-1") as r:
                (m,) = await r.receive_messages(max_wait_time=2)
                await r.session.set_state(b"x")
                assert await r.session.get_state() == b"x"
                await r.complete_message(m)

    asyncio.run(run())


# ---- every AMQP type byte for byte, symbolic descriptors -----------------------------------------

class RawTransfer:
    """Bytes to send as one transfer as they are (a ``BlockingSender.send`` argument)."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def send(self, sender, tag=None):
        delivery = sender.delivery(tag or sender.delivery_tag())
        sender.stream(self.payload)
        sender.advance()
        return delivery


def _send_raw(emulator, queue, payload: bytes, namespace="contoso"):
    conn = BlockingConnection(f"amqp://127.0.0.1:{emulator.port(namespace)}", allowed_mechs="ANONYMOUS",
                              timeout=10)
    try:
        conn.create_sender(queue).send(RawTransfer(payload))      # raises unless accepted
    finally:
        conn.close()


def _peek_raw(emulator, queue, count):
    props, body = _mgmt(emulator, queue, "com.microsoft:peek-message",
                        {"from-sequence-number": 1, "message-count": int32(count)})
    assert props["statusCode"] == 200
    return [item["message"] for item in body["messages"]]


def _user_sections(raw: bytes):
    """The sections the sender owns: everything but the header and the annotations."""
    return [(code, sec) for code, sec in codec.split_sections(raw)
            if code not in (codec.HEADER, codec.DELIVERY_ANNOTATIONS, codec.MESSAGE_ANNOTATIONS)]


def _exotic_message(n: int) -> Message:
    exotic = {
        "char": char("\u00e9"),
        "decimal32": decimal32(0x3040_0001),
        "decimal64": decimal64(0x3180_0000_0000_0007),
        "decimal128": decimal128(bytes(range(16))),
        "ints": Array(UNDESCRIBED, Data.INT, 1, -2, 3),
        "symbols": Array(UNDESCRIBED, Data.SYMBOL, symbol("a"), symbol("b")),
        "described-array": Array(symbol("com.example:point"), Data.LONG, 7, 8),
        "described": Described(symbol("com.example:money"), [decimal64(12345), "EUR"]),
    }
    return Message(id=f"exotic-{n}", subject="types", properties=exotic,
                   annotations={symbol("x-opt-custom"): Described(ulong(7), char("x"))},
                   body=[exotic["char"], exotic["decimal128"], exotic["ints"], exotic["described"], n])


def test_every_amqp_type_is_kept_byte_for_byte(queue, emulator):
    single = _exotic_message(0).encode()
    batch = [_exotic_message(1).encode(), _exotic_message(2).encode()]
    # a batch envelope as the SDK builds one: Data sections that each hold a whole encoded message
    envelope = b"".join(codec.enc_section(codec.DATA, b"\xb0" + len(m).to_bytes(4, "big") + m) for m in batch)
    _send_raw(emulator, queue, single)
    _send_raw(emulator, queue, envelope)
    peeked = _peek_raw(emulator, queue, 5)
    assert len(peeked) == 3
    for sent, got in zip([single] + batch, peeked):
        assert [code for code, _ in _user_sections(got)] == [codec.PROPERTIES, codec.APPLICATION_PROPERTIES,
                                                             codec.AMQP_VALUE]
        assert _user_sections(got) == _user_sections(sent)
        (custom,) = [entry for code, sec in codec.split_sections(sent) if code == codec.MESSAGE_ANNOTATIONS
                     for entry in codec.section_map_entries(sec)]
        got_annotations = [entry for code, sec in codec.split_sections(got) if code == codec.MESSAGE_ANNOTATIONS
                           for entry in codec.section_map_entries(sec)]
        assert custom in got_annotations
    decoded = Message()
    decoded.decode(peeked[0])
    assert isinstance(decoded.properties["char"], char) and decoded.properties["char"] == "\u00e9"
    assert isinstance(decoded.properties["decimal128"], decimal128)
    assert decoded.body[-1] == 0 and decoded.annotations[symbol("x-opt-sequence-number")] == 1


def _symbolic(name: str, value: bytes) -> bytes:
    return b"\x00" + codec.enc_sym(name) + value


def test_symbolic_section_descriptors_use_the_spec_names(queue, emulator):
    properties = _symbolic("amqp:properties:list", codec.encode_any(["sym-1"]))
    app = _symbolic("amqp:application-properties:map", codec.enc_map([(codec.enc_str("k"), codec.enc_str("v"))]))
    value = _symbolic("amqp:amqp-value:*", codec.encode_any("hello"))
    raw = properties + app + value
    assert [code for code, _ in codec.split_sections(raw)] == [codec.PROPERTIES, codec.APPLICATION_PROPERTIES,
                                                               codec.AMQP_VALUE]
    with pytest.raises(codec.DecodeError, match="unknown section descriptor"):
        codec.split_sections(properties + _symbolic("amqp:value:*", codec.encode_any("hello")))
    # alone, and twice in a batch envelope whose Data sections are symbolic too
    envelope = b"".join(_symbolic("amqp:data:binary", b"\xb0" + len(raw).to_bytes(4, "big") + raw) for _ in "ab")
    _send_raw(emulator, queue, raw)
    _send_raw(emulator, queue, envelope)
    peeked = _peek_raw(emulator, queue, 5)
    assert len(peeked) == 3
    for got in peeked:
        assert [sec for _, sec in _user_sections(got)] == [properties, app, value]
