"""Where each migration source's messages go in the target namespace, and the refusal of a configuration that
would deliver a message twice without anyone noticing. Pure: the listings come in as values.

- A queue's messages go to the target's entity of the same name, a topic's scheduled messages to the target's
  topic, a dead-letter sub-queue's along its entity's route (a re-drive back into it); ``migration.destination_map``
  overrides any of these by source path (a subscription's ``topic`` and ``property`` routes also by topic name).
- A subscription's messages need the operator's choice (``migration.subscriptions``, by path or pattern):
  re-sent to the topic, every other subscription of it gets a copy too.

  ``topic``     to the topic, when the subscription is its topic's only subscription in the source, or when every
                subscription of the topic is a source with the choice ``topic`` (every one holds the same
                messages: ``migration.fan_out`` checks it at the run's start): then the first of them by name (the
                lead) sends each message to the topic, which gives every subscription its copy again, and the
                others' copies are covered (``Route.covered_by``: recorded, settled, never sent);
  ``queue``     to the queue ``migration.destination_map`` names for it;
  ``property``  to the topic with ``migration.subscription_property`` set to the subscription's name, only
                where the target's listing shows every rule of every subscription of that topic selecting on
                the property (a rule that does not takes the other subscriptions' copies as well).

Invariants:
- every selected source has exactly one route, or the run does not start (``RouteError``, one line naming the
  setting to change and what to write);
- a route never sends a subscription's messages where another subscription can take a copy unseen; a dead-letter
  sub-queue of a subscription whose topic has others goes to its topic only by an explicit
  ``migration.destination_map`` entry (its messages are that subscription's alone).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Iterable, Mapping

from backlog_syphon.config import MigrationConfig
from backlog_syphon.errors import SettingsError
from backlog_syphon.model import (
    EntityKind,
    NamespaceListing,
    Route,
    SourceEntity,
    SourceKind,
    SubscriptionDelivery,
)
from backlog_syphon.model.migration import SUBSCRIPTIONS_SEGMENT


class RouteError(SettingsError):
    """A route that cannot be taken as configured, or that would duplicate silently."""


def plan_routes(sources: Iterable[SourceEntity], migration: MigrationConfig, source_listing: NamespaceListing,
                target_listing: NamespaceListing | None, *, redrive: bool = False,
                selected: Iterable[SourceEntity] = ()) -> dict[str, Route]:
    """{source path (lower case): its route}. ``target_listing``: the target's administration API's listing,
    None where it does not answer (then ``property`` cannot be checked and is refused). ``redrive``: the sources
    are dead-letter sub-queues re-driven along their entity's route, as a direct delivery would have gone
    (provenance only when ``migration.provenance`` asks for it); ``selected``: the entities whose sub-queues they
    are (a ``migration.destination_map`` key may name one of them)."""
    sources = list(sources)
    mapped = {key.lower(): value for key, value in migration.destination_map.items()}
    named = [*sources, *selected]
    known = {source.path.lower() for source in named} | {source.topic.lower() for source in named if source.topic}
    known |= {source.owner.lower() for source in named if source.owner}
    for key in migration.destination_map:
        if key.lower() not in known:
            raise RouteError(f"migration.destination_map names {key!r}, which is not a selected source (nor the topic "
                             f"of one): name a source entity's path as migration.entities selects it")
    selected = {source.path.lower(): source for source in sources}
    routes = {}
    for source in sources:
        route = _route(source, migration, mapped, source_listing, target_listing, selected)
        provenance = migration.provenance if migration.provenance is not None else (
            source.kind is SourceKind.DEAD_LETTERS and not redrive)
        routes[source.path.lower()] = Route(
            source.path, route.destination, route.delivery, route.property_name, route.property_value,
            _session_state_entity(source, route, target_listing), bool(provenance), route.covered_by)
    return routes


def subscription_choice(path: str, choices: Mapping[str, str]) -> SubscriptionDelivery | None:
    """The delivery ``migration.subscriptions`` chooses for the subscription ``path``: its own entry, else the
    first pattern that matches it (case-insensitively)."""
    lowered = path.lower()
    for key, choice in choices.items():
        if key.lower() == lowered:
            return SubscriptionDelivery(choice)
    for key, choice in choices.items():
        if fnmatchcase(lowered, key.lower()):
            return SubscriptionDelivery(choice)
    return None


def _route(source: SourceEntity, migration: MigrationConfig, mapped: dict[str, str], source_listing: NamespaceListing,
           target_listing: NamespaceListing | None, selected: Mapping[str, SourceEntity]) -> Route:
    own = mapped.get(source.path.lower())
    if source.kind is SourceKind.DEAD_LETTERS:
        if own is not None:
            return Route(source.path, own)
        owner = SourceEntity(source.owner, SourceKind.SUBSCRIPTION if source.subscription else SourceKind.QUEUE,
                             topic=source.topic, subscription=source.subscription)
        route = _route(owner, migration, mapped, source_listing, target_listing, selected)
        if route.delivery is SubscriptionDelivery.TOPIC and _siblings(owner, source_listing):
            raise RouteError(f"{source.path} would go to the topic {route.destination} as its subscription's route "
                             f"does, but its messages are that subscription's alone: re-sent to the topic, every other "
                             f"subscription of {source.topic} would get a copy too. Name a queue for it in "
                             f"migration.destination_map ({source.path}: <queue>), or leave it out "
                             f"(migration.exclude)")
        return route
    if source.kind is not SourceKind.SUBSCRIPTION:
        return Route(source.path, own or source.path)
    choice = subscription_choice(source.path, migration.subscriptions)
    if choice is None:
        raise RouteError(f"migration.subscriptions has no choice for {source.path}: re-sent to its topic, every other "
                         f"subscription of {source.topic} would get a copy too. Choose one: topic (its only "
                         f"subscription), queue (with migration.destination_map naming the queue) or property (the "
                         f"target's subscription rules select on migration.subscription_property)")
    if choice is SubscriptionDelivery.QUEUE:
        if own is None:
            raise RouteError(f"migration.subscriptions sends {source.path} to a queue: migration.destination_map "
                             f"must name it ({source.path}: <queue>)")
        _check_kind(own, EntityKind.QUEUE, source.path, target_listing)
        return Route(source.path, own, choice)
    topic = own or mapped.get(source.topic.lower()) or source.topic
    _check_kind(topic, EntityKind.TOPIC, source.path, target_listing)
    if choice is SubscriptionDelivery.TOPIC:
        others = _siblings(source, source_listing)
        if not others:
            return Route(source.path, topic, choice)
        return Route(source.path, topic, choice,
                     covered_by=_fan_out_lead(source, others, topic, migration, mapped, selected))
    _check_property_rules(source, topic, migration.subscription_property, target_listing)
    return Route(source.path, topic, choice, migration.subscription_property, source.subscription)


def _siblings(source: SourceEntity, source_listing: NamespaceListing) -> list[str]:
    """The names of the other subscriptions of ``source``'s topic, as the source namespace lists them."""
    listed = source_listing.find(source.topic)
    return sorted(subscription.name for subscription in (listed.subscriptions if listed else ())
                  if subscription.name.lower() != source.subscription.lower())


def _fan_out_lead(source: SourceEntity, others: list[str], topic: str, migration: MigrationConfig,
                  mapped: dict[str, str], selected: Mapping[str, SourceEntity]) -> str | None:
    """The lead subscription's path where ``source`` is covered by it (None: ``source`` is the lead), once every
    subscription of its topic is a selected source routed to the same topic; else ``RouteError``."""
    paths = {name: f"{source.topic}/{SUBSCRIPTIONS_SEGMENT}/{name}" for name in others}
    missing = [name for name, path in paths.items() if path.lower() not in selected]
    elsewhere = [name for name, path in paths.items() if path.lower() in selected and (
        subscription_choice(path, migration.subscriptions) is not SubscriptionDelivery.TOPIC
        or (mapped.get(path.lower()) or mapped.get(source.topic.lower()) or source.topic) != topic)]
    if missing or elsewhere:
        raise RouteError(f"migration.subscriptions sends {source.path} to its topic, which has other subscriptions "
                         f"({', '.join(others)}): each would get a copy too. Choose queue or property for it, or "
                         f"topic for every subscription of {source.topic} (select them all, to the same topic) when "
                         f"each holds the same messages: "
                         + "; ".join(filter(None, [missing and f"not selected: {', '.join(missing)}",
                                                   elsewhere and f"routed otherwise: {', '.join(elsewhere)}"])))
    members = sorted([source.path, *(selected[path.lower()].path for path in paths.values())], key=str.lower)
    return None if members[0].lower() == source.path.lower() else members[0]


def _check_kind(name: str, kind: EntityKind, source: str, target_listing: NamespaceListing | None) -> None:
    listed = target_listing.find(name) if target_listing is not None else None
    if listed is not None and listed.kind is not kind:
        raise RouteError(f"the route of {source} names {name!r}, which the target namespace lists as a {listed.kind}, "
                         f"not a {kind}: name a {kind} in migration.destination_map")


def _check_property_rules(source: SourceEntity, topic: str, property_name: str,
                          target_listing: NamespaceListing | None) -> None:
    if target_listing is None:
        raise RouteError(f"migration.subscriptions sends {source.path} by property, which needs the target's "
                         f"subscription rules to check: the target's administration API did not answer (grant Manage "
                         f"on the target topic {topic}: Azure Service Bus Data Owner), or choose queue")
    listed = target_listing.find(topic)
    if listed is None:
        raise RouteError(f"migration.subscriptions sends {source.path} by property to the topic {topic!r}, which the "
                         f"target namespace does not list")
    if not any(subscription.name.lower() == source.subscription.lower() for subscription in listed.subscriptions):
        raise RouteError(f"migration.subscriptions sends {source.path} by property, but the target topic {topic} has "
                         f"no subscription {source.subscription!r} to select its copies")
    for subscription in listed.subscriptions:
        for rule in subscription.rules:
            if not rule.names(property_name):
                raise RouteError(
                    f"migration.subscriptions sends {source.path} by property, but the target subscription "
                    f"{topic}/{SUBSCRIPTIONS_SEGMENT}/{subscription.name} has a rule ({rule.name}) that does not "
                    f"select on {property_name}: it would take every subscription's copies. Make each rule of each "
                    f"subscription of {topic} name {property_name} (a SQL filter such as \"{property_name} IS NULL AND "
                    f"(...) OR {property_name} = '{subscription.name}'\"), or choose queue")


def _session_state_entity(source: SourceEntity, route: Route, target_listing: NamespaceListing | None) -> str | None:
    """Where a session-enabled source's session states go: the route's queue, or the target topic's subscription
    named as the source's; None where the target lists that entity without sessions, or it has none."""
    if not source.requires_session:
        return None
    if route.delivery in (SubscriptionDelivery.TOPIC, SubscriptionDelivery.PROPERTY):
        listed = target_listing.find(route.destination) if target_listing is not None else None
        if listed is not None:
            match = next((s for s in listed.subscriptions if s.name.lower() == (source.subscription or "").lower()),
                         None)
            return None if match is None or not match.requires_session else (
                f"{listed.name}/{SUBSCRIPTIONS_SEGMENT}/{match.name}")
        return f"{route.destination}/{SUBSCRIPTIONS_SEGMENT}/{source.subscription}"
    listed = target_listing.find(route.destination) if target_listing is not None else None
    if listed is not None and (listed.kind is not EntityKind.QUEUE or not listed.requires_session):
        return None
    return route.destination
