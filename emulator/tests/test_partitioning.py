"""Partitioned entities through the real SDK: sequence numbers ``partition << 48 | n`` dense per partition,
``x-opt-partition-id`` on what is received and peeked, peeks that answer from one partition per call (and
one message per call where a namespace asks for it), receives that interleave partitions, the batching
refusals, duplicate detection on MessageId plus PartitionKey, Premium's namespace-wide ``partitions``, and
what the administration API and the configuration readers say about it."""
import datetime
import uuid

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import ServiceBusError
from azure.servicebus.management import ServiceBusAdministrationClient
from azure.servicebus._pyamqp.error import ErrorCondition

from proton import Disposition, Message
from proton.utils import BlockingConnection, SendException

from servicebus_emulator import ConfigError, Emulator, EmulatorConfig

SHIFT = 48
PARTITION_ID = b"x-opt-partition-id"


def _ns(name, **settings):
    return {"name": name, "port": 0, "queues": [], **settings}


CONFIG = {"namespaces": [
    _ns("standard", allow_short_locks=True, topics=[{"name": "events", "enable_partitioning": True,
                                                     "subscriptions": [{"name": "all"}]}]),
    _ns("one-per-call", peek_one_per_call=True, queues=[{"name": "q", "enable_partitioning": True}]),
    _ns("premium", tier="premium", partitions=4, queues=[{"name": "q"}]),
    _ns("gaps", receive_empty_probability=0.5, receive_seed=3, queues=[{"name": "q", "enable_partitioning": True}]),
]}


@pytest.fixture(scope="module")
def emu():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def client(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string("standard"), retry_total=0) as c:
        yield c


@pytest.fixture
def new_queue(emu):
    def make(namespace="standard", **settings):
        name = f"q-{uuid.uuid4().hex[:8]}"
        emu.add_queue(namespace, name, **settings)
        return name
    return make


def _send_singles(client, queue, messages):
    with client.get_queue_sender(queue) as sender:
        for m in messages:
            sender.send_messages(m)


def _split(seq):
    return seq >> SHIFT, seq & ((1 << SHIFT) - 1)


def _peek_all_partitions(receiver, partitions=16, asked=250):
    """Every message, walking each partition from its first number until an answer comes from another."""
    seen = []
    for p in range(partitions):
        position = (p << SHIFT) | 1
        while True:
            page = receiver.peek_messages(max_message_count=asked, sequence_number=position)
            mine = [m for m in page if m.sequence_number >> SHIFT == p]
            seen += mine
            if not mine or len(mine) < len(page):
                break
            position = mine[-1].sequence_number + 1
    return seen


def test_keyless_messages_spread_round_robin_and_number_densely_per_partition(client, new_queue):
    q = new_queue(enable_partitioning=True)
    _send_singles(client, q, [ServiceBusMessage(f"m{i}") for i in range(40)])
    with client.get_queue_receiver(q) as r:
        seen = _peek_all_partitions(r)
    by_partition = {}
    for m in seen:
        p, n = _split(m.sequence_number)
        by_partition.setdefault(p, []).append(n)
        assert m.raw_amqp_message.annotations[PARTITION_ID] == p
        assert type(m.raw_amqp_message.annotations[PARTITION_ID]) is int
    assert sorted(by_partition) == list(range(16))
    assert {p: len(ns) for p, ns in by_partition.items()} == {p: 3 if p < 8 else 2 for p in range(16)}
    assert all(ns == list(range(1, len(ns) + 1)) for ns in by_partition.values())
    # round robin: the i-th message sent went to partition i % 16
    bodies = {(m.sequence_number >> SHIFT, m.sequence_number & 0xFFFF): str(m) for m in seen}
    assert bodies[(5, 2)] == "m21" and bodies[(0, 1)] == "m0" and bodies[(15, 1)] == "m15"


def test_a_key_or_session_always_lands_in_one_partition(client, new_queue):
    q = new_queue(enable_partitioning=True)
    _send_singles(client, q, [ServiceBusMessage(f"k{i}", partition_key="tenant-a") for i in range(5)])
    with client.get_queue_receiver(q) as r:
        page = r.peek_messages(max_message_count=50, sequence_number=0)
    assert len({m.sequence_number >> SHIFT for m in page}) == 1
    assert [m.sequence_number & 0xFFFF for m in page] == [1, 2, 3, 4, 5]
    assert [str(m) for m in page] == [f"k{i}" for i in range(5)]


def test_a_peek_answers_from_the_partition_holding_the_number_else_the_next_non_empty_one(client, new_queue):
    q = new_queue(enable_partitioning=True)
    _send_singles(client, q, [ServiceBusMessage(f"m{i}") for i in range(32)])   # 2 in each partition
    with client.get_queue_receiver(q) as r:
        first = r.peek_messages(max_message_count=100, sequence_number=0)
        holding = r.peek_messages(max_message_count=100, sequence_number=(3 << SHIFT) | 2)
        past_end = r.peek_messages(max_message_count=100, sequence_number=(3 << SHIFT) | 3)
        beyond = r.peek_messages(max_message_count=100, sequence_number=(15 << SHIFT) | 3)
    assert [_split(m.sequence_number) for m in first] == [(0, 1), (0, 2)]       # one partition, not 100
    assert [_split(m.sequence_number) for m in holding] == [(3, 2)]
    assert [_split(m.sequence_number) for m in past_end] == [(4, 1), (4, 2)]
    assert beyond == []


def test_one_message_per_peek_when_the_namespace_asks(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string("one-per-call"), retry_total=0) as c:
        _send_singles(c, "q", [ServiceBusMessage(f"m{i}", partition_key="k") for i in range(4)])
        with c.get_queue_receiver("q") as r:
            pages = [r.peek_messages(max_message_count=250, sequence_number=0)]
            while pages[-1]:
                pages.append(r.peek_messages(max_message_count=250,
                                             sequence_number=pages[-1][-1].sequence_number + 1))
    assert [len(p) for p in pages] == [1, 1, 1, 1, 0]
    assert [str(p[0]) for p in pages[:4]] == ["m0", "m1", "m2", "m3"]


@pytest.mark.parametrize("mode", [ServiceBusReceiveMode.PEEK_LOCK, ServiceBusReceiveMode.RECEIVE_AND_DELETE])
def test_receives_interleave_partitions_and_settle_across_them(client, new_queue, emu, mode):
    q = new_queue(enable_partitioning=True)
    # partition keys chosen to land in different partitions, four messages each, sent key after key
    keys = [f"key-{i}" for i in range(4)]
    _send_singles(client, q, [ServiceBusMessage(f"{k}/{n}", partition_key=k) for k in keys for n in range(4)])
    got = []
    with client.get_queue_receiver(q, receive_mode=mode) as r:
        while len(got) < 16:
            batch = r.receive_messages(max_message_count=16, max_wait_time=2)
            assert batch
            for m in batch:
                got.append(m)
                if mode == ServiceBusReceiveMode.PEEK_LOCK:
                    r.complete_message(m)
    bodies = [str(m) for m in got]
    assert sorted(bodies) == sorted(f"{k}/{n}" for k in keys for n in range(4))
    assert bodies != [f"{k}/{n}" for k in keys for n in range(4)]            # not in global order
    for k in keys:                                                             # in order per key
        assert [b for b in bodies if b.startswith(k + "/")] == [f"{k}/{n}" for n in range(4)]
    assert all(m.raw_amqp_message.annotations[PARTITION_ID] == m.sequence_number >> SHIFT for m in got)
    assert emu.stats("standard")[q]["total"] == 0


def test_a_session_is_one_partitions_and_keeps_its_order(client, new_queue):
    q = new_queue(enable_partitioning=True, requires_session=True, lock_duration_seconds=30)
    _send_singles(client, q, [ServiceBusMessage(f"{sid}/{n}", session_id=sid) for n in range(3) for sid in "abc"])
    for _ in "abc":
        with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION) as r:
            got = r.receive_messages(max_message_count=10, max_wait_time=2)
            for m in got:
                r.complete_message(m)
        sid = r.session.session_id
        assert [str(m) for m in got] == [f"{sid}/{n}" for n in range(3)]
        assert len({m.sequence_number >> SHIFT for m in got}) == 1
        numbers = [m.sequence_number for m in got]
        assert numbers == sorted(numbers)
        assert all(m.raw_amqp_message.annotations[PARTITION_ID] == m.sequence_number >> SHIFT for m in got)


def test_receives_come_back_empty_while_messages_wait_when_the_namespace_asks(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string("gaps"), retry_total=0) as c:
        with c.get_queue_sender("q") as s:
            s.send_messages([ServiceBusMessage(f"m{i}") for i in range(30)])
        answers, got = [], []
        with c.get_queue_receiver("q") as r:
            while len(got) < 30 and len(answers) < 40:
                batch = r.receive_messages(max_message_count=10, max_wait_time=1)
                answers.append(len(batch))
                for m in batch:
                    r.complete_message(m)
                got += [str(m) for m in batch]
    assert 0 in answers[:-1]                       # an empty answer before the queue was empty
    assert sorted(got) == sorted(f"m{i}" for i in range(30))
    assert emu.stats("gaps")["q"]["total"] == 0


def test_scheduled_and_deferred_messages_keep_their_partitioned_numbers(client, new_queue, emu):
    q = new_queue(enable_partitioning=True)
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    with client.get_queue_sender(q) as s:
        scheduled = s.schedule_messages([ServiceBusMessage("s0"), ServiceBusMessage("s1")], later)
        assert [_split(n) for n in scheduled] == [(0, 1), (1, 1)]
        s.cancel_scheduled_messages(scheduled[1])
        s.send_messages(ServiceBusMessage("d"))
    with client.get_queue_receiver(q) as r:
        (m,) = r.receive_messages(max_message_count=1, max_wait_time=2)
        assert _split(m.sequence_number) == (2, 1)
        r.defer_message(m)
        (again,) = r.receive_deferred_messages([m.sequence_number])
        assert str(again) == "d" and again.raw_amqp_message.annotations[PARTITION_ID] == 2
        r.complete_message(again)
    assert emu.stats("standard")[q]["total"] == 1                 # the one scheduled message left


def test_a_batch_of_distinct_partition_keys_is_refused_and_nothing_stored(client, new_queue, emu):
    q = new_queue(enable_partitioning=True)
    with client.get_queue_sender(q) as s:
        with pytest.raises(ServiceBusError) as refused:
            s.send_messages([ServiceBusMessage("a", partition_key="a"), ServiceBusMessage("b", partition_key="b")])
        assert type(refused.value) is ServiceBusError
        assert refused.value.inner_exception.condition == ErrorCondition.NotAllowed
        assert "Batching brokered messages with distinct SessionId or PartitionKey is not supported for an " \
               "entity with partitioning enabled." in str(refused.value)
        with pytest.raises(ServiceBusError, match="distinct SessionId or PartitionKey"):
            s.send_messages([ServiceBusMessage("a", partition_key="a"), ServiceBusMessage("none")])
        s.send_messages([ServiceBusMessage(f"same{i}", partition_key="a") for i in range(3)])   # one key: taken
        s.send_messages([ServiceBusMessage(f"keyless{i}") for i in range(3)])                  # no key: taken
    assert emu.stats("standard")[q]["total"] == 6
    with client.get_queue_receiver(q) as r:
        seen = _peek_all_partitions(r)
    keyless = [m for m in seen if str(m).startswith("keyless")]
    assert len({m.sequence_number >> SHIFT for m in keyless}) == 1              # a batch is one partition's


def test_with_duplicate_detection_a_batch_of_distinct_message_ids_is_refused(client, new_queue, emu):
    q = new_queue(enable_partitioning=True, duplicate_detection_window_seconds=60)
    with client.get_queue_sender(q) as s:
        with pytest.raises(ServiceBusError) as refused:
            s.send_messages([ServiceBusMessage("a", message_id="1"), ServiceBusMessage("b", message_id="2")])
        assert refused.value.inner_exception.condition == ErrorCondition.NotAllowed
        text = str(refused.value)
        assert "Batching brokered messages with distinct SessionId, PartitionKey, or MessageId  is not supported " \
               "for an entity with partitioning and duplicate detection enabled.LogicalPartitionId:" in text
        assert "::MessageId:1::ViaPartitionKey:::" in text
        s.send_messages([ServiceBusMessage("a", message_id="1")])
        s.send_messages(ServiceBusMessage("a", message_id="2"))
        s.send_messages(ServiceBusMessage("k", partition_key="k"))   # a key is enough
    assert emu.stats("standard")[q]["total"] == 3


def test_with_duplicate_detection_a_message_without_message_id_or_key_is_refused(emu, new_queue):
    """The SDK always gives a message a MessageId: proton's own client sends one without."""
    q = new_queue(enable_partitioning=True, duplicate_detection_window_seconds=60)
    connection = BlockingConnection(f"amqp://127.0.0.1:{emu.port('standard')}", allowed_mechs="ANONYMOUS", timeout=10)
    try:
        sender = connection.create_sender(q)
        with pytest.raises(SendException) as refused:
            sender.send(Message(body=b"no id", inferred=True))
        assert refused.value.state == Disposition.REJECTED
        sender.send(Message(body=b"an id", id="1", inferred=True))
    finally:
        connection.close()
    assert emu.stats("standard")[q]["total"] == 1


def test_duplicate_detection_keys_on_message_id_and_partition_key(client, new_queue, emu):
    q = new_queue(enable_partitioning=True, duplicate_detection_window_seconds=60)
    _send_singles(client, q, [ServiceBusMessage("x", message_id="1"), ServiceBusMessage("x", message_id="1"),
                              ServiceBusMessage("x", message_id="1", partition_key="a"),
                              ServiceBusMessage("x", message_id="1", partition_key="a"),
                              ServiceBusMessage("x", message_id="1", partition_key="b")])
    stats = emu.stats("standard")[q]
    assert (stats["total"], stats["duplicates"]) == (3, 2)
    plain = new_queue(duplicate_detection_window_seconds=60)                # not partitioned: MessageId alone
    _send_singles(client, plain, [ServiceBusMessage("x", message_id="1"),
                                  ServiceBusMessage("x", message_id="1", partition_key="a")])
    assert emu.stats("standard")[plain]["total"] == 1


def test_a_topic_copies_keep_the_partition_bits_and_dead_letters_stay_in_their_partition(client, emu):
    with client.get_topic_sender("events") as s:
        for i in range(4):
            s.send_messages(ServiceBusMessage(f"e{i}"))
    with client.get_subscription_receiver("events", "all") as r:
        got = []
        while len(got) < 4:
            got += r.receive_messages(max_message_count=4, max_wait_time=2)
        assert sorted(m.sequence_number >> SHIFT for m in got) == [0, 1, 2, 3]
        for m in got:
            r.dead_letter_message(m, reason="test")
    with client.get_subscription_receiver("events", "all", sub_queue="deadletter") as d:
        dead = d.peek_messages(max_message_count=10, sequence_number=0)
        assert [_split(m.sequence_number) for m in dead] == [(0, 1)]
        assert dead[0].raw_amqp_message.annotations[PARTITION_ID] == 0
        assert len(_peek_all_partitions(d)) == 4


def test_a_premium_namespace_partitions_every_entity(emu):
    emu.add_queue("premium", "added")
    with ServiceBusClient.from_connection_string(emu.connection_string("premium"), retry_total=0) as c:
        for queue in ("q", "added"):
            _send_singles(c, queue, [ServiceBusMessage(f"m{i}") for i in range(8)])
            with c.get_queue_receiver(queue) as r:
                seen = _peek_all_partitions(r, partitions=4)
            assert sorted(_split(m.sequence_number) for m in seen) == [(p, n) for p in range(4) for n in (1, 2)]
    assert emu.stats("premium")["q"]["partitions"] == 4
    emu.add_queue("premium", "plain-asked")          # in a partitioned namespace every queue is partitioned
    assert emu.stats("premium")["plain-asked"]["partitions"] == 4


def test_the_administration_api_reports_partitioning_and_totals_counts(emu, client, new_queue):
    q = new_queue(enable_partitioning=True, duplicate_detection_window_seconds=60)
    plain = new_queue()
    assert "partitions" not in emu.stats("standard")[plain]
    _send_singles(client, q, [ServiceBusMessage(f"m{i}", message_id=str(i)) for i in range(20)])
    with ServiceBusAdministrationClient.from_connection_string(
            emu.admin_connection_string("standard"), connection_verify=emu.ca_file, retry_total=0) as admin:
        props = admin.get_queue(q)
        assert props.enable_partitioning is True and props.requires_duplicate_detection is True
        assert admin.get_queue(plain).enable_partitioning is False
        assert admin.get_queue_runtime_properties(q).active_message_count == 20
        assert admin.get_topic("events").enable_partitioning is True
    with ServiceBusAdministrationClient.from_connection_string(
            emu.admin_connection_string("premium"), connection_verify=emu.ca_file, retry_total=0) as admin:
        assert admin.get_queue("q").enable_partitioning is True


def test_a_queue_recreated_partitioned_numbers_by_partition(emu, client, new_queue):
    q = new_queue()
    _send_singles(client, q, [ServiceBusMessage("before")])
    emu.recreate_queue("standard", q, enable_partitioning=True)
    _send_singles(client, q, [ServiceBusMessage("after", partition_key="k")])
    with client.get_queue_receiver(q) as r:
        seen = _peek_all_partitions(r)
    assert [str(m) for m in seen] == ["after"] and seen[0].sequence_number & 0xFFFF == 1


@pytest.mark.parametrize("namespace, error", [
    ({"tier": "standard", "partitions": 4}, "partitions: a partitioned namespace is Premium"),
    ({"tier": "premium", "partitions": 3}, "1, 2 or 4 partitions, got 3"),
    ({"tier": "premium", "queues": [{"name": "q", "enable_partitioning": True}]}, "set partitions: 1, 2 or 4"),
    ({"queues": [{"name": "q", "enable_partitioning": "yes"}]}, "enable_partitioning: expected bool"),
    ({"peek_one_per_call": 1}, "peek_one_per_call: expected true or false"),
    ({"receive_empty_probability": 2}, "receive_empty_probability: must be from 0 to 1"),
])
def test_partitioning_settings_are_checked(namespace, error):
    with pytest.raises(ConfigError, match=error):
        EmulatorConfig.from_dict({"namespaces": [{"name": "n", **namespace}]})


def test_config_json_has_no_partitioning_key_and_says_what_to_write():
    doc = {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": [
        {"Name": "q", "Properties": {"EnablePartitioning": True}}]}]}}
    with pytest.raises(ConfigError, match=r"Queues\[0\]\.Properties\.EnablePartitioning: the official emulator has "
                                          r"no partitioning.*enable_partitioning: true"):
        EmulatorConfig.from_dict(doc)
