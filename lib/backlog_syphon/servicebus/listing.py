"""The migration mode's view of its namespaces through their administration APIs: what the source lists (its
queues, topics and subscriptions: ``NamespaceListing``), what the target lists (and, where a subscription's
messages go by property, its subscriptions' rules), and the run's plan made from them (``migration_plan``:
the pure ``migration.selection`` and ``migration.routes`` on these listings). Reading changes nothing.

The source's listing is required: without it the syphon cannot tell a session-enabled entity (whose messages
only a session receiver settles), so a refusal ends the run with one line naming the role (Manage: *Azure
Service Bus Data Owner*). The target's is best effort: without it ``property`` routes cannot be checked and
are refused (``migration.routes``), and the rest goes on.
"""

from __future__ import annotations

import logging
from typing import Iterable

from backlog_syphon.config import NamespaceConfig, SyphonConfig
from backlog_syphon.errors import SettingsError
from backlog_syphon.migration.routes import plan_routes, subscription_choice
from backlog_syphon.migration.selection import dead_letter_sources_of, select_sources
from backlog_syphon.model import (
    AccessRight,
    EntityKind,
    ListedEntity,
    ListedSubscription,
    MessageRules,
    MigrationPlan,
    NamespaceListing,
    RuleFilter,
    SourceKind,
    SubscriptionDelivery,
)
from backlog_syphon.servicebus.access import AccessFailure, Refusal, discovery_refused, refusal_line
from backlog_syphon.servicebus.peek import administration_client

logger = logging.getLogger(__name__)


class ListingRefusedError(SettingsError):
    """The source's administration API refused the listing (Manage missing), or could not be reached."""


def namespace_listing(namespace: NamespaceConfig, *, rules_of: Iterable[str] = ()) -> NamespaceListing:
    """Every queue and topic of ``namespace`` with each topic's subscriptions, and the rules of the subscriptions
    of the topics in ``rules_of`` (any case). Raises what the administration client raises."""
    wanted = {topic.lower() for topic in rules_of}
    with administration_client(namespace) as admin:
        entities = [ListedEntity(queue.name, EntityKind.QUEUE, bool(queue.requires_session),
                                 bool(queue.enable_partitioning)) for queue in admin.list_queues()]
        for topic in admin.list_topics():
            subscriptions = tuple(
                ListedSubscription(subscription.name, bool(subscription.requires_session),
                                   _rules(admin, topic.name, subscription.name) if topic.name.lower() in wanted else ())
                for subscription in admin.list_subscriptions(topic.name))
            entities.append(ListedEntity(topic.name, EntityKind.TOPIC, False, bool(topic.enable_partitioning),
                                         subscriptions))
    return NamespaceListing(tuple(entities))


def _rules(admin, topic: str, subscription: str) -> tuple[RuleFilter, ...]:
    from azure.servicebus.management import CorrelationRuleFilter, SqlRuleFilter, TrueRuleFilter

    found = []
    for rule in admin.list_rules(topic, subscription):
        flt = rule.filter
        if isinstance(flt, CorrelationRuleFilter):
            found.append(RuleFilter(rule.name, properties=tuple(sorted((flt.properties or {}).keys()))))
        elif isinstance(flt, TrueRuleFilter) or flt is None or (
                isinstance(flt, SqlRuleFilter) and (flt.sql_expression or "").replace(" ", "") == "1=1"):
            found.append(RuleFilter(rule.name, takes_all=True))
        else:
            found.append(RuleFilter(rule.name, sql=getattr(flt, "sql_expression", None) or ""))
    return tuple(found)


def source_listing(namespace: NamespaceConfig) -> NamespaceListing:
    """The source namespace's listing; ``ListingRefusedError`` (one line naming the role or the setting) when its
    administration API refuses or does not answer."""
    try:
        return namespace_listing(namespace)
    except Exception as exc:  # noqa: BLE001 - sorted into the one line an operator acts on
        status = getattr(exc, "status_code", None)
        if discovery_refused(status):
            detail = getattr(exc, "message", None) or str(exc)
            raise ListingRefusedError(refusal_line(Refusal(AccessFailure.MISSING_RIGHT, detail), namespace,
                                                   "secondary", AccessRight.MANAGE, ["(the namespace)"])
                                      + " (the migration mode lists the source's entities)") from exc
        raise ListingRefusedError(
            f"the source namespace's administration API ({namespace.administration_host}) did not answer "
            f"({type(exc).__name__}{f' {status}' if status else ''}): check secondary.administration_endpoint (and "
            f"secondary.ca_file); the migration mode lists the source's entities through it") from exc


def target_listing(namespace: NamespaceConfig, rules_of: Iterable[str]) -> NamespaceListing | None:
    """The target namespace's listing (with the rules of ``rules_of``' subscriptions); None where its administration
    API does not answer (said once, as a warning)."""
    try:
        return namespace_listing(namespace, rules_of=rules_of)
    except Exception as exc:  # noqa: BLE001 - best effort: routes that need it are refused by name
        logger.warning("the target namespace's administration API did not answer (%s): entity kinds and session "
                       "settings of the destinations are not checked, and subscriptions cannot go by property",
                       type(exc).__name__)
        return None


def migration_plan(config: SyphonConfig) -> MigrationPlan:
    """A migration run's plan: its sources (``migration.entities`` over the source's listing; a re-drive's: their
    dead-letter sub-queues) and each one's route, checked against both listings. ``SettingsError`` (exit code 2)
    for what cannot start as configured."""
    migration = config.migration
    listing = source_listing(config.secondary)
    selected = sources = select_sources(listing, migration.entities, migration.exclude)
    if config.redriving:
        sources = dead_letter_sources_of(selected, migration.exclude)
    # The target topics a subscription goes to by property: their subscriptions' rules are checked.
    by_property = sorted({migration.destination_map.get(source.path) or migration.destination_map.get(source.topic)
                          or source.topic for source in sources
                          if source.kind in (SourceKind.SUBSCRIPTION, SourceKind.DEAD_LETTERS) and source.subscription
                          and subscription_choice(source.owner or source.path, migration.subscriptions)
                          is SubscriptionDelivery.PROPERTY})
    target = target_listing(config.primary, by_property)
    routes = plan_routes(sources, migration, listing, target, redrive=config.redriving, selected=selected)
    plan = MigrationPlan(tuple(sources), routes, migration.message_rules == MessageRules.COPY,
                         migration.scheduled_margin_seconds)
    logger.info("migration: %d source(s) selected (%s)", len(sources),
                ", ".join(f"{source.path} -> {routes[source.path.lower()].destination}" for source in sources)[:2000])
    return plan
