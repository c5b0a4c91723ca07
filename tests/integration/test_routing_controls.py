"""The two routing controls against the emulator, end to end with real Delta tables:
``restore.destination_map`` (a renamed destination receives what was addressed to its old name) and
``restore.skip_destinations`` (a closed destination's messages stay in the backlog, untouched, while the
others drain; a later run without the skip delivers them).

One backlog and two runs: the held messages sit in the same backlog queue as, and in front of,
messages that are delivered, so the purge has to pass over them to settle the others.
"""

import pytest

from backlog_syphon.model import Outcome, ReasonCode
from backlog_syphon.restore.queue_names import backlog_queue_name
from backlog_syphon.run.dry_run import dry_run
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.storage import delta
from tools.backlog_writer import OriginalMessage, send_legacy_backlog
from tools.testing import drain_destinations, read_queues

from .conftest import PRIMARY, SECONDARY, make_config

ROUTING = {"restore.destination_map": "{Orders-V1: orders}", "restore.skip_destinations": "[payments]"}


def _backlog() -> dict[str, list[OriginalMessage]]:
    """Queue 0 interleaves all three kinds (a held message first); queue 1 holds renamed and plain ones."""
    q0, q1 = backlog_queue_name(PRIMARY, 0), backlog_queue_name(PRIMARY, 1)
    first = []
    for i in range(6):
        first.append(OriginalMessage("payments", f"pay {i}".encode(), message_id=f"pay-{i}"))
        first.append(OriginalMessage("orders-v1" if i % 2 else "ORDERS-V1", f"old {i}".encode(),
                                     message_id=f"old-{i}", application_properties={"n": i}))
        first.append(OriginalMessage("orders", f"new {i}".encode(), message_id=f"new-{i}"))
    second = [OriginalMessage("orders-v1", b"old q1", message_id="old-q1"),
              OriginalMessage("orders", b"new q1", message_id="new-q1"),
              OriginalMessage("payments", b"pay q1", message_id="pay-q1")]
    return {q0: first, q1: second}


def _backlog_messages(emulator, queues) -> dict[str, list]:
    """What each backlog queue holds, peeked (nothing locked or counted)."""
    return read_queues(emulator.connection_string(SECONDARY), queues,
                       lambda receiver: receiver.peek_messages(max_message_count=100, sequence_number=1))


@pytest.mark.timeout(900)
def test_a_renamed_destination_gets_its_old_names_messages_and_a_skipped_one_waits_for_a_later_run(
        spark, emulator, tmp_path):
    config = make_config(emulator, tmp_path, **ROUTING)
    backlog = _backlog()
    send_legacy_backlog(config.secondary, backlog)
    pay_ids = {m.message_id for batch in backlog.values() for m in batch if m.destination == "payments"}
    old_ids = {m.message_id for batch in backlog.values() for m in batch if m.destination.lower() == "orders-v1"}
    new_ids = {m.message_id for batch in backlog.values() for m in batch if m.destination == "orders"}
    assert (len(pay_ids), len(old_ids), len(new_ids)) == (7, 7, 7)

    # The dry run shows the rename and what the skip would leave, per destination, and sends nothing.
    report = dry_run(spark, config)
    by_destination = {row["destination"]: row for row in report.per_destination}
    assert (by_destination["orders"]["messages"], by_destination["orders"]["to_deliver"]) == (14, 14)
    assert by_destination["orders"]["renamed_from"] == "ORDERS-V1, orders-v1"
    assert (by_destination["payments"]["to_hold"], by_destination["payments"]["to_deliver"]) == (7, 0)
    lines = "\n".join(report.lines())
    assert "    Orders-V1 -> orders: 7 messages" in lines
    assert "would leave 7 messages in the backlog for restore.skip_destinations" in lines
    assert "    payments: 7 messages" in lines

    # Run 1, with the map and the skip: the renamed destination gets everything addressed to either name;
    # the closed one gets nothing and its messages stay, untouched; everything else leaves the backlog.
    first = run_syphon(spark, config)
    assert first.drained, first.lines()  # left only for the skip: not a run that fell short (exit code 0)
    assert first.held == {"payments": 7}
    assert first.per_destination["orders"][Outcome.DELIVERED] == 14
    assert sum(first.remaining.values()) == 7
    received = drain_destinations(emulator.connection_string(PRIMARY), ["orders", "payments"])
    assert sorted(m.message_id for m in received["orders"]) == sorted(old_ids | new_ids)
    assert received["payments"] == []
    renamed = {m.message_id: m for m in received["orders"] if m.message_id in old_ids}
    assert renamed["old-3"].application_properties[b"n"] == 3 and bytes(next(renamed["old-3"].body)) == b"old 3"
    assert not any(key.startswith(b"x-ms-") for m in received["orders"]
               for key in (m.application_properties or {}))
    left = _backlog_messages(emulator, backlog)
    assert {m.message_id for batch in left.values() for m in batch} == pay_ids
    assert all(m.delivery_count == 0 for batch in left.values() for m in batch)  # untouched: never abandoned
    assert [m.sequence_number for m in left[backlog_queue_name(PRIMARY, 0)]] == [1, 4, 7, 10, 13, 16]

    audit = delta.read_table(spark, config.storage.audit_table)
    rows = {row["message_id"]: row for row in audit.where(f"run_id = '{first.run_id}'").collect()}
    assert len(rows) == 21
    assert {(rows[i]["destination"], rows[i]["original_destination"], rows[i]["outcome"]) for i in old_ids} == {
        ("orders", "orders-v1", "delivered"), ("orders", "ORDERS-V1", "delivered")}
    assert {(rows[i]["destination"], rows[i]["original_destination"], rows[i]["outcome"]) for i in new_ids} == {
        ("orders", None, "delivered")}
    assert {(rows[i]["outcome"], rows[i]["reason_code"]) for i in pay_ids} == {
        (Outcome.HELD, ReasonCode.DESTINATION_SKIPPED)}

    # Run 2, the destination open again (no skip): it reads what run 1 left below its offsets and delivers
    # exactly that, once; nothing delivered before is sent again, and the backlog is empty.
    reopened = make_config(emulator, tmp_path, **{"restore.destination_map": "{Orders-V1: orders}"})
    second = run_syphon(spark, reopened)
    assert second.drained and sum(second.remaining.values()) == 0, second.lines()
    assert second.per_destination == {"payments": {**dict.fromkeys(second.per_destination["payments"], 0),
                                                   Outcome.DELIVERED: 7}}
    received = drain_destinations(emulator.connection_string(PRIMARY), ["orders", "payments"])
    assert sorted(m.message_id for m in received["payments"]) == sorted(pay_ids)
    assert [m.message_id for m in received["payments"] if m.message_id.startswith("pay-") and m.message_id != "pay-q1"
            ] == [f"pay-{i}" for i in range(6)]  # in backlog order
    assert received["orders"] == []
    final = delta.read_table(spark, config.storage.audit_table).where(f"outcome = '{Outcome.DELIVERED}'")
    assert final.count() == 21 and final.select("message_id").distinct().count() == 21
    assert final.where(f"run_id = '{second.run_id}'").where("destination = 'payments'").count() == 7
