"""Which entities of a source namespace a migration run reads: names and patterns over its listing."""

from __future__ import annotations

import pytest

from backlog_syphon.migration.selection import SelectionError, dead_letter_sources_of, select_sources
from backlog_syphon.model import EntityKind, ListedEntity, ListedSubscription, NamespaceListing, SourceKind

LISTING = NamespaceListing((
    ListedEntity("orders", EntityKind.QUEUE),
    ListedEntity("Sessions-Orders", EntityKind.QUEUE, requires_session=True),
    ListedEntity("partitioned", EntityKind.QUEUE, partitioned=True),
    ListedEntity("contoso/x-servicebus-transfer/0", EntityKind.QUEUE),
    ListedEntity("events", EntityKind.TOPIC, partitioned=True, subscriptions=(
        ListedSubscription("all"), ListedSubscription("eu", requires_session=True))),
))


def paths(sources) -> list[str]:
    return [source.path for source in sources]


def test_names_match_whatever_their_case_and_patterns_leave_dead_letters_and_backlog_queues_out():
    assert paths(select_sources(LISTING, ["ORDERS", "sessions-orders"])) == ["orders", "Sessions-Orders"]
    assert paths(select_sources(LISTING, ["*"])) == ["events", "events/Subscriptions/all", "events/Subscriptions/eu",
                                                     "orders", "partitioned", "Sessions-Orders"]
    assert paths(select_sources(LISTING, ["*/$deadletterqueue"])) == [
        "events/Subscriptions/all/$DeadLetterQueue", "events/Subscriptions/eu/$DeadLetterQueue",
        "orders/$DeadLetterQueue", "partitioned/$DeadLetterQueue", "Sessions-Orders/$DeadLetterQueue"]
    # A backlog queue only by its name (it is the backlog mode's), never by a pattern.
    assert paths(select_sources(LISTING, ["contoso/x-servicebus-transfer/0"])) == ["contoso/x-servicebus-transfer/0"]


def test_each_source_knows_its_kind_its_sessions_its_partitions_and_its_owner():
    found = {source.path: source for source in select_sources(LISTING, ["*", "events/Subscriptions/eu/$DeadLetterQueue"])}
    eu = found["events/Subscriptions/eu"]
    assert (eu.kind, eu.requires_session, eu.partitioned, eu.topic, eu.subscription, eu.browse_only) == (
        SourceKind.SUBSCRIPTION, True, True, "events", "eu", True)
    dead = found["events/Subscriptions/eu/$DeadLetterQueue"]
    assert (dead.kind, dead.requires_session, dead.owner, dead.browse_only) == (
        SourceKind.DEAD_LETTERS, False, "events/Subscriptions/eu", False)  # a dead-letter queue takes no session
    assert (found["events"].kind, found["events"].browse_only) == (SourceKind.TOPIC, True)  # its scheduled messages
    assert not found["orders"].browse_only


def test_exclude_takes_out_again_and_the_dead_letters_of_a_re_drive_are_those_of_queues_and_subscriptions():
    sources = select_sources(LISTING, ["*"], exclude=["events*"])
    assert paths(sources) == ["orders", "partitioned", "Sessions-Orders"]
    assert paths(dead_letter_sources_of(select_sources(LISTING, ["orders", "events", "events/Subscriptions/all"]))) == [
        "events/Subscriptions/all/$DeadLetterQueue", "orders/$DeadLetterQueue"]
    assert paths(dead_letter_sources_of(select_sources(LISTING, ["orders", "events/Subscriptions/all"]),
                                        ["*/Subscriptions/*/$DeadLetterQueue"])) == ["orders/$DeadLetterQueue"]


@pytest.mark.parametrize("entities, exclude, says", [
    (["order"], [], "the name 'order' matches no entity the source namespace lists (it lists orders, Sessions-Orders"),
    (["queue-*"], [], "the pattern 'queue-*' matches no entity"),
    (["orders"], ["nope"], "migration.exclude: the name 'nope'"),
    (["orders"], ["orders"], "selects nothing once migration.exclude is applied"),
])
def test_a_name_or_pattern_that_matches_nothing_is_refused_in_one_line(entities, exclude, says):
    with pytest.raises(SelectionError, match=None) as refused:
        select_sources(LISTING, entities, exclude)
    assert says in str(refused.value) and "\n" not in str(refused.value)
