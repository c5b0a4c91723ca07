"""The foreachBatch sink: the batch as a pure state machine, its Spark ports, the pure delivery rounds and
bookkeeping, the background purge."""
