"""Peeks that come back short or empty are never the end of a queue (design invariants 1 and 11), against the
emulator over real AMQP with the unmodified SDK: the planner's probes and its available-now target, the
window reader, the purge's verification and its closing look, the run's closing counts and the status's
counts, and a peek that times out. The emulator's injected peek faults stand in for what a real namespace
does at will: a page cut to its first message (``short``), or no message at all (``empty``, status 204).

Each test asserts that nothing is skipped, ended early or left unsettled, and that the fault it injected
fired (the emulator counts ``fault_peek`` per entity).
"""

from __future__ import annotations

import collections

import pytest

from backlog_syphon.restore.queue_names import backlog_queue_name
from tools.backlog_writer import OriginalMessage, send_legacy_backlog
from tools.testing import drain_destinations

from .helpers import free_port
from .conftest import PRIMARY, ROOT, SECONDARY, make_config

DESTINATIONS = ("payments", "small")  # no duplicate detection: every arrival counts


def _queue(index: int) -> str:
    return backlog_queue_name(PRIMARY, index)


def _originals(tag: str, count: int) -> list[OriginalMessage]:
    return [OriginalMessage(DESTINATIONS[n % 2], f"{tag} {n}".encode(), message_id=f"{tag}-{n:04d}")
            for n in range(count)]


def _fired(emulator, entity: str) -> int:
    return emulator.stats(SECONDARY)[entity]["ops"].get("fault_peek", 0)


def _left(emulator, queues) -> dict[str, int]:
    stats = emulator.stats(SECONDARY)
    return {queue: stats[queue]["total"] for queue in queues}


# --- the planner and the reader, in one run --------------------------------------------------------

@pytest.mark.timeout(600)
def test_one_run_drains_every_queue_whatever_its_probes_and_pages_answer(spark, emulator, tmp_path):
    """Queue 0: the available-now target's tail search is told "nothing" 64 past the first message (without a
    second look the target would stop at 65 and the run end early). Queue 1: every page the reader asks for
    is cut to its first message, and one comes back empty mid-window. Queue 2: untouched, for comparison."""
    from backlog_syphon.run.runs import summary_end
    from backlog_syphon.run.syphon import run_syphon

    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 3, "run.max_messages_per_trigger": 900})
    per_queue = {_queue(index): _originals(f"plan{index}", 300) for index in range(3)}
    send_legacy_backlog(config.secondary, per_queue)
    # single-message probes too (min_message_count=1); from 2 on, so the pre-flight's peek at 1 passes
    emulator.inject_peek_fault(SECONDARY, _queue(0), mode="empty", count=1, min_message_count=1, min_from_sequence=2)
    emulator.inject_peek_fault(SECONDARY, _queue(1), mode="short", count=40, min_message_count=2)
    emulator.inject_peek_fault(SECONDARY, _queue(1), mode="empty", count=1, min_message_count=2,
                               min_from_sequence=150)

    summary = run_syphon(spark, config)
    end = summary_end(summary, config.run.trigger)
    print(f"\n[planner and reader] exit code {end.exit_code}, faults fired "
          f"{ {queue.rsplit('/', 1)[-1]: _fired(emulator, queue) for queue in per_queue} }")
    assert (end.exit_code, summary.drained) == (0, True), end.line
    assert emulator.faults_pending(SECONDARY, "peek") == 0
    assert (_fired(emulator, _queue(0)), _fired(emulator, _queue(1)), _fired(emulator, _queue(2))) == (1, 41, 0)
    arrived = drain_destinations(emulator.connection_string(PRIMARY), DESTINATIONS)
    counts = collections.Counter((destination, m.message_id) for destination, ms in arrived.items() for m in ms)
    assert counts == {(m.destination, m.message_id): 1 for ms in per_queue.values() for m in ms}
    assert _left(emulator, per_queue) == dict.fromkeys(per_queue, 0)


@pytest.mark.timeout(120)
def test_the_planner_looks_again_where_an_empty_probe_would_end_an_available_now_run(emulator, tmp_path):
    """The planner alone, on the real probes: queue 0 answers its target's first probe (at its offset) with
    nothing although it holds 500 messages; the plan's head probe is the second look and finds them."""
    from backlog_syphon.servicebus.peek import probe_at_once
    from backlog_syphon.source.window_planner import WindowPlanner

    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 2})
    send_legacy_backlog(config.secondary, {_queue(0): _originals("target", 500)})
    emulator.inject_peek_fault(SECONDARY, _queue(0), mode="empty", count=1, min_message_count=1, min_from_sequence=0)

    planner = WindowPlanner(lambda asks: probe_at_once(config.secondary, asks), max_messages=200,
                            available_now=True, idle_probe_max_seconds=900)
    planner.prepare_available_now()
    queues = [_queue(0), _queue(1)]
    first = planner.latest_offset(None, queues, 200, now=0.0)
    assert _fired(emulator, _queue(0)) == 1
    assert planner.target == {_queue(0): 501, _queue(1): 0}
    assert {queue: offset.next for queue, offset in first.items()} == {_queue(0): 201, _queue(1): 0}
    print(f"\n[target] {planner.last_count.probes} probes in {planner.last_count.rounds} rounds")


# --- the purge: its verification, its closing look ---------------------------------------------------

def _span_of(config, queue: str, first: int, last: int):
    """The recorded span of messages ``first..last`` of ``queue``, from what a peek says of them."""
    from backlog_syphon.model import RecordedSpan
    from backlog_syphon.servicebus.clients import pooled_receiver
    from backlog_syphon.servicebus.peek import peek_identities

    with pooled_receiver(config.secondary, queue) as receiver:
        identities = peek_identities(receiver, first, last)
    return RecordedSpan(queue, first, last, identities[0][1], identities[-1][1], len(identities))


@pytest.mark.timeout(120)
def test_the_purges_verification_reads_on_past_short_and_empty_pages_and_settles_everything(emulator, tmp_path):
    """A plan to verify (after a restart: some may be gone): its peeks come back short, then one empty; the
    purge still counts all 300, receives them and completes them all."""
    from backlog_syphon.purge.plan import PurgePlan
    from backlog_syphon.servicebus.purge import purge_backlog

    config = make_config(emulator, tmp_path)
    queue = _queue(0)
    send_legacy_backlog(config.secondary, {queue: _originals("verify", 300)})
    span = _span_of(config, queue, 1, 300)
    emulator.inject_peek_fault(SECONDARY, queue, mode="short", count=3, min_message_count=2)
    emulator.inject_peek_fault(SECONDARY, queue, mode="empty", count=1, min_message_count=2, min_from_sequence=4)

    result = purge_backlog(config.secondary, PurgePlan(queue, (span,), 300, verify=True))
    assert _fired(emulator, queue) == 4 and emulator.faults_pending(SECONDARY, "peek") == 0
    assert (result.completed, result.released, result.remaining, result.settled) == (300, 0, (), (span,))
    assert _left(emulator, [queue]) == {queue: 0}


@pytest.mark.timeout(120)
def test_the_purges_closing_look_at_a_span_left_unsettled_is_taken_twice(emulator, tmp_path):
    """Spans 1..5 and 7..9, and 6 not recorded between them: the purge settles 1..5, meets 6 (released, the
    purge stops there) and leaves 9. The closing look at the second span comes back empty once; without a
    second look the span would count as settled and the purge mark would pass message 9."""
    from backlog_syphon.purge.plan import PurgePlan
    from backlog_syphon.servicebus.purge import purge_backlog

    config = make_config(emulator, tmp_path)
    queue = _queue(0)
    send_legacy_backlog(config.secondary, {queue: _originals("closing", 9)})
    first, second = _span_of(config, queue, 1, 5), _span_of(config, queue, 7, 9)
    emulator.inject_peek_fault(SECONDARY, queue, mode="empty", count=1, min_message_count=1, min_from_sequence=7)

    result = purge_backlog(config.secondary, PurgePlan(queue, (first, second), 8))
    assert _fired(emulator, queue) == 1
    assert (result.completed, result.released, result.settled) == (7, 1, (first,))
    [left] = result.remaining
    assert (left.first, left.last) == (9, 9)  # message 9 is still there, and the plan knows it
    assert _left(emulator, [queue]) == {queue: 2}  # 6 (never recorded) and 9


# --- counting: the run's closing counts, the status ------------------------------------------------

@pytest.mark.timeout(120)
def test_closing_and_status_counts_read_on_past_short_pages_and_look_twice_at_an_empty_one(emulator, tmp_path):
    """Queue 0 holds 40 messages and answers its count's pages short, then once empty; queue 1 holds 3 and
    answers its first peek empty: neither count says fewer than there are (a status of "drained" for a
    queue that is not would be the worst of answers)."""
    from backlog_syphon.servicebus.counts import count_backlog
    from backlog_syphon.servicebus.peek import peek_counts

    # Peeks count only where the administration API does not answer (here nothing listens where it is said to be).
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 2,
                                                "secondary.administration_endpoint": f"127.0.0.1:{free_port()}"})
    queues = [_queue(0), _queue(1)]
    send_legacy_backlog(config.secondary, {queues[0]: _originals("count", 40), queues[1]: _originals("few", 3)})

    def inject():
        emulator.inject_peek_fault(SECONDARY, queues[0], mode="short", count=5, min_message_count=2)
        emulator.inject_peek_fault(SECONDARY, queues[0], mode="empty", count=1, min_message_count=2)
        emulator.inject_peek_fault(SECONDARY, queues[1], mode="empty", count=1, min_message_count=1)

    inject()
    assert peek_counts(config.secondary, queues) == {queues[0]: 40, queues[1]: 3}
    assert emulator.faults_pending(SECONDARY, "peek") == 0
    inject()
    backlog, dead_letters, _ = count_backlog(config.secondary, PRIMARY, queues)
    assert emulator.faults_pending(SECONDARY, "peek") == 0
    assert {queue: (count.messages, count.exact) for queue, count in backlog.items()} == {
        queues[0]: (40, True), queues[1]: (3, True)}
    assert {count.messages for count in dead_letters.values()} == {0}
    assert (_fired(emulator, queues[0]), _fired(emulator, queues[1])) == (12, 2)


# --- a peek that times out --------------------------------------------------------------------------

@pytest.fixture
def slow_secondary():
    """The emulator with every frame of the secondary namespace 300 ms late."""
    from servicebus_emulator import Emulator, load_config

    with Emulator(load_config(ROOT / "conf/emulator.yaml"), ports={PRIMARY: 0, SECONDARY: 0},
                  latency_ms={SECONDARY: 300}) as emu:
        yield emu


@pytest.mark.timeout(120)
def test_a_peek_that_times_out_is_asked_again_and_one_that_never_answers_says_so(slow_secondary, tmp_path):
    from backlog_syphon.errors import PeekTimedOutError
    from backlog_syphon.restore.amqp.sections import broker_identity
    from backlog_syphon.servicebus.clients import pooled_receiver
    from backlog_syphon.servicebus.peek import PeekTimeouts, peek_raw

    config = make_config(slow_secondary, tmp_path)
    queue = _queue(0)
    send_legacy_backlog(config.secondary, {queue: _originals("slow", 20)})
    with pooled_receiver(config.secondary, queue) as receiver:
        peek_raw(receiver, 1, 1)  # the link is open: what follows times only the peeks
        before = slow_secondary.stats(SECONDARY)[queue]["ops"]["peek"]
        # 0.1 s cannot hold a 300 ms round trip, 1.6 s can: the first attempt times out, a later one answers
        page = peek_raw(receiver, 1, 20, timeouts=PeekTimeouts(first_seconds=0.1, attempts=3, factor=4))
        assert [broker_identity(raw)[0] for raw in page] == list(range(1, 21))
        asked = slow_secondary.stats(SECONDARY)[queue]["ops"]["peek"] - before
        assert 2 <= asked <= 3, asked
        with pytest.raises(PeekTimedOutError, match=f"queue {queue}: a peek from sequence number 5 got no answer "
                                                    f"in 2 attempts \\(0.05 s, 0.05 s\\)"):
            peek_raw(receiver, 5, 1, timeouts=PeekTimeouts(first_seconds=0.05, attempts=2, factor=1))
        # the late answers to the abandoned attempts are not taken for the next peek's
        assert [broker_identity(raw)[0] for raw in peek_raw(receiver, 11, 3)] == [11, 12, 13]
