"""The purge of a partitioned backlog queue: receives interleave partitions and come back empty while
messages exist, so neither ends the round; only recorded messages are settled, anything else is released."""

from __future__ import annotations

from backlog_syphon.model import RecordedSpan
from backlog_syphon.partitions import LANES, absolute
from backlog_syphon.purge.plan import PARTITIONED_IDLE_RECEIVES, PurgePlan
from backlog_syphon.purge.progress import PurgeProgress
from backlog_syphon.sink.queue_marks import renumbered
from backlog_syphon.model import CheckpointRow

Q = "ns/x-servicebus-transfer/0"


def ms(seq: int) -> int:
    return 1_000 + (seq >> 48) * 100 + (seq & 0xFFFF)


def span(partition: int, first: int, last: int) -> RecordedSpan:
    a, b = absolute(partition, first), absolute(partition, last)
    return RecordedSpan(Q, a, b, ms(a), ms(b), last - first + 1)


def identities(partition: int, *locals_) -> list[tuple[int, int]]:
    return [(absolute(partition, n), ms(absolute(partition, n))) for n in locals_]


def plan(*spans: RecordedSpan) -> PurgePlan:
    return PurgePlan(Q, spans, sum(s.count for s in spans))


def test_a_partitioned_plan_is_known_from_its_numbers():
    assert plan(span(3, 1, 4)).interleaved
    assert not PurgePlan(Q, (RecordedSpan(Q, 1, 4, ms(1), ms(4), 4),), 4).interleaved
    assert PurgePlan(Q, (RecordedSpan(Q, 1, 4, ms(1), ms(4), 4),), 4, partitioned=True).interleaved


def test_empty_and_unrecorded_receives_do_not_end_the_round_and_every_recorded_message_is_settled():
    progress = PurgeProgress(plan(span(0, 1, 3), span(5, 1, 2)))
    settled = []
    pages = [identities(5, 1), [], identities(9, 1) + identities(0, 1), [], identities(0, 2, 3) + identities(5, 2)]
    for page in pages:
        assert progress.credit() > 0
        actions = progress.on_page(page)
        assert set(actions.release) <= {absolute(9, 1)}  # another partition's unrecorded message: released
        settled += actions.complete
        progress.on_settled(len(actions.complete))
    assert sorted(settled) == sorted(seq for seq, _ in identities(0, 1, 2, 3) + identities(5, 1, 2))
    assert progress.stopped and progress.released == 1 and progress.credit() == 0


def test_the_round_ends_after_a_bound_of_receives_that_bring_nothing_recorded():
    progress = PurgeProgress(plan(span(2, 1, 5)))
    progress.on_settled(len(progress.on_page(identities(2, 1)).complete))
    for index in range(PARTITIONED_IDLE_RECEIVES):
        assert not progress.stopped
        actions = progress.on_page([] if index % 2 else identities(7, 1))
        assert not actions.complete and not actions.dead_letter
    assert progress.stopped and progress.completed == 1


def test_credit_is_the_recorded_messages_left_but_at_least_one_per_partition():
    progress = PurgeProgress(plan(*(span(p, 1, 3) for p in range(8))))
    assert progress.credit() == 24
    progress.on_settled(len(progress.on_page([i for p in range(7) for i in identities(p, 1, 2, 3)]).complete))
    assert progress.credit() == LANES  # 3 recorded left, but a receive takes each partition's next in turn
    assert PurgeProgress(plan(*(span(p, 1, 3) for p in range(8))), page=10).credit() == 10  # a page still bounds it


def test_a_recorded_message_behind_the_released_heads_of_every_other_partition_is_reached():
    """Receives take each partition's next message in turn, and what the purge releases is at its partition's head
    again. Every partition but 13 holds only unrecorded messages: a receive asking for the recorded messages left
    (one) would bring partitions 0, 1, 2, 3 in turn, release each, and end the round on the idle bound."""
    progress = PurgeProgress(plan(span(13, 1, 1)))
    heads = {p: identities(p, 1)[0] for p in range(LANES)}  # partition 13's is the recorded one
    turn = 0
    while credit := progress.credit():
        page = [heads[(turn + k) % LANES] for k in range(min(credit, LANES))]
        turn += len(page)
        progress.on_settled(len(progress.on_page(page).complete))
    assert progress.completed == 1 and progress.released == LANES - 1


def test_a_partitioned_plan_is_verified_partition_by_partition():
    assert plan(span(9, 4, 6), span(0, 1, 3), span(9, 7, 8), span(0, 4, 5)).ranges == (
        (absolute(0, 1), absolute(0, 5)), (absolute(9, 4), absolute(9, 8)))


def test_a_plain_queue_still_stops_at_the_first_empty_or_unrecorded_receive():
    plain = PurgePlan(Q, (RecordedSpan(Q, 1, 4, ms(1), ms(4), 4),), 4)
    assert PurgeProgress(plain).on_page([]).stop
    assert PurgeProgress(plain).on_page([(9, ms(9))]).stop


def test_a_lower_partitions_newer_messages_are_no_recreation_of_the_checkpoint():
    row = CheckpointRow(Q, 1, absolute(6, 40), ms(absolute(6, 40)), 0, None, 1, "r", None, 0, 0, 0)
    assert not renumbered(row, [span(0, 1, 3)])  # partition 0's numbers lie below partition 6's
    assert renumbered(row, [RecordedSpan(Q, absolute(6, 1), absolute(6, 2), 10**9, 10**9, 2)])


def test_a_redrives_partitioned_dead_letter_queue_passes_over_what_stays_and_goes_on_past_empty_receives():
    dlq = Q + "/$DeadLetterQueue"
    a, b = absolute(3, 1), absolute(3, 2)
    recorded = RecordedSpan(dlq, a, b, ms(a), ms(b), 2)
    progress = PurgeProgress(PurgePlan(dlq, (recorded,), 2, passing=True))
    first = progress.on_page(identities(8, 5))  # not selected, in a higher partition: it stays, passed over
    assert first.pass_over == (absolute(8, 5),) and not first.stop
    assert not progress.on_page([]).stop  # receives interleave partitions: an empty one is not the end
    done = progress.on_page(identities(3, 1, 2))
    progress.on_settled(len(done.complete))
    assert done.complete == (a, b) and progress.stopped
