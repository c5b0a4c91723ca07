"""Where each migration source's messages go, and the configurations refused because they would duplicate
silently."""

from __future__ import annotations

import pytest

from backlog_syphon.config import MigrationConfig
from backlog_syphon.migration.routes import RouteError, plan_routes, subscription_choice
from backlog_syphon.migration.selection import select_sources
from backlog_syphon.model import (
    EntityKind,
    ListedEntity,
    ListedSubscription,
    NamespaceListing,
    RuleFilter,
    SubscriptionDelivery,
)

SOURCE = NamespaceListing((
    ListedEntity("orders", EntityKind.QUEUE),
    ListedEntity("sessions", EntityKind.QUEUE, requires_session=True),
    ListedEntity("events", EntityKind.TOPIC, subscriptions=(
        ListedSubscription("all"), ListedSubscription("eu", requires_session=True))),
    ListedEntity("alerts", EntityKind.TOPIC, subscriptions=(ListedSubscription("ops"),)),
))
PROPERTY = "x-syphon-subscription"
SELECTS = RuleFilter("migrated", properties=(PROPERTY,))


def target(*, all_rules=(SELECTS,), eu_rules=(SELECTS,), sessions=True) -> NamespaceListing:
    return NamespaceListing((
        ListedEntity("orders", EntityKind.QUEUE), ListedEntity("sessions", EntityKind.QUEUE, requires_session=sessions),
        ListedEntity("events-all", EntityKind.QUEUE),
        ListedEntity("events", EntityKind.TOPIC, subscriptions=(
            ListedSubscription("all", False, all_rules), ListedSubscription("eu", True, eu_rules))),
        ListedEntity("alerts", EntityKind.TOPIC, subscriptions=(ListedSubscription("ops", False, (RuleFilter("$Default", takes_all=True),)),)),
    ))


def routes(entities, target_listing=None, **settings):
    migration = MigrationConfig(entities=tuple(entities), **settings)
    sources = select_sources(SOURCE, migration.entities)
    return plan_routes(sources, migration, SOURCE, target() if target_listing is None else target_listing)


def test_queues_topics_and_dead_letters_go_to_the_same_name_a_map_or_their_entitys_route():
    found = routes(["orders", "orders/$DeadLetterQueue", "alerts", "sessions"],
                   destination_map={"Alerts": "alerts-v2"})
    assert {path: route.destination for path, route in found.items()} == {
        "orders": "orders", "orders/$deadletterqueue": "orders", "alerts": "alerts-v2", "sessions": "sessions"}
    assert [found[path].provenance for path in ("orders", "orders/$deadletterqueue")] == [False, True]
    assert found["sessions"].session_state_entity == "sessions"
    mapped = routes(["orders/$DeadLetterQueue"], destination_map={"orders/$DeadLetterQueue": "orders-dead-letters"})
    assert mapped["orders/$deadletterqueue"].destination == "orders-dead-letters"


def test_each_subscription_choice_routes_its_messages_and_a_dead_letter_queue_follows_its_subscription():
    found = routes(["events/Subscriptions/all", "events/Subscriptions/eu", "events/Subscriptions/eu/$DeadLetterQueue",
                    "alerts/Subscriptions/ops"],
                   subscriptions={"events/Subscriptions/all": "queue", "events/*": "property", "alerts/*/ops": "topic"},
                   destination_map={"events/Subscriptions/all": "events-all"})
    all_, eu, eu_dead, ops = (found[key] for key in ("events/subscriptions/all", "events/subscriptions/eu",
                                                     "events/subscriptions/eu/$deadletterqueue",
                                                     "alerts/subscriptions/ops"))
    assert (all_.destination, all_.delivery, all_.property_name) == ("events-all", SubscriptionDelivery.QUEUE, None)
    assert (eu.destination, eu.delivery, eu.property_name, eu.property_value) == (
        "events", SubscriptionDelivery.PROPERTY, PROPERTY, "eu")
    assert eu.session_state_entity == "events/Subscriptions/eu"  # the target subscription of the same name
    assert (eu_dead.destination, eu_dead.property_value, eu_dead.provenance) == ("events", "eu", True)
    assert (ops.destination, ops.delivery) == ("alerts", SubscriptionDelivery.TOPIC)


@pytest.mark.parametrize("entities, settings, target_listing, says", [
    (["events/Subscriptions/all"], {}, None, "migration.subscriptions has no choice for events/Subscriptions/all"),
    (["events/Subscriptions/all"], {"subscriptions": {"events/*": "topic"}}, None,
     "which has other subscriptions (eu): each would get a copy too"),
    (["events/Subscriptions/all"], {"subscriptions": {"events/*": "queue"}}, None,
     "migration.destination_map must name it"),
    (["events/Subscriptions/all"], {"subscriptions": {"events/*": "queue"},
                                    "destination_map": {"events/Subscriptions/all": "events"}}, None,
     "which the target namespace lists as a topic, not a queue"),
    (["events/Subscriptions/eu"], {"subscriptions": {"events/*": "property"}}, "unanswered",
     "the target's administration API did not answer"),
    (["events/Subscriptions/eu"], {"subscriptions": {"events/*": "property"}},
     target(all_rules=(RuleFilter("$Default", takes_all=True),)),
     "events/Subscriptions/all has a rule ($Default) that does not select on x-syphon-subscription"),
    (["events/Subscriptions/eu"], {"subscriptions": {"events/*": "property"}},
     target(all_rules=(SELECTS, RuleFilter("live", properties=("region",)))), "has a rule (live)"),
    (["orders"], {"destination_map": {"payments": "orders"}}, None, "names 'payments', which is not a selected source"),
])
def test_what_would_duplicate_silently_or_cannot_be_routed_is_refused_in_one_line(entities, settings, target_listing,
                                                                                  says):
    listing = NamespaceListing(()) if target_listing is None else target_listing
    with pytest.raises(RouteError) as refused:
        migration = MigrationConfig(entities=tuple(entities), **settings)
        plan_routes(select_sources(SOURCE, entities), migration, SOURCE,
                    None if target_listing == "unanswered" else (target() if target_listing is None else listing))
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_sql_filter_that_mentions_the_property_selects_on_it_and_a_true_filter_does_not():
    sql = RuleFilter("live-and-migrated", sql=f"{PROPERTY} IS NULL AND region = 'eu' OR {PROPERTY} = 'eu'")
    found = routes(["events/Subscriptions/eu"], target(all_rules=(sql,), eu_rules=(sql,)),
                   subscriptions={"events/*": "property"})
    assert found["events/subscriptions/eu"].property_value == "eu"
    assert not RuleFilter("all", takes_all=True).names(PROPERTY)


def test_session_states_have_nowhere_to_go_on_a_target_without_sessions():
    assert routes(["sessions"], target(sessions=False))["sessions"].session_state_entity is None
    assert routes(["orders"])["orders"].session_state_entity is None


def test_a_subscriptions_own_choice_wins_over_a_pattern():
    choices = {"events/*": "property", "events/Subscriptions/all": "queue"}
    assert subscription_choice("events/Subscriptions/ALL", choices) is SubscriptionDelivery.QUEUE
    assert subscription_choice("events/Subscriptions/eu", choices) is SubscriptionDelivery.PROPERTY
    assert subscription_choice("alerts/Subscriptions/ops", choices) is None


def test_every_subscription_of_a_topic_to_it_goes_through_its_first_by_name_and_covers_the_others():
    found = routes(["events/Subscriptions/eu", "events/Subscriptions/all"], subscriptions={"events/*": "topic"})
    all_, eu = found["events/subscriptions/all"], found["events/subscriptions/eu"]
    assert (all_.destination, all_.delivery, all_.covered_by) == ("events", SubscriptionDelivery.TOPIC, None)
    assert (eu.destination, eu.delivery, eu.covered_by) == ("events", SubscriptionDelivery.TOPIC,
                                                            "events/Subscriptions/all")


@pytest.mark.parametrize("entities, settings, says", [
    (["events/Subscriptions/all", "events/Subscriptions/eu"],
     {"subscriptions": {"events/Subscriptions/all": "topic", "events/Subscriptions/eu": "property"}},
     "routed otherwise: eu"),
    (["events/Subscriptions/all", "events/Subscriptions/eu"],
     {"subscriptions": {"events/*": "topic"}, "destination_map": {"events/Subscriptions/eu": "events-all"}},
     "routed otherwise: eu"),
    (["events/Subscriptions/all", "events/Subscriptions/eu", "events/Subscriptions/eu/$DeadLetterQueue"],
     {"subscriptions": {"events/*": "topic"}}, "its messages are that subscription's alone"),
])
def test_a_topic_through_one_subscription_needs_every_one_of_them_and_never_takes_a_dead_letter_queue(entities,
                                                                                                       settings, says):
    with pytest.raises(RouteError) as refused:
        routes(entities, **settings)
    assert says in str(refused.value)


def test_a_dead_letter_queue_of_such_a_subscription_goes_where_the_map_names():
    found = routes(["events/Subscriptions/all", "events/Subscriptions/eu", "events/Subscriptions/eu/$DeadLetterQueue"],
                   subscriptions={"events/*": "topic"},
                   destination_map={"events/Subscriptions/eu/$DeadLetterQueue": "events-all"})
    assert found["events/subscriptions/eu/$deadletterqueue"].destination == "events-all"
    assert found["events/subscriptions/eu/$deadletterqueue"].covered_by is None
