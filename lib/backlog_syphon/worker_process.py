"""What a Spark Python worker process does once, before its first task's work: keep what it imported out of
every later garbage collection.

PySpark's daemon runs ``gc.collect()`` in a reused worker after every task, and a full collection walks every
object the process holds: pyspark, pyarrow, pandas (which pyarrow loads), the Service Bus SDK and the syphon,
some hundreds of thousands, none of them garbage. A batch runs two Python workers per backlog queue (the
source's read and the send task), so that walk was a fifth of the Python workers' CPU in a 20,000-message run
(py-spy, 2026-12-07). ``gc.freeze()`` moves what exists at that moment into a generation collections never walk:
called once per process, after the imports and before anything of a task's own, so nothing frozen is garbage
that a collection would have freed (objects freed by reference counting go as before).
"""

from __future__ import annotations

import gc

_FROZEN = False


def freeze_imports() -> None:
    """Freeze what this process holds now, the first time it is called (later calls do nothing)."""
    global _FROZEN
    if not _FROZEN:
        gc.collect()  # whatever import-time cycles are garbage go first
        gc.freeze()
        _FROZEN = True
