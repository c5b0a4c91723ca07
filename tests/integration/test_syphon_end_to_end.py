"""The syphon against the emulator with real Delta: fidelity, order, poison messages, tables, secrets."""

import datetime as dt
import uuid
from collections import defaultdict

from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

from backlog_syphon.restore.amqp.message_decoding import decode_message
from backlog_syphon.restore.amqp.values import Int, Symbol, Timestamp, ULong
from backlog_syphon.restore.legacy_properties import LEGACY_PROPERTIES
from backlog_syphon.restore.queue_names import backlog_queue_name
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.servicebus.peek import peek_raw
from tools import backlog_writer
from tools.backlog_writer import OriginalMessage
from tools.testing import backlog_dead_letters, drain_destinations, read_queues

from backlog_syphon.storage import audit_table, checkpoint_table, delta, lease_table

from .helpers import read_with_deltalake
from .conftest import PRIMARY

BACKLOG_QUEUES = [backlog_queue_name(PRIMARY, index) for index in range(10)]

RECEIVE_AND_DELETE = ServiceBusReceiveMode.RECEIVE_AND_DELETE
TYPED_PROPERTIES = {
    "long": 2**40,
    "small_long": 5,  # a long whose value fits in an int stays a long
    "int": Int(-7),
    "ulong": ULong(2**63),
    "text": "héllo",
    "flag": True,
    "ratio": 1.25,
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "when": Timestamp(1_700_000_000_000),
    "sym": Symbol("a-symbol"),
    "blob": b"\x00\x01\xff",
}
EXPECTED_TYPES = {"long": int, "small_long": int, "int": Int, "ulong": ULong, "text": str,
                  "flag": bool, "ratio": float, "id": uuid.UUID, "when": Timestamp, "sym": Symbol,
                  "blob": bytes}


def drain_queue(emulator, queue, *, session=False):
    """Receive-and-delete everything; returns messages in arrival order (grouped per session)."""
    return drain_destinations(emulator.connection_string(PRIMARY), [queue], session_entities=[queue] if session else [])[queue]


def test_fidelity_of_every_field_and_property(emulator, syphon_config, spark):
    config = syphon_config.with_overrides({"restore.ttl_policy": "restart"})
    body = bytes(range(256)) * 4
    full = OriginalMessage(
        "orders", body, message_id="full-1", correlation_id="corr-1", subject="order-created",
        content_type="application/x-custom", reply_to="replies", reply_to_session_id="reply-session",
        to="someone", time_to_live=dt.timedelta(hours=3), application_properties=dict(TYPED_PROPERTIES))
    session = OriginalMessage("sessions-orders", b"in a session", message_id="session-1", session_id="customer-42")
    eu = OriginalMessage("events", b"eu event", message_id="event-eu", application_properties={"region": "eu"})
    us = OriginalMessage("events", b"us event", message_id="event-us", application_properties={"region": "us"})
    backlog_writer.write_backlog(config.secondary, PRIMARY, [full, session, eu, us], queue_count=10)

    summary = run_syphon(spark, config)
    assert summary.drained
    assert summary.per_destination["orders"]["delivered"] == 1
    assert summary.per_destination["events"]["delivered"] == 2

    with ServiceBusClient.from_connection_string(emulator.connection_string(PRIMARY)) as client:
        with client.get_queue_receiver("orders") as receiver:
            [raw] = peek_raw(receiver, 1, 10)
        stored = decode_message(raw)
        assert stored.body == (body,)
        props = stored.properties
        assert (props.message_id, props.correlation_id, props.subject, props.content_type, props.reply_to,
                props.reply_to_group_id, props.to) == ("full-1", "corr-1", "order-created",
                                                       "application/x-custom", "replies", "reply-session",
                                                       "someone")
        assert props.group_id is None
        assert stored.header.ttl_ms == 3 * 3600 * 1000  # restart policy: the original TTL again
        assert not LEGACY_PROPERTIES & set(map(str, stored.application_properties))
        for name, expected_type in EXPECTED_TYPES.items():
            value = stored.application_properties[name]
            assert type(value) is expected_type, (name, type(value))
        assert stored.application_properties["long"] == 2**40
        assert stored.application_properties["int"] == -7
        assert stored.application_properties["blob"] == b"\x00\x01\xff"
        assert stored.application_properties["when"] == 1_700_000_000_000

        [session_copy] = drain_queue(emulator, "sessions-orders", session=True)
        assert session_copy.session_id == "customer-42" and b"".join(session_copy.body) == b"in a session"
        with client.get_subscription_receiver("events", "all", receive_mode=RECEIVE_AND_DELETE) as receiver:
            assert sorted(m.message_id for m in receiver.receive_messages(10, max_wait_time=2)) == ["event-eu",
                                                                                                    "event-us"]
        with client.get_subscription_receiver("events", "eu", receive_mode=RECEIVE_AND_DELETE) as receiver:
            assert [m.message_id for m in receiver.receive_messages(10, max_wait_time=2)] == ["event-eu"]

    audit = spark.read.format("delta").load(config.storage.audit_table)
    assert audit.count() == 4
    assert {r.outcome for r in audit.collect()} == {"delivered"}
    row = audit.where("message_id = 'session-1'").first()
    assert row.destination == "sessions-orders" and row.session_id == "customer-42" and row.attempts == 1


def test_remaining_ttl_and_schedule(emulator, syphon_config, spark):
    later_on = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=10)).replace(microsecond=0)
    ttl = OriginalMessage("payments", b"ttl", message_id="ttl-1", time_to_live=dt.timedelta(hours=1))
    scheduled = OriginalMessage("payments", b"later", message_id="scheduled-1", scheduled_enqueue_time=later_on)
    expired = OriginalMessage("payments", b"too late", message_id="expired-1",
                              time_to_live=dt.timedelta(milliseconds=1))
    written_at = dt.datetime.now(dt.timezone.utc)
    backlog_writer.write_backlog(syphon_config.secondary, PRIMARY, [ttl, scheduled, expired], queue_count=10)
    summary = run_syphon(spark, syphon_config)
    waited = dt.datetime.now(dt.timezone.utc) - written_at
    assert summary.per_destination["payments"] == {"delivered": 2, "dead_lettered": 1, "skipped_ping": 0, "held": 0,
                                                   "not_selected": 0, "expired": 0, "covered": 0}

    with ServiceBusClient.from_connection_string(emulator.connection_string(PRIMARY)) as client:
        with client.get_queue_receiver("payments", receive_mode=RECEIVE_AND_DELETE) as receiver:
            first = receiver.receive_messages(10, max_wait_time=1)
            assert [m.message_id for m in first] == ["ttl-1"]  # the scheduled one is not visible yet
            remaining_ttl = first[0].time_to_live
            # remaining policy: the time spent in the backlog is taken off the original hour
            assert dt.timedelta(hours=1) - waited <= remaining_ttl < dt.timedelta(hours=1) - dt.timedelta(seconds=1)
            [raw] = peek_raw(receiver, 1, 10)  # peek also shows scheduled messages
            scheduled_copy = decode_message(raw)
            assert scheduled_copy.properties.message_id == "scheduled-1"
            assert scheduled_copy.scheduled_enqueue_time == later_on
    dead = backlog_dead_letters(syphon_config.secondary, BACKLOG_QUEUES)
    assert [(m.message_id, m.dead_letter_reason) for m in dead] == [("expired-1", "expired_in_backlog")]


def test_order_per_backlog_queue_and_per_session(emulator, syphon_config, spark):
    originals = backlog_writer.realistic_backlog(240, seed=3, body_size=64)
    originals = [m for m in originals if m.scheduled_enqueue_time is None]
    written = backlog_writer.write_backlog(syphon_config.secondary, PRIMARY, originals, queue_count=10, seed=3)
    backlog_order = read_queues(emulator.connection_string("contoso-secondary"), written, lambda receiver: [
        decode_message(raw).properties.message_id for raw in peek_raw(receiver, 1, 1000)])
    queue_of = {mid: queue for queue, ids in backlog_order.items() for mid in ids}

    config = syphon_config.with_overrides({"run.max_messages_per_trigger": "150"})  # two batches
    summary = run_syphon(spark, config)
    assert summary.drained

    drained = drain_destinations(emulator.connection_string(PRIMARY), ["orders", "payments", "sessions-orders"],
                                 session_entities=["sessions-orders"])
    arrived = defaultdict(list)  # destination -> message ids in arrival order
    sessions = defaultdict(list)
    for destination in ("orders", "payments"):
        arrived[destination] = [m.message_id for m in drained[destination]]
    for message in drained["sessions-orders"]:
        sessions[message.session_id].append(message.message_id)
        arrived["sessions-orders"].append(message.message_id)
    for destination, ids in arrived.items():
        if destination == "sessions-orders":
            continue  # drained session by session: checked per session below
        for queue, order in backlog_order.items():
            sent_from_queue = [mid for mid in ids if queue_of[mid] == queue]
            assert sent_from_queue == [mid for mid in order if mid in set(sent_from_queue)], (destination, queue)
    expected_sessions = defaultdict(list)
    for message in originals:
        if message.session_id:
            expected_sessions[message.session_id].append(message.message_id)
    assert dict(sessions) == dict(expected_sessions)  # a session's messages share one backlog queue
    assert sum(len(v) for v in arrived.values()) == sum(1 for m in originals if m.destination != "events")


def test_the_source_planners_start_on_a_read_of_no_queue(spark, monkeypatch, caplog):
    """What a run's start does beside its lease (``start_planners``), once the source is registered: a batch
    read of no queue is planned, which starts Spark's Python planner processes, once per application.
    It runs no Spark job and opens no connection (its options name no namespace), and it succeeded (a
    failure is only logged, and leaves the application to try again)."""
    import logging
    from types import SimpleNamespace

    from backlog_syphon.rows import BACKLOG_ROW_SCHEMA
    from backlog_syphon.source import data_source

    spark.dataSource.register(data_source.BacklogDataSource)
    monkeypatch.setattr(data_source, "_PLANNERS_STARTED", set())  # as in a new application
    store = spark.sparkContext._jsc.sc().statusStore()
    jobs = store.jobsList(None).size()
    caplog.set_level(logging.INFO, logger=data_source.logger.name)
    data_source.start_planners(spark)
    assert store.jobsList(None).size() == jobs
    assert [record.getMessage() for record in caplog.records] == []  # no "were not started early"

    reads = []

    class Session:
        """An application's session that counts the reads planned in it, and fails them."""

        def __init__(self, application_id: str):
            self.sparkContext = SimpleNamespace(applicationId=application_id)

        @property
        def read(self):
            reads.append(self.sparkContext.applicationId)
            raise RuntimeError("Python worker failed to connect back")

    data_source.start_planners(Session(spark.sparkContext.applicationId))
    assert reads == []  # started already in this application: nothing planned again
    data_source.start_planners(Session("another-application"))
    data_source.start_planners(Session("another-application"))
    assert reads == ["another-application"] * 2  # a failure leaves it to be tried again, and is logged
    assert [record.getMessage() for record in caplog.records] == [
        "Spark's Python planners were not started early (RuntimeError); the query starts them"] * 2
    frame = spark.readStream.format(data_source.SOURCE_NAME).options(primaryNamespace="contoso").load()
    assert frame.isStreaming and frame.schema == BACKLOG_ROW_SCHEMA


def test_poison_messages_are_dead_lettered_with_reasons_audited_and_no_secret_shows(emulator, syphon_config, spark):
    good = [OriginalMessage("orders", f"good {i}".encode(), message_id=f"good-{i}") for i in range(5)]
    poison = backlog_writer.poison_backlog(seed=1)
    messages = good[:2] + [m for m, _ in poison] + good[2:]  # poison in the middle of good ones
    backlog_writer.write_backlog(syphon_config.secondary, PRIMARY, messages, queue_count=10, senders=1)

    # The secondary's key is in no query plan (the source's options carry a reference to it, not the key)...
    from backlog_syphon.source.data_source import BacklogDataSource, SOURCE_NAME, backlog_source_options

    spark.dataSource.register(BacklogDataSource)
    frame = spark.readStream.format(SOURCE_NAME).options(**backlog_source_options(syphon_config)).load()
    key = syphon_config.secondary.connection_string.reveal().split("SharedAccessKey=")[1].split(";")[0]
    assert key not in frame._jdf.queryExecution().toString()

    summary = run_syphon(spark, syphon_config)
    assert summary.drained
    drained = drain_destinations(emulator.connection_string(PRIMARY), ["orders", "small"])
    assert [m.message_id for m in drained["orders"]] == [f"good-{i}" for i in range(5)]
    assert drained["small"] == []

    expected = {message.message_id: reason for message, reason in poison}
    dead = backlog_dead_letters(syphon_config.secondary, BACKLOG_QUEUES)
    assert {m.message_id: m.dead_letter_reason for m in dead} == expected
    assert all(m.dead_letter_error_description for m in dead)
    assert all("x-ms-path" in {k.decode() if isinstance(k, bytes) else k for k in m.application_properties}
               for m in dead if m.message_id != "poison-1-missing-path")  # dead-lettered as they were

    audit = {r.message_id: r for r in spark.read.format("delta").load(syphon_config.storage.audit_table).collect()}
    for message_id, reason in expected.items():
        assert audit[message_id].outcome == "dead_lettered"
        assert audit[message_id].reason_code == reason and audit[message_id].reason
    assert all(audit[f"good-{i}"].outcome == "delivered" for i in range(5))
    checkpoint = spark.read.format("delta").load(syphon_config.storage.checkpoint_table).collect()
    assert sum(r.delivered_count for r in checkpoint) == 5
    assert sum(r.dead_lettered_count for r in checkpoint) == len(poison)
    assert all(r.purged_through == r.delivered_through for r in checkpoint)
    # Any Delta reader can read the three tables, with the declared (plain) column types.
    storage = syphon_config.storage
    for table, schema in ((storage.audit_table, audit_table.AUDIT_SCHEMA),
                          (storage.checkpoint_table, checkpoint_table.CHECKPOINT_SCHEMA),
                          (storage.resolved_lease_table, lease_table.LEASE_SCHEMA)):
        assert sorted(read_with_deltalake(table)) == sorted(schema.fieldNames())
    # ... and in no table row, the dead-letter reasons included.
    for table in (storage.audit_table, storage.checkpoint_table, storage.resolved_lease_table):
        rows = delta.read_table(spark, table).collect()
        assert rows and all(key not in str(row) and "SharedAccessKey" not in str(row) for row in rows), table
