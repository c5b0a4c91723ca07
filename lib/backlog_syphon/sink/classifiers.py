"""The restore rules (a migration run's copy rules) of a run, one per column set of its rows: built once in the
process that runs the batches, and kept there (the sink owns the cache and hands it to each batch's ports).

Pure: the rules are column expressions (``restore.rules``, ``migration.copy_rules``), built from the run's
settings alone.
"""

from __future__ import annotations

from typing import Mapping

from backlog_syphon.config import SyphonConfig
from backlog_syphon.migration.copy_rules import CopyClassifier
from backlog_syphon.model import DestinationShape, MigrationPlan
from backlog_syphon.restore import rules


class Classifiers:
    """The run's classifiers by the rows' columns. A pickled copy (a Spark Connect server's) builds its own:
    column expressions belong to the process that built them."""

    def __init__(self, config: SyphonConfig, migration: MigrationPlan,
                 destination_shapes: Mapping[str, DestinationShape]):
        self.config, self.migration, self.destination_shapes = config, migration, destination_shapes
        self._built: dict[tuple[str, ...], rules.Classifier | CopyClassifier] = {}

    def for_columns(self, columns: list[str]) -> rules.Classifier | CopyClassifier:
        key = tuple(columns)
        if key not in self._built:
            self._built[key] = self._build(columns)
        return self._built[key]

    def _build(self, columns: list[str]) -> rules.Classifier | CopyClassifier:
        migration, max_size = self.migration, self.config.sink.max_message_size_bytes
        if migration.sources and migration.copy:
            return CopyClassifier(columns, routes=migration.routes, max_message_size_bytes=max_size,
                                  scheduled_margin_seconds=migration.scheduled_margin_seconds,
                                  destination_shapes=self.destination_shapes, topics=migration.topics)
        restore = self.config.restore
        return rules.Classifier(columns, ttl_policy=restore.ttl_policy, max_message_size_bytes=max_size,
                                destination_map=restore.destination_map, skip_destinations=restore.skip_destinations,
                                destination_shapes=self.destination_shapes)

    def __getstate__(self):
        return {**self.__dict__, "_built": {}}
