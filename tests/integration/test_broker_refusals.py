"""Answers a real namespace gives that no retry changes: the syphon dead-letters the one message they
concern, with the service's words, and goes on; it never waits them out (``sink.outage_wait_seconds``
is an hour here, longer than the test may take)."""

from tools import backlog_writer
from tools.backlog_writer import OriginalMessage
from tools.testing import backlog_dead_letters, drain_destinations

from backlog_syphon.model import Outcome, ReasonCode
from backlog_syphon.restore.queue_names import backlog_queue_names
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.storage import delta

from .conftest import PRIMARY, make_config
from .helpers import free_port

BACKLOG_QUEUES = backlog_queue_names(PRIMARY, 10)
SESSION_NOT_SET = "The SessionId was not set on a message, and it cannot be sent to the entity."


def _session_backlog(config):
    """Two messages the application sent before their queue was made session-enabled (no x-ms-sessionid),
    among a session's messages, in one backlog queue; a plain queue's in another."""
    sessions = [OriginalMessage("sessions-orders", f"s{i}".encode(), message_id=f"session-{i}", session_id="customer-7")
                for i in range(6)]
    plain = [OriginalMessage("orders", f"o{i}".encode(), message_id=f"order-{i}") for i in range(6)]
    sessionless = [OriginalMessage("sessions-orders", f"x{i}".encode(), message_id=f"no-session-{i}") for i in range(2)]
    backlog_writer.send_legacy_backlog(config.secondary, {
        BACKLOG_QUEUES[0]: sessions[:2] + [sessionless[0]] + sessions[2:4] + [sessionless[1]] + sessions[4:],
        BACKLOG_QUEUES[1]: plain})
    return sessions, plain


def test_session_less_messages_for_a_session_queue_are_dead_lettered_by_the_refusal_not_waited_out(
        emulator, tmp_path, spark):
    # The primary's administration API cannot be reached (nothing listens there), so nothing is known of the
    # destinations up front: the service's refusal is what tells.
    config = make_config(emulator, tmp_path, **{"sink.outage_wait_seconds": 3600, "backlog.queue_count": 2,
                                                "primary.administration_endpoint": f"127.0.0.1:{free_port()}"})
    sessions, plain = _session_backlog(config)

    summary = run_syphon(spark, config)

    assert summary.drained
    drained = drain_destinations(emulator.connection_string(PRIMARY), ["orders", "sessions-orders"],
                                 session_entities=["sessions-orders"])
    assert [m.message_id for m in drained["sessions-orders"]] == [m.message_id for m in sessions]  # in order
    assert sorted(m.message_id for m in drained["orders"]) == sorted(m.message_id for m in plain)
    dead = {m.message_id: m for m in backlog_dead_letters(config.secondary, BACKLOG_QUEUES[:2])}
    assert sorted(dead) == ["no-session-0", "no-session-1"]
    assert {m.dead_letter_reason for m in dead.values()} == {ReasonCode.SESSION_REQUIRED}
    audit = {row.message_id: row for row in delta.read_table(spark, config.storage.audit_table).collect()}
    for message_id in dead:
        assert (audit[message_id].outcome, audit[message_id].reason_code) == (Outcome.DEAD_LETTERED,
                                                                               ReasonCode.SESSION_REQUIRED)
    # The first is the one the service refused (sent alone once the batch of both was refused), in its words;
    # the second was not sent again: the refusal taught the sender that the queue requires sessions.
    assert audit["no-session-0"].reason.startswith("destination 'sessions-orders' refused the message "
                                                   "(amqp:not-allowed): " + SESSION_NOT_SET)
    assert audit["no-session-1"].reason.startswith("destination 'sessions-orders' requires sessions and the message "
                                                   "has no SessionId")
    assert {audit[m.message_id].outcome for m in sessions + plain} == {Outcome.DELIVERED}
    assert not [row for row in audit.values() if row.outcome == Outcome.UNSENT]


def test_where_the_administration_api_describes_the_destination_they_are_dead_lettered_before_sending(
        emulator, tmp_path, spark, caplog):
    config = make_config(emulator, tmp_path, **{"sink.outage_wait_seconds": 3600, "backlog.queue_count": 2})
    sessions, plain = _session_backlog(config)
    sends_before = emulator.stats(PRIMARY)["sessions-orders"]["ops"].get("send", 0)

    summary = run_syphon(spark, config)

    assert summary.drained
    audit = {row.message_id: row for row in delta.read_table(spark, config.storage.audit_table).collect()}
    for message_id in ("no-session-0", "no-session-1"):
        row = audit[message_id]
        assert (row.outcome, row.reason_code, row.attempts) == (Outcome.DEAD_LETTERED, ReasonCode.SESSION_REQUIRED, 0)
        assert row.reason.startswith("destination 'sessions-orders' requires sessions and the message has no "
                                     "SessionId")
    # the session's messages went in one send: the refused ones were never sent
    assert emulator.stats(PRIMARY)["sessions-orders"]["ops"].get("send", 0) - sends_before == 1
    drained = drain_destinations(emulator.connection_string(PRIMARY), ["orders", "sessions-orders"],
                                 session_entities=["sessions-orders"])
    assert [m.message_id for m in drained["sessions-orders"]] == [m.message_id for m in sessions]
    assert len(drained["orders"]) == len(plain)
