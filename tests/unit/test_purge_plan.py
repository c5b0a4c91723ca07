"""The purge of one backlog queue as a state machine: what to ask for, settle by identity, give back."""

import dataclasses

import pytest

from backlog_syphon.model import HeldSpan, RecordedSpan
from backlog_syphon.purge.bulk_settlement import BulkSettlement
from backlog_syphon.purge.plan import PurgePlan, PurgeResult, span_after_peek
from backlog_syphon.purge.progress import PageActions, PurgeProgress, dead_letter_groups
from backlog_syphon.purge.settle_timing import SettleTiming

T0 = 1_700_000_000_000  # enqueue times in ms: message n of the first incarnation entered at T0 + n


def msg(seq, enqueued_ms=None):
    """A message's identity: (sequence number, enqueue time in ms)."""
    return seq, T0 + seq if enqueued_ms is None else enqueued_ms


def span(first, last, *, queue="q", enqueued_from=None, enqueued_to=None, count=None):
    return RecordedSpan(queue, first, last, T0 + first if enqueued_from is None else enqueued_from,
                        T0 + last if enqueued_to is None else enqueued_to,
                        last - first + 1 if count is None else count)


def plan_of(*spans, expected=None, dead_letters=None, verify=False):
    return PurgePlan("q", tuple(spans), sum(s.count for s in spans) if expected is None else expected,
                     dead_letters or {}, verify)


def run_purge(plan, queue, *, page=100, settle_fails=()):
    """Drive PurgeProgress against a fake queue: each receive hands over the next ``credit`` messages.

    ``queue`` is what the broker would deliver (identities, in order). What is completed or
    dead-lettered leaves it; what is released or fails to settle stays. Returns (result, requests,
    actions, what is left in the queue).
    """
    progress = PurgeProgress(plan, page=page)
    remaining = list(queue)
    requests, actions, locked = [], [], []
    looks = 0
    while (credit := progress.credit()) or progress.wants_look:
        if not credit:  # a receive missed recorded messages: count those still there (none: the round ends);
            # the fake's clock moves on by more than any lock between looks, so a second miss ends a wait
            progress.on_look(remaining, 1000.0 * looks)
            looks += 1
            continue
        requests.append(credit)
        received, remaining = remaining[:credit], remaining[credit:]
        step = progress.on_page(received)
        actions.append(step)
        failed = [seq for seq in step.complete if seq in settle_fails]
        settled = (set(step.complete) - set(failed)) | {seq for seq, _, _ in step.dead_letter}
        progress.on_settled(len(step.complete) - len(failed), [seq for seq, _, _ in step.dead_letter])
        locked += [identity for identity in received if identity[0] in step.pass_over]  # released at the end
        remaining = sorted([identity for identity in received
                            if identity[0] not in settled and identity[0] not in step.pass_over] + remaining)
    remaining = sorted(remaining + locked)
    heads = {s.first: next((identity for identity in remaining if identity[0] >= s.first), None)
             for s in plan.spans}
    return progress.result(heads), requests, actions, remaining


def test_completes_and_dead_letters_exactly_the_plan_asking_for_no_more_than_planned():
    recorded = span(1, 250)
    plan = plan_of(recorded, dead_letters={msg(7): ("missing_path", "no x-ms-path")})
    result, requests, actions, left = run_purge(plan, [msg(seq) for seq in range(1, 400)])
    assert requests == [100, 100, 50]  # never more than what is recorded: 251.. are not touched
    assert sum(len(a.complete) for a in actions) == 249
    assert [a.dead_letter for a in actions if a.dead_letter] == [((7, "missing_path", "no x-ms-path"),)]
    assert not any(a.release for a in actions)
    assert result == PurgeResult(completed=249, dead_lettered=1, released=0, remaining=(), settled=(recorded,))
    assert left == [msg(seq) for seq in range(251, 400)]


def test_a_message_outside_the_plan_is_released_and_stops_the_purge():
    # 5 is not received, so the broker fills the credit with 9, which is not recorded: the round looks whether 5
    # is still there (it is not, for the fake) before it ends.
    recorded = span(3, 8, count=6)
    result, requests, actions, _ = run_purge(plan_of(recorded), [msg(s) for s in (3, 4, 6, 7, 8, 9, 10)])
    assert requests == [6]
    assert actions == [PageActions(complete=(3, 4, 6, 7, 8), dead_letter=(), release=(9,), stop=True, look=True)]
    assert result.released == 1 and result.completed == 5
    assert result.settled == (recorded,)  # 5 is not there (for the fake): the first message from 3 on is 9


def test_a_message_whose_settlement_failed_leaves_the_span_from_it_on():
    recorded = span(1, 10)
    result, _, _, _ = run_purge(plan_of(recorded), [msg(seq) for seq in range(1, 11)], settle_fails={4})
    assert result.completed == 9
    assert result.remaining == (dataclasses.replace(recorded, first=4),) and result.settled == ()


def test_nothing_arriving_ends_the_purge_and_nothing_planned_asks_for_nothing():
    recorded = span(5, 9)
    result, requests, actions, _ = run_purge(plan_of(recorded), [])
    assert requests == [5] and actions[0].stop and result.settled == (recorded,)  # all gone already
    assert PurgeProgress(PurgePlan("q", (), 0)).credit() == 0
    assert PurgeProgress(plan_of(recorded, expected=0)).credit() == 0


def test_messages_below_the_plan_are_released_not_settled():
    _, _, actions, left = run_purge(plan_of(span(5, 6)), [msg(2), msg(5), msg(6)])
    assert actions[0] == PageActions(complete=(5,), dead_letter=(), release=(2,), stop=True, look=True)
    assert left == [msg(2), msg(6)]


def test_a_page_arriving_out_of_order_is_settled_in_sequence_order():
    progress = PurgeProgress(plan_of(span(1, 3)))
    assert progress.on_page([msg(3), msg(1), msg(2)]) == PageActions((1, 2, 3), (), (), True)


def test_a_recreated_queues_message_inside_the_span_numbers_is_released_never_completed():
    # The queue was deleted and created again: its new message 4 entered long after the recorded 1..10.
    recorded = span(1, 10)
    newcomer = msg(4, T0 + 1_000_000)
    result, requests, actions, left = run_purge(plan_of(recorded), [msg(1), msg(2), newcomer, msg(5)])
    assert requests == [10]
    assert actions == [PageActions(complete=(1, 2, 5), dead_letter=(), release=(4,), stop=True, look=True)]
    assert result.completed == 3 and result.released == 1
    assert newcomer in left
    assert result.settled == (recorded,)  # the first message from 1 on is not one of the span's


def test_only_the_recreated_queues_messages_come_and_none_is_touched():
    recorded = span(1, 3)
    result, _, actions, left = run_purge(plan_of(recorded), [msg(1, T0 + 9_000), msg(2, T0 + 9_001)])
    assert actions == [PageActions(complete=(), dead_letter=(), release=(1, 2), stop=True, look=True)]
    assert (result.completed, result.dead_lettered, result.released) == (0, 0, 2)
    assert left == [msg(1, T0 + 9_000), msg(2, T0 + 9_001)]


def test_dead_letters_are_carried_out_by_identity():
    recorded = span(1, 5)
    plan = plan_of(recorded, dead_letters={msg(2): ("missing_path", "no x-ms-path"),
                                           (4, T0 + 777): ("ping", "other incarnation")})
    _, _, actions, _ = run_purge(plan, [msg(seq) for seq in range(1, 6)])
    # 4 is recorded as delivered in this incarnation: the dead-letter order for another message 4 does not apply
    assert actions == [PageActions(complete=(1, 3, 4, 5), dead_letter=((2, "missing_path", "no x-ms-path"),),
                                   release=(), stop=True)]


def test_a_verified_plan_expects_only_the_present_messages_it_holds():
    plan = plan_of(span(1, 5), span(8, 9), verify=True)
    present = [msg(2), msg(3), msg(6), msg(9), (4, T0 + 50_000), (8, None)]
    verified = plan.verified(present)
    assert (verified.expected, verified.verify) == (3, False)  # 2, 3 and 9; not 6, nor the other 4, nor 8 unknown
    assert verified.spans == plan.spans
    assert plan.verified([]).expected == 0


def test_a_plan_spans_range_covers_its_spans():
    plan = plan_of(span(8, 9), span(3, 5))
    assert (plan.ranges, plan.last) == (((3, 9),), 9)
    assert plan.holds(msg(4)) and plan.holds(msg(9))
    assert not plan.holds(msg(6)) and not plan.holds((4, T0 + 50_000))


@pytest.mark.parametrize("head, left", [
    (None, None),  # nothing at or after its first: all settled
    (msg(11), None),  # the first message there lies past the span
    ((3, T0 + 50_000), None),  # another incarnation's message 3: the span went with the old queue
    ((3, None), None),  # no enqueue time: not one of its messages
    (msg(3), dataclasses.replace(span(1, 10), first=3)),  # still there from 3 on (its count now unknown)
    (msg(1), span(1, 10)),  # nothing settled
])
def test_span_after_peek(head, left):
    assert span_after_peek(span(1, 10), head) == left


def test_a_purge_reports_each_span_settled_or_left_from_what_is_still_there():
    first, second = span(1, 3), span(5, 6)
    progress = PurgeProgress(plan_of(first, second))
    progress.on_page([msg(1), msg(2), msg(3)])
    progress.on_settled(3)
    result = progress.result({1: msg(5), 5: msg(5)})
    assert result == PurgeResult(3, 0, 0, remaining=(second,), settled=(first,))


def test_a_round_a_throttled_receive_ended_reports_what_it_settled_whole_and_leaves_the_rest_as_planned():
    first, second = span(1, 3), span(5, 8)
    progress = PurgeProgress(plan_of(first, second))
    progress.on_page([msg(1), msg(2), msg(3), msg(5)])
    progress.on_settled(4, completed_numbers=(1, 2, 3, 5))  # then the next receive was refused: no look
    assert progress.throttled_result() == PurgeResult(4, 0, 0, remaining=(second,), settled=(first,), throttled=True)


@pytest.mark.parametrize("spans, expected", [
    ((span(1, 3),), -1),
    ((span(1, 3, queue="other"),), 3),
])
def test_invalid_plans_are_refused(spans, expected):
    with pytest.raises(ValueError, match="invalid purge plan for q"):
        PurgePlan("q", spans, expected)


def held_span(first, last, count):
    return HeldSpan("q", first, last, T0 + first, T0 + last, count)


def test_messages_held_for_skipped_destinations_are_passed_over_and_what_lies_behind_them_is_settled():
    """2, 3 and 6 are held (restore.skip_destinations): kept locked while 1, 4, 5 and 7 are completed behind
    them, never settled, and handed back (released by the I/O side at the end of the round)."""
    recorded = (span(1, 1), span(4, 5), span(7, 7))
    plan = dataclasses.replace(plan_of(*recorded), held=held_span(2, 6, 3))
    queue = [msg(seq) for seq in range(1, 9)]
    result, requests, actions, left = run_purge(plan, queue, page=3)
    assert [a.pass_over for a in actions if a.pass_over] == [(2, 3), (6,)]
    assert sorted(seq for a in actions for seq in a.complete) == [1, 4, 5, 7]
    assert not any(a.release for a in actions)  # nothing unexpected: the purge did not stop at 2
    assert requests[0] == 3 and sum(requests) <= 4 + 3 + 3  # the recorded ones, and at most the held ones more
    assert result.completed == 4 and result.released == 0 and set(result.settled) == set(recorded)
    assert [identity[0] for identity in left][:3] == [2, 3, 6]  # the held ones stay in the queue


def test_without_a_held_span_a_held_message_stops_the_purge_as_before():
    plan = plan_of(span(1, 1), span(3, 3))
    _, _, actions, _ = run_purge(plan, [msg(seq) for seq in range(1, 5)])
    assert actions[-1].release == (2,) and actions[-1].stop


def test_a_message_outside_the_held_range_still_stops_the_purge():
    plan = dataclasses.replace(plan_of(span(1, 1), span(5, 5)), held=held_span(2, 3, 2))
    _, _, actions, _ = run_purge(plan, [msg(seq) for seq in range(1, 7)])
    assert [a.pass_over for a in actions if a.pass_over] == [(2, 3)]
    assert [a.release for a in actions if a.release] == [(4,)] and actions[-1].stop


def test_locks_running_out_end_the_round():
    plan = dataclasses.replace(plan_of(span(1, 1), span(5, 5)), held=held_span(2, 4, 3))
    progress = PurgeProgress(plan, page=2)
    progress.on_page([msg(1), msg(2)])
    assert progress.credit() > 0
    progress.locks_running_out()
    assert progress.credit() == 0


def test_a_held_message_that_comes_back_ends_the_round_instead_of_going_round_again():
    plan = dataclasses.replace(plan_of(span(5, 5)), held=held_span(1, 2, 2))
    progress = PurgeProgress(plan, page=2)
    assert not progress.on_page([msg(1), msg(2)]).stop
    assert progress.on_page([msg(1)]).stop  # its lock was lost: it is at the head again


def test_one_pass_over_for_every_message_that_stays_held_or_left_in_a_dead_letter_queue():
    """Held messages (a backlog queue's HeldSpan) and what a re-drive leaves in a dead-letter sub-queue
    (passing mode) go down one path: passed over, counted as passed, never released early nor settled."""
    recorded = (span(2, 2), span(4, 4))
    held = dataclasses.replace(plan_of(*recorded), held=held_span(1, 3, 2))
    passing = dataclasses.replace(plan_of(*recorded), passing=True)
    for plan in (held, passing):
        progress = PurgeProgress(plan, page=4)
        actions = progress.on_page([msg(seq) for seq in (1, 2, 3, 4)])
        assert (actions.complete, actions.pass_over, actions.release, actions.stop) == ((2, 4), (1, 3), (), True)
        assert (progress.passed, progress.released) == (2, 0)
    # past the plan's last recorded message nothing is left to settle: the round ends at once
    progress = PurgeProgress(dataclasses.replace(plan_of(span(2, 2), span(9, 9)), held=held_span(1, 5, 2)), page=3)
    assert progress.on_page([msg(1), msg(2), msg(5)]).stop is False  # 9 is still ahead
    progress = PurgeProgress(dataclasses.replace(plan_of(span(2, 2), span(4, 4)), passing=True), page=3)
    assert progress.on_page([msg(2), msg(7)]).stop  # 4 is gone already, 7 lies past it


# --- settling within the locks ------------------------------------------------------------------------

def complete_with(completion: BulkSettlement, lost: set, *, clock=lambda: 0.0, broken=False) -> list[tuple]:
    """Drive a ``BulkSettlement`` against a broker that refuses a request holding a lost lock (and, like the
    emulator, settles nothing of a refused request); returns the requests made."""
    requests = []
    while (request := completion.next_request(clock())) is not None:
        requests.append(request)
        if broken:
            completion.stop()
        elif lost.intersection(request):
            completion.lock_lost(request)
        else:
            completion.succeeded(request)
    return requests


def test_a_bulk_completion_that_succeeds_is_one_request():
    completion = BulkSettlement(range(1, 101), deadline=60.0)
    assert complete_with(completion, set()) == [tuple(range(1, 101))]
    assert sorted(completion.completed) == list(range(1, 101)) and completion.unsettled == []


@pytest.mark.parametrize("lost", [{37}, {1, 100}, {5, 6, 7}])
def test_a_bulk_completion_refused_for_a_lost_lock_is_split_never_walked_one_by_one(lost):
    completion = BulkSettlement(range(1, 101), deadline=60.0)
    requests = complete_with(completion, lost)
    assert sorted(completion.completed) == sorted(set(range(1, 101)) - lost)  # every other message completed
    assert sorted(completion.lost) == sorted(lost) and completion.left == []  # the lost ones come back later
    assert len(requests) <= 1 + 2 * len(lost) * 7  # about 2 log2(100) per lost lock, not 100 round trips


def test_nothing_is_sent_once_the_locks_are_about_to_end_and_a_broken_link_ends_it():
    now = {"t": 0.0}

    def clock():
        now["t"] += 1.0  # each request takes a second
        return now["t"]

    completion = BulkSettlement(range(1, 101), deadline=4.5)
    requests = complete_with(completion, {10, 60}, clock=clock)
    assert len(requests) == 4  # then the deadline: nothing more goes out
    assert sorted(completion.completed + completion.unsettled) == list(range(1, 101))
    assert completion.left and not set(completion.completed) & {10, 60}

    broken = BulkSettlement(range(1, 11), deadline=60.0)
    assert complete_with(broken, set(), broken=True) == [tuple(range(1, 11))]
    assert sorted(broken.left) == list(range(1, 11)) and broken.completed == []


def measured(lock, receive, round_trip):
    """What a queue's purges measured: locks of ``lock`` seconds as seen, receives and requests taking so long."""
    timing = SettleTiming()
    timing.observed_page(receive, lock)
    timing.observed_request(round_trip)
    return timing


def test_pages_follow_the_lock_and_the_round_trip_not_fixed_seconds():
    one_reason = {msg(seq): ("missing_path", "no x-ms-path") for seq in range(1, 451, 10)}
    # a 5-second lock, 300 ms away: one completion and one dead-lettering fit in a full page's locks
    progress = PurgeProgress(plan_of(span(1, 450), dead_letters=one_reason), timing=measured(4.7, 0.5, 0.3))
    assert (progress.credit(), progress.requests_needed()) == (100, 2)
    # a reason each, 300 ms each way: 5 requests fit, pages of 40 (about 4 dead-letterings and the completion)
    own_reasons = {msg(seq): ("message_too_large", f"body of {seq} bytes") for seq in range(1, 451, 10)}
    progress = PurgeProgress(plan_of(span(1, 450), dead_letters=own_reasons), timing=measured(4.7, 0.9, 0.6))
    assert (progress.credit(), progress.requests_needed()) == (40, 5)
    # nothing measured yet: a full page (the deadline still holds for it); too slow for the lock: nothing
    assert PurgeProgress(plan_of(span(1, 450))).credit() == 100
    assert PurgeProgress(plan_of(span(1, 10)), timing=measured(4.7, 3.0, 2.0)).credit() == 0


def test_dead_letters_go_in_one_request_per_distinct_reason_the_largest_first():
    orders = ((2, "missing_path", "no x-ms-path"), (3, "too_large", "body of 9 bytes"),
              (5, "missing_path", "no x-ms-path"), (8, "missing_path", "other text"))
    assert dead_letter_groups(orders) == [(("missing_path", "no x-ms-path"), (2, 5)),
                                          (("too_large", "body of 9 bytes"), (3,)),
                                          (("missing_path", "other text"), (8,))]
    dead = {msg(2): ("a", "x"), msg(3): ("b", "y")}
    progress = PurgeProgress(plan_of(span(1, 5), dead_letters=dead), timing=measured(59.9, 0.1, 0.05))
    assert progress.requests_needed() == 3
    progress.on_page([msg(seq) for seq in range(1, 4)])
    progress.on_settled(1, [2, 3])
    assert progress.requests_needed() == 1  # what is left needs its completion only


def test_what_missed_its_deadline_is_received_again_and_a_page_that_settled_nothing_ends_the_round():
    progress = PurgeProgress(plan_of(span(1, 10)), page=10)
    assert progress.on_page([msg(seq) for seq in range(1, 11)]).stop  # every recorded message seen
    progress.on_settled(6, given_back=4)  # four released before their locks could end
    assert not progress.stopped and progress.credit() == 4
    progress.on_page([msg(seq) for seq in range(7, 11)])
    progress.on_settled(0, given_back=4)  # none of them in time: the next page would fare no better
    assert progress.stopped and progress.late_only and progress.credit() == 0


def test_a_page_whose_locks_are_all_gone_stops_after_a_few_requests_not_two_per_message():
    completion = BulkSettlement(range(1, 101), deadline=60.0)
    requests = complete_with(completion, set(range(1, 101)))
    assert completion.all_lost and completion.completed == []
    assert len(requests) <= 2 * 7 + 1  # one path down the halves and a little more, then it gives up
    assert sorted(completion.unsettled) == list(range(1, 101))
    single = BulkSettlement(range(1, 101), deadline=60.0)
    complete_with(single, {1, 2})  # two lost locks side by side: still split to the end
    assert not single.all_lost and sorted(single.lost) == [1, 2] and len(single.completed) == 98


def test_a_message_received_twice_in_one_page_is_settled_once_by_its_latest_delivery():
    from backlog_syphon.purge.progress import latest_of_each

    assert latest_of_each([5, 6, 7]) == ([0, 1, 2], [])
    # 6 came back (its earlier delivery's lock given up) after 7: the later copy is kept, the earlier given back
    assert latest_of_each([5, 6, 7, 6]) == ([0, 2, 3], [1])
    assert latest_of_each([9, 9, 9]) == ([2], [0, 1])


def test_special_messages_are_not_received_a_verified_plan_keeps_those_still_there_and_a_session_asks_for_its_own():
    from backlog_syphon.model import SettleKind, SettleOrder

    scheduled = SettleOrder("q", 3, T0 + 3, SettleKind.CANCEL_SCHEDULED)
    plan = dataclasses.replace(plan_of(span(1, 4), expected=3), special={msg(3): scheduled}, verify=True)
    verified = plan.verified([msg(2), msg(3), msg(4)])  # 1 is gone already
    assert (verified.expected, verified.special, verified.verify) == (2, {msg(3): scheduled}, False)
    assert plan.verified([msg(2)]).special == {}
    in_session = dataclasses.replace(plan, sessions={"s-a": 2}).in_session("s-a", 2)
    assert (in_session.expected, in_session.sessions, in_session.special) == (2, None, {msg(3): scheduled})


def test_a_look_that_finds_no_recorded_message_says_nothing_planned_is_there():
    from backlog_syphon.model import SettleKind, SettleOrder

    progress = PurgeProgress(plan_of(span(1, 2)))
    assert progress.on_page([]).look and not progress.came_up_empty
    progress.on_look([], now=0.0)
    assert progress.came_up_empty and progress.stopped
    locked = PurgeProgress(plan_of(span(1, 2)))
    locked.on_page([])
    locked.on_look([msg(1)], now=0.0)  # still there, locked elsewhere: not empty, and the round waits
    assert not locked.came_up_empty and not locked.stopped
    deferred = SettleOrder("q", 2, T0 + 2, SettleKind.RECEIVE_DEFERRED)
    special = PurgeProgress(dataclasses.replace(plan_of(span(1, 2), expected=1), special={msg(2): deferred}))
    special.on_page([])
    special.on_look([msg(2)], now=0.0)  # a deferred one no receive brings (its settling failed): not waited for
    assert special.came_up_empty and special.stopped and special.lock_wait is None


# --- settlements across partitions, and refusals whose live tokens may or may not be settled ---------------

def settle_on(namespace_mode: str, completion: BulkSettlement, dead: set, settled: set, *, partitioned=True) -> list:
    """Drive a ``BulkSettlement`` against a namespace that refuses a request spanning partitions (as a partitioned
    entity does), and answers a request with a dead token 410, settling its live ones (``partial``) or none
    (``atomic``). ``settled`` collects what the namespace settled; a look finds what is still there."""
    requests = []
    while (request := completion.next_request(0.0)) is not None:
        requests.append(request)
        assert not partitioned or len({seq >> 48 for seq in request}) == 1, "a request across partitions"
        if dead.intersection(request) or settled.intersection(request):
            if namespace_mode == "partial":
                settled.update(seq for seq in request if seq not in dead)
            present = {seq for seq in request if seq not in settled} if completion.needs_look(request) else None
            completion.lock_lost(request, present=present)
        else:
            settled.update(request)
            completion.succeeded(request)
    return requests


def lanes(*partitions, per=50):
    return [p << 48 | n for p in partitions for n in range(1, per + 1)]


def test_lock_tokens_go_one_request_per_partition():
    items = lanes(3, 0, 7)
    completion = BulkSettlement(sorted(items), deadline=60.0, partition=lambda seq: seq >> 48)
    settled: set = set()
    requests = settle_on("partial", completion, set(), settled)
    assert [request[0] >> 48 for request in requests] == [0, 3, 7] and settled == set(items)


@pytest.mark.parametrize("mode", ["partial", "atomic"])
@pytest.mark.parametrize("dead", [{7}, {1, 50}, {5, 6, 7, 48}])
def test_a_refused_request_settles_every_live_message_and_nothing_twice_whatever_the_namespace_does(mode, dead):
    completion = BulkSettlement(range(1, 101), deadline=60.0)
    settled: set = set()
    requests = settle_on(mode, completion, dead, settled, partitioned=False)
    assert settled == set(range(1, 101)) - dead  # every live token settled, and by the namespace only once
    assert sorted(completion.completed) == sorted(settled)  # what the purge counts is what went
    assert sorted(completion.lost) == sorted(dead) and completion.left == []
    if mode == "partial":
        assert len(requests) == 1  # the look tells at once: what went was settled, what is there lost its lock
    else:
        assert len(requests) <= 1 + 2 * len(dead) * 7  # halving, as before


def test_once_a_look_found_nothing_gone_the_settlement_halves_without_looking():
    completion = BulkSettlement(range(1, 101), deadline=60.0)
    assert completion.needs_look(tuple(range(1, 101)))
    completion.lock_lost(tuple(range(1, 101)), present=set(range(1, 101)))
    assert not completion.looks and not completion.needs_look(tuple(range(1, 51)))


def test_what_a_round_still_expects_to_receive_counts_down_with_each_page():
    progress = PurgeProgress(plan_of(span(1, 30)), page=100)
    assert progress.left == 30
    progress.on_page([msg(seq) for seq in range(1, 11)])
    progress.on_settled(10)
    assert progress.left == 20  # a page that came back short asks for the rest of these, no more
