"""The executor's send task: one backlog queue's rows of a send round, delivered in order, and their
outcomes as Arrow record batches (``sink.spark_ports.send_on_executors`` starts one per queue).

A task reads its rows in chunks (``SEND_CHUNK_ROWS``, whatever the window's size), restores each
deliverable row's message with the codec (``restore.restored_message``), and hands the chunks to the pure
delivery rounds (``sink.delivery``) with the real senders (``servicebus.send``, links pooled per
process) and its share of the rate cap (``sink.pacing``). It runs in a Python worker: everything it
needs comes through its closure (the settings, the round's limits, a test harness's ``Hooks``, and in the migration
mode its routes: each message is then sent as it was, ``restore.copied_message``).
"""

from __future__ import annotations

import dataclasses
import functools
import datetime as dt
import logging
import time
from typing import Callable, Iterator, Mapping

from backlog_syphon.model import (
    NO_MIGRATION, Action, MigrationPlan, Outcome, OutcomeRecord, ReasonCode, RefusedBeforeSending, SendShape
)
from backlog_syphon.restore.copied_message import Additions, copy_message_bytes
from backlog_syphon.restore.destination_fit import property_size_refusal
from backlog_syphon.restore.legacy_properties import LegacyFields
from backlog_syphon.restore.restored_message import restore_message_bytes
from backlog_syphon.restore.queue_names import is_dead_letter_queue_name
from backlog_syphon.rows import OUTCOME_ROW_ARROW_SCHEMA, record_batch
from backlog_syphon.sink import delivery
from backlog_syphon.sink.micro_batch import NO_HOOKS, Hooks
from backlog_syphon.sink.pacing import Pacer
from backlog_syphon.sink.send_shape import SendShapes

# The sink's logger, as before the send task had a module of its own: its log lines stay the same.
logger = logging.getLogger(__name__)


def deliver_partition(batches, *, primary, sink, run_id: str, batch_id: int, limits: delivery.RoundLimits,
                      pace_share: float | None = None, pacing_reports=None, hooks: Hooks = NO_HOOKS,
                      send_shapes: Mapping[str, SendShape] | None = None, migration: MigrationPlan = NO_MIGRATION,
                      clock: Callable[[], float] = time.time) -> Iterator:
    """Deliver one task's rows (Arrow record batches) and yield the outcomes as Arrow record batches;
    at the end, report the task's pacing (``pacing_reports``, an accumulator). ``hooks``: a test harness's,
    told of the task's first send (``CrashPoint.MID_SEND``). ``send_shapes``: the send shapes
    the administration API decided, by lower-case destination name (``sink.send_shape.known_shapes``).
    ``migration``: a migration run's plan: its routes decide what each copy gets (``copy_outgoing``)."""
    from backlog_syphon.servicebus.send import DestinationSenders, classify_send_error
    from backlog_syphon.worker_process import freeze_imports

    freeze_imports()  # once per process: its collections skip what it imported
    mid_send = []

    def first_send() -> None:
        if not mid_send:
            mid_send.append(True)
            hooks.task_sent()

    senders = DestinationSenders(primary)
    opened: set[str] = set()
    pacer = Pacer(pace_share, sink.throttle_recovery_seconds, clock())
    shapes = SendShapes(known=dict(send_shapes or {}), learned=LEARNED_SHAPES.setdefault(primary.endpoint, {}))
    build = build_outgoing  # chosen once: the per-message path of a backlog run stays as it was
    if migration.sources and migration.copy:
        build = functools.partial(_copy_outgoing_now, migration=migration, clock=clock)
    for results in delivery.deliver_chunks(row_chunks(batches, opened, senders), build=build, sender=senders,
                                           classify=classify_send_error, sink=sink, limits=limits, clock=clock,
                                           on_sent=first_send, pacer=pacer, shapes=shapes):
        yield record_batch([outcome_row(result, run_id, batch_id, clock()) for result in results],
                           OUTCOME_ROW_ARROW_SCHEMA)
    stats = dataclasses.replace(pacer.stats(clock()), single_message_destinations=tuple(sorted(shapes.learned)),
                                shape_refusals=shapes.refusals)
    if pacer.throttled_count:
        logger.info("send task: %d sent, throttled %d times, slowed for %.1f s, rate limit at the end %s msg/s",
                    stats.sent, stats.throttled, stats.slowed_seconds,
                    "none" if stats.rate_limit is None else f"{stats.rate_limit:.0f}")
    if shapes.refusals:
        logger.info("send task: %d batch(es) refused for their shape (reason_code=%s) and sent again one message at "
                    "a time; single messages from now on to %s", shapes.refusals, ReasonCode.BATCH_SHAPE_REFUSED,
                    ", ".join(sorted(shapes.learned)))
    if pacing_reports is not None:
        pacing_reports.add(stats)


# What refusals of a batch's shape taught this process, per primary namespace (its endpoint) and destination: a
# later task (and batch) of the run that lands in this Python worker starts with single messages there.
LEARNED_SHAPES: dict[str, dict[str, SendShape]] = {}

SEND_CHUNK_ROWS = 2000  # rows a send task holds as Python objects at once, whatever the window's size


def row_chunks(batches, opened: set[str], senders) -> Iterator[list[dict]]:
    """A task's Arrow batches as lists of at most ``SEND_CHUNK_ROWS`` rows, in order, each as soon as it
    arrives (what arrives next is read meanwhile); the senders of each chunk's new destinations opened
    at once before it is delivered."""
    for batch in batches:
        rows = batch.to_pylist()
        for start in range(0, len(rows), SEND_CHUNK_ROWS):
            chunk = rows[start:start + SEND_CHUNK_ROWS]
            new = {row["destination"] for row in chunk if row["action"] == Action.DELIVER} - opened
            if new:
                senders.open(new)
                opened.update(new)
            yield chunk


def _copy_outgoing_now(row, *, migration: MigrationPlan, clock) -> delivery.Outgoing:
    return copy_outgoing(row, migration, clock())


def build_outgoing(row) -> delivery.Outgoing:
    """The restored message of a deliverable row, as the bytes to send, with the TTL its classification chose;
    ``RefusedBeforeSending`` where Service Bus would refuse it for its properties' size. The source read the
    message whole to fill the row (a deliverable row has no decode problem), so the splice takes the session id
    and scheduled enqueue time from the row and decodes nothing again but the framing and the keys it rewrites
    (``restore_message_bytes``' ``checked``)."""
    checked = LegacyFields(session_id=row["session_id"], scheduled_enqueue_time=row["scheduled_enqueue_time"])
    encoded = restore_message_bytes(row["raw_message"], row["restored_time_to_live_ms"],
                                    from_dead_letters=is_dead_letter_queue_name(row["backlog_queue"]), checked=checked)
    too_large = property_size_refusal(encoded, row["message_id"], row["session_id"])
    if too_large is not None:
        raise RefusedBeforeSending(ReasonCode.PROPERTY_TOO_LARGE,
                                   f"Service Bus would refuse the restored message: {too_large} (its answer, \"The "
                                   f"service was unable to process the request; please retry the operation\", "
                                   f"would look transient); no retry changes it")
    return delivery.Outgoing(encoded, row["message_id"], row["session_id"], row["partition_key"])


def copy_outgoing(row, migration: MigrationPlan, now: float) -> delivery.Outgoing:
    """A migrated row's message as it was, its expiry kept (``restore.copied_message``), with what its route adds:
    provenance, and the property a subscription's ``property`` delivery sets."""
    route = migration.route(row["backlog_queue"])
    additions = Additions(source_entity=row["backlog_queue"] if route is not None and route.provenance else None,
                          property_name=route.property_name if route is not None else None,
                          property_value=route.property_value if route is not None else None)
    encoded = copy_message_bytes(row["raw_message"], now_ms=int(now * 1000), additions=additions,
                                 from_dead_letters=is_dead_letter_queue_name(row["backlog_queue"]))
    return delivery.Outgoing(encoded, row["message_id"], row["session_id"], row["partition_key"])


def outcome_row(result: delivery.Delivery, run_id: str, batch_id: int, now: float) -> OutcomeRecord:
    """One audit row (``OUTCOME_ROW_SCHEMA``) for a delivery result; an unsent row's time is when its
    destination started failing."""
    row = result.row
    at = result.at if result.outcome == Outcome.UNSENT and result.at is not None else now
    return {
        "run_id": run_id, "batch_id": batch_id, "backlog_queue": row["backlog_queue"],
        "sequence_number": row["sequence_number"], "message_id": row["message_id"],
        "destination": row["destination"], "session_id": row["session_id"], "outcome": result.outcome.value,
        "reason_code": None if result.reason_code is None else str(result.reason_code), "reason": result.reason,
        "body_size": row["body_size"], "enqueued_time": row["enqueued_time"],
        "scheduled_enqueue_time": row["scheduled_enqueue_time"], "time_to_live_ms": row["restored_time_to_live_ms"],
        "outcome_time": dt.datetime.fromtimestamp(at, dt.timezone.utc), "attempts": result.attempts,
        "dead_letter_reason": row.get("dead_letter_reason"),
        "dead_letter_error_description": row.get("dead_letter_error_description"),
        "original_destination": row.get("original_destination"),
        "message_state": row.get("message_state"),
    }
