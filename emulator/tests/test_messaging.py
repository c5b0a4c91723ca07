"""Send, peek, receive and settle through the real azure-servicebus SDK against the emulator."""
import datetime
import time
import uuid

import pytest
from azure.servicebus import (ServiceBusClient, ServiceBusMessage, ServiceBusMessageState,
                              ServiceBusReceiveMode, ServiceBusSubQueue)
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import (MessageLockLostError, MessageSizeExceededError,
                                         MessagingEntityNotFoundError, ServiceBusAuthenticationError)


def _send(client, queue, *messages):
    with client.get_queue_sender(queue) as s:
        s.send_messages(list(messages) if len(messages) > 1 else messages[0])


def test_send_receive_complete_with_broker_annotations(client, queue, emulator):
    before = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=2)
    _send(client, queue, ServiceBusMessage("hello", message_id="m-1", subject="greeting",
                                           application_properties={"k": "v"}))
    with client.get_queue_receiver(queue, max_wait_time=2) as r:
        (m,) = r.receive_messages(max_message_count=5, max_wait_time=2)
        assert str(m) == "hello" and m.message_id == "m-1" and m.subject == "greeting"
        assert m.application_properties[b"k"] == b"v"
        assert m.sequence_number == 1
        assert m.delivery_count == 0
        assert m.enqueued_time_utc >= before
        assert m.locked_until_utc > datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=20)
        assert isinstance(m.lock_token, uuid.UUID)
        assert m.raw_amqp_message.delivery_annotations[b"x-opt-lock-token"] == m.lock_token
        r.complete_message(m)
        assert r.receive_messages(max_wait_time=0.5) == []
    st = emulator.stats("contoso")[queue]
    assert (st["in"], st["completed"], st["active"], st["total"]) == (1, 1, 0, 0)
    assert st["ops"]["complete"] == 1 and st["ops"]["send"] == 1


def test_list_and_batch_send_keep_order_and_sequence_numbers(client, queue, emulator):
    with client.get_queue_sender(queue) as s:
        s.send_messages([ServiceBusMessage(f"list-{i}") for i in range(10)])
        batch = s.create_message_batch()
        for i in range(50):
            batch.add_message(ServiceBusMessage(f"batch-{i}"))
        s.send_messages(batch)
    with client.get_queue_receiver(queue) as r:
        peeked = r.peek_messages(max_message_count=100)
    assert [str(m) for m in peeked] == [f"list-{i}" for i in range(10)] + [f"batch-{i}" for i in range(50)]
    assert [m.sequence_number for m in peeked] == list(range(1, 61))
    assert emulator.stats("contoso")[queue]["ops"]["send_batch"] == 2


def test_peek_from_sequence_number_and_empty_queue(client, queue):
    with client.get_queue_receiver(queue) as r:
        assert r.peek_messages(max_message_count=5) == []          # 204 from the broker
        _send(client, queue, *[ServiceBusMessage(str(i)) for i in range(20)])
        page = r.peek_messages(max_message_count=5, sequence_number=8)
        assert [m.sequence_number for m in page] == [8, 9, 10, 11, 12]
        assert all(m.state == ServiceBusMessageState.ACTIVE for m in page)
        assert r.peek_messages(max_message_count=5, sequence_number=21) == []
        # peeking does not lock or remove
        assert len(r.receive_messages(max_message_count=20, max_wait_time=2)) >= 1


def test_receive_and_delete_removes_on_delivery(client, queue, emulator):
    _send(client, queue, ServiceBusMessage("a"), ServiceBusMessage("b"))
    with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as r:
        got = []
        for _ in range(3):
            got += r.receive_messages(max_message_count=2, max_wait_time=1)
            if len(got) == 2:
                break
        assert [str(m) for m in got] == ["a", "b"]
        assert got[0].lock_token is None
    assert emulator.stats("contoso")[queue]["total"] == 0


def test_prefetch_delivers_in_order(client, queue):
    _send(client, queue, *[ServiceBusMessage(str(i)) for i in range(30)])
    got = []
    with client.get_queue_receiver(queue, prefetch_count=10) as r:
        deadline = time.time() + 10
        while len(got) < 30 and time.time() < deadline:
            batch = r.receive_messages(max_message_count=10, max_wait_time=1)
            for m in batch:
                r.complete_message(m)
            got += [int(str(m)) for m in batch]
    assert got == list(range(30))


def test_abandon_and_max_delivery_count_dead_letters(client, new_queue, emulator):
    q = new_queue(max_delivery_count=2)
    _send(client, q, ServiceBusMessage("poison"))
    with client.get_queue_receiver(q) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        assert m.delivery_count == 0
        r.abandon_message(m)
        (m,) = r.receive_messages(max_wait_time=2)
        assert m.delivery_count == 1
        r.abandon_message(m)                    # second failed delivery: MaxDeliveryCountExceeded
        assert r.receive_messages(max_wait_time=0.5) == []
    with client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = dlq.receive_messages(max_wait_time=2)
        assert str(d) == "poison" and d.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert d.sequence_number == 1
        dlq.complete_message(d)
    st = emulator.stats("contoso")[q]
    assert st["dead_lettered"] == 1 and st["ops"]["abandon"] == 2


def test_dead_letter_with_reason_and_description(client, queue, emulator):
    _send(client, queue, ServiceBusMessage("bad", application_properties={"keep": 7}))
    with client.get_queue_receiver(queue) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        seq = m.sequence_number
        r.dead_letter_message(m, reason="no-destination", error_description="x-ms-path missing")
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = dlq.peek_messages(max_message_count=5)
        assert d.sequence_number == seq
        assert d.dead_letter_reason == "no-destination"
        assert d.dead_letter_error_description == "x-ms-path missing"
        assert d.application_properties[b"keep"] == 7
    st = emulator.stats("contoso")[queue]
    assert st["dead_letter_count"] == 1 and st["dead_lettered"] == 1 and st["total"] == 0


def test_defer_then_receive_deferred_and_complete(client, queue):
    _send(client, queue, ServiceBusMessage("later"))
    with client.get_queue_receiver(queue) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        seq = m.sequence_number
        r.defer_message(m)
        assert r.receive_messages(max_wait_time=0.5) == []
        (p,) = r.peek_messages(max_message_count=1, sequence_number=seq)
        assert p.state == ServiceBusMessageState.DEFERRED
        (d,) = r.receive_deferred_messages([seq])
        assert str(d) == "later" and d.lock_token is not None
        r.complete_message(d)
        assert r.peek_messages(max_message_count=1) == []


def test_lock_expiry_redelivers_and_old_lock_is_lost(client, new_queue):
    q = new_queue(lock_duration_seconds=1)
    _send(client, q, ServiceBusMessage("slow"))
    with client.get_queue_receiver(q) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        time.sleep(1.3)
        (again,) = r.receive_messages(max_wait_time=2)
        assert again.delivery_count == 1 and again.sequence_number == m.sequence_number
        with pytest.raises(MessageLockLostError):
            r.complete_message(m)
        r.complete_message(again)


def test_renew_lock_extends_locked_until(client, new_queue):
    q = new_queue(lock_duration_seconds=2)
    _send(client, q, ServiceBusMessage("renew"))
    with client.get_queue_receiver(q) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        first = m.locked_until_utc
        time.sleep(1.2)
        renewed = r.renew_message_lock(m)
        assert renewed > first
        time.sleep(1.2)                      # past the original lock, within the renewed one
        r.complete_message(m)


def test_unknown_entity_raises_not_found(client):
    with pytest.raises(MessagingEntityNotFoundError):
        with client.get_queue_sender("no-such-queue") as s:
            s.send_messages(ServiceBusMessage("x"))
    with pytest.raises(MessagingEntityNotFoundError):
        with client.get_queue_receiver("no-such-queue") as r:
            r.receive_messages(max_wait_time=1)


def test_wrong_key_raises_authentication_error(emulator):
    (key_name,) = emulator.config.namespace("contoso").sas_keys
    bad = emulator.connection_string("contoso", key_name=key_name, key="wrong")
    with ServiceBusClient.from_connection_string(bad, retry_total=0) as c:
        with pytest.raises(ServiceBusAuthenticationError):
            with c.get_queue_sender("orders") as s:
                s.send_messages(ServiceBusMessage("x"))


def test_message_size_exceeded(client):
    with client.get_queue_sender("small") as s:
        with pytest.raises(MessageSizeExceededError):
            s.send_messages(ServiceBusMessage(b"x" * (80 * 1024)))
        s.send_messages(ServiceBusMessage(b"x" * (60 * 1024)))   # under the 64 KB limit


def test_large_message_round_trip(client, queue):
    body = bytes(range(256)) * 800                                 # 200 KB, multi-frame both ways
    _send(client, queue, ServiceBusMessage(body))
    with client.get_queue_receiver(queue) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        assert b"".join(m.body) == body
        r.complete_message(m)


def test_value_and_sequence_bodies_are_kept(client, queue):
    _send(client, queue,
          AmqpAnnotatedMessage(value_body={"a": 1, "b": [1, 2]}),
          AmqpAnnotatedMessage(sequence_body=[[1, "two"]]))
    with client.get_queue_receiver(queue) as r:
        a, b = r.peek_messages(max_message_count=2)
    assert a.body_type == AmqpMessageBodyType.VALUE and a.body == {b"a": 1, b"b": [1, 2]}
    assert b.body_type == AmqpMessageBodyType.SEQUENCE and list(b.body) == [[1, b"two"]]


def test_resent_received_message_gets_fresh_broker_annotations(client, queue, new_queue):
    other = new_queue()
    _send(client, other, *[ServiceBusMessage("filler") for _ in range(5)])
    _send(client, queue, ServiceBusMessage("hop", partition_key="pk"))
    with client.get_queue_receiver(queue) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        with client.get_queue_sender(other) as s:
            s.send_messages(m)
        r.complete_message(m)
    with client.get_queue_receiver(other) as r2:
        msgs = r2.peek_messages(max_message_count=10)
    assert msgs[-1].sequence_number == 6 and str(msgs[-1]) == "hop"
    assert msgs[-1].partition_key == "pk"
    assert msgs[-1].enqueued_time_utc >= m.enqueued_time_utc


def test_ping_messages_are_accepted_but_never_delivered(client, queue, emulator):
    _send(client, queue, ServiceBusMessage("", content_type="application/vnd.ms-servicebus-ping"),
          ServiceBusMessage("real"))
    with client.get_queue_receiver(queue) as r:
        assert [str(m) for m in r.peek_messages(max_message_count=5)] == ["real"]
    assert emulator.stats("contoso")[queue]["total"] == 1


def test_duplicate_detection_by_message_id(client, new_queue, emulator):
    q = new_queue(duplicate_detection_window_seconds=60)
    _send(client, q, ServiceBusMessage("1", message_id="same"), ServiceBusMessage("2", message_id="same"),
          ServiceBusMessage("3", message_id="other"))
    with client.get_queue_receiver(q) as r:
        assert [str(m) for m in r.peek_messages(max_message_count=5)] == ["1", "3"]
    assert emulator.stats("contoso")[q]["total"] == 2


def test_secondary_namespace_backlog_queue(emulator):
    cs = emulator.connection_string("contoso-secondary")
    with ServiceBusClient.from_connection_string(cs, retry_total=0) as c:
        with c.get_queue_sender("contoso/x-servicebus-transfer/0") as s:
            s.send_messages(ServiceBusMessage("backlog", application_properties={"x-ms-path": "orders"}))
        with c.get_queue_receiver("contoso/x-servicebus-transfer/0") as r:
            (m,) = r.peek_messages(max_message_count=1)
            assert m.application_properties[b"x-ms-path"] == b"orders"
    assert emulator.stats("contoso-secondary")["contoso/x-servicebus-transfer/0"]["total"] == 1


def _receive_all(receiver, count: int) -> list:
    """``count`` messages, over as many receives as it takes: one may bring a part of what it asks for, as the
    service's do (the emulator's ``short_receive_probability``)."""
    got: list = []
    while len(got) < count and (page := receiver.receive_messages(max_message_count=count - len(got), max_wait_time=2)):
        got += page
    return got


def test_a_dead_letter_sub_queue_addressed_by_its_path_peeks_from_a_sequence_number_receives_and_releases(
        client, queue, emulator):
    """What a re-drive of the syphon needs: ``<queue>/$DeadLetterQueue`` as an entity path (as the syphon
    names it), each dead-lettered message keeping its sequence number and enqueue time, peeks from a
    sequence number, and PeekLock receive + complete + release (a release counts no delivery)."""
    for n in range(4):
        _send(client, queue, ServiceBusMessage(f"m{n}"))
    with client.get_queue_receiver(queue) as r:
        received = _receive_all(r, 4)
        original = {m.sequence_number: m.enqueued_time_utc for m in received}
        for m in received:
            r.dead_letter_message(m, reason="destination_not_found", error_description="no such queue")
    dead_letters = f"{queue}/$DeadLetterQueue"
    with client.get_queue_receiver(dead_letters) as dlq:
        peeked = dlq.peek_messages(max_message_count=10, sequence_number=min(original) + 2)
        assert [m.sequence_number for m in peeked] == sorted(original)[2:]
        assert {m.sequence_number: m.enqueued_time_utc for m in peeked} == {
            seq: original[seq] for seq in sorted(original)[2:]}
        got = _receive_all(dlq, 4)
        assert [m.sequence_number for m in got] == sorted(original)
        assert {m.dead_letter_reason for m in got} == {"destination_not_found"}
        dlq.complete_message(got[1])
        for m in got[:1] + got[2:]:
            dlq._handler.settle_messages(m._delivery_id, m._delivery_tag, "released")  # as the syphon's purge does
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        left = dlq.peek_messages(max_message_count=10)
        assert [m.sequence_number for m in left] == [seq for i, seq in enumerate(sorted(original)) if i != 1]
        assert {m.delivery_count for m in left} == {0}
    assert emulator.stats("contoso")[queue]["dead_letter_count"] == 3
