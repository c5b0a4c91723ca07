"""The purge within the shortest lock the service accepts (design invariants 1 and 8), end to end: the
emulator over real AMQP, the unmodified SDK, Spark and Delta.

Backlog queues with a 5-second lock (Service Bus's minimum), the secondary namespace 300 ms away (the
emulator delays every frame it sends), a tenth of the messages poison (no ``x-ms-path``). With fixed
margins (settle nothing within 5 s of the first lock's end) such a backlog never drained: every run ended
with exit code 4, nothing purged. Now one available-now run drains it whole: every message delivered or
dead-lettered once, each page settled inside its first lock (no message received twice, none abandoned),
the dead-lettering in one request per reason.

300 messages over three queues (the same one-in-ten poison as the 450 of the report, fewer to keep the test
near half a minute): each queue's purge is a page of 100 messages, exactly the shape that failed, one bulk
completion and one bulk dead-lettering inside a 5-second lock at 300 ms.
"""

from __future__ import annotations

import collections
import time

import pytest

from backlog_syphon.errors import EXIT_OK
from backlog_syphon.model import Outcome, ReasonCode
from backlog_syphon.restore.queue_names import backlog_queue_name
from tools.backlog_writer import OriginalMessage, send_legacy_backlog
from tools.testing import drain_destinations, read_queues

from .conftest import PRIMARY, ROOT, SECONDARY, make_config

LOCK_SECONDS = 5  # the shortest lock Service Bus accepts
ONE_WAY_MS = 300
QUEUES = 3
PER_QUEUE = 100
POISON_EVERY = 10
NO_PATH_REASON = "x-ms-path is missing, so the destination is unknown"


@pytest.fixture
def distant_emulator():
    """Both namespaces, the secondary's answers 300 ms late, its backlog queues locking for 5 seconds."""
    from servicebus_emulator import Emulator, load_config

    with Emulator(load_config(ROOT / "conf/emulator.yaml"), ports={PRIMARY: 0, SECONDARY: 0},
                  latency_ms={SECONDARY: ONE_WAY_MS}) as emu:
        for index in range(QUEUES):
            emu.recreate_queue(SECONDARY, backlog_queue_name(PRIMARY, index), lock_duration_seconds=LOCK_SECONDS)
        yield emu


def _backlog() -> dict[str, list[OriginalMessage]]:
    backlog = {}
    for index in range(QUEUES):
        backlog[backlog_queue_name(PRIMARY, index)] = [
            OriginalMessage(None if n % POISON_EVERY == 0 else ("orders", "payments")[n % 2],
                            f"q{index} body {n}".encode(), message_id=f"lock-{index}-{n:03d}")
            for n in range(PER_QUEUE)]
    return backlog


@pytest.mark.timeout(300)
def test_a_five_second_lock_300_ms_away_drains_poison_and_all_in_one_run(spark, distant_emulator, tmp_path):
    from backlog_syphon.run.runs import summary_end
    from backlog_syphon.run.syphon import run_syphon
    from backlog_syphon.storage import delta

    emulator = distant_emulator
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": QUEUES})
    backlog = _backlog()
    send_legacy_backlog(config.secondary, backlog)
    originals = [message for messages in backlog.values() for message in messages]
    poison = {m.message_id for m in originals if m.destination is None}
    assert (len(originals), len(poison)) == (QUEUES * PER_QUEUE, QUEUES * PER_QUEUE // POISON_EVERY)

    started = time.monotonic()
    summary = run_syphon(spark, config)
    seconds = time.monotonic() - started
    end = summary_end(summary, config.run.trigger)
    stats = emulator.stats(SECONDARY)
    backlog_stats = {queue: stats[queue] for queue in backlog}
    print(f"\n[5 s lock, {ONE_WAY_MS} ms] one run in {seconds:.1f} s: exit code {end.exit_code}; per queue "
          f"{ {q.rsplit('/', 1)[-1]: dict(s['ops']) for q, s in backlog_stats.items()} }")
    assert end.exit_code == EXIT_OK, end.line

    # Delivered once each, at their destinations.
    arrived = drain_destinations(emulator.connection_string(PRIMARY), ["orders", "payments"])
    counts = collections.Counter((destination, m.message_id) for destination, ms in arrived.items() for m in ms)
    assert counts == {(m.destination, m.message_id): 1 for m in originals if m.destination is not None}

    # The backlog queues are empty, their dead-letter sub-queues hold exactly the poison, with its reason.
    assert {queue: entry["total"] for queue, entry in backlog_stats.items()} == dict.fromkeys(backlog, 0)
    dead = read_queues(config.secondary, backlog, lambda receiver: receiver.peek_messages(
        max_message_count=100, sequence_number=1), dead_letters=True)
    dead_letters = [m for messages in dead.values() for m in messages]
    assert sorted(m.message_id for m in dead_letters) == sorted(poison)
    assert {(m.dead_letter_reason, m.dead_letter_error_description) for m in dead_letters} == {
        (ReasonCode.MISSING_PATH.value, NO_PATH_REASON)}
    for queue, entry in backlog_stats.items():
        ops = entry["ops"]
        # Each settled inside its first lock: delivered to the purge once (a lock that ran out, or a message
        # released for want of time, would be delivered again), none abandoned.
        assert (ops.get("receive"), ops.get("abandon", 0)) == (PER_QUEUE, 0), (queue, ops)
        assert (ops.get("complete"), ops.get("dead_letter")) == (PER_QUEUE - PER_QUEUE // POISON_EVERY,
                                                               PER_QUEUE // POISON_EVERY), (queue, ops)
        # One page: one bulk completion and one bulk dead-lettering (one reason), not a request per message.
        assert ops.get("update_disposition") == 2, (queue, ops)

    rows = delta.read_table(spark, config.storage.audit_table).collect()
    final = collections.Counter(row["message_id"] for row in rows)
    assert final == dict.fromkeys((m.message_id for m in originals), 1)
    outcomes = {row["message_id"]: (row["outcome"], row["reason_code"], row["reason"]) for row in rows}
    assert {outcomes[message_id] for message_id in poison} == {
        (Outcome.DEAD_LETTERED.value, ReasonCode.MISSING_PATH.value, NO_PATH_REASON)}
