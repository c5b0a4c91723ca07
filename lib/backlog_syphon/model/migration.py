"""The migration mode's records: the entities a namespace lists, the sources a run reads, where each one's
messages go, and the recorded messages a receive does not bring (scheduled, deferred) that the purge
settles by their own means.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backlog_syphon.model.vocabulary import EntityKind, MessageState, SettleKind, SourceKind, SubscriptionDelivery

SUBSCRIPTIONS_SEGMENT = "Subscriptions"  # "<topic>/Subscriptions/<name>": how the SDK addresses a subscription


@dataclass(frozen=True)
class ListedSubscription:
    name: str
    requires_session: bool = False
    # Each rule's filter as the administration API describes it: the application property names and system
    # fields a correlation filter tests, or a SQL filter's expression; None: a filter that takes everything
    # (TrueFilter, "1=1"). Only read where ``property`` delivery needs it (``migration.routes``).
    rules: tuple[RuleFilter, ...] = ()


@dataclass(frozen=True)
class RuleFilter:
    """One subscription rule's filter: what ``property`` delivery checks it selects on."""

    name: str
    properties: tuple[str, ...] = ()  # a correlation filter's application property names
    sql: str | None = None  # a SQL filter's expression
    takes_all: bool = False  # a true filter (or "1=1"): every message sent to the topic

    def names(self, property_name: str) -> bool:
        """Whether this filter selects on ``property_name`` (a correlation filter on it, or a SQL filter that
        mentions it): only then can it tell one subscription's copies from another's."""
        if self.takes_all:
            return False
        lowered = property_name.lower()
        return (any(name.lower() == lowered for name in self.properties)
                or (self.sql is not None and lowered in self.sql.lower()))


@dataclass(frozen=True)
class ListedEntity:
    """A queue or topic as a namespace's administration API lists it."""

    name: str
    kind: EntityKind
    requires_session: bool = False  # a queue's
    partitioned: bool = False
    subscriptions: tuple[ListedSubscription, ...] = ()  # a topic's


@dataclass(frozen=True)
class NamespaceListing:
    """What a namespace's administration API lists: every queue and topic, with a topic's subscriptions."""

    entities: tuple[ListedEntity, ...] = ()

    def find(self, name: str) -> ListedEntity | None:
        lowered = name.lower()
        return next((entity for entity in self.entities if entity.name.lower() == lowered), None)


@dataclass(frozen=True)
class SourceEntity:
    """One entity a migration run reads (``migration.selection``): its path as the SDK addresses it."""

    path: str
    kind: SourceKind
    requires_session: bool = False  # its messages can be received (settled) only in their session
    partitioned: bool = False
    topic: str | None = None  # a subscription's (or its dead-letter sub-queue's) topic
    subscription: str | None = None  # a subscription's name (also for its dead-letter sub-queue)
    owner: str | None = None  # a dead-letter sub-queue's entity path

    @property
    def browse_only(self) -> bool:
        """Whether it is peeked through a management-only link: a receive link without a session is refused on
        a session-enabled entity, and a topic takes no receive link at all."""
        return self.requires_session or self.kind is SourceKind.TOPIC


@dataclass(frozen=True)
class Route:
    """Where one source's messages go in the target namespace (``migration.routes``)."""

    source: str
    destination: str
    delivery: SubscriptionDelivery | None = None  # a subscription's choice (also for its dead-letter sub-queue)
    # ``property`` delivery: the application property set on every copy, and its value (the subscription's name)
    property_name: str | None = None
    property_value: str | None = None
    # Where the source's session states go: the route's queue, or the target topic's subscription of the same
    # name; None where they have nowhere to go (a session-less source, or a target that takes no sessions).
    session_state_entity: str | None = None
    provenance: bool = False  # the broker's own fields travel as ``x-syphon-*`` application properties
    # ``topic`` delivery of a topic whose every subscription holds the same messages: the lead subscription's path
    # (whose messages are sent to the topic for all of them) on each other subscription's route; None elsewhere.
    covered_by: str | None = None


@dataclass(frozen=True)
class SettleOrder:
    """A recorded message the purge settles by its own means, by identity: a receive does not bring it."""

    backlog_queue: str  # the source entity
    sequence_number: int
    enqueued_ms: int
    kind: SettleKind
    session_id: str | None = None  # a deferred message of a session-enabled entity is received in its session

    @property
    def identity(self) -> tuple[int, int]:
        return self.sequence_number, self.enqueued_ms


def settle_kind(state: MessageState | str | None) -> SettleKind | None:
    """How a recorded message in ``state`` is settled, where a receive does not bring it."""
    return {MessageState.SCHEDULED: SettleKind.CANCEL_SCHEDULED,
            MessageState.DEFERRED: SettleKind.RECEIVE_DEFERRED}.get(state)


@dataclass(frozen=True)
class SessionStates:
    """What moving one source's session states did (``servicebus.session_states``)."""

    source: str
    moved: tuple[str, ...] = ()  # session ids whose state is now on the target (and cleared in the source)
    left: dict[str, str] = field(default_factory=dict)  # session id -> why its state is still in the source


@dataclass(frozen=True)
class MigrationPlan:
    """What a migration run works from, decided before its stream starts (``run.migration``): its sources and
    their routes. Picklable: it goes to the send tasks (the routes) and the source (the entities)."""

    sources: tuple[SourceEntity, ...] = ()
    routes: dict[str, Route] = field(default_factory=dict)  # by lower-case source path
    copy: bool = True  # ``migration.message_rules: copy`` (else the backlog mode's restore rules)
    scheduled_margin_seconds: float = 60.0

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(source.path for source in self.sources)

    @property
    def session_entities(self) -> frozenset[str]:
        """Lower-case paths of the sources whose messages are settled session by session."""
        return frozenset(source.path.lower() for source in self.sources if source.requires_session)

    @property
    def browse_only(self) -> frozenset[str]:
        """Lower-case paths of the sources peeked through a management-only link (``SourceEntity.browse_only``)."""
        return frozenset(source.path.lower() for source in self.sources if source.browse_only)

    @property
    def topics(self) -> tuple[str, ...]:
        """The sources that are topics themselves (what they hold of their own: their scheduled messages)."""
        return tuple(source.path for source in self.sources if source.kind is SourceKind.TOPIC)

    @property
    def partitioned(self) -> frozenset[str]:
        return frozenset(source.path.lower() for source in self.sources if source.partitioned)

    @property
    def covered(self) -> tuple[str, ...]:
        """The sources whose messages their lead subscription's send to the topic gives them again
        (``Route.covered_by``)."""
        return tuple(route.source for route in self.routes.values() if route.covered_by)

    def fan_out_groups(self) -> dict[str, tuple[str, ...]]:
        """{lead subscription's path: the paths of the subscriptions it sends for}, for each ``topic`` route of a
        topic with several subscriptions."""
        groups: dict[str, list[str]] = {}
        for route in self.routes.values():
            if route.covered_by:
                groups.setdefault(route.covered_by, []).append(route.source)
        return {lead: tuple(sorted(covered)) for lead, covered in sorted(groups.items())}

    def route(self, source: str) -> Route | None:
        return self.routes.get(source.lower())


NO_MIGRATION = MigrationPlan()
