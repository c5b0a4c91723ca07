"""The foreachBatch sink: ``foreach_batch`` (what Spark calls), the micro-batch as a pure state machine
(``micro_batch``), its Spark and Delta ports (``spark_ports``), the executors' send task (``send_task``),
the pure delivery rounds, pacing, outcome aggregate and per-queue marks, the background purge, and a
test's fault plan (``fault_plan``, ``fault_injection``)."""
