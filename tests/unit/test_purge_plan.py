"""The purge of one backlog queue as a state machine: what to ask for, settle, give back."""

import pytest

from backlog_syphon.servicebus.purge_plan import PageActions, PurgePlan, PurgeProgress, PurgeResult


def run_purge(plan, queue_head, *, page=100, settle_fails=()):
    """Drive PurgeProgress against a fake queue: each receive hands over the next ``credit`` messages.

    ``queue_head`` is what the broker would deliver, in order. Returns (result, requests, actions).
    """
    progress = PurgeProgress(plan, page=page)
    remaining = list(queue_head)
    requests, actions = [], []
    while credit := progress.credit():
        requests.append(credit)
        received, remaining = remaining[:credit], remaining[credit:]
        step = progress.on_page(received)
        actions.append(step)
        failed = [seq for seq in step.complete if seq in settle_fails]
        progress.on_settled(len(step.complete) - len(failed), len(step.dead_letter))
        remaining = sorted(failed + list(step.release) + remaining)  # not settled: still there
    still_there = [seq for seq in remaining if seq >= plan.first]
    return progress.result(still_there[0] if still_there else None), requests, actions


def test_completes_and_dead_letters_exactly_the_plan_asking_for_no_more_than_planned():
    plan = PurgePlan("q", first=1, through=250, expected=250, dead_letters={7: ("missing_path", "no x-ms-path")})
    result, requests, actions = run_purge(plan, list(range(1, 400)))
    assert requests == [100, 100, 50]  # never more than what is recorded: 251.. are not touched
    assert sum(len(a.complete) for a in actions) == 249
    assert [a.dead_letter for a in actions if a.dead_letter] == [((7, "missing_path", "no x-ms-path"),)]
    assert not any(a.release for a in actions)
    assert result == PurgeResult(completed=249, dead_lettered=1, released=0, settled_through=250)


def test_a_message_outside_the_plan_is_released_and_stops_the_purge():
    # 5 is locked by someone else, so the broker fills the credit with 9, which is not recorded.
    plan = PurgePlan("q", first=3, through=8, expected=6)
    result, requests, actions = run_purge(plan, [3, 4, 6, 7, 8, 9, 10])
    assert requests == [6]
    assert actions == [PageActions(complete=(3, 4, 6, 7, 8), dead_letter=(), release=(9,), stop=True)]
    assert result.released == 1 and result.completed == 5
    assert result.settled_through == 8  # 5 is not there (for the fake): settled as far as the plan goes


def test_settled_through_stops_below_what_is_still_there():
    plan = PurgePlan("q", first=1, through=10, expected=10)
    result, _, _ = run_purge(plan, list(range(1, 11)), settle_fails={4})  # 4's lock was lost
    assert result.completed == 9 and result.settled_through == 3


def test_nothing_arriving_ends_the_purge_and_nothing_planned_asks_for_nothing():
    plan = PurgePlan("q", first=5, through=9, expected=5)
    result, requests, actions = run_purge(plan, [])
    assert requests == [5] and actions[0].stop and result.settled_through == 9  # all gone already
    assert PurgeProgress(PurgePlan("q", first=5, through=4, expected=0)).credit() == 0


def test_messages_below_the_plan_are_released_not_settled():
    plan = PurgePlan("q", first=5, through=6, expected=2)
    _, _, actions = run_purge(plan, [2, 5, 6])
    assert actions[0] == PageActions(complete=(5,), dead_letter=(), release=(2,), stop=True)


@pytest.mark.parametrize("first, through, expected", [(0, 3, 1), (5, 3, 0), (1, 3, -1)])
def test_invalid_plans_are_refused(first, through, expected):
    with pytest.raises(ValueError, match="invalid purge plan"):
        PurgePlan("q", first=first, through=through, expected=expected)
