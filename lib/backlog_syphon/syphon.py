"""Wire the source, the sink and the tables into one streaming query: the one code path of every run mode."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import uuid
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from backlog_syphon import delivery_plan, delta_tables
from backlog_syphon.backlog_source import SOURCE_NAME, BacklogDataSource, backlog_source_options
from backlog_syphon.config import SyphonConfig, trigger_options
from backlog_syphon.delivery_sink import DeliverySink
from backlog_syphon.legacy_properties import backlog_queue_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    per_destination: dict[str, dict[str, int]]  # destination -> outcome -> count
    remaining: dict[str, int]  # backlog queue -> messages still there

    @property
    def drained(self) -> bool:
        return not any(self.remaining.values())

    def lines(self) -> list[str]:
        out = [f"run {self.run_id}"]
        out.append(f"  {'destination':<32} {'delivered':>10} {'dead-lettered':>14} {'skipped':>8}")
        for destination, counts in self.per_destination.items():
            out.append(f"  {destination:<32} {counts['delivered']:>10} {counts['dead_lettered']:>14} "
                       f"{counts['skipped_ping']:>8}")
        if not self.per_destination:
            out.append("  (nothing moved)")
        out.append(f"  {'backlog queue':<40} {'remaining':>10}")
        for queue, count in self.remaining.items():
            out.append(f"  {queue:<40} {count:>10}")
        return out


def checkpoint_app_id(config: SyphonConfig) -> str:
    """Delta transaction app id: tied to the streaming checkpoint, since batch ids restart with it."""
    digest = hashlib.sha256(config.storage.checkpoint_location.encode()).hexdigest()[:16]
    return f"backlog-syphon-{digest}"


def start_syphon(spark: SparkSession, config: SyphonConfig, *, run_id: str | None = None
                 ) -> tuple[StreamingQuery, DeliverySink]:
    """Start the streaming query; the caller waits on it (``run_syphon`` does)."""
    spark.dataSource.register(BacklogDataSource)
    delta_tables.ensure_tables(spark, config.storage.audit_table, config.storage.checkpoint_table)
    run_id = run_id or f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    sink = DeliverySink(config, run_id=run_id, app_id=checkpoint_app_id(config))
    stream = spark.readStream.format(SOURCE_NAME).options(**backlog_source_options(config)).load()
    query = (stream.writeStream.foreachBatch(sink)
             .option("checkpointLocation", config.storage.checkpoint_location)
             .queryName(config.run.query_name)
             .trigger(**trigger_options(config.run.trigger))
             .start())
    logger.info("started run_id=%s query=%s trigger=%s", run_id, config.run.query_name, config.run.trigger)
    return query, sink


def run_syphon(spark: SparkSession, config: SyphonConfig, *, run_id: str | None = None,
               timeout_seconds: float | None = None) -> RunSummary:
    """Run until an available-now run has drained what was there (or the query stops); summarise."""
    query, sink = start_syphon(spark, config, run_id=run_id)
    try:
        query.awaitTermination(timeout_seconds)
    finally:
        if query.isActive:
            query.stop()
        sink.flush(spark)
    if query.exception() is not None:
        raise query.exception()
    return summarise_run(config, sink)


def summarise_run(config: SyphonConfig, sink: DeliverySink) -> RunSummary:
    from backlog_syphon.servicebus_io import peek_counts

    queues = [backlog_queue_name(config.primary.namespace, i) for i in range(config.backlog.queue_count)]
    return RunSummary(run_id=sink.run_id, per_destination=delivery_plan.summarise(sink.totals),
                      remaining=peek_counts(config.secondary, queues))
