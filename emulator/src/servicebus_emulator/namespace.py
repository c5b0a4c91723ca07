"""A namespace: its queues, topics and subscriptions by path (with their dead-letter queues), the state
its fault switches set, and storing what a sender sends into a queue or topic. No I/O; only the loop
thread touches it (``broker`` holds each entity's messages, locks and sessions).

Invariants:
- a path resolves to the entity object registered under it; a deleted (or replaced) entity no longer
  resolves, which is how a link attached to it learns that it is gone (``exists``);
- a queue or topic numbers what it stores from its own sequencer (a partitioned one: from the
  partition's, ``partitions``), in the order of the transfer; a duplicate (duplicate detection) or a
  ping is not stored and takes no number (-1);
- an entity is made in one place per kind (``add_queue``, ``add_topic``) and stored into in one
  (``store``); partitioned entities are made and stored into there too, by their ``partitioner``.
"""
from __future__ import annotations

import socket
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Set, Tuple

from . import limits, refusals
from .config import EntitySettings
from .broker import BrokerError, Entity, Topic, any_rule_matches
from .credits import CreditKind, Credits
from .faults import Faults
from .idle import IdleTimers
from .message import PING_CONTENT_TYPE, Content
from .partitions import Partitioner, ReceiveGaps, routing_key
from .peek_pages import PeekPager
from .short_receives import ShortReceives
from .wire import Transport


def entity_path(address: Optional[str]) -> str:
    """``amqps://host:port/a/b`` -> ``a/b``; bare node paths are returned as they are."""
    addr = address or ""
    if "://" in addr:
        addr = addr.split("://", 1)[1]
        addr = addr.split("/", 1)[1] if "/" in addr else ""
    return addr.strip("/")


class Namespace:
    """One configured namespace while the emulator runs: its entities, listener, connections and switches."""

    def __init__(self, cfg, ports: Dict[Transport, int], latency_ms: float):
        self.cfg = cfg
        self.name = cfg.name
        self.host = cfg.host
        self.ports = dict(ports)                  # per transport: as configured, then as bound
        self.latency_ms = latency_ms
        self.entities: Dict[str, Entity] = {}     # receivable entities by lower-case path
        self.senders: Dict[str, Any] = {}         # send targets (queues, topics) by lower-case path
        self.listeners: Dict[Transport, socket.socket] = {}
        self.accepted: Counter = Counter()             # connections taken per transport (its value)
        self.conns: set = set()
        self.busy_all = False
        self.refusing = False
        self.busy_entities: set = set()
        self.refusals: Dict[Optional[str], str] = {}   # lower-case path (None = every entity) -> mode
        self.deleted: Dict[str, Any] = {}              # lower-case name -> settings of a deleted queue
        self.faults = Faults()
        self.auth_counts: Counter = Counter()          # put-tokens taken (sas, jwt) and refused
        self.role_assignments = list(cfg.azure_ad.role_assignments) if cfg.azure_ad else []
        self.settings = cfg.service
        self.pager = PeekPager(cfg.service)
        self.receive_gaps = ReceiveGaps(cfg.service.receive_empty_probability, cfg.service.receive_seed)
        self.short_receives = ShortReceives(cfg.service.short_receive_probability, cfg.service.receive_seed)
        self.credits = Credits(cfg.service.credits_per_second)
        self.admitted_connections = 0                  # connections opened within the quota (max_connections)
        self.refused_connections = 0
        self.next_sweep = time.monotonic() + cfg.service.expiry_sweep_seconds   # expired messages' next collection
        self.starved: set = set()                      # entities whose receivers wait for credits
        self.paused: set = set()                       # receive links in a short receive's pause
        self.idle = IdleTimers.of(cfg.service)
        self.idle_counts: Counter = Counter()          # links detached and connections closed for idleness
        for q in cfg.queues:
            self.add_queue(q)
        for t in cfg.topics:
            self.add_topic(t)

    @property
    def port(self) -> int:
        """The plain AMQP port (what a ``UseDevelopmentEmulator=true`` connection string names)."""
        return self.ports[Transport.AMQP]

    def add_queue(self, qcfg) -> Entity:
        key = qcfg.name.lower()
        if key in self.senders or key in self.entities:
            raise ValueError(f"an entity named {qcfg.name!r} already exists in namespace {self.name!r}")
        partitions = self.partitions_of(qcfg)
        e = Entity(qcfg.name, qcfg, partitions=partitions)    # a new Entity: its own numbering, from 1
        if partitions:
            e.partitioner = Partitioner(partitions, qcfg.duplicate_detection_window_seconds > 0)
        self._register(e)
        self.senders[key] = e
        return e

    def queue(self, name: str) -> Optional[Entity]:
        target = self.senders.get(name.lower())
        return target if isinstance(target, Entity) else None

    def remove_queue(self, name: str) -> Entity:
        """Forget a queue and its dead-letter sub-queue (their messages go with them)."""
        e = self.queue(name)
        if e is None:
            raise KeyError(f"no queue {name!r} in namespace {self.name!r}")
        key = name.lower()
        del self.senders[key]
        for path in (key, key + "/$deadletterqueue", key + "/$transfer/$deadletterqueue"):
            del self.entities[path]
        self.deleted[key] = e.settings        # what recreate_queue starts from
        return e

    def partitions_of(self, cfg) -> int:
        """How many partitions a queue or topic of these settings has here: the namespace's (Premium), else
        16 when it enables partitioning, else none (0)."""
        if self.settings.partitions:
            return self.settings.partitions
        return limits.STANDARD_PARTITIONS if getattr(cfg, "enable_partitioning", False) else 0

    def add_topic(self, tcfg) -> Topic:
        subs, filters = [], {}
        partitions = self.partitions_of(tcfg)
        for s in tcfg.subscriptions:
            e = Entity(f"{tcfg.name}/Subscriptions/{s.name}", s, partitions=partitions)
            subs.append(e)
            filters[e.path] = tuple(r.correlation_filter for r in s.rules)
            self._register(e)
        t = Topic(tcfg, subs, filters, partitions=partitions,
                  held_settings=EntitySettings(tcfg.name, max_message_size_kb=tcfg.max_message_size_kb,
                                               status=tcfg.status))
        for e in subs:
            e.topic = t
        t.held.on_activate = lambda content, now: fan_out(t, content, next_number(t, content), now)
        self.senders[tcfg.name.lower()] = t
        return t

    def _register(self, e: Entity):
        key = e.path.lower()
        self.entities[key] = e
        self.entities[key + "/$deadletterqueue"] = e.dlq
        self.entities[key + "/$transfer/$deadletterqueue"] = e.dlq

    def is_busy(self, path: str) -> bool:
        if self.busy_all:
            return True
        if not self.busy_entities:
            return False
        p = path.lower()
        return any(p == b or p.startswith(b + "/") for b in self.busy_entities)

    def load_refusal(self, kind: CreditKind, path: str) -> Optional[BrokerError]:
        """Why the namespace refuses an operation of ``kind`` on ``path`` under load, or None: a test's
        ``server-busy`` switch, or no credits left this second (``credits``)."""
        busy = refusals.busy_refusal(self, path)
        if busy is not None:
            self.credits.throttled[kind.value] += 1
            return busy
        if not self.credits.admit(kind, time.monotonic()):
            return refusals.throttled(self, path)
        return None

    def spend(self, kind: CreditKind, cost: int) -> None:
        """An operation of ``kind`` was served: its cost in credits."""
        self.credits.spend(kind, cost, time.monotonic())

    def exists(self, target) -> bool:
        """False for an entity deleted (or replaced) since a link was attached to it."""
        return self.entities.get(target.path.lower(), self.senders.get(target.path.lower())) is target

    def send_refusal(self, path: str) -> Optional[BrokerError]:
        """The refusal a ``set_unavailable`` send mode (quota-exceeded, throttled) answers sends with, or None."""
        mode = self.refusals.get(path.lower(), self.refusals.get(None))
        if mode is None:
            return None
        condition, description, status = refusals.SEND_REFUSALS[mode]
        return BrokerError(condition, self.described(description.format(path=f"{self.name}/{path}"), path), status)

    def described(self, text: str, path: str) -> str:
        """A status description as the service writes them: the text, then where and when."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{text} TrackingId:{uuid.uuid4().hex}, SystemTracker:{self.name}:{path}, Timestamp:{stamp}"

    def all_entities(self):
        """Every entity that holds messages: the receivable ones, and each topic's log of scheduled messages."""
        seen = set()
        for e in self.entities.values():
            if id(e) not in seen:
                seen.add(id(e))
                yield e
        for target in self.senders.values():
            if isinstance(target, Topic) and target.held is not None:
                yield target.held


def store(target, contents: List[Content], now: int, *, batch: bool = False) -> Tuple[List[int], Set[Entity]]:
    """Store one transfer's messages in a queue or topic (already found acceptable): their sequence numbers
    (-1 = not stored), and the entities that got messages, whose receivers are to be served. A ``batch``
    goes to one partition of a partitioned entity, the one its first message chooses."""
    seqs: List[int] = []
    touched: Set[Entity] = set()
    partitioner = target.partitioner
    partition = partitioner.choose(contents[0]) if partitioner is not None and batch and contents else None
    for content in contents:
        if content.content_type == PING_CONTENT_TYPE:
            target.counters["pings"] += 1
            seqs.append(-1)
            continue
        if target.dedupe.is_duplicate(content.message_id, now, partitioned=partitioner is not None,
                                      partition_key=routing_key(content) if partitioner is not None else None):
            target.counters["duplicates"] += 1
            seqs.append(-1)
            continue
        seq = next_number(target, content, partition)
        seqs.append(seq)
        if isinstance(target, Topic):
            target.counters["in"] += 1
            if content.scheduled_ms and content.scheduled_ms > now and target.held is not None:
                target.held.enqueue(content, seq, now)   # in the topic's own log until its time
                continue
            touched |= fan_out(target, content, seq, now)
        else:
            target.enqueue(content, seq, now)
            touched.add(target)
    return seqs, touched


def next_number(target, content: Content, partition: Optional[int] = None) -> int:
    """The next sequence number of a queue or topic (a partitioned one's: of ``partition``, else the one the
    message's keys choose)."""
    partitioner = target.partitioner
    if partitioner is None:
        return target.sequencer.next()
    return partitioner.next(partition if partition is not None else partitioner.choose(content))


def fan_out(topic: Topic, content: Content, seq: int, now: int) -> Set[Entity]:
    """A topic's copy of the message in each subscription a rule of which matches it; the entities touched."""
    touched: Set[Entity] = set()
    for sub in topic.subscriptions:
        if any_rule_matches(topic.filters[sub.path], content):
            if sub.requires_session and content.session_id is None:   # the service's answer
                sub.dead_letter(sub.enqueue(content, seq, now), *refusals.SESSIONLESS_COPY)
                touched.add(sub.dlq)
                continue
            sub.enqueue(content, seq, now)
            touched.add(sub)
    return touched


def not_found(ns: Namespace, path: str) -> BrokerError:
    return BrokerError("amqp:not-found", f"The messaging entity '{ns.name}/{path}' could not be found.", 404)
