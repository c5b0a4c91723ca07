"""A purge round that misses recorded messages locked by an earlier receiver (a killed run's) waits for their
locks to end, within one lock duration and a round trip, instead of ending at the first empty receive; and
it still ends at once where nothing recorded is left, or where what is left lies behind an unrecorded message
(``purge.lock_wait``, ``purge.progress``)."""

import dataclasses

import pytest

from backlog_syphon.model import RecordedSpan
from backlog_syphon.partitions import PARTITION_SHIFT
from backlog_syphon.purge.lock_wait import MAX_LOCK_SECONDS, MIN_POLL_SECONDS, LockWait
from backlog_syphon.purge.plan import PurgePlan
from backlog_syphon.purge.progress import PurgeProgress
from backlog_syphon.purge.settle_timing import SettleTiming

T0 = 1_700_000_000_000
NOW = 1_000.0


def msg(seq):
    return seq, T0 + seq


def plan(first=1, last=10, *, lock=None, partitioned=False):
    spans = (RecordedSpan("q", first, last, T0 + first, T0 + last, last - first + 1),)
    return PurgePlan("q", spans, last - first + 1, lock_seconds=lock, partitioned=partitioned)


def settle(progress, actions):
    progress.on_settled(len(actions.complete), [seq for seq, _, _ in actions.dead_letter])


def test_the_wait_lasts_one_lock_and_a_round_trip_from_the_first_miss():
    wait = LockWait.start(NOW, 3, queue_lock=60.0, seen_lock=5.0, round_trip=0.2)  # the queue's lock wins
    assert (wait.locked, wait.lock_seconds, wait.lock_known, wait.bound_seconds) == (3, 60.0, True, 60.2)
    assert wait.until == NOW + 60.2 and wait.receive_wait(NOW + 10) == pytest.approx(50.2)
    assert not wait.over(NOW + 60.1) and wait.over(NOW + 60.2) and wait.receive_wait(NOW + 70) == 0
    seen = LockWait.start(NOW, 1, queue_lock=None, seen_lock=5.0, round_trip=None)
    assert (seen.lock_seconds, seen.lock_known, seen.bound_seconds) == (5.0, True, 5.0)
    unknown = LockWait.start(NOW, 1, queue_lock=None, seen_lock=None, round_trip=0.1)
    assert (unknown.lock_seconds, unknown.lock_known, unknown.bound_seconds) == (MAX_LOCK_SECONDS, False, 300.1)
    # between receives that bring only other messages: a tenth of the lock, at least half a second, never past the end
    assert wait.pause(NOW) == 6.0 and seen.pause(NOW) == MIN_POLL_SECONDS
    assert wait.pause(NOW + 60.0) == pytest.approx(0.2)


def test_recorded_messages_locked_elsewhere_are_waited_for_and_settled_when_their_locks_end():
    progress = PurgeProgress(plan(lock=5.0), timing=SettleTiming())
    assert progress.credit() == 10
    missed = progress.on_page([])  # a killed run's purge holds every one of them
    assert missed.stop and missed.look and progress.wants_look and progress.credit() == 0
    progress.on_look([msg(seq) for seq in range(1, 11)], NOW)  # the peeks still see them all
    wait = progress.lock_wait
    assert (wait.locked, wait.lock_seconds, wait.until) == (10, 5.0, NOW + 5.0)
    assert not progress.stopped and progress.credit() == 10
    assert progress.receive_wait(NOW + 1, 5.0) == 5.0 and progress.receive_wait(NOW + 0.5, 1.0) == 4.5
    assert progress.pause_before_receive(NOW + 1) == 0  # nothing came: a receive waits by itself
    page = progress.on_page([msg(seq) for seq in range(1, 11)])  # their locks ended
    settle(progress, page)
    assert page.complete == tuple(range(1, 11)) and progress.stopped and not progress.wants_look


def test_a_wait_ends_the_round_once_its_bound_has_passed():
    progress = PurgeProgress(plan(lock=5.0))
    progress.on_page([])
    progress.on_look([msg(4), msg(5)], NOW)
    settle(progress, progress.on_page([]))
    progress.on_look([msg(4), msg(5)], NOW + 2)  # within the lock: receive on
    assert not progress.stopped
    progress.on_page([])
    progress.on_look([msg(4), msg(5)], NOW + 5.0)  # someone alive holds them: a later round tries again
    assert progress.stopped and not progress.wants_look and progress.credit() == 0
    assert progress.expected == 2  # what is still there, for the credit of any later receive


def test_nothing_recorded_left_ends_the_round_without_waiting():
    progress = PurgeProgress(plan())
    progress.on_page([])
    progress.on_look([msg(40)], NOW)  # only later, unrecorded messages are there: the recorded ones are gone
    assert progress.stopped and progress.lock_wait is None


def test_recorded_messages_behind_an_unrecorded_one_end_the_round_as_always():
    """An unrecorded message (left unsent, say) at the head of a plain queue stops the purge there: the recorded
    ones after it are not locked, they lie behind it; waiting would only receive and release it again."""
    progress = PurgeProgress(plan(1, 10))
    page = progress.on_page([msg(1), msg(2), (3, None)])  # 3 is another message (its enqueue time): not recorded
    assert page.release == (3,) and page.look
    settle(progress, page)
    progress.on_look([(3, None)] + [msg(seq) for seq in range(4, 11)], NOW)
    assert progress.stopped and progress.lock_wait is None


def test_recorded_messages_the_receives_skip_for_later_ones_are_waited_for_with_pauses_between_receives():
    """Locked recorded messages at the head, later unrecorded ones available: each receive brings the later
    ones (released at once, and available again), so the round pauses a tenth of the lock between receives."""
    progress = PurgeProgress(plan(1, 3, lock=20.0))
    page = progress.on_page([msg(11), msg(12), msg(13)])
    assert page.release == (11, 12, 13) and page.look
    settle(progress, page)
    progress.on_look([msg(1), msg(2), msg(3), msg(11), msg(12), msg(13)], NOW)
    assert progress.lock_wait.locked == 3 and progress.credit() == 3
    assert progress.pause_before_receive(NOW) == 2.0
    settle(progress, progress.on_page([msg(1), msg(2), msg(3)]))  # their locks ended
    assert progress.stopped and progress.completed == 3 and progress.pause_before_receive(NOW + 3) == 0


def test_on_a_partitioned_queue_only_a_partitions_skipped_recorded_messages_are_waited_for():
    def seq(partition, n):
        return partition << PARTITION_SHIFT | n

    spans = tuple(RecordedSpan("q", seq(p, 1), seq(p, 2), T0, T0 + 1, 2) for p in (0, 1))
    progress = PurgeProgress(PurgePlan("q", spans, 4, partitioned=True, lock_seconds=5.0))
    present = [(seq(0, 1), T0), (seq(0, 2), T0 + 1), (seq(1, 1), T0), (seq(1, 2), T0 + 1)]
    # partition 0's recorded messages lie behind an unrecorded one of partition 0 (number 0 is below them):
    for _ in range(4):
        settle(progress, progress.on_page([(seq(0, 0), None)]))
    assert progress.wants_look
    progress.on_look([(seq(0, 0), None), *present], NOW)
    assert progress.lock_wait is not None and progress.lock_wait.locked == 2  # partition 1's: skipped, locked


def test_a_verified_plan_counts_only_what_is_there_and_a_look_recounts_it():
    progress = PurgeProgress(dataclasses.replace(plan(lock=5.0), expected=3))
    assert progress.credit() == 3
    settle(progress, progress.on_page([msg(1)]))
    assert progress.on_page([]).look
    progress.on_look([msg(5), msg(6)], NOW)
    assert (progress.expected, progress.credit()) == (3, 2)
