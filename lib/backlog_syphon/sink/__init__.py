"""The foreachBatch sink: the driver's steps, the pure delivery state machine and the pure bookkeeping between steps."""
