"""The foreachBatch sink: ``foreach_batch`` (what Spark calls), the micro-batch as a pure state machine
(``micro_batch``, with the no-op hooks a test harness replaces), its Spark and Delta ports (``spark_ports``),
the run's restore rules (``classifiers``), the executors' send task (``send_task``), the pure delivery rounds,
pacing, outcome aggregate and per-queue marks, and the background purge."""
