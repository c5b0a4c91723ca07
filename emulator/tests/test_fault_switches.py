"""Fault switches a client's error paths need, seen through the real SDK: queues deleted and recreated at
run time, sends refused on an attached link, short or empty peek pages, injected receive, settlement and
management failures, and a restart on the same ports."""
import threading
import time

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (MessageLockLostError, MessageSizeExceededError,
                                         MessagingEntityDisabledError, MessagingEntityNotFoundError,
                                         ServiceBusConnectionError, ServiceBusError,
                                         ServiceBusQuotaExceededError, ServiceBusServerBusyError)

from servicebus_emulator import Emulator, EmulatorConfig


def _send(client, queue, *bodies):
    with client.get_queue_sender(queue) as s:
        s.send_messages([ServiceBusMessage(b) for b in bodies])


def _receive(receiver, n):
    """Exactly ``n`` messages (the emulator delivers at once; the loop only bounds the SDK's batching)."""
    got = []
    for _ in range(5):
        got += receiver.receive_messages(max_message_count=n - len(got), max_wait_time=1)
        if len(got) == n:
            return got
    raise AssertionError(f"received {len(got)} of {n} messages")


# ---- delete and recreate -------------------------------------------------------------------------

def test_deleted_queue_is_not_found_and_recreated_queue_numbers_from_1(client, new_queue, emulator):
    q = new_queue(max_message_size_kb=1)
    _send(client, q, *[f"old-{i}" for i in range(5)])
    emulator.delete_queue("contoso", q)
    assert q not in emulator.stats("contoso") and f"{q}/$DeadLetterQueue" not in emulator.stats("contoso")
    with pytest.raises(MessagingEntityNotFoundError):          # the receive link's attach is refused
        with client.get_queue_receiver(q) as r:
            r.peek_messages(max_message_count=10)
    with pytest.raises(KeyError):
        emulator.delete_queue("contoso", q)

    emulator.recreate_queue("contoso", q)                       # the same settings: 1 KB messages at most
    with client.get_queue_sender(q) as s, pytest.raises(MessageSizeExceededError):
        s.send_messages(ServiceBusMessage(b"x" * 2048))
    _send(client, q, *[f"new-{i}" for i in range(3)])
    with client.get_queue_receiver(q) as r:
        peeked = r.peek_messages(max_message_count=10, sequence_number=1)
    assert [(m.sequence_number, str(m)) for m in peeked] == [(1, "new-0"), (2, "new-1"), (3, "new-2")]

    emulator.recreate_queue("contoso", q, max_message_size_kb=64)     # overridden, and emptied again
    _send(client, q, "x" * 2048)
    st = emulator.stats("contoso")[q]
    assert (st["in"], st["total"]) == (1, 1)
    with pytest.raises(ValueError, match="already exists"):
        emulator.add_queue("contoso", q)


def test_deleting_a_queue_detaches_its_links(client, new_queue, emulator):
    q = new_queue()
    _send(client, q, "a", "b", "c")
    with client.get_queue_sender(q) as s, client.get_queue_receiver(q) as peeker, \
            client.get_queue_receiver(q, prefetch_count=0) as r:
        assert len(peeker.peek_messages(max_message_count=10)) == 3      # its $management link is attached
        (locked,) = r.receive_messages(max_message_count=1, max_wait_time=2)
        emulator.delete_queue("contoso", q)
        # management requests on the kept $management link answer 404 amqp:not-found
        with pytest.raises(MessagingEntityNotFoundError):
            peeker.peek_messages(max_message_count=10)
        # the detached receive link sends the SDK to update-disposition, on a $management link it has
        # not opened yet: the attach is refused with amqp:not-found, which the SDK reports as a generic
        # "Failed to open mgmt link" (it drops a management attach's condition)
        with pytest.raises(ServiceBusError, match="Failed to open mgmt link") as refused:
            r.complete_message(locked)
        assert refused.type is ServiceBusError
        # a sender learns of the detach while its transfer is in flight: a connection error (retried by
        # a client with retries, whose re-attach then raises MessagingEntityNotFoundError)
        with pytest.raises(ServiceBusConnectionError):
            s.send_messages(ServiceBusMessage("lost"))
        with pytest.raises(MessagingEntityNotFoundError):
            s.send_messages(ServiceBusMessage("lost"))
    assert q not in emulator.stats("contoso")


def test_receiver_waiting_on_a_deleted_queue_is_not_found(client, new_queue, emulator):
    q = new_queue()
    with client.get_queue_receiver(q, prefetch_count=0) as r:
        assert r.receive_messages(max_wait_time=0.2) == []                # the link is attached
        emulator.delete_queue("contoso", q)
        with pytest.raises(MessagingEntityNotFoundError):
            r.receive_messages(max_wait_time=1)


def test_session_receiver_waiting_on_a_deleted_queue_is_not_found(client, new_queue, emulator):
    q = new_queue(requires_session=True)
    outcome = []

    def wait_for_a_session():
        try:
            with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=20):
                outcome.append("accepted")
        except Exception as exc:  # noqa: BLE001 - the type is the assertion
            outcome.append(exc)

    waiter = threading.Thread(target=wait_for_a_session)
    waiter.start()
    deadline = time.monotonic() + 10                       # its attach waits for a session to appear
    while not emulator.stats("contoso")[q]["ops"].get("attach") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert emulator.stats("contoso")[q]["ops"]["attach"] == 1
    emulator.delete_queue("contoso", q)
    waiter.join(10)
    assert not waiter.is_alive()
    (error,) = outcome
    assert isinstance(error, MessagingEntityNotFoundError)


# ---- sends refused on an attached link -----------------------------------------------------------

@pytest.mark.parametrize("mode, error", [("quota-exceeded", ServiceBusQuotaExceededError),
                                         ("disabled", MessagingEntityDisabledError)])
def test_refused_sends_leave_the_sender_attached(client, new_queue, emulator, mode, error):
    q = new_queue()
    _send(client, q, "before")
    emulator.set_unavailable("contoso", entity=q, mode=mode)
    try:
        with client.get_queue_sender(q) as s:                     # attaching still works
            with pytest.raises(error):
                s.send_messages(ServiceBusMessage("single"))
            with pytest.raises(error):
                s.send_messages([ServiceBusMessage("list-1"), ServiceBusMessage("list-2")])
            batch = s.create_message_batch()
            batch.add_message(ServiceBusMessage("batched"))
            with pytest.raises(error):
                s.send_messages(batch)
        with client.get_queue_sender("orders") as s:               # other entities are unaffected
            s.send_messages(ServiceBusMessage("elsewhere"))
        with client.get_queue_receiver(q) as r:                    # peek and receive go on
            assert [str(m) for m in r.peek_messages(max_message_count=10)] == ["before"]
            (m,) = r.receive_messages(max_wait_time=2)
            r.complete_message(m)
    finally:
        emulator.set_available("contoso", entity=q)
    st = emulator.stats("contoso")[q]
    assert (st["in"], st["total"], st["ops"]["send"]) == (1, 0, 4)
    _send(client, q, "after")
    assert emulator.stats("contoso")[q]["total"] == 1


def test_namespace_wide_quota_refuses_every_entity(client, new_queue, emulator):
    q = new_queue()
    emulator.set_unavailable("contoso", mode="quota-exceeded")
    try:
        for entity in (q, "orders"):
            with client.get_queue_sender(entity) as s, pytest.raises(ServiceBusQuotaExceededError):
                s.send_messages(ServiceBusMessage("x"))
        with client.get_topic_sender("events") as s, pytest.raises(ServiceBusQuotaExceededError):
            s.send_messages(ServiceBusMessage("x"))
        emulator.set_available("contoso", entity=q)                 # the namespace-wide switch stays
        with client.get_queue_sender(q) as s, pytest.raises(ServiceBusQuotaExceededError):
            s.send_messages(ServiceBusMessage("x"))
    finally:
        emulator.set_available("contoso")
    _send(client, q, "fine")
    assert emulator.stats("contoso")[q]["total"] == 1


def test_throttled_sends_answer_server_busy_on_an_attached_link(emulator, new_queue):
    """``mode="throttled"``: the exact condition the SDK maps to ServiceBusServerBusyError, on sends only;
    the sender stays attached and its next send after ``set_available`` goes through."""
    from servicebus_emulator.refusals import SEND_REFUSALS

    assert SEND_REFUSALS["throttled"][0] == "com.microsoft:server-busy"
    q = new_queue()
    # no SDK retries: each send_messages is one transfer, so the counts below are exact
    with ServiceBusClient.from_connection_string(emulator.connection_string("contoso"), retry_total=0) as client:
        _send(client, q, "before")
        with client.get_queue_sender(q) as s:
            s.send_messages(ServiceBusMessage("attached first"))
            attaches = emulator.stats("contoso")[q]["ops"]["attach"]
            emulator.set_unavailable("contoso", mode="throttled")
            try:
                with pytest.raises(ServiceBusServerBusyError, match="throttled"):
                    s.send_messages(ServiceBusMessage("single"))
                batch = s.create_message_batch()
                batch.add_message(ServiceBusMessage("batched"))
                with pytest.raises(ServiceBusServerBusyError):
                    s.send_messages(batch)
                with client.get_queue_receiver(q) as r:                # peeks (management) go on
                    assert [str(m) for m in r.peek_messages(max_message_count=10)] == ["before", "attached first"]
                with client.get_topic_sender("events") as t, pytest.raises(ServiceBusServerBusyError):
                    t.send_messages(ServiceBusMessage("topic"))          # every entity of the namespace
            finally:
                emulator.set_available("contoso")
            s.send_messages(ServiceBusMessage("after"))                  # the same link, no re-attach
            st = emulator.stats("contoso")[q]
            assert st["ops"]["attach"] == attaches + 1                   # the peeking receiver's only
    assert (st["in"], st["total"], st["ops"]["send"]) == (3, 3, 5)


# ---- peek pages ----------------------------------------------------------------------------------

def test_peek_fault_empty_page(client, queue, emulator):
    _send(client, queue, *[str(i) for i in range(5)])
    emulator.inject_peek_fault("contoso", queue, mode="empty", count=2, min_from_sequence=3)
    assert emulator.faults_pending("contoso", "peek", queue) == 2
    with client.get_queue_receiver(queue) as r:
        assert [m.sequence_number for m in r.peek_messages(max_message_count=1, sequence_number=3)] == [3]
        assert [m.sequence_number for m in r.peek_messages(max_message_count=10, sequence_number=1)] == \
            [1, 2, 3, 4, 5]                                         # before min_from_sequence
        assert r.peek_messages(max_message_count=10, sequence_number=3) == []
        assert r.peek_messages(max_message_count=2, sequence_number=4) == []
        assert emulator.faults_pending("contoso", "peek", queue) == 0
        assert [m.sequence_number for m in r.peek_messages(max_message_count=10, sequence_number=3)] == [3, 4, 5]
    assert emulator.stats("contoso")[queue]["ops"]["fault_peek"] == 2


def test_peek_fault_short_page(client, queue, emulator):
    _send(client, queue, *[str(i) for i in range(5)])
    emulator.inject_peek_fault("contoso", queue, mode="short", min_message_count=5)
    with client.get_queue_receiver(queue) as r:
        assert len(r.peek_messages(max_message_count=4, sequence_number=1)) == 4
        short = r.peek_messages(max_message_count=10, sequence_number=2)
        assert [(m.sequence_number, str(m)) for m in short] == [(2, "1")]
        assert [m.sequence_number for m in r.peek_messages(max_message_count=10, sequence_number=2)] == [2, 3, 4, 5]
    assert emulator.faults_pending("contoso", "peek", queue) == 0
    assert emulator.stats("contoso")[queue]["ops"]["fault_peek"] == 1


# ---- receive, settlement and management failures -------------------------------------------------

def test_settle_fault_fails_one_completion_and_the_message_stays(client, queue, emulator):
    _send(client, queue, "keep")
    emulator.inject_fault("contoso", "settle", entity=queue)
    with client.get_queue_receiver(queue, prefetch_count=0) as r:
        (m,) = r.receive_messages(max_wait_time=2)
        with pytest.raises(MessageLockLostError):
            r.complete_message(m)
        st = emulator.stats("contoso")[queue]
        assert (st["ops"]["fault_settle"], st["locked"], st["total"]) == (1, 1, 1)
        assert emulator.faults_pending("contoso", "settle") == 0
        # the lock is intact: the SDK's retry (through update-disposition: the delivery is settled) works
        r.complete_message(m)
    st = emulator.stats("contoso")[queue]
    assert (st["total"], st["completed"], st["ops"]["update_disposition"]) == (0, 1, 1)


def test_settle_fault_fails_a_bulk_update_disposition(client, queue, emulator):
    _send(client, queue, "a", "b", "c")
    emulator.inject_fault("contoso", "settle", entity=queue)
    with client.get_queue_receiver(queue, prefetch_count=0) as r:
        got = _receive(r, 3)
        with pytest.raises(MessageLockLostError):
            # the management form of settlement, as the syphon's bulk completion sends it
            r._settle_message_via_mgmt_link("completed", [m.lock_token for m in got])  # noqa: SLF001
        assert emulator.stats("contoso")[queue]["locked"] == 3
        for m in got:                                               # each one still completes
            r.complete_message(m)
    st = emulator.stats("contoso")[queue]
    assert (st["total"], st["completed"], st["ops"]["fault_settle"]) == (0, 3, 1)


def test_receive_fault_fails_one_receive_then_a_retry_works(client, queue, emulator):
    _send(client, queue, "a", "b")
    with client.get_queue_receiver(queue, prefetch_count=0) as r:
        attached = emulator.stats("contoso")[queue]["ops"]["attach"]
        emulator.inject_fault("contoso", "receive", entity=queue)   # amqp:link:detach-forced
        with pytest.raises(ServiceBusConnectionError):
            r.receive_messages(max_message_count=2, max_wait_time=2)
        assert [str(m) for m in _receive(r, 2)] == ["a", "b"]       # the SDK re-attaches
    st = emulator.stats("contoso")[queue]
    assert (st["ops"]["fault_receive"], st["ops"]["attach"]) == (1, attached + 1)


def test_receive_fault_with_another_condition(client, queue, emulator):
    _send(client, queue, "a")
    emulator.inject_fault("contoso", "receive", entity=queue, condition="com.microsoft:server-busy")
    with client.get_queue_receiver(queue, prefetch_count=0) as r:
        with pytest.raises(ServiceBusServerBusyError):
            r.receive_messages(max_wait_time=2)
        # ServiceBusServerBusyError does not shut the SDK's handler down: its detached link stays in
        # error, and this receiver raises the same error again without asking the emulator
        with pytest.raises(ServiceBusServerBusyError):
            r.receive_messages(max_wait_time=2)
    with client.get_queue_receiver(queue, prefetch_count=0) as r:
        assert [str(m) for m in _receive(r, 1)] == ["a"]
    assert emulator.stats("contoso")[queue]["ops"]["fault_receive"] == 1


def test_management_fault_on_any_entity_fails_one_peek(client, new_queue, emulator):
    q = new_queue()
    _send(client, q, "a")
    emulator.inject_fault("contoso", "management")                 # any entity, server-busy
    with client.get_queue_receiver(q) as r:
        with pytest.raises(ServiceBusServerBusyError):
            r.peek_messages(max_message_count=10)
        assert [str(m) for m in r.peek_messages(max_message_count=10)] == ["a"]
    emulator.inject_fault("contoso", "management", entity=q, count=2, condition="com.microsoft:message-lock-lost")
    with client.get_queue_receiver(q) as r:
        with pytest.raises(MessageLockLostError):
            r.peek_messages(max_message_count=10)
        assert emulator.faults_pending("contoso", "management", q) == 1
    assert emulator.clear_faults("contoso") == 1
    assert emulator.faults_pending("contoso") == 0
    assert emulator.stats("contoso")[q]["ops"]["fault_management"] == 2


def test_bad_fault_arguments_are_refused(emulator, queue):
    with pytest.raises(ValueError, match="operation"):
        emulator.inject_fault("contoso", "peek")
    with pytest.raises(ValueError, match="mode"):
        emulator.inject_peek_fault("contoso", queue, mode="slow")
    with pytest.raises(ValueError, match="count"):
        emulator.inject_fault("contoso", "settle", count=0)
    with pytest.raises(ValueError, match="mode"):
        emulator.set_unavailable("contoso", entity=queue, mode="full")
    assert emulator.faults_pending("contoso") == 0


# ---- restart -------------------------------------------------------------------------------------

def test_restart_on_the_same_ports_with_fresh_state():
    config = EmulatorConfig.from_dict({"namespaces": [{"name": "ns", "port": 0, "queues": [{"name": "q"}]}]})
    first = Emulator(config).start()
    try:
        port, conn_str = first.port("ns"), first.connection_string("ns")
        client = ServiceBusClient.from_connection_string(conn_str, retry_total=3, retry_backoff_factor=0.05)
        with client.get_queue_sender("q") as s:
            s.send_messages([ServiceBusMessage("before") for _ in range(3)])
    finally:
        first.stop()
    with client, Emulator(config, ports={"ns": port}) as second:    # bound again at once
        assert second.connection_string("ns") == conn_str
        assert second.stats("ns")["q"]["total"] == 0
        with client.get_queue_receiver("q") as r:                  # the client from before reconnects
            assert r.peek_messages(max_message_count=10) == []
        with client.get_queue_sender("q") as s:
            s.send_messages(ServiceBusMessage("after"))
        with ServiceBusClient.from_connection_string(conn_str, retry_total=0) as fresh, \
                fresh.get_queue_receiver("q") as r:
            assert [(m.sequence_number, str(m)) for m in r.peek_messages(max_message_count=10)] == [(1, "after")]
