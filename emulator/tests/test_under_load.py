"""A namespace under load, through the real SDK: the credit budget and what it throttles (sends, peeks,
receives, settlements on the link and through ``$management``, lock renewals, the administration API),
the ``server-busy`` switch on every path, settlements whose lock tokens span partitions, the two answers a
multi-token settlement with a dead token can get, short receives, peeks answered from another partition,
expired messages collected lazily, property size limits and the connection quota."""
import datetime
import time
import uuid

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import (MessageLockLostError, ServiceBusConnectionError, ServiceBusError,
                                         ServiceBusServerBusyError)
from azure.servicebus.management import ServiceBusAdministrationClient

from servicebus_emulator import ConfigError, Emulator, EmulatorConfig

SHIFT = 48
THROTTLED = "is being throttled. Error code : 50009. Please wait 2 seconds and try again."


def _ns(name, **settings):
    return {"name": name, "port": 0, "queues": [], "short_receive_probability": 0, **settings}


CONFIG = {"namespaces": [
    _ns("budget", credits_per_second=10, topics=[{"name": "events", "subscriptions": [
        {"name": "all"}, {"name": "eu", "correlation_filter": {"properties": {"region": "eu"}}}]}]),
    _ns("plain", credits_per_second=0, expiry_sweep_seconds=0.3),
    _ns("partial", credits_per_second=0),
    _ns("atomic", credits_per_second=0, multi_token_disposition="atomic"),
    _ns("short", credits_per_second=0, short_receive_probability=1, receive_seed=7),
    _ns("elsewhere", credits_per_second=0, peek_other_partition_probability=1, peek_seed=1),
    _ns("quota", credits_per_second=0, max_connections=2),
]}


@pytest.fixture(scope="module")
def emu():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emulator:
        yield emulator


def _client(emu, namespace):
    return ServiceBusClient.from_connection_string(emu.connection_string(namespace), retry_total=0)


def _receive(receiver, count: int) -> list:
    """``count`` messages, over as many receives as it takes (a receive may bring a part: short receives)."""
    held = []
    while len(held) < count:
        held += receiver.receive_messages(max_message_count=count - len(held), max_wait_time=5)
    return held


def _queue(emu, namespace, **settings):
    name = f"q-{uuid.uuid4().hex[:8]}"
    emu.add_queue(namespace, name, **settings)
    return name


def test_the_default_budget_is_the_tiers_and_premium_has_none():
    config = EmulatorConfig.from_dict({"namespaces": [_ns("s"), _ns("b", tier="basic"),
                                                      _ns("p", tier="premium")]})
    assert [ns.service.credits_per_second for ns in config.namespaces] == [1000, 1000, 0]
    with pytest.raises(ConfigError, match=r"credits_per_second: a Premium namespace has no credit budget"):
        EmulatorConfig.from_dict({"namespaces": [_ns("p", tier="premium", credits_per_second=500)]})
    with pytest.raises(ConfigError, match=r"multi_token_disposition: must be one of partial, atomic"):
        EmulatorConfig.from_dict({"namespaces": [_ns("p", multi_token_disposition="some")]})


def test_out_of_credits_every_operation_is_throttled_with_the_services_text_and_nothing_changes(emu):
    queue = _queue(emu, "budget")
    emu.set_credits_per_second("budget", 0)              # counted, not throttled, while the test sets up
    with _client(emu, "budget") as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        receiver = client.get_queue_receiver(queue, prefetch_count=0)
        held = []
        while len(held) < 2:
            held += receiver.receive_messages(max_message_count=2 - len(held), max_wait_time=5)
        emu.set_credits_per_second("budget", 1)
        # a batch of 30 is admitted on the second's one credit and takes the next 29 seconds' too
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"n{i}") for i in range(30)])
            with pytest.raises(ServiceBusServerBusyError, match=f"namespace budget {THROTTLED}"):
                sender.send_messages(ServiceBusMessage("refused"))
        with pytest.raises(ServiceBusServerBusyError, match=THROTTLED):
            receiver.peek_messages(max_message_count=1)
        with pytest.raises(ServiceBusServerBusyError, match=THROTTLED):
            receiver._settle_message_via_mgmt_link("completed", [held[0].lock_token])  # noqa: SLF001
        with pytest.raises(ServiceBusServerBusyError, match=THROTTLED):
            receiver.renew_message_lock(held[0])
        with pytest.raises(ServiceBusServerBusyError, match=THROTTLED):
            receiver.complete_message(held[1])       # on the link: the disposition is rejected
        # a receive on a link holding locks waits for credits (a detach would lose them); one without, detached
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
        with client.get_queue_receiver(queue, prefetch_count=0) as other:
            with pytest.raises(ServiceBusServerBusyError, match=THROTTLED):
                other.receive_messages(max_message_count=1, max_wait_time=1)
        receiver.close()
    with ServiceBusAdministrationClient.from_connection_string(
            emu.admin_connection_string("budget"), connection_verify=emu.ca_file, retry_total=0) as admin:
        with pytest.raises(HttpResponseError, match=THROTTLED) as refused:
            admin.get_queue_runtime_properties(queue)
        assert refused.value.status_code == 503
        stats = emu.stats("budget")[queue]
        assert (stats["total"], stats["completed"]) == (33, 0)    # nothing refused was stored or settled
        emu.set_credits_per_second("budget", 1000)      # a new budget: the namespace answers again
        assert admin.get_queue_runtime_properties(queue).total_message_count == 33
    credits = emu.credit_stats("budget")
    assert (credits["spent"]["send"], credits["spent"]["receive"], credits["spent"]["administration"]) == (33, 2, 10)
    assert {"send", "peek", "settle", "renew_lock", "receive", "administration"} <= set(credits["throttled"])


def test_a_topic_send_costs_one_more_credit_per_filter_and_a_peek_one_per_message(emu):
    emu.set_credits_per_second("budget", 0)       # counted, never throttled
    before = emu.credit_stats("budget")["spent"]
    with _client(emu, "budget") as client:
        with client.get_topic_sender("events") as sender:
            sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        with client.get_subscription_receiver("events", "all") as receiver:
            assert len(receiver.peek_messages(max_message_count=10)) == 2
            assert receiver.peek_messages(max_message_count=10, sequence_number=99) == []
    after = emu.credit_stats("budget")["spent"]
    spent = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in after}
    assert (spent["send"], spent["filter"], spent["peek"]) == (2, 4, 3)   # 2 subscriptions' filters; an empty peek 1


def test_the_server_busy_switch_throttles_every_path_with_the_services_text(emu):
    queue = _queue(emu, "plain")
    with _client(emu, "plain") as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
            receiver = client.get_queue_receiver(queue, prefetch_count=0)
            (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            emu.set_unavailable("plain", mode="server-busy")
            try:
                with pytest.raises(ServiceBusServerBusyError, match="namespace plain " + THROTTLED):
                    sender.send_messages(ServiceBusMessage("c"))
                with pytest.raises(ServiceBusServerBusyError, match=THROTTLED):
                    receiver.peek_messages(max_message_count=1)
                with pytest.raises(ServiceBusServerBusyError, match=THROTTLED):
                    receiver.complete_message(held)
                assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
                other = client.get_queue_receiver(queue, prefetch_count=0)
                with pytest.raises(ServiceBusServerBusyError, match=THROTTLED):
                    other.receive_messages(max_message_count=1, max_wait_time=1)
            finally:
                emu.set_available("plain")
            other.close()   # azure-servicebus 7.15 raises a detach's error again on every receive until then
            receiver.complete_message(held)
            receiver.close()
        with client.get_queue_receiver(queue, prefetch_count=0) as receiver:
            assert len(receiver.receive_messages(max_message_count=2, max_wait_time=5)) >= 1


def _partitioned_locks(client, queue, count):
    """``count`` keyless messages (round robin: partitions 0, 1, ...) received and locked."""
    with client.get_queue_sender(queue) as sender:
        for i in range(count):
            sender.send_messages(ServiceBusMessage(f"m{i}"))
    receiver = client.get_queue_receiver(queue, prefetch_count=0)
    held = []
    while len(held) < count:
        held += receiver.receive_messages(max_message_count=count - len(held), max_wait_time=5)
    return receiver, held


def test_a_settlement_or_renewal_whose_tokens_span_partitions_is_refused_whole(emu):
    queue = _queue(emu, "plain", enable_partitioning=True)
    with _client(emu, "plain") as client:
        receiver, held = _partitioned_locks(client, queue, 2)
        assert {m.sequence_number >> SHIFT for m in held} == {0, 1}
        tokens = [m.lock_token for m in held]
        text = "Batching lock tokens for different partitions is not supported for an entity with partitioning"
        with client.get_queue_receiver(queue) as other:   # lock tokens are the entity's: any link may name them
            with pytest.raises(ServiceBusError, match=text):
                other._settle_message_via_mgmt_link("completed", tokens)  # noqa: SLF001
        with client.get_queue_receiver(queue) as other:   # (the SDK closes a handler after that error)
            with pytest.raises(ServiceBusError, match=text):
                other._renew_locks(*tokens)  # noqa: SLF001
        assert emu.stats("plain")[queue]["locked"] == 2
        for m in held:                                    # one partition per request: settled
            receiver._settle_message_via_mgmt_link("completed", [m.lock_token])  # noqa: SLF001
        receiver.close()
    assert emu.stats("plain")[queue]["completed"] == 2


@pytest.mark.parametrize("namespace, settled", [("partial", 2), ("atomic", 0)])
def test_a_settlement_with_a_dead_token_answers_lock_lost_and_settles_the_live_ones_or_none(emu, namespace, settled):
    queue = _queue(emu, namespace)
    with _client(emu, namespace) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        receiver = client.get_queue_receiver(queue, prefetch_count=0)
        held = _receive(receiver, 3)
        tokens = [m.lock_token for m in held]
        receiver.complete_message(held[1])                # its token is dead now
        with pytest.raises(MessageLockLostError):
            receiver._settle_message_via_mgmt_link("completed", tokens)  # noqa: SLF001
        stats = emu.stats(namespace)[queue]
        assert (stats["completed"], stats["locked"]) == (1 + settled, 2 - settled)
        receiver.close()


def test_receives_get_a_part_of_what_they_ask_drawn_from_the_seed(emu):
    def parts():
        queue = _queue(emu, "short")
        with _client(emu, "short") as client:
            with client.get_queue_sender(queue) as sender:
                sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(40)])
            with client.get_queue_receiver(queue, prefetch_count=0) as receiver:
                got = [len(receiver.receive_messages(max_message_count=10, max_wait_time=1)) for _ in range(3)]
        return got

    first = parts()
    assert all(1 <= n < 10 for n in first)
    assert emu.stats("short") is not None and parts() != [10, 10, 10]


def test_a_partitioned_peek_may_answer_from_a_later_partition(emu):
    queue = _queue(emu, "elsewhere", enable_partitioning=True)
    with _client(emu, "elsewhere") as client:
        with client.get_queue_sender(queue) as sender:
            for _ in range(4):                            # partitions 0, 1, 2, 3
                sender.send_messages(ServiceBusMessage("m"))
        with client.get_queue_receiver(queue) as receiver:
            (answer,) = receiver.peek_messages(max_message_count=5, sequence_number=1)
            assert answer.sequence_number >> SHIFT in (1, 2, 3)        # never the one asked, never lower
            (last,) = receiver.peek_messages(max_message_count=5, sequence_number=3 << SHIFT)
            assert last.sequence_number == 3 << SHIFT | 1                  # no later one holds messages


def test_expired_messages_stay_peekable_until_the_sweep_collects_them(emu):
    queue = _queue(emu, "plain", dead_lettering_on_message_expiration=True)
    with _client(emu, "plain") as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("short", time_to_live=datetime.timedelta(seconds=1)))
        time.sleep(1.5)                                   # past its expiry and at least one sweep (0.3 s)
        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            (m,) = receiver.peek_messages(max_message_count=5)
            assert m.dead_letter_reason == "TTLExpiredException"
    assert emu.stats("plain")[queue]["expired"] == 1


@pytest.mark.parametrize("message", [
    ServiceBusMessage("big property", application_properties={"p": "x" * (33 * 1024)}),
    ServiceBusMessage("big header", application_properties={f"p{i}": "x" * (30 * 1024) for i in range(3)}),
    # the SDK refuses a long MessageId itself; an AMQP message goes as it is
    AmqpAnnotatedMessage(data_body=b"long id", properties={"message_id": "i" * 129}),
])
def test_properties_above_the_limits_are_refused_with_the_generic_text(emu, message):
    queue = _queue(emu, "plain")
    with _client(emu, "plain") as client, client.get_queue_sender(queue) as sender:
        with pytest.raises(ServiceBusError, match="The service was unable to process the request; please retry"):
            sender.send_messages(message)
        sender.send_messages(ServiceBusMessage("fits", application_properties={"p": "x" * (31 * 1024)}))
    assert emu.stats("plain")[queue]["total"] == 1


def test_connections_past_the_namespaces_quota_are_refused(emu):
    queue = _queue(emu, "quota")
    clients = [_client(emu, "quota") for _ in range(3)]
    receivers = [client.get_queue_receiver(queue) for client in clients]
    try:
        for receiver in receivers[:2]:                   # each SDK receiver opens a connection of its own
            assert receiver.peek_messages(max_message_count=1) == []
        with pytest.raises(ServiceBusConnectionError, match="ConnectionsQuotaExceeded for namespace quota"):
            receivers[2].peek_messages(max_message_count=1)
        assert emu.credit_stats("quota")["refused_connections"] >= 1
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("namespace, settled", [("partial", 2), ("atomic", 0)])
def test_a_lose_lock_fault_kills_the_last_token_of_a_multi_token_settlement(emu, namespace, settled):
    queue = _queue(emu, namespace)
    with _client(emu, namespace) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        receiver = client.get_queue_receiver(queue, prefetch_count=0)
        held = _receive(receiver, 3)
        emu.inject_fault(namespace, "lose_lock", entity=queue)
        with pytest.raises(MessageLockLostError):
            receiver._settle_message_via_mgmt_link("completed", [m.lock_token for m in held])  # noqa: SLF001
        stats = emu.stats(namespace)[queue]
        assert (stats["completed"], stats["active"], stats["ops"]["fault_lose_lock"]) == (settled, 1, 1)
        receiver.close()
