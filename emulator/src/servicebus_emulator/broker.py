"""Broker state: entities (queues, subscriptions, dead-letter queues, topics), their messages, locks and
sessions. No I/O; the loop drives it from one thread (``message`` holds a message itself).

Invariants:
- sequence numbers are assigned once per queue/topic, increase monotonically and are never reused
  (a deleted and recreated queue is a new Entity, numbering from 1 as Service Bus does); a
  dead-lettered message keeps its sequence number in the dead-letter sub-queue; a scheduled message gets
  a new one when it becomes active, "as if it had been enqueued at the current instant" (message sequencing);
- a topic holds its scheduled messages in a log of its own (``Topic.held``), peeked and cancelled through the
  topic's ``$management``, in no subscription before their time; then they fan out, with new numbers;
- a message is in exactly one state (active, locked, deferred, scheduled) while it exists;
- a partitioned entity numbers each partition apart (``partitions``); its ``order`` is still one sorted
  list, partition after partition, and each partition has its own availability heap;
- every per-operation lookup is O(log n) or amortised O(1): ``order`` is a sorted list of sequence
  numbers with lazy deletion (peek is a bisect), availability is a heap, locks are a dict.
"""
from __future__ import annotations

import heapq
import time
import uuid
from bisect import bisect_left, insort
from collections import Counter, OrderedDict
from typing import Any, Dict, List, Optional

from . import codec
from .codec import APPLICATION_PROPERTIES
from .message import ACTIVE, DEFERRED, LOCKED, SCHEDULED, Content, Msg
from .dedupe import Deduper
from .partitions import PARTITION_SHIFT, Partitioner, partition_of

DEAD_LETTER_PROPERTIES = ("DeadLetterReason", "DeadLetterErrorDescription")


def now_ms() -> int:
    return int(time.time() * 1000)


class BrokerError(Exception):
    """An operation failed with an AMQP condition (mapped to an SDK exception by the client)."""

    def __init__(self, condition: str, description: str, status: int = 400):
        super().__init__(description)
        self.condition, self.description, self.status = condition, description, status


def lock_lost(token) -> BrokerError:
    return BrokerError("com.microsoft:message-lock-lost",
                       f"The lock supplied ({token}) is invalid: it expired, or the message was already "
                       f"settled or removed.", 410)


class Session:
    __slots__ = ("id", "state", "owner", "locked_until", "avail", "count", "updated_ms")

    def __init__(self, sid: str):
        self.id, self.state, self.owner, self.locked_until = sid, None, None, 0
        self.avail: List[int] = []
        self.count = 0
        self.updated_ms = now_ms()


class Entity:
    """A queue, a subscription or a dead-letter sub-queue: something messages are received from."""

    def __init__(self, path: str, settings, *, sequencer=None, parent: Optional["Entity"] = None,
                 partitions: int = 0):
        self.path = path                     # display path, e.g. "events/Subscriptions/eu"
        self.settings = settings
        self.is_dlq = is_dlq = parent is not None
        self.parent = parent                 # the entity a dead-letter queue belongs to
        self.topic: Optional["Topic"] = None     # a subscription's topic (set by the namespace)
        self.status = settings.status        # an EntityStatus; a dead-letter queue follows its parent's
        self.requires_session = settings.requires_session and not is_dlq
        self.sequencer = sequencer if sequencer is not None else Sequencer()
        self.partitions = partitions         # 0: one ordered log; else its partitions (``partitions``)
        self.part_avail: List[List[int]] = [[] for _ in range(partitions)]   # per partition, as ``avail``
        self._next_partition = 0             # where the next receive starts looking (round robin)
        self.partitioner: Optional[Partitioner] = None     # a partitioned queue's (set by the namespace)
        self.msgs: Dict[int, Msg] = {}
        self.order: List[int] = []           # sorted sequence numbers, lazily pruned
        self._order_dead = 0
        self.avail: List[int] = []           # heap of active sequence numbers (non-session entities)
        self.sessions: Dict[str, Session] = OrderedDict()
        self.locks: Dict[uuid.UUID, Msg] = {}
        self.lock_heap: List = []
        self.sched_heap: List = []
        self.expiry_heap: List = []
        self.consumers: List = []            # server-side sender links (set by the server)
        self.session_waiters: List = []      # pending next-available session attaches
        self.counters: Counter = Counter()
        self.ops: Counter = Counter()
        self.dlq: Optional[Entity] = None
        if not is_dlq:
            self.dlq = Entity(path + "/$DeadLetterQueue", settings, parent=self, partitions=partitions)
        self.dedupe = Deduper(getattr(settings, "duplicate_detection_window_seconds", 0))
        # what the administration API reports: when it was made, and last sent to or received from
        self.created_ms = self.accessed_ms = now_ms()
        # Where a scheduled message goes when it becomes active, instead of becoming active here: a topic's log
        # hands it to the topic to fan out (``Topic``); None: it becomes active here, under a new number.
        self.on_activate = None
        self.touched_elsewhere: set = set()     # entities an activation fanned out to: their receivers are served

    # ---- storage --------------------------------------------------------------------------------
    def _store(self, m: Msg):
        self.msgs[m.seq] = m
        if not self.order or m.seq > self.order[-1]:
            self.order.append(m.seq)
        else:
            insort(self.order, m.seq)
        if m.session is not None and self.requires_session:
            self.session(m.session).count += 1

    def _remove(self, m: Msg):
        del self.msgs[m.seq]
        if m.lock_token is not None:
            self.locks.pop(m.lock_token, None)
            m.lock_token = None
        if m.session is not None and self.requires_session:
            s = self.sessions.get(m.session)
            if s is not None:
                s.count -= 1
        self._order_dead += 1
        if self._order_dead > 1024 and self._order_dead * 2 > len(self.order):
            self.order = [s for s in self.order if s in self.msgs]
            self._order_dead = 0

    def session(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = Session(sid)
        return s

    def enqueue(self, content: Content, seq: int, now: int) -> Msg:
        m = Msg(content, seq, now)
        if self.partitions:
            m.partition = partition_of(seq)
        self.counters["in"] += 1
        self.accessed_ms = now
        self._store(m)
        if content.scheduled_ms and content.scheduled_ms > now:
            m.state = SCHEDULED
            heapq.heappush(self.sched_heap, (content.scheduled_ms, seq))
        else:
            self._start_ttl(m, now)
            self._make_available(m)
        return m

    def _start_ttl(self, m: Msg, now: int):
        ttl = m.content.ttl or 0
        default = int(getattr(self.settings, "default_message_ttl_seconds", 0) * 1000)
        if default and (not ttl or default < ttl):
            ttl = default
        if ttl and not self.is_dlq:
            m.expires_ms = now + ttl
            heapq.heappush(self.expiry_heap, (m.expires_ms, m.seq))

    def _make_available(self, m: Msg):
        m.state = ACTIVE
        m.lock_owner = None
        if m.lock_token is not None:
            self.locks.pop(m.lock_token, None)
            m.lock_token = None
        if m.was_deferred:
            m.state = DEFERRED
            return
        if self.requires_session and m.session is not None:
            heapq.heappush(self.session(m.session).avail, m.seq)
        elif self.partitions:
            heapq.heappush(self.part_avail[partition_of(m.seq)], m.seq)
        else:
            heapq.heappush(self.avail, m.seq)

    # ---- receiving ------------------------------------------------------------------------------
    def next_available(self, session: Optional[Session] = None) -> Optional[Msg]:
        if session is None and self.partitions:
            return self._next_across_partitions()
        return self._next_in(session.avail if session is not None else self.avail)

    def _next_across_partitions(self) -> Optional[Msg]:
        """The oldest available message of the next partition that has one, in turn: receives interleave
        the partitions, as a partitioned entity's gateway takes the first message any partition yields."""
        for step in range(self.partitions):
            p = (self._next_partition + step) % self.partitions
            m = self._next_in(self.part_avail[p])
            if m is not None:
                self._next_partition = (p + 1) % self.partitions
                return m
        return None

    def _next_in(self, heap: List[int]) -> Optional[Msg]:
        now = None
        while heap:
            m = self.msgs.get(heapq.heappop(heap))
            if m is None or m.state != ACTIVE:
                continue
            if m.expires_ms is not None:
                now = now or now_ms()
                if m.expires_ms <= now:
                    self.expire(m)
                    continue
            return m
        return None

    def has_available(self, session: Optional[Session] = None) -> bool:
        if session is None and self.partitions:
            return any(self._heap_has_available(h) for h in self.part_avail)
        return self._heap_has_available(session.avail if session is not None else self.avail)

    def _heap_has_available(self, heap: List[int]) -> bool:
        while heap:
            m = self.msgs.get(heap[0])
            if m is not None and m.state == ACTIVE:
                return True
            heapq.heappop(heap)
        return False

    def lock(self, m: Msg, owner, now: int, session: Optional[Session] = None) -> uuid.UUID:
        m.state = LOCKED
        m.lock_owner = owner
        m.lock_token = uuid.uuid4()
        self.locks[m.lock_token] = m
        if session is not None:
            m.locked_until = session.locked_until
        else:
            m.locked_until = now + int(self.settings.lock_duration_seconds * 1000)
            heapq.heappush(self.lock_heap, (m.locked_until, m.seq, m.lock_token))
        self.counters["out"] += 1
        self.accessed_ms = now
        return m.lock_token

    def take(self, m: Msg):
        """Receive-and-delete."""
        self.counters["out"] += 1
        self.accessed_ms = now_ms()
        self._remove(m)

    def locked(self, token: uuid.UUID, owner=None) -> Msg:
        m = self.locks.get(token)
        if m is None or (owner is not None and m.lock_owner is not owner):
            raise lock_lost(token)
        return m

    def complete(self, m: Msg):
        self.counters["completed"] += 1
        self._remove(m)

    def abandon(self, m: Msg, *, count: bool = True):
        """Abandon (count=True) or release (count=False) a locked message."""
        if count:
            m.delivery_count += 1
            if m.delivery_count >= self.settings.max_delivery_count and not self.is_dlq:
                self.dead_letter(m, "MaxDeliveryCountExceeded",
                                 f"Message could not be consumed after {self.settings.max_delivery_count} "
                                 f"delivery attempts.")
                return
        if m.expires_ms is not None and m.expires_ms <= now_ms():
            self.expire(m)
            return
        self._make_available(m)

    def defer(self, m: Msg):
        self.counters["deferred"] += 1
        self.locks.pop(m.lock_token, None)
        m.lock_token, m.lock_owner, m.state, m.was_deferred = None, None, DEFERRED, True

    def dead_letter(self, m: Msg, reason: Optional[str], description: Optional[str]):
        if self.dlq is None:
            raise BrokerError("amqp:not-allowed", "Messages in a dead-letter queue cannot be dead-lettered.")
        self.counters["dead_lettered"] += 1
        self._remove(m)
        d = Msg(m.content, m.seq, m.enqueued_ms)
        d.partition = m.partition
        d.delivery_count = m.delivery_count
        d.session = None
        entries = [(k, v) for k, v in codec.section_map_entries(m.app_raw)
                   if codec.key_name(k) not in DEAD_LETTER_PROPERTIES] if m.app_raw else []
        for name, value in zip(DEAD_LETTER_PROPERTIES, (reason, description)):
            if value is not None:
                entries.append((codec.enc_str(name), codec.enc_app_value(value)))
        d.app_raw = codec.enc_section(APPLICATION_PROPERTIES, codec.enc_map(entries)) if entries else b""
        self.dlq.counters["in"] += 1
        self.dlq._store(d)
        self.dlq._make_available(d)
        return d

    def expire(self, m: Msg):
        self.counters["expired"] += 1
        if getattr(self.settings, "dead_lettering_on_message_expiration", False) and self.dlq is not None:
            self.dead_letter(m, "TTLExpiredException", "The message expired and was dead lettered.")
        else:
            self._remove(m)

    def renew(self, m: Msg, now: int) -> int:
        m.locked_until = now + int(self.settings.lock_duration_seconds * 1000)
        heapq.heappush(self.lock_heap, (m.locked_until, m.seq, m.lock_token))
        return m.locked_until

    # ---- management -----------------------------------------------------------------------------
    def peek(self, from_seq: int, count: int, session_id: Optional[str] = None) -> List[Msg]:
        """The first ``count`` messages at or after ``from_seq``, in order. On a partitioned entity, from one
        partition only: the first message found decides which, and the answer ends with that partition."""
        out = []
        i = bisect_left(self.order, from_seq)
        order, msgs = self.order, self.msgs
        end = None                           # a partitioned entity: the first number past the partition
        while i < len(order) and len(out) < count:
            seq = order[i]
            if end is not None and seq >= end:
                break
            m = msgs.get(seq)
            i += 1
            if m is None or (session_id is not None and m.session != session_id):
                continue
            if self.partitions and end is None:
                end = (partition_of(seq) + 1) << PARTITION_SHIFT
            out.append(m)
        return out

    def holds_partition(self, partition: int) -> bool:
        """Whether a partitioned entity holds any message in ``partition``."""
        first = partition << PARTITION_SHIFT
        i = bisect_left(self.order, first)
        while i < len(self.order) and self.order[i] < first + (1 << PARTITION_SHIFT):
            if self.order[i] in self.msgs:
                return True
            i += 1
        return False

    def cancel_scheduled(self, seq: int):
        m = self.msgs.get(seq)
        if m is None or m.state != SCHEDULED:
            raise BrokerError("com.microsoft:message-not-found",
                              f"No scheduled message with sequence number {seq}.", 404)
        self._remove(m)

    def deferred(self, seq: int) -> Msg:
        m = self.msgs.get(seq)
        if m is None or m.state != DEFERRED:
            raise BrokerError("com.microsoft:message-not-found",
                              f"No deferred message with sequence number {seq}.", 404)
        return m

    # ---- time -----------------------------------------------------------------------------------
    def tick(self, now: int, *, sweep: bool = True) -> bool:
        """Expire locks, activate scheduled messages and, when ``sweep``, collect expired messages (the
        service's garbage collection: until it runs, or a receive meets them, expired messages stay and are
        peeked). True when availability changed. (Session lock expiry needs the link, so the server handles it.)"""
        changed = False
        while self.lock_heap and self.lock_heap[0][0] <= now:
            _, _, token = heapq.heappop(self.lock_heap)
            m = self.locks.get(token)
            if m is not None and m.locked_until <= now:
                self.abandon(m)
                changed = True
        while self.sched_heap and self.sched_heap[0][0] <= now:
            _, seq = heapq.heappop(self.sched_heap)
            m = self.msgs.get(seq)
            if m is not None and m.state == SCHEDULED:
                self._activate(m, now)
                changed = True
        while sweep and self.expiry_heap and self.expiry_heap[0][0] <= now:
            _, seq = heapq.heappop(self.expiry_heap)
            m = self.msgs.get(seq)
            if m is not None and m.state in (ACTIVE, DEFERRED) and m.expires_ms is not None \
                    and m.expires_ms <= now:
                self.expire(m)
                changed = True
        return changed

    def _activate(self, m: Msg, now: int):
        """A scheduled message's time came: it is appended "as if it had been enqueued at the current instant,
        which includes assigning a new SequenceNumber" (message sequencing), or, in a topic's log, fanned out."""
        self._remove(m)
        if self.on_activate is not None:
            self.touched_elsewhere |= self.on_activate(m.content, now)
            return
        if self.partitioner is not None:
            seq = self.partitioner.next(m.partition if m.partition is not None else 0)
        else:
            seq = self.sequencer.next()
        active = Msg(m.content, seq, now)
        active.partition = m.partition
        self._store(active)
        self._start_ttl(active, now)
        self._make_available(active)

    def next_deadline(self, *, sweep: bool = True) -> Optional[int]:
        heads = [h[0][0] for h in (self.lock_heap, self.sched_heap) + ((self.expiry_heap,) if sweep else ()) if h]
        return min(heads) if heads else None

    def stats(self) -> Dict[str, Any]:
        states = Counter(m.state for m in self.msgs.values())
        out = {k: self.counters.get(k, 0) for k in
               ("in", "out", "peeked", "completed", "dead_lettered", "deferred", "expired", "duplicates")}
        out.update(active=states[ACTIVE], locked=states[LOCKED], deferred_count=states[DEFERRED],
                   scheduled=states[SCHEDULED], total=len(self.msgs), ops=dict(self.ops))
        if self.dlq is not None:
            out["dead_letter_count"] = len(self.dlq.msgs)
        if self.partitions:
            out["partitions"] = self.partitions
        return out


class Sequencer:
    def __init__(self):
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


class Topic:
    def __init__(self, cfg, subscriptions: List[Entity], filters: Dict[str, Any], partitions: int = 0,
                 held_settings=None):
        self.path = cfg.name
        self.partitions = partitions
        self.partitioner = Partitioner(partitions, cfg.duplicate_detection_window_seconds > 0) if partitions else None
        self.settings = cfg
        self.status = cfg.status
        self.sequencer = Sequencer()
        self.subscriptions = subscriptions
        self.filters = filters            # subscription path -> its rules' correlation filters
        # filter evaluations per message sent (a subscription without rules has the true $Default one)
        self.filter_count = sum(max(1, len(rules)) for rules in filters.values())
        self.counters: Counter = Counter()
        self.ops: Counter = Counter()
        self.dedupe = Deduper(cfg.duplicate_detection_window_seconds)
        self.created_ms = now_ms()
        # The topic's own log: its scheduled messages until their time ("Scheduled messages reside in the topic
        # until the scheduled time": azure-docs#59641; peeked and cancelled through the topic's $management by
        # design: azure-service-bus#352). The namespace fans them out when they become active (``on_activate``).
        self.held = Entity(cfg.name, held_settings, partitions=partitions) if held_settings is not None else None

    def stats(self) -> Dict[str, Any]:
        return {"in": self.counters.get("in", 0), "duplicates": self.counters.get("duplicates", 0),
                "scheduled": len(self.held.msgs) if self.held is not None else 0, "ops": dict(self.ops)}


def any_rule_matches(filters, content: Content) -> bool:
    """A subscription takes a message when any of its rules' filters matches it."""
    return any(correlation_matches(flt, content) for flt in filters)


def correlation_matches(flt: Optional[Dict[str, Any]], content: Content) -> bool:
    """Every field and property the filter names must be equal; no filter (a true filter) matches all."""
    if not flt:
        return True
    for key, expected in flt.items():
        if key == "properties":
            props = content.app_props
            for name, value in expected.items():
                actual = props.get(name)
                if isinstance(actual, (bytes, bytearray)) and isinstance(value, str):
                    actual = actual.decode("utf-8", "replace")
                if actual != value:
                    return False
        else:
            actual = content.prop(key)
            if isinstance(actual, (bytes, bytearray)):
                actual = actual.decode("utf-8", "replace")
            if actual is None or str(actual) != str(expected):
                return False
    return True
