"""Build (or, on Databricks, reuse) the SparkSession every run mode uses: Delta on, UTC, quiet."""

from __future__ import annotations

import logging
import os
import sys

import pyspark
from pyspark.sql import SparkSession

from backlog_syphon.local_setup import delta_jars, jvm_options

logger = logging.getLogger(__name__)

# What the driver keeps per job, stage, task, SQL execution and streaming progress, for the UI and
# ``recentProgress``. Spark keeps the last N of each, so it is bounded, but its defaults (1,000 jobs,
# stages and SQL executions, 100,000 tasks, every root RDD of a stage's graph) are sized for interactive
# use: a continuous syphon runs a few jobs per batch and a batch every few seconds for months. These keep
# the last hours' worth. Set where the caller (or the cluster) did not set them: a caller's value wins.
RETAINED_STATE_CONFS = {
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "200",
    "spark.ui.retainedTasks": "10000",
    "spark.ui.retainedDeadExecutors": "20",
    "spark.ui.dagGraph.retainedRootRDDs": "200",
    "spark.sql.ui.retainedExecutions": "200",
    "spark.sql.streaming.ui.retainedQueries": "20",
    "spark.sql.streaming.ui.retainedProgressUpdates": "100",
    "spark.sql.streaming.numRecentProgressUpdates": "100",
}
# A session the syphon reuses (Databricks, spark-submit) was configured by whoever started it: these
# are read once when the driver starts, so they belong in the cluster's Spark configuration there
# (docs/running/table-upkeep.md); Spark's defaults are bounded too, only larger.

_DELTA_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def build_spark_session(app_name: str = "backlog-syphon", master: str | None = None,
                        extra_conf: dict[str, str] | None = None, verbose: bool = False,
                        remote: str | None = None) -> SparkSession:
    """Return a SparkSession with Delta Lake, UTC time zone and WARN logging.

    ``remote`` (or ``SPARK_REMOTE``), e.g. ``sc://host:15002``: a Spark Connect session instead
    (Databricks serverless, standard access mode, Databricks Connect, a Connect server of one's own).
    The server owns the Spark set-up there, Delta included; the client only asks for UTC.

    An active session (Databricks, a notebook, spark-submit with its own --packages/--jars) is
    reused as it is: its Delta set-up belongs to whoever started it. Otherwise a local session is
    built with the JARs fetched by ``delta_jars`` or, when none are cached, with
    ``spark.jars.packages`` so Spark resolves Delta from the Maven registry by itself.

    Spark's own console logging is kept to errors (warnings with ``verbose``, or whatever
    ``SYPHON_SPARK_LOG_LEVEL`` says), so the syphon's lines are readable.
    """
    log_level = os.environ.get("SYPHON_SPARK_LOG_LEVEL", "WARN" if verbose else "ERROR")
    remote = remote or os.environ.get("SPARK_REMOTE")
    if remote:
        session = SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
        session.conf.set("spark.sql.session.timeZone", "UTC")
        return session
    active = SparkSession.getActiveSession()
    if active is None and (os.environ.get("DATABRICKS_RUNTIME_VERSION") or os.environ.get("PYSPARK_GATEWAY_PORT")):
        # Databricks, or spark-submit (which starts the JVM before Python, with its own --master,
        # --jars or --packages): the session's set-up belongs to them, only the app name is ours.
        active = SparkSession.builder.appName(app_name).getOrCreate()
        if not os.environ.get("DATABRICKS_RUNTIME_VERSION"):
            # spark-submit logs at INFO by default: thousands of lines around the progress lines.
            active.sparkContext.setLogLevel(log_level)
    if active is not None:
        active.conf.set("spark.sql.session.timeZone", "UTC")
        return active

    # Python workers must run the interpreter that has the library and its pinned packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master or not os.environ.get("SPARK_MASTER"):
        master = master or os.environ.get("SYPHON_SPARK_MASTER", "local[2]")
        builder = builder.master(master)
    confs = {
        **_DELTA_CONFS,
        **RETAINED_STATE_CONFS,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        # Delta rebuilds a table's snapshot with 50 tasks by default; the syphon's tables are
        # small, and on a 2-core machine that alone doubled the cost of every commit.
        "spark.databricks.delta.snapshotPartitions": "2",
        # Delta's VACUUM lists a table's folders in stages of this many tasks (Spark's default, 10,000, is
        # sized for listing a cluster's millions of files): each VACUUM of a small state table cost a
        # local session about 55 s of CPU (--maintain runs three or four), with 4 tasks about 3 s.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
        # Every plan the syphon runs (a batch's bookkeeping, a Delta commit, a lease read) handles a
        # few thousand rows at most, where compiling generated Java code per plan and task costs far
        # more than it saves: a third of a local run's JVM samples were code generation and Janino.
        # Interpreted evaluation (Spark's own fallback) cut the JVM's CPU for 20,000 messages in four
        # batches from 64-71 s to 56 s. The messages themselves are handled in Python either way.
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        # Adaptive execution plans each shuffle stage as a job of its own, to re-plan the rest from
        # its statistics: worth it for large joins, pure overhead for plans of a few thousand rows.
        # Off, a run on new state needs 20 Spark jobs instead of 30, and its JVM about an eighth
        # less CPU (measured warm: 11.8-12.8 s against 13.6-14.9 s; cold: 36.0 s against 42.0 s).
        "spark.sql.adaptive.enabled": "false",
        # Delta's log store for local paths (HDFSLogStore) commits through Hadoop's FileContext,
        # whose rename starts a `readlink` process four times per commit file where Hadoop's native
        # library is missing (always, with pip's pyspark): about 150 processes per run. Its check
        # then rename is no more atomic between processes than LocalLogStore's, which renames
        # through the FileSystem API and serialises the commits of one JVM; between processes the
        # commits that two runs race for take turns under ``storage.commit_lock``. Cloud schemes
        # keep their own log stores.
        "spark.delta.logStore.file.impl": "io.delta.storage.LocalLogStore",
        # The same for the files written whole then renamed into place: the streaming checkpoint's
        # offsets and commits, and each Delta commit's checksum file. Spark's default manager renames
        # through FileContext as well (four `readlink` processes per file, about 90 per run, at some
        # 25 ms of the JVM's CPU each); this one renames through the FileSystem API. Its check for an
        # existing target is as good as FileContext's, and one run at a time writes a checkpoint (the lease).
        "spark.sql.streaming.checkpointFileManagerClass": _file_system_checkpoint_manager(),
        # How long the JVM waits for a Python process it started (the streaming source's, a worker)
        # to connect back. Spark's 15 s is too short for a busy driver, where starting an interpreter
        # and importing pyspark can take longer: the query then fails with "Python worker failed to
        # connect back" (seen at load 5 on 2 cores).
        "spark.python.authenticate.socketTimeout": "120s",
    }
    jars = delta_jars.fetched_jars()
    caller_class_path = "spark.driver.extraClassPath" in (extra_conf or {})
    if jars and _single_jvm(master) and not caller_class_path:
        # One JVM runs driver and executors: the JARs go on its class path, where the class archive
        # covers Delta's classes too (it cannot cover those of the loader ``spark.jars`` adds, and
        # that one copies each JAR to a scratch folder first).
        confs["spark.driver.extraClassPath"] = os.pathsep.join(jars)
    elif jars:
        confs["spark.jars"] = ",".join(jars)
    else:
        artifact, version = delta_jars.delta_coordinates()
        logger.info("no pre-fetched Delta JARs; Spark will resolve io.delta:%s:%s", artifact, version)
        confs["spark.jars.packages"] = f"io.delta:{artifact}:{version}"
    confs.update(extra_conf or {})
    if "spark.driver.extraJavaOptions" not in confs:  # a caller's own options replace the syphon's
        confs["spark.driver.extraJavaOptions"] = jvm_options.driver_java_options(class_path_extended=caller_class_path)
    for key, value in confs.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    write_no_local_checksums(spark)
    return spark


def write_no_local_checksums(spark: SparkSession) -> None:
    """Have this JVM's local file system write no checksum file beside each file it writes.

    Hadoop's local file system keeps a hidden ``.<name>.crc`` beside every file; cloud file systems have
    none. A Delta commit writes two files (its JSON and its checksum), so each left four entries in the
    ``_delta_log`` folder, which every commit lists whole on a local disk (41-48 us an entry here): half of
    what a local table's log costs per batch, and a process started (``chmod``, where Hadoop's native
    library is missing) for every file created. Files written before keep theirs and are still verified.
    The setting belongs to the file system instance Hadoop caches for ``file:`` in this JVM, which every
    writer of a session the syphon builds (driver and local executors) is handed."""
    try:
        jvm = spark._jvm
        jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration()).setWriteChecksum(False)
    except Exception as exc:  # noqa: BLE001 - only speed is at stake
        logger.info("the local file system keeps writing checksum files (%s)", type(exc).__name__)


def spark_line(version: str) -> tuple[int, int]:
    """A Spark version's (major, minor): "4.1.0" -> (4, 1)."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _file_system_checkpoint_manager() -> str:
    """Spark's FileSystem-based checkpoint file manager, in the package of the installed Spark (4.1 moved it)."""
    moved = spark_line(pyspark.__version__) >= (4, 1)
    return f"org.apache.spark.sql.execution.streaming{'.checkpointing' if moved else ''}.FileSystemBasedCheckpointFileManager"


def _single_jvm(master: str | None) -> bool:
    """Whether ``master`` runs the executors in the driver's JVM: ``local``, ``local[N]``, ``local[N,F]``."""
    return master is not None and (master == "local" or master.startswith("local["))


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session: then ``foreachBatch`` runs in a process of the
    server's, not in this one, and no state of the sink object comes back to the client."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
