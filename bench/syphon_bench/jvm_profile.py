"""Where the driver JVM of a run spends its CPU (``--jfr DIR``): a Java Flight Recording's execution samples
(``jfr print``), each put down to the innermost step of ``STEPS`` on its stack, before the first batch (the
start) and from it on (the batches)."""
from __future__ import annotations

import collections
import datetime as dt
import re
import subprocess
from pathlib import Path

# (step, prefixes of a frame's class and method), innermost match on a stack wins, the first listed on a tie.
STEPS = (
    ("class loading and linking", ("java.lang.ClassLoader", "jdk.internal.loader", "java.lang.Class.forName",
                                   "java.lang.invoke", "jdk.internal.reflect")),
    ("Arrow <-> rows", ("org.apache.spark.sql.execution.arrow", "org.apache.spark.sql.vectorized",
                        "org.apache.arrow")),
    ("Python runners (to and from Python workers)", ("org.apache.spark.api.python", "org.apache.spark.sql.execution.python",
                                                      "org.apache.spark.sql.execution.datasources.v2.python")),
    ("Parquet", ("org.apache.parquet",)),
    ("Delta", ("io.delta", "org.apache.spark.sql.delta")),
    ("JSON (Jackson)", ("com.fasterxml",)),
    ("Hadoop file system", ("org.apache.hadoop",)),
    ("expressions (interpreted)", ("org.apache.spark.sql.catalyst.expressions",)),
    ("query planning (analysis, optimizer, plans)", ("org.apache.spark.sql.catalyst", "org.apache.spark.sql.execution.QueryExecution",
                                                     "org.apache.spark.sql.execution.SparkStrategies",
                                                     "org.apache.spark.sql.execution.SparkPlan")),
    ("streaming engine", ("org.apache.spark.sql.execution.streaming",)),
    ("block manager, shuffle", ("org.apache.spark.storage", "org.apache.spark.shuffle", "org.apache.spark.util.collection")),
    ("scheduler, RPC, netty", ("org.apache.spark.scheduler", "org.apache.spark.rpc", "io.netty", "org.apache.spark.network")),
    ("py4j", ("py4j",)),
    ("serialisation (Java, Kryo)", ("java.io.ObjectOutputStream", "java.io.ObjectInputStream", "com.esotericsoftware")),
)
_TIME = re.compile(r"startTime = (\d\d:\d\d:\d\d(?:\.\d+)?)(?: \((\d{4}-\d\d-\d\d)\))?")


# Frames that say nothing of the step they serve: a stack is put down to the first frame below them.
_GENERIC = ("scala.", "java.util.", "java.lang.String", "java.lang.Object", "java.lang.Integer", "java.lang.Long",
            "java.lang.StringBuilder", "java.lang.AbstractStringBuilder", "java.lang.Math", "jdk.internal.misc",
            "java.lang.ThreadLocal", "java.lang.ref.")


def step_of(frames: list[str]) -> str:
    """The innermost step a stack (innermost frame first, as jfr prints it) is in, generic frames (collections,
    strings) left out; ``other`` when none."""
    for frame in frames:
        if frame.startswith(_GENERIC):
            continue
        for step, prefixes in STEPS:
            if frame.startswith(prefixes):
                return step
    return "other"


def execution_samples(recording: Path, day: dt.date):
    """``(epoch seconds, frames innermost first)`` of every execution sample of ``recording``; ``day``: the date
    of its times where jfr prints none (its times are this host's local time)."""
    text = subprocess.run(["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "64", str(recording)],
                          capture_output=True, text=True, check=True).stdout
    for event in text.split("jdk.ExecutionSample {")[1:]:
        found = _TIME.search(event)
        at = None if found is None else dt.datetime.fromisoformat(f"{found[2] or day.isoformat()}T{found[1]}").timestamp()
        stack = event.split("stackTrace = [", 1)[-1]
        yield at, [line.strip() for line in stack.splitlines()[1:] if line.strip() and line.strip() not in ("]", "}", "...")]


def jvm_samples_by_step(recording: Path, origin: float | None, first_batch: float | None) -> collections.Counter:
    """``"start: step"`` / ``"batches: step"`` -> samples (the start: before the run's first batch)."""
    split = None if origin is None or first_batch is None else origin + first_batch
    counts: collections.Counter = collections.Counter()
    day = dt.date.fromtimestamp(origin) if origin is not None else dt.date.today()
    for at, frames in execution_samples(recording, day):
        phase = "start" if split is not None and at is not None and at < split else "batches"
        counts[f"{phase}: {step_of(frames)}"] += 1
    return counts
