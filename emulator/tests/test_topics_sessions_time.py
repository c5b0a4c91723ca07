"""Topics and filters, sessions, scheduling and TTL through the real SDK."""
import datetime
import time

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusMessageState, ServiceBusSubQueue
from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError


def _utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def _drain(receiver, expected, wait=2):
    got = []
    deadline = time.time() + 10
    while len(got) < expected and time.time() < deadline:
        batch = receiver.receive_messages(max_message_count=expected - len(got), max_wait_time=wait)
        for m in batch:
            receiver.complete_message(m)
        got += batch
    return got


def test_topic_fan_out_with_correlation_filters(client, emulator):
    with client.get_topic_sender("events") as s:
        s.send_messages([
            ServiceBusMessage("eu-1", application_properties={"region": "eu"}),
            ServiceBusMessage("us-1", application_properties={"region": "us"}),
            ServiceBusMessage("alert-1", subject="alert"),
        ])
    expected = {"all": ["eu-1", "us-1", "alert-1"], "eu": ["eu-1"], "alerts": ["alert-1"]}
    for sub, bodies in expected.items():
        with client.get_subscription_receiver("events", sub) as r:
            got = _drain(r, len(bodies))
            assert [str(m) for m in got] == bodies
            assert r.receive_messages(max_wait_time=0.3) == []
    stats = emulator.stats("contoso")
    assert stats["events"]["in"] == 3
    assert stats["events/Subscriptions/eu"]["completed"] == 1
    # copies share the topic's sequence numbers
    assert stats["events/Subscriptions/all"]["in"] == 3


def test_named_session_receive_state_and_renew(client):
    with client.get_queue_sender("sessions-orders") as s:
        s.send_messages([ServiceBusMessage(f"a{i}", session_id="A") for i in range(3)]
                        + [ServiceBusMessage("b0", session_id="B")])
    with client.get_queue_receiver("sessions-orders", session_id="A") as r:
        assert r.session.session_id == "A"
        assert r.session.locked_until_utc > _utcnow()
        got = _drain(r, 3)
        assert [str(m) for m in got] == ["a0", "a1", "a2"]
        assert all(m.session_id == "A" for m in got)
        assert r.session.get_state() is None
        r.session.set_state(b"checkpoint-\x00\xff")
        assert r.session.get_state() == b"checkpoint-\x00\xff"
        before = r.session.locked_until_utc
        time.sleep(0.05)
        assert r.session.renew_lock() > before
        with pytest.raises(SessionCannotBeLockedError):
            with client.get_queue_receiver("sessions-orders", session_id="A") as other:
                other.receive_messages(max_wait_time=1)
    # after the first receiver closed, the session can be taken again and its state is kept
    with client.get_queue_receiver("sessions-orders", session_id="A") as r:
        assert r.session.get_state() == b"checkpoint-\x00\xff"
    with client.get_queue_receiver("sessions-orders", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as r:
        assert r.session.session_id == "B"
        assert [str(m) for m in _drain(r, 1)] == ["b0"]


def test_next_available_session_times_out_when_none(client):
    with pytest.raises(OperationTimeoutError):
        with client.get_queue_receiver("sessions-orders", session_id=NEXT_AVAILABLE_SESSION,
                                       max_wait_time=1) as r:
            r.receive_messages(max_wait_time=1)


def test_session_peek_and_deferred_in_session(client):
    with client.get_queue_sender("sessions-orders") as s:
        s.send_messages([ServiceBusMessage("c0", session_id="C"), ServiceBusMessage("c1", session_id="C")])
    with client.get_queue_receiver("sessions-orders", session_id="C") as r:
        assert [str(m) for m in r.peek_messages(max_message_count=10)] == ["c0", "c1"]
        first, second = _drain_no_complete(r, 2)
        r.defer_message(first)
        r.complete_message(second)
        (d,) = r.receive_deferred_messages([first.sequence_number])
        r.complete_message(d)
        assert r.peek_messages(max_message_count=10) == []


def _drain_no_complete(receiver, expected):
    got = []
    deadline = time.time() + 10
    while len(got) < expected and time.time() < deadline:
        got += receiver.receive_messages(max_message_count=expected - len(got), max_wait_time=2)
    return got


def test_schedule_and_cancel(client, queue):
    with client.get_queue_sender(queue) as s:
        at = _utcnow() + datetime.timedelta(seconds=1.5)
        keep, cancel = s.schedule_messages([ServiceBusMessage("later"), ServiceBusMessage("never")], at)
        s.cancel_scheduled_messages(cancel)
        s.send_messages(ServiceBusMessage("now", scheduled_enqueue_time_utc=_utcnow() - datetime.timedelta(1)))
    with client.get_queue_receiver(queue) as r:
        peeked = r.peek_messages(max_message_count=10)
        assert [(str(m), m.state) for m in peeked] == [("later", ServiceBusMessageState.SCHEDULED),
                                                      ("now", ServiceBusMessageState.ACTIVE)]
        assert peeked[0].sequence_number == keep
        assert [str(m) for m in _drain(r, 1, wait=1)] == ["now"]
        got = _drain(r, 1, wait=3)
        assert [str(m) for m in got] == ["later"]
        assert got[0].enqueued_time_utc >= at - datetime.timedelta(milliseconds=50)


def test_ttl_expiry_dead_letters_or_drops_when_a_receive_meets_the_message(client, new_queue, emulator):
    dl = new_queue(dead_lettering_on_message_expiration=True)
    drop = new_queue()
    for q in (dl, drop):
        with client.get_queue_sender(q) as s:
            s.send_messages([ServiceBusMessage("short", time_to_live=datetime.timedelta(seconds=1)),
                             ServiceBusMessage("long")])
    time.sleep(1.3)
    for q in (dl, drop):
        with client.get_queue_receiver(q) as r:
            # expired, and still there until a receive (or the minute's sweep) collects it, as on Service Bus
            assert [str(m) for m in r.peek_messages(max_message_count=5)] == ["short", "long"]
            received = r.receive_messages(max_message_count=5, max_wait_time=2)
            assert [str(m) for m in received] == ["long"]
            r.complete_message(received[0])
    with client.get_queue_receiver(dl, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as r:
        (m,) = r.peek_messages(max_message_count=5)
        assert str(m) == "short" and m.dead_letter_reason == "TTLExpiredException"
    stats = emulator.stats("contoso")
    assert stats[drop]["total"] == 0 and stats[drop]["dead_letter_count"] == 0 and stats[drop]["expired"] == 1
    assert stats[dl]["dead_letter_count"] == 1


def test_a_scheduled_message_gets_a_new_sequence_number_when_it_becomes_active(client, queue):
    """"As the message transitions to the active state, the message is appended to the queue as if had been
    enqueued at the current instant, which includes assigning a new SequenceNumber" (message sequencing): the
    number the schedule returned cancels nothing any more."""
    from azure.servicebus.exceptions import MessageNotFoundError

    with client.get_queue_sender(queue) as s:
        (scheduled,) = s.schedule_messages([ServiceBusMessage("later")], _utcnow() + datetime.timedelta(seconds=0.5))
        s.send_messages(ServiceBusMessage("now"))
        with client.get_queue_receiver(queue) as r:
            got = _drain(r, 2, wait=2)
        assert [str(m) for m in got] == ["now", "later"]
        assert got[1].sequence_number > got[0].sequence_number > scheduled
        with pytest.raises(MessageNotFoundError):
            s.cancel_scheduled_messages(scheduled)


def test_a_topics_scheduled_messages_stay_in_the_topic_until_their_time(client):
    """"Scheduled messages reside in the topic until the scheduled time" (azure-docs#59641): a subscription's peek
    does not show them ("Yes for queues. No for subscriptions", message browsing); the topic's $management cancels
    them by their numbers (azure-service-bus#352); at their time they fan out, under new numbers."""
    with client.get_topic_sender("events") as s:
        keep, cancel = s.schedule_messages([ServiceBusMessage("later", application_properties={"region": "eu"}),
                                            ServiceBusMessage("never", application_properties={"region": "eu"})],
                                           _utcnow() + datetime.timedelta(seconds=1))
        with client.get_subscription_receiver("events", "eu") as r:
            assert r.peek_messages(max_message_count=10) == []
            s.cancel_scheduled_messages(cancel)
            (got,) = _drain(r, 1, wait=3)
        assert str(got) == "later" and got.sequence_number > max(keep, cancel)
        with client.get_subscription_receiver("events", "all") as r:
            assert [str(m) for m in _drain(r, 1, wait=1)] == ["later"]


def test_sessions_are_listed_with_messages_or_a_state_and_by_when_their_state_changed(client, new_queue):
    """get-message-sessions: with last-updated-time at DateTime.MaxValue (the SDK's default), "sessions with active
    messages or stored session state"; with an earlier time, those whose state was set after it."""
    q = new_queue(requires_session=True)
    with client.get_queue_sender(q) as s:
        s.send_messages([ServiceBusMessage("a", session_id="with-messages"), ServiceBusMessage("b", session_id="emptied")])
    with client.get_queue_receiver(q, session_id="emptied") as r:
        _drain(r, 1)
    with client.get_queue_receiver(q, session_id="with-state") as r:
        r.session.set_state(b"state")
    assert sorted(client.list_queue_sessions(q)) == ["with-messages", "with-state"]
    later = _utcnow()
    time.sleep(0.01)
    with client.get_queue_receiver(q, session_id="with-messages") as r:
        r.session.set_state(b"now")
    assert list(client.list_queue_sessions(q, state_updated_after=later)) == ["with-messages"]
