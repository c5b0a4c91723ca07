"""A message as the broker holds it: what the sender encoded (``Content``, shared by a topic's copies)
and one entity's copy with its state (``Msg``), encoded again for a receiver or a peek. No I/O.

Invariants:
- the broker's own annotations (sequence number, enqueued time, lock, state) are never taken from what
  a sender wrote: they are dropped on the way in and written from ``Msg``'s state on the way out.
"""
from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional

from . import codec
from .codec import (APPLICATION_PROPERTIES, BODY_CODES, DELIVERY_ANNOTATIONS, FOOTER, HEADER,
                    MESSAGE_ANNOTATIONS, PROPERTIES)

ACTIVE, DEFERRED, SCHEDULED, LOCKED = 0, 1, 2, 3
PARTITION_ID = "x-opt-partition-id"
PING_CONTENT_TYPE = "application/vnd.ms-servicebus-ping"
BROKER_ANNOTATIONS = frozenset({
    "x-opt-sequence-number", "x-opt-enqueued-time", "x-opt-locked-until", "x-opt-message-state",
    "x-opt-enqueue-sequence-number", "x-opt-deadletter-source", "x-opt-lock-token",
})


class Content:
    """The immutable part of a message as the sender encoded it (shared by topic fan-out copies)."""
    __slots__ = ("durable", "priority", "ttl", "ann_entries", "props_raw", "app_raw", "body_raw", "size",
                 "message_id", "session_id", "props", "scheduled_ms", "_app_props")

    # indices into the AMQP properties list
    FIELDS = {"message_id": 0, "to": 2, "subject": 3, "label": 3, "reply_to": 4, "correlation_id": 5,
              "content_type": 6, "session_id": 10, "reply_to_session_id": 12}

    @classmethod
    def parse(cls, raw) -> "Content":
        c = cls()
        c.size = len(raw)
        c.durable, c.priority, c.ttl = False, None, None
        c.ann_entries, c.props_raw, c.app_raw, c.scheduled_ms, c.props = [], b"", b"", None, []
        body, saw_body = [], False
        for code, sec in codec.split_sections(raw):
            if code == HEADER:
                h = list(codec.section_value(sec)) + [None] * 5
                c.durable, c.priority, c.ttl = bool(h[0]), h[1], h[2]
            elif code == MESSAGE_ANNOTATIONS:
                for k, v in codec.section_map_entries(sec):
                    name = codec.key_name(k)
                    if name in BROKER_ANNOTATIONS:
                        continue
                    if name == "x-opt-scheduled-enqueue-time":
                        c.scheduled_ms = int(codec.decode_value(v) or 0) or None
                    c.ann_entries.append((k, v))
            elif code == PROPERTIES:
                c.props_raw = sec
                c.props = list(codec.section_value(sec))
            elif code == APPLICATION_PROPERTIES:
                c.app_raw = sec
            elif code in BODY_CODES or code == FOOTER:
                saw_body = saw_body or code in BODY_CODES
                body.append(sec)
            # delivery-annotations are hop-by-hop: dropped
        if not saw_body:
            raise codec.DecodeError("message has no body section")
        c.body_raw = b"".join(body)
        c.message_id = c.prop("message_id")
        c.session_id = codec.as_text(c.prop("session_id"))
        c._app_props = None
        return c

    def prop(self, field: str):
        i = self.FIELDS[field]
        return self.props[i] if i < len(self.props) else None

    @property
    def content_type(self) -> Optional[str]:
        return codec.as_text(self.prop("content_type"))

    @property
    def app_props(self) -> Dict[str, Any]:
        if self._app_props is None:
            self._app_props = ({str(k): v for k, v in codec.section_value(self.app_raw).items()}
                               if self.app_raw else {})
        return self._app_props


def is_batch_envelope(raw) -> Optional[List[bytes]]:
    """The inner messages if ``raw`` has the shape of a 0x80013700 batch envelope, else None.

    python-qpid-proton does not expose the transfer's message-format, so the envelope is recognised by
    shape: all body sections are Data, and each one decodes as a complete AMQP message with a body.
    (A single message whose Data body is itself an encoded AMQP message would be split by mistake.)
    """
    try:
        inner = []
        for code, sec in codec.split_sections(raw):
            if code in (codec.AMQP_VALUE, codec.AMQP_SEQUENCE):
                return None
            if code == codec.DATA:
                payload = codec.section_binary(sec)
                if not payload or payload[0] != 0x00:
                    return None
                if not any(c in BODY_CODES for c, _ in codec.split_sections(payload)):
                    return None
                inner.append(payload)
        return inner or None
    except (codec.DecodeError, IndexError, ValueError):
        return None


class Msg:
    """A message in one entity, with its broker-side state."""
    __slots__ = ("content", "seq", "enqueued_ms", "expires_ms", "delivery_count", "state", "lock_token",
                 "locked_until", "lock_owner", "app_raw", "was_deferred", "dead_letter_source", "session",
                 "partition")

    def __init__(self, content: Content, seq: int, enqueued_ms: int):
        self.content, self.seq, self.enqueued_ms = content, seq, enqueued_ms
        self.expires_ms: Optional[int] = None
        self.delivery_count = 0
        self.state = ACTIVE
        self.lock_token: Optional[uuid.UUID] = None
        self.locked_until = 0
        self.lock_owner = None
        self.app_raw = content.app_raw
        self.was_deferred = False
        self.session = content.session_id
        self.dead_letter_source: Optional[str] = None
        self.partition: Optional[int] = None     # its partition, in a partitioned entity

    def encode(self, *, lock_token: Optional[uuid.UUID] = None, with_state: bool = False,
               locked_until: Optional[int] = None) -> bytes:
        c = self.content
        parts = [codec.enc_header(c.durable, c.priority, c.ttl, self.delivery_count)]
        if lock_token is not None:
            parts.append(codec.enc_section(DELIVERY_ANNOTATIONS, codec.enc_map(
                [(codec.enc_sym("x-opt-lock-token"), codec.enc_uuid(lock_token))])))
        ann = list(c.ann_entries)
        if self.partition is not None:       # the broker's own partition id, never a sender's
            ann = [(k, v) for k, v in ann if codec.key_name(k) != PARTITION_ID]
            ann.append((codec.enc_sym(PARTITION_ID), codec.enc_short(self.partition)))
        ann.append((codec.enc_sym("x-opt-sequence-number"), codec.enc_long(self.seq)))
        ann.append((codec.enc_sym("x-opt-enqueued-time"), codec.enc_timestamp(self.enqueued_ms)))
        ann.append((codec.enc_sym("x-opt-enqueue-sequence-number"), codec.enc_long(self.seq)))
        if locked_until is not None:
            ann.append((codec.enc_sym("x-opt-locked-until"), codec.enc_timestamp(locked_until)))
        if with_state or self.state in (DEFERRED, SCHEDULED) or self.was_deferred:
            state = DEFERRED if self.was_deferred else (self.state if self.state != LOCKED else ACTIVE)
            ann.append((codec.enc_sym("x-opt-message-state"), codec.enc_int(state)))
        if self.dead_letter_source:
            ann.append((codec.enc_sym("x-opt-deadletter-source"), codec.enc_str(self.dead_letter_source)))
        parts.append(codec.enc_section(MESSAGE_ANNOTATIONS, codec.enc_map(ann)))
        parts += [c.props_raw, self.app_raw, c.body_raw]
        return b"".join(parts)
