"""A topic drained through one of its subscriptions: they must hold the same messages, counting what earlier runs
recorded, or the run does not start."""

from __future__ import annotations

import pytest

from backlog_syphon.migration.fan_out import FanOutError, check_same_messages
from backlog_syphon.model import MigrationPlan, Route, SubscriptionDelivery

LEAD, OTHER = "events/Subscriptions/all", "events/Subscriptions/eu"
GROUPS = {LEAD: (OTHER,)}


def test_the_same_numbers_or_the_difference_recorded_by_an_earlier_run_pass():
    check_same_messages(GROUPS, {LEAD: frozenset({1, 2, 3}), OTHER: frozenset({1, 2, 3})}, {})
    # a run stopped half-way: the lead sent 1 and 2 (its copies settled); the other's copy of 3 was covered
    check_same_messages(GROUPS, {LEAD: frozenset({3}), OTHER: frozenset({1, 2})},
                        {LEAD.lower(): frozenset({1, 2}), OTHER.upper(): frozenset({3})})


@pytest.mark.parametrize("live, says", [
    ({LEAD: frozenset({1, 2}), OTHER: frozenset({1, 2, 3})}, f"{OTHER} holds 1 message(s) {LEAD} does not "
                                                            f"(sequence numbers 3)"),
    ({LEAD: frozenset(range(1, 10)), OTHER: frozenset()}, "copy its consumers had already taken"),
    ({LEAD: frozenset(range(1, 10)), OTHER: frozenset()}, "sequence numbers 1, 2, 3, 4, 5, ..."),
])
def test_a_message_only_one_of_them_holds_refuses_the_run(live, says):
    with pytest.raises(FanOutError) as refused:
        check_same_messages(GROUPS, live, {})
    assert says in str(refused.value) and "Choose queue or property" in str(refused.value)


def test_the_plan_groups_the_covered_subscriptions_by_their_lead():
    plan = MigrationPlan(routes={
        LEAD.lower(): Route(LEAD, "events", SubscriptionDelivery.TOPIC),
        OTHER.lower(): Route(OTHER, "events", SubscriptionDelivery.TOPIC, covered_by=LEAD),
        "orders": Route("orders", "orders")})
    assert plan.fan_out_groups() == {LEAD: (OTHER,)} and plan.covered == (OTHER,)
