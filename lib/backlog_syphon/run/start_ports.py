"""The start's ports on Spark, Delta and Service Bus (``run.run_start.StartPorts``): the pre-flights, the
source's registration, the administration API's reads, the state tables and the lease."""

from __future__ import annotations

from typing import Callable

from pyspark.sql import SparkSession

from backlog_syphon.config import SyphonConfig
from backlog_syphon.model import NO_MIGRATION, DestinationShape, Lease, MigrationPlan, QueueSettings
from backlog_syphon.run.fence import LeaseKeeper
from backlog_syphon.run.run_start import CreatedTables
from backlog_syphon.run.spark_session import is_connect
from backlog_syphon.sink.spark_ports import read_recovery
from backlog_syphon.source.data_source import BacklogDataSource, start_planners
from backlog_syphon.storage import state_tables
from backlog_syphon.timeline import Milestone, Timeline


class SparkStartPorts:
    def __init__(self, spark: SparkSession, config: SyphonConfig, keeper: LeaseKeeper, timeline: Timeline, *,
                 on_wait: Callable[[str], None] | None, migration: MigrationPlan = NO_MIGRATION):
        self.spark, self.config, self.keeper, self.timeline, self.on_wait = spark, config, keeper, timeline, on_wait
        self.storage = config.storage
        self.migration = migration
        # A migration run's plan goes with its state read and its pre-flight; a backlog run's calls stay as they were.
        self._planned = {"migration": migration} if migration.sources else {}

    def check_driver(self) -> None:
        from backlog_syphon.servicebus.preflight import preflight

        preflight(self.config, **self._planned)

    def check_executors(self) -> None:
        from backlog_syphon.servicebus.preflight import executor_preflight

        executor_preflight(self.spark, self.config)

    def prepare_source(self) -> None:
        self.spark.dataSource.register(BacklogDataSource)
        if not is_connect(self.spark):  # a Connect server plans the source itself: nothing here to start early
            start_planners(self.spark)

    def destination_shapes(self) -> dict[str, DestinationShape]:
        from backlog_syphon.servicebus.entities import destination_shapes

        return destination_shapes(self.config.primary)

    def queue_settings(self) -> QueueSettings:
        from backlog_syphon.servicebus.entities import queue_settings

        settings = queue_settings(self.config.secondary)
        if self.migration.sources:  # its sources' partitioning is known from the listing they were selected in
            return QueueSettings(self.migration.partitioned, settings.lock_seconds)
        return settings

    def create_tables(self) -> CreatedTables:
        storage = self.storage
        created = state_tables.create_tables(self.spark, storage.audit_table, storage.checkpoint_table,
                                       storage.resolved_lease_table, retention_days=storage.table_retention_days)
        return CreatedTables(state_tables={storage.audit_table, storage.checkpoint_table} <= created,
                             lease_table=storage.resolved_lease_table in created)

    def acquire_lease(self, *, table_created: bool, on_free: Callable[[], None] | None) -> Lease:
        return self.keeper.acquire(self.spark, wait=self.config.run.wait_for_lease, on_wait=self.on_wait,
                                   table_created=table_created, on_free=on_free)

    def set_upkeep_properties(self) -> None:
        storage = self.storage
        state_tables.set_upkeep_properties(self.spark, storage.audit_table, storage.checkpoint_table,
                                     storage.resolved_lease_table, retention_days=storage.table_retention_days)

    def start_heartbeat(self) -> None:
        self.keeper.start_heartbeat(self.spark)

    def read_recovery(self):
        return read_recovery(self.spark, self.storage, **self._planned)

    def release_lease(self) -> None:
        self.keeper.release(self.spark)

    def mark(self, milestone: Milestone) -> None:
        self.timeline.mark(milestone)
