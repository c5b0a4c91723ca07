"""The administration API's documents: ATOM entries and feeds holding ``QueueDescription``,
``TopicDescription``, ``SubscriptionDescription`` and ``RuleDescription`` (https://learn.microsoft.com/rest/api/servicebus/),
the empty feed the service answers for an entity that does not exist, and its ``<Error>`` body. Pure.

Invariants:
- element names, namespaces and order follow what the service sends, so any ATOM reader (not only the
  Python SDK's) parses them: the description in the Service Bus connect namespace, the counts in the
  2011/06 namespace (prefix ``d2p1``);
- durations are .NET ``TimeSpan`` ISO-8601 texts (``PT1M``, ``P1DT2H``); "never" (no TTL, no auto-delete)
  is ``TimeSpan.MaxValue``, ``P10675199DT2H48M5.4775807S``; times are UTC with milliseconds and ``Z``;
- every text taken from an entity name is XML-escaped.
"""
from __future__ import annotations

import datetime
from typing import List, Optional, Sequence
from xml.sax.saxutils import escape, quoteattr

from .admin_views import EntityKind, EntityView, RuleView

ATOM_NS = "http://www.w3.org/2005/Atom"
CONNECT_NS = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
COUNTS_NS = "http://schemas.microsoft.com/netservices/2011/06/servicebus"
INSTANCE_NS = "http://www.w3.org/2001/XMLSchema-instance"
API_VERSION = "2024-05"                  # what azure-servicebus 7.15.0 asks for
NEVER = "P10675199DT2H48M5.4775807S"      # TimeSpan.MaxValue
TICKS_PER_SECOND = 10_000_000
DEFAULT_DUPLICATE_WINDOW = "PT10M"        # what the service reports when duplicate detection is off
MAX_SIZE_IN_MEGABYTES = 1024              # the service's default; the emulator sets no entity size quota
XML_DECLARATION = '<?xml version="1.0" encoding="utf-8"?>'
FEED_TITLES = {EntityKind.QUEUE: "Queues", EntityKind.TOPIC: "Topics", EntityKind.SUBSCRIPTION: "Subscriptions"}


def iso_duration(seconds: float) -> str:
    """Seconds as .NET writes a TimeSpan (``XmlConvert.ToString``): ``PT30S``, ``PT1M``, ``P1DT12H``,
    ``PT0.5S``; 0 is ``PT0S``."""
    ticks = round(seconds * TICKS_PER_SECOND)
    days, ticks = divmod(ticks, 86400 * TICKS_PER_SECOND)
    hours, ticks = divmod(ticks, 3600 * TICKS_PER_SECOND)
    minutes, ticks = divmod(ticks, 60 * TICKS_PER_SECOND)
    whole, fraction = divmod(ticks, TICKS_PER_SECOND)
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if fraction:
        clock += f"{whole}.{fraction:07d}".rstrip("0") + "S"
    elif whole:
        clock += f"{whole}S"
    text = "P" + (f"{days}D" if days else "")
    if clock or not days:
        text += "T" + (clock or "0S")
    return text


def iso_time(ms: int) -> str:
    stamp = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def entry(view: EntityView, base_url: str, namespace: str, *, in_feed: Optional[str] = None) -> str:
    """One ``<entry>``; ``in_feed`` is the feed's URL when the entry is part of one (its ``xml:base``)."""
    url = f"{base_url}/{view.path}?api-version={API_VERSION}"
    created = iso_time(view.created_ms)
    base = f" xml:base={quoteattr(in_feed)}" if in_feed else ""
    author = f"<author><name>{escape(namespace)}</name></author>" if view.kind is not EntityKind.SUBSCRIPTION else ""
    return (f'<entry xmlns="{ATOM_NS}"{base}><id>{escape(url)}</id><title type="text">{escape(view.name)}</title>'
            f"<published>{created}</published><updated>{created}</updated>{author}"
            f'<link rel="self" href={quoteattr(url)}/><content type="application/xml">{_description(view)}'
            f"</content></entry>")


def entry_document(view: EntityView, base_url: str, namespace: str) -> bytes:
    return (XML_DECLARATION + entry(view, base_url, namespace)).encode()


def feed_document(kind: EntityKind, views: Sequence[EntityView], self_url: str, next_url: Optional[str],
                  base_url: str, namespace: str, now_ms: int) -> bytes:
    """A page of a list: the entries, a ``self`` link and, when more entities follow, a ``next`` link
    (the SDKs page on as long as there is one)."""
    links = [f'<link rel="self" href={quoteattr(self_url)}/>']
    if next_url:
        links.append(f'<link rel="next" href={quoteattr(next_url)}/>')
    entries = "".join(entry(v, base_url, namespace, in_feed=self_url) for v in views)
    return (f'{XML_DECLARATION}<feed xmlns="{ATOM_NS}"><title type="text">{FEED_TITLES[kind]}</title>'
            f"<id>{escape(self_url)}</id><updated>{iso_time(now_ms)}</updated>{''.join(links)}{entries}"
            f"</feed>").encode()


# A correlation filter's system fields (the emulator's configuration keys) and their elements, in the service's order.
CORRELATION_FIELDS = (("correlation_id", "CorrelationId"), ("message_id", "MessageId"), ("to", "To"),
                      ("reply_to", "ReplyTo"), ("label", "Label"), ("subject", "Label"), ("session_id", "SessionId"),
                      ("reply_to_session_id", "ReplyToSessionId"), ("content_type", "ContentType"))
XML_SCHEMA_NS = "http://www.w3.org/2001/XMLSchema"


def rule_feed_document(rules: Sequence[RuleView], self_url: str, next_url: Optional[str], now_ms: int) -> bytes:
    """A page of a subscription's rules: one ``RuleDescription`` entry per rule (its filter a ``CorrelationFilter``
    with ``KeyValueOfstringanyType`` properties, or a ``TrueFilter``; its action empty), as the SDK's
    ``list_rules`` reads them."""
    links = [f'<link rel="self" href={quoteattr(self_url)}/>']
    if next_url:
        links.append(f'<link rel="next" href={quoteattr(next_url)}/>')
    entries = "".join(_rule_entry(rule, self_url) for rule in rules)
    return (f'{XML_DECLARATION}<feed xmlns="{ATOM_NS}"><title type="text">Rules</title>'
            f"<id>{escape(self_url)}</id><updated>{iso_time(now_ms)}</updated>{''.join(links)}{entries}"
            f"</feed>").encode()


def _rule_entry(rule: RuleView, feed_url: str) -> str:
    created = iso_time(rule.created_ms)
    flt = rule.correlation_filter
    if flt:
        fields = [_field(element, flt[key]) for key, element in CORRELATION_FIELDS if flt.get(key) is not None]
        properties = "".join(
            f"<KeyValueOfstringanyType><Key>{escape(str(name))}</Key><Value xmlns:d6p1=\"{XML_SCHEMA_NS}\" "
            f"i:type=\"d6p1:{_xml_type(value)}\">{escape(_xml_text(value))}</Value></KeyValueOfstringanyType>"
            for name, value in (flt.get("properties") or {}).items())
        filter_xml = f'<Filter i:type="CorrelationFilter">{"".join(fields)}<Properties>{properties}</Properties></Filter>'
    else:
        filter_xml = ('<Filter i:type="TrueFilter"><SqlExpression>1=1</SqlExpression>'
                      '<CompatibilityLevel>20</CompatibilityLevel></Filter>')
    description = (f'<RuleDescription xmlns="{CONNECT_NS}" xmlns:i="{INSTANCE_NS}">{filter_xml}'
                   f'<Action i:type="EmptyRuleAction"/>{_field("CreatedAt", created)}{_field("Name", rule.name)}'
                   f"</RuleDescription>")
    return (f'<entry xmlns="{ATOM_NS}" xml:base={quoteattr(feed_url)}><id>{escape(feed_url)}</id>'
            f'<title type="text">{escape(rule.name)}</title><published>{created}</published>'
            f'<updated>{created}</updated><content type="application/xml">{description}</content></entry>')


def _xml_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    return "string"


def _xml_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def not_found_document(self_url: str, now_ms: int) -> bytes:
    """What the service answers (200) for a GET of an entity that does not exist: an empty feed."""
    return (f'{XML_DECLARATION}<feed xmlns="{ATOM_NS}"><title type="text">Publicly Listed Services</title>'
            f'<subtitle type="text">This is the list of publicly-listed services currently available.</subtitle>'
            f"<id>{escape(self_url)}</id><updated>{iso_time(now_ms)}</updated>"
            f"<generator>servicebus-emulator</generator></feed>").encode()


def error_document(code: int, detail: str) -> bytes:
    return f"<Error><Code>{code}</Code><Detail>{escape(detail)}</Detail></Error>".encode()


def _description(view: EntityView) -> str:
    s = view.settings
    if view.kind is EntityKind.TOPIC:
        return _element("TopicDescription", [
            _field("DefaultMessageTimeToLive", NEVER), _field("MaxSizeInMegabytes", MAX_SIZE_IN_MEGABYTES),
            *_duplicate_detection(s), _field("EnableBatchedOperations", True),
            _field("SizeInBytes", view.size_in_bytes), _field("FilteringMessagesBeforePublishing", False),
            _field("IsAnonymousAccessible", False), _field("AuthorizationRules", None), _field("Status", view.status),
            _times(view), _field("SupportOrdering", True), _counts(view),
            _field("SubscriptionCount", view.subscription_count), _field("AutoDeleteOnIdle", NEVER),
            _field("EnablePartitioning", view.enable_partitioning), _field("EntityAvailabilityStatus", "Available"),
            _field("EnableSubscriptionPartitioning", False), _field("EnableExpress", False),
            _field("MaxMessageSizeInKilobytes", s.max_message_size_kb)])
    if view.kind is EntityKind.SUBSCRIPTION:
        return _element("SubscriptionDescription", [
            _field("LockDuration", iso_duration(s.lock_duration_seconds)), _field("RequiresSession", s.requires_session),
            _field("DefaultMessageTimeToLive", _ttl(s)),
            _field("DeadLetteringOnMessageExpiration", s.dead_lettering_on_message_expiration),
            _field("DeadLetteringOnFilterEvaluationExceptions", True), _field("MessageCount", view.counts.total),
            _field("MaxDeliveryCount", s.max_delivery_count), _field("EnableBatchedOperations", True),
            _field("Status", view.status), _times(view), _counts(view), _field("AutoDeleteOnIdle", NEVER),
            _field("EntityAvailabilityStatus", "Available")])
    requires_duplicate_detection, duplicate_window = _duplicate_detection(s)
    return _element("QueueDescription", [
        _field("LockDuration", iso_duration(s.lock_duration_seconds)), _field("MaxSizeInMegabytes", MAX_SIZE_IN_MEGABYTES),
        requires_duplicate_detection, _field("RequiresSession", s.requires_session),
        _field("DefaultMessageTimeToLive", _ttl(s)),
        _field("DeadLetteringOnMessageExpiration", s.dead_lettering_on_message_expiration), duplicate_window,
        _field("MaxDeliveryCount", s.max_delivery_count), _field("EnableBatchedOperations", True),
        _field("SizeInBytes", view.size_in_bytes), _field("MessageCount", view.counts.total),
        _field("IsAnonymousAccessible", False), _field("AuthorizationRules", None), _field("Status", view.status),
        _times(view), _field("SupportOrdering", True), _counts(view), _field("AutoDeleteOnIdle", NEVER),
        _field("EnablePartitioning", view.enable_partitioning), _field("EntityAvailabilityStatus", "Available"),
        _field("EnableExpress", False), _field("MaxMessageSizeInKilobytes", s.max_message_size_kb)])


def _element(name: str, fields: List[str]) -> str:
    return f'<{name} xmlns="{CONNECT_NS}" xmlns:i="{INSTANCE_NS}">{"".join(fields)}</{name}>'


def _field(tag: str, value) -> str:
    """``<Tag>value</Tag>``: booleans as ``true``/``false``; None as an empty element."""
    if value is None:
        return f"<{tag}/>"
    text = ("true" if value else "false") if isinstance(value, bool) else escape(str(value))
    return f"<{tag}>{text}</{tag}>"


def _times(view: EntityView) -> str:
    # entities are never updated in place (a recreated queue is a new entity): updated = created
    created = iso_time(view.created_ms)
    return (_field("CreatedAt", created) + _field("UpdatedAt", created)
            + _field("AccessedAt", iso_time(view.accessed_ms)))


def _duplicate_detection(settings) -> List[str]:
    window = settings.duplicate_detection_window_seconds
    return [_field("RequiresDuplicateDetection", window > 0),
            _field("DuplicateDetectionHistoryTimeWindow",
                   iso_duration(window) if window > 0 else DEFAULT_DUPLICATE_WINDOW)]


def _ttl(settings) -> str:
    ttl = settings.default_message_ttl_seconds
    return iso_duration(ttl) if ttl > 0 else NEVER


def _counts(view: EntityView) -> str:
    c = view.counts
    values = (("ActiveMessageCount", c.active), ("DeadLetterMessageCount", c.dead_letter),
              ("ScheduledMessageCount", c.scheduled), ("TransferMessageCount", c.transfer),
              ("TransferDeadLetterMessageCount", c.transfer_dead_letter))
    inner = "".join(f"<d2p1:{tag}>{n}</d2p1:{tag}>" for tag, n in values)
    return f'<CountDetails xmlns:d2p1="{COUNTS_NS}">{inner}</CountDetails>'
