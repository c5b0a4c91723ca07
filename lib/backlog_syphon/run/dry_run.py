"""The dry run: peek every backlog queue and report what a replay would do, changing nothing anywhere.

It reads the same source rows and applies the same restore rules as a replay, attaches (without
sending) a sender to each destination, and summarises with the pure ``dry_run_plan``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from backlog_syphon.config import AVAILABLE_NOW, SyphonConfig
from backlog_syphon.migration.copy_rules import CopyClassifier
from backlog_syphon.model import Action, EntityKind, Route, SourceEntity
from backlog_syphon.partitions import LANES
from backlog_syphon.restore.destination_fit import session_subscription_warning
from backlog_syphon.restore.redrive import select_for_redrive
from backlog_syphon.restore.rules import classify_messages
from backlog_syphon.run import dry_run_plan
from backlog_syphon.sink.queue_marks import awaiting_settlement
from backlog_syphon.sink.spark_ports import held_by_any, read_recovery
from backlog_syphon.source.data_source import SOURCE_NAME, BacklogDataSource, backlog_source_options
from backlog_syphon.storage import audit_table


@dataclass(frozen=True)
class DryRunReport:
    per_destination: list[dict]  # dry_run_plan.destination_summary rows
    per_queue: dict[str, int]  # backlog queue -> messages in it
    dead_letters: list[dict]  # the first ``dead_letter_limit`` messages that would be dead-lettered
    dead_letter_total: int
    unchecked: dict[str, str]  # destination -> why it could not be checked (e.g. the primary is down)
    state_tables: str = ""  # the lease table that fences runs of this backlog
    lease_holder: str | None = None  # who delivers from this backlog now, if anyone
    batch_bound: str = ""  # what bounds a run's batches here
    # restore.destination_map as configured ({old: new}) and the renames the backlog needs (old, new, messages)
    destination_map: dict[str, str] | None = None
    renamed: list[dict] | None = None
    per_reason: list[dict] | None = None  # a re-drive: dry_run_plan.redrive_summary rows
    # What the destinations' settings warn of (a topic whose session subscriptions dead-letter session-less copies)
    destination_warnings: tuple[str, ...] = ()
    # A partitioned queue's messages per partition (read partition by partition, each in order)
    per_partition: dict[str, dict[int, int]] | None = None
    # A migration: per source entity what it holds and would become (dry_run_plan.source_summary rows), and its
    # route (its kind, destination and, for a subscription, the delivery chosen)
    per_source: list[dict] | None = None
    routes: dict[str, str] | None = None
    cost: dry_run_plan.DrainCost | None = None  # what the drain will cost the namespaces' credits
    # Per queue, messages earlier runs recorded (delivered, dead-lettered) that may still wait to be settled:
    # the next run settles them and sends none again (``sink.queue_marks.awaiting_settlement``); the plan above
    # leaves them out
    recorded: dict[str, int] | None = None

    def migration_lines(self) -> list[str]:
        """What a migration run would move, per source entity, and where each one's messages go."""
        out = ["migration: the sources selected, what each holds, what would become of it and where it goes",
               f"  {'source':<40} {'messages':>8} {'sessions':>8} {'scheduled':>9} {'deferred':>8} {'deliver':>7} "
               f"{'hold':>5} {'expire':>6} {'dead-letter':>11} {'covered':>7}  route"]
        rows = {row["backlog_queue"]: row for row in self.per_source or []}
        for source, route in (self.routes or {}).items():
            row = rows.get(source, {})
            out.append(f"  {source:<40} {row.get('messages', 0):>8} {row.get('sessions', 0):>8} "
                       f"{row.get('scheduled', 0):>9} {row.get('deferred', 0):>8} {row.get('to_deliver', 0):>7} "
                       f"{row.get('to_hold', 0):>5} {row.get('to_expire', 0):>6} {row.get('to_dead_letter', 0):>11}"
                       f" {row.get('to_cover', 0):>7}  -> {route}")
        return out

    def redrive_lines(self) -> list[str]:
        """What a re-drive would move, per destination and dead-letter reason."""
        out = ["re-drive of the dead-letter queues: what would move, per destination and dead-letter reason",
               f"  {'destination':<28} {'dead-letter reason':<28} {'messages':>8} {'move':>6} {'stay':>6} "
               f"{'not selected':>12}"]
        for row in self.per_reason or []:
            out.append(f"  {row['destination']:<28} {row['dead_letter_reason']:<28} {row['messages']:>8} "
                       f"{row['to_move']:>6} {row['to_stay']:>6} {row['not_selected']:>12}")
        if not self.per_reason:
            out.append("  (the dead-letter queues are empty)")
        out.append(f"  would move {sum(row['to_move'] for row in self.per_reason or [])} message(s); 'stay': tried "
                   f"and still undeliverable (left in place, audited); 'not selected': left alone (redrive.* filters, "
                   f"or dead-lettered again by an earlier re-drive)")
        return out

    def lines(self) -> list[str]:
        out = ["dry run: nothing was sent, settled or written"]
        if self.routes is not None:
            out += self.migration_lines()
        if self.per_reason is not None:
            out += self.redrive_lines()
        out.append(f"  {'destination':<28} {'messages':>8} {'bytes':>10} {'sessions':>8} {'scheduled':>9} "
                   f"{'expired':>7} {'deliver':>7} {'dead-letter':>11} {'skip':>5} {'held':>5}  "
                   f"oldest .. newest enqueued")
        for row in self.per_destination:
            oldest = f"{row['oldest_enqueued']:%Y-%m-%d %H:%M:%S}" if row["oldest_enqueued"] else "-"
            newest = f"{row['newest_enqueued']:%Y-%m-%d %H:%M:%S}" if row["newest_enqueued"] else "-"
            out.append(f"  {row['destination']:<28} {row['messages']:>8} {row['body_bytes']:>10} "
                       f"{row['sessions']:>8} {row['scheduled']:>9} {row['expired']:>7} {row['to_deliver']:>7} "
                       f"{row['to_dead_letter']:>11} {row['to_skip']:>5} {row['to_hold']:>5}  {oldest} .. {newest}")
        if not self.per_destination:
            out.append("  (the dead-letter queues are empty)" if self.per_reason is not None
                       else "  (nothing to deliver: earlier runs recorded what is there, below)" if self.recorded
                       else "  (the backlog queues are empty)")
        kind = "sources" if self.routes is not None else (
            "dead-letter queues" if self.per_reason is not None else "backlog queues")
        out.append(f"  {kind}: {sum(self.per_queue.values())} messages in "
                   f"{sum(1 for n in self.per_queue.values() if n)} of {len(self.per_queue)} "
                   f"{'entities' if self.routes is not None else 'queues'}")
        if self.recorded:
            out.append(f"  recorded by earlier runs, waiting to be settled: {sum(self.recorded.values())} message(s) "
                       f"in {len(self.recorded)} queue(s), not in the plan above: they were delivered or "
                       f"dead-lettered, and the next run removes them from the backlog first, sending none again")
        for queue, lanes in sorted((self.per_partition or {}).items()):
            out.append(f"    {queue} is partitioned; read partition by partition, each in order: "
                       + ", ".join(f"partition {partition}: {count}" for partition, count in lanes.items()))
        if self.destination_map:
            out.append("  restore.destination_map (x-ms-path name -> destination sent to):")
            for old, new in sorted(self.destination_map.items()):
                # x-ms-path may spell the old name in any case: they are one entity
                count = sum(row["messages"] for row in self.renamed or [] if row["old_name"].lower() == old.lower())
                out.append(f"    {old} -> {new}: {count} messages")
        held = [row for row in self.per_destination if row["to_hold"]]
        if held:
            out.append(f"  would leave {sum(row['to_hold'] for row in held)} messages in the backlog for "
                       f"restore.skip_destinations (untouched, for a later run):")
            for row in held:
                out.append(f"    {row['destination']}: {row['to_hold']} messages")
        if self.dead_letter_total:
            out.append(f"  would {'leave in the dead-letter queues (still undeliverable)' if self.per_reason is not None else 'dead-letter'} "
                       f"{self.dead_letter_total} messages:")
            for row in self.dead_letters:
                out.append(f"    {row['backlog_queue']}#{row['sequence_number']} message_id={row['message_id']} "
                           f"destination={row['destination']} {row['reason_code']}: {row['reason']}")
            if self.dead_letter_total > len(self.dead_letters):
                out.append(f"    ... and {self.dead_letter_total - len(self.dead_letters)} more")
        for warning in self.destination_warnings:
            out.append(f"  warning: {warning}")
        for destination, reason in self.unchecked.items():
            out.append(f"  warning: could not check destination '{destination}' ({reason}); a replay "
                       f"would wait for it rather than dead-letter")
        if self.cost is not None:
            out += self.cost.lines()
        if self.batch_bound:
            out.append(f"  a replay here: {self.batch_bound}")
        if self.lease_holder:
            out.append(f"  note: {self.lease_holder} is delivering from this backlog now; a replay would wait for it "
                       f"or exit")
        out.append(f"  WARNING: only runs that use the same state tables ({self.state_tables}) are kept from "
                   f"delivering at the same time; a run of this backlog with other state tables would send the "
                   f"same messages again")
        return out


def dry_run(spark: SparkSession, config: SyphonConfig, *, now: dt.datetime | None = None,
            dead_letter_limit: int = 100) -> DryRunReport:
    """Peek every backlog queue and report what a replay would do, changing nothing anywhere.

    Uses the same source rows and restore rules as the syphon, and attaches (without sending) a
    sender to each destination to find those the primary namespace would refuse.
    """
    from backlog_syphon.run.syphon import prepare_migration, source_queues
    from backlog_syphon.servicebus.entities import destination_shapes
    from backlog_syphon.servicebus.preflight import check_destinations
    from backlog_syphon.servicebus.throttling import pace_driver

    now = now or dt.datetime.now(dt.timezone.utc)
    pace_driver(config)
    migration = prepare_migration(config)  # a migration's sources and routes (a refused one says so here)
    spark.dataSource.register(BacklogDataSource)
    # What earlier runs recorded and may not have settled: the next run drops those rows (by identity) and
    # settles them, so they are counted apart, not planned.
    recorded = read_recovery(spark, config.storage, migration)[0].unsettled
    snapshot = spark.read.format(SOURCE_NAME).options(**backlog_source_options(config, migration=migration)).load()
    shapes = destination_shapes(config.primary)
    if migration.sources and migration.copy:
        classified = CopyClassifier(snapshot.columns, routes=migration.routes,
                                    max_message_size_bytes=config.sink.max_message_size_bytes,
                                    scheduled_margin_seconds=migration.scheduled_margin_seconds,
                                    destination_shapes=shapes, topics=migration.topics)(snapshot, now=now)
    else:
        classified = classify_messages(snapshot, now=now, ttl_policy=config.restore.ttl_policy,
                                       max_message_size_bytes=config.sink.max_message_size_bytes,
                                       destination_map=config.restore.destination_map,
                                       skip_destinations=config.restore.skip_destinations, destination_shapes=shapes)
    if config.redriving:
        classified = select_for_redrive(classified, config.redrive,
                                        audit_table.redriven_dead_letters(spark, config.storage.audit_table))
    classified = classified.persist()
    try:
        per_queue, per_partition = dry_run_plan.by_partition(dry_run_plan.partition_counts(classified).collect())
        to_plan = classified.where(~held_by_any(recorded)) if recorded else classified
        deliverable = to_plan.where(F.col("action") == Action.DELIVER)
        destinations = [row[0] for row in deliverable.select("destination").distinct().collect()]
        sessionless = [row[0] for row in deliverable.where(F.col("session_id").isNull()).select("destination")
                       .distinct().collect()]
        checks = check_destinations(config.primary, destinations) if destinations else {}
        planned = dry_run_plan.apply_destination_checks(
            to_plan,
            problems={d: dry_run_plan.DestinationProblem(c.failure.reason_code, c.failure.reason)
                      for d, c in checks.items() if c.failure is not None and not c.failure.transient},
            max_sizes={d: c.max_message_size for d, c in checks.items() if c.max_message_size})
        dead_letters = dry_run_plan.dead_letter_plan(planned)
        per_destination = [row.asDict() for row in dry_run_plan.destination_summary(planned, now=now).collect()]
        cost = dry_run_plan.drain_cost(
            per_destination, topics={name for name, shape in shapes.items() if shape.kind is EntityKind.TOPIC},
            lanes=len(source_queues(config, migration)) + (LANES - 1) * len(per_partition or {}),
            max_messages_per_trigger=config.run.max_messages_per_trigger,
            secondary_budget=config.secondary.max_credits_per_second,
            primary_budget=config.primary.max_credits_per_second)
        return DryRunReport(
            per_destination=per_destination, cost=cost,
            per_queue=dict.fromkeys(source_queues(config, migration), 0) | per_queue, per_partition=per_partition,
            dead_letters=[row.asDict() for row in dead_letters.limit(dead_letter_limit).collect()],
            dead_letter_total=dead_letters.count(),
            unchecked={d: c.failure.reason for d, c in checks.items() if c.failure is not None and c.failure.transient},
            state_tables=config.storage.resolved_lease_table, lease_holder=_current_holder(spark, config, now),
            batch_bound=batch_bound(spark, config), destination_map=dict(config.restore.destination_map),
            renamed=[row.asDict() for row in dry_run_plan.renamed_destinations(planned).collect()],
            per_reason=[row.asDict() for row in dry_run_plan.redrive_summary(planned).collect()]
            if config.redriving else None, recorded=awaiting_settlement(recorded),
            destination_warnings=tuple(warning for destination in sorted(sessionless)
                                       if destination.lower() in shapes
                                       for warning in [session_subscription_warning(shapes[destination.lower()])]
                                       if warning),
            per_source=[row.asDict() for row in dry_run_plan.source_summary(planned).collect()]
            if migration.sources else None,
            routes={source.path: describe_route(migration.route(source.path), source) for source in migration.sources}
            if migration.sources else None)
    finally:
        classified.unpersist()


def describe_route(route: Route, source: SourceEntity) -> str:
    """``events (property x-syphon-subscription=eu)``: where a source's messages go, and how."""
    how = [source.kind.value]
    if route.delivery is not None:
        how.append(f"{route.delivery.value}" + (f" {route.property_name}={route.property_value}"
                                                if route.property_name else ""))
    if route.covered_by:
        how.append(f"covered: sent once, from {route.covered_by}")
    if source.requires_session:
        how.append("sessions" + (f", states to {route.session_state_entity}" if route.session_state_entity else ""))
    if route.provenance:
        how.append("provenance")
    return f"{route.destination} ({'; '.join(how)})"


def batch_bound(spark: SparkSession, config: SyphonConfig) -> str:
    """What bounds a run's micro-batches on this Spark (see docs/running/compute.md, "How big a batch gets")."""
    from backlog_syphon.run.spark_session import is_connect
    from backlog_syphon.run.syphon import server_has_read_limits

    bound = f"batches of at most {config.run.max_messages_per_trigger} messages (run.max_messages_per_trigger)"
    if config.run.trigger != AVAILABLE_NOW or not is_connect(spark) or server_has_read_limits(spark):
        return bound
    return (f"one batch of the whole backlog: Spark {spark.version} over Connect has no read limits for Python "
            f"sources (a backlog over run.max_single_batch_messages, {config.run.max_single_batch_messages}, "
            f"refuses to start)")


def _current_holder(spark: SparkSession, config: SyphonConfig, now: dt.datetime) -> str | None:
    """Who holds the backlog's lease now (the dry run only reads: a missing lease table means nobody)."""
    from backlog_syphon.run.fence import current_holder

    try:
        lease = current_holder(spark, config.storage.resolved_lease_table, config.storage.checkpoint_table, now)
    except Exception:  # noqa: BLE001 - no lease table yet: no run has taken the lease
        return None
    if lease is None:
        return None
    return f"{lease.holder} (lease until {lease.expires_at:%Y-%m-%d %H:%M:%S} UTC)"
