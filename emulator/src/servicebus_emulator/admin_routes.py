"""Administration API requests -> typed routes: which operation, on which entity, which page. Pure.

Paths as ``ServiceBusAdministrationClient`` builds them (each name percent-encoded with ``safe=""``, so a
queue named ``contoso/x-servicebus-transfer/0`` arrives as one segment ``contoso%2Fx-servicebus-transfer%2F0``):

    GET    /{entity}                                   a queue or a topic
    GET    /$Resources/{queues|topics}?$skip&$top      a page of the list
    GET    /{topic}/subscriptions/{name}               a subscription
    GET    /{topic}/subscriptions?$skip&$top           a page of a topic's subscriptions
    GET    /{topic}/subscriptions/{name}/rules?$skip&$top   a page of a subscription's rules
    DELETE /{queue}                                    delete a queue (a topic: not served)
    PUT, other DELETEs, one rule, /$namespaceinfo      not served (``RouteKind.UNSUPPORTED``)

Invariants: segments are split before they are decoded; an unencoded multi-segment path that is not a
subscription path names one entity (``a/b/c``); ``$skip`` defaults to 0 and ``$top`` to 100, the SDK's page.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional
from urllib.parse import parse_qs, unquote

from .admin_views import EntityKind

DEFAULT_TOP = 100


class RouteKind(Enum):
    GET_ENTITY = "get entity"
    LIST_ENTITIES = "list entities"
    GET_SUBSCRIPTION = "get subscription"
    LIST_SUBSCRIPTIONS = "list subscriptions"
    LIST_RULES = "list rules"
    DELETE_ENTITY = "delete entity"
    UNSUPPORTED = "unsupported"


class BadRequest(ValueError):
    """A request the service would answer 400; the message says what is wrong."""


@dataclass(frozen=True)
class Route:
    kind: RouteKind
    entity: str = ""                     # the queue or topic (for subscriptions: the topic)
    subscription: str = ""
    list_kind: Optional[EntityKind] = None
    skip: int = 0
    top: int = DEFAULT_TOP
    unsupported: str = ""                # what the emulator does not do, for the error text


def route(method: str, target: str) -> Route:
    """The route of ``method`` on ``target`` (the request line's path and query)."""
    raw_path, _, query = target.partition("?")
    raw = [s for s in raw_path.split("/") if s]
    segments = [unquote(s) for s in raw]
    lower = [s.lower() for s in segments]
    if method == "PUT":
        return Route(RouteKind.UNSUPPORTED, unsupported="creating or updating entities and rules (PUT)")
    if method == "DELETE":
        if not segments or lower[0].startswith("$") or (len(lower) >= 2 and lower[1] == "subscriptions"):
            return Route(RouteKind.UNSUPPORTED, unsupported="deleting subscriptions, rules and namespace "
                                                            "resources (DELETE)")
        return Route(RouteKind.DELETE_ENTITY, entity="/".join(segments))
    if method != "GET":
        return Route(RouteKind.UNSUPPORTED, unsupported=f"the method {method}")
    if not segments:
        raise BadRequest("The request names no entity: GET /<queue or topic>, /$Resources/queues or "
                         "/$Resources/topics.")
    if lower[0] == "$namespaceinfo":
        return Route(RouteKind.UNSUPPORTED, unsupported="namespace properties ($namespaceinfo)")
    if lower[0] == "$resources":
        kinds = {"queues": EntityKind.QUEUE, "topics": EntityKind.TOPIC}
        if len(lower) != 2 or lower[1] not in kinds:
            return Route(RouteKind.UNSUPPORTED, unsupported=f"listing {'/'.join(segments[1:]) or 'nothing'} "
                                                            f"(only $Resources/queues and $Resources/topics)")
        return Route(RouteKind.LIST_ENTITIES, list_kind=kinds[lower[1]], **_page(query))
    if len(lower) >= 2 and lower[1] == "subscriptions":
        if len(lower) == 2:
            return Route(RouteKind.LIST_SUBSCRIPTIONS, entity=segments[0], **_page(query))
        if len(lower) == 3:
            return Route(RouteKind.GET_SUBSCRIPTION, entity=segments[0], subscription=segments[2])
        if lower[3] == "rules" and len(lower) == 4:
            return Route(RouteKind.LIST_RULES, entity=segments[0], subscription=segments[2], **_page(query))
        if lower[3] == "rules":
            return Route(RouteKind.UNSUPPORTED, unsupported="one subscription rule (list them instead)")
    return Route(RouteKind.GET_ENTITY, entity="/".join(segments))


def _page(query: str) -> dict:
    params = parse_qs(query)
    page = {}
    for name, key, default in (("$skip", "skip", 0), ("$top", "top", DEFAULT_TOP)):
        text = params.get(name, [str(default)])[0]
        try:
            page[key] = int(text)
        except ValueError:
            page[key] = -1
        if page[key] < 0:
            raise BadRequest(f"{name}: expected a non-negative integer, got {text!r}.")
    return page
