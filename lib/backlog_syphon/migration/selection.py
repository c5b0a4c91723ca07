"""Which entities of the source namespace a migration run reads: ``migration.entities`` (names and shell
patterns) over what its administration API lists, less ``migration.exclude``. Pure.

Every candidate is an entity path as the SDK addresses it: a queue (``orders``), a topic (``events``: what
it holds of its own are its scheduled messages), a subscription (``events/Subscriptions/audit``), and the
dead-letter sub-queue of a queue or subscription (``orders/$DeadLetterQueue``).

Invariants:
- names and patterns match case-insensitively, as Service Bus names do;
- a dead-letter sub-queue is selected only by a name or pattern that says ``$DeadLetterQueue``: ``*`` alone
  means the entities, not what was dead-lettered in them;
- the backlog mode's queues (``x-servicebus-transfer``) are never matched by a pattern;
- a name the listing lacks, or a pattern that matches nothing, is an error: a typo must not look like an
  empty entity.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Iterable

from backlog_syphon.errors import SettingsError
from backlog_syphon.model import EntityKind, NamespaceListing, SourceEntity, SourceKind
from backlog_syphon.model.migration import SUBSCRIPTIONS_SEGMENT
from backlog_syphon.restore.queue_names import BACKLOG_QUEUE_SEGMENT, DEAD_LETTER_SUBQUEUE, dead_letter_queue_name

PATTERN_CHARACTERS = frozenset("*?[")


class SelectionError(SettingsError):
    """``migration.entities`` or ``migration.exclude`` names what the source does not list."""


def subscription_path(topic: str, subscription: str) -> str:
    return f"{topic}/{SUBSCRIPTIONS_SEGMENT}/{subscription}"


def candidates(listing: NamespaceListing) -> list[SourceEntity]:
    """Every entity the listing makes readable, with its dead-letter sub-queues, in listing order."""
    found: list[SourceEntity] = []
    for entity in listing.entities:
        if entity.kind is EntityKind.QUEUE:
            queue = SourceEntity(entity.name, SourceKind.QUEUE, entity.requires_session, entity.partitioned)
            found += [queue, _dead_letters_of(queue)]
            continue
        found.append(SourceEntity(entity.name, SourceKind.TOPIC, False, entity.partitioned, topic=entity.name))
        for listed in entity.subscriptions:
            subscription = SourceEntity(subscription_path(entity.name, listed.name), SourceKind.SUBSCRIPTION,
                                        listed.requires_session, entity.partitioned, topic=entity.name,
                                        subscription=listed.name)
            found += [subscription, _dead_letters_of(subscription)]
    return found


def _dead_letters_of(entity: SourceEntity) -> SourceEntity:
    # A dead-letter sub-queue takes a receive link without a session, and is partitioned as its entity is.
    return SourceEntity(dead_letter_queue_name(entity.path), SourceKind.DEAD_LETTERS, False, entity.partitioned,
                        topic=entity.topic, subscription=entity.subscription, owner=entity.path)


def is_pattern(text: str) -> bool:
    return any(character in PATTERN_CHARACTERS for character in text)


def matches(pattern: str, entity: SourceEntity) -> bool:
    """Whether ``pattern`` (a name or shell pattern) selects ``entity``."""
    path, wanted = entity.path.lower(), pattern.lower()
    if not is_pattern(pattern):
        return path == wanted
    if entity.kind is SourceKind.DEAD_LETTERS and DEAD_LETTER_SUBQUEUE.lower() not in wanted:
        return False
    if BACKLOG_QUEUE_SEGMENT in path:
        return False
    return fnmatchcase(path, wanted)


def select_sources(listing: NamespaceListing, entities: Iterable[str], exclude: Iterable[str] = ()) -> list[SourceEntity]:
    """The sources ``entities`` selects, less what ``exclude`` names, sorted by path; ``SelectionError`` (one
    line) for a name or pattern that matches nothing."""
    known = candidates(listing)
    selected: dict[str, SourceEntity] = {}
    for pattern in entities:
        found = [entity for entity in known if matches(pattern, entity)]
        if not found:
            raise SelectionError(_nothing_matches("migration.entities", pattern, known))
        selected.update((entity.path.lower(), entity) for entity in found)
    for pattern in exclude:
        found = [entity for entity in known if matches(pattern, entity)]
        if not found:
            raise SelectionError(_nothing_matches("migration.exclude", pattern, known))
        for entity in found:
            selected.pop(entity.path.lower(), None)
    if not selected:
        raise SelectionError("migration.entities selects nothing once migration.exclude is applied: name at least one "
                             "entity to drain")
    return sorted(selected.values(), key=lambda entity: entity.path.lower())


def _nothing_matches(key: str, pattern: str, known: list[SourceEntity]) -> str:
    what = "pattern" if is_pattern(pattern) else "name"
    shown = ", ".join(entity.path for entity in known if entity.kind is not SourceKind.DEAD_LETTERS)[:300]
    hint = ("; a dead-letter sub-queue is selected by a name or pattern that says $DeadLetterQueue"
            if DEAD_LETTER_SUBQUEUE.lower() not in pattern.lower() and is_pattern(pattern) else "")
    return (f"{key}: the {what} {pattern!r} matches no entity the source namespace lists (it lists {shown or 'none'})"
            f"{hint}")


def dead_letter_sources_of(sources: Iterable[SourceEntity], exclude: Iterable[str] = ()) -> list[SourceEntity]:
    """The dead-letter sub-queues of the selected queues and subscriptions, less those ``exclude`` names: what a
    re-drive of what the migration dead-lettered reads (``run.source: dead_letters`` with a ``migration``
    section)."""
    exclude = list(exclude)
    found = [_dead_letters_of(entity) for entity in sources
             if entity.kind in (SourceKind.QUEUE, SourceKind.SUBSCRIPTION)]
    return [entity for entity in found if not any(matches(pattern, entity) for pattern in exclude)]
