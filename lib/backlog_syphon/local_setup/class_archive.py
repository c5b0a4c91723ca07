"""A class archive (the JVM's application class-data sharing) for the local Spark driver: a cold start
about twice as fast.

A local run starts its own Spark JVM, which loads some 20,000 classes (Spark, Delta, Hadoop, Scala)
from JAR files before its first batch, parsing and verifying each one: on two cores that is about half
of the session's start and a fifth of a short run's CPU. ``python -m backlog_syphon.local_setup.class_archive``
(``make setup`` runs it) starts Spark once with the JVM's ``-XX:ArchiveClassesAtExit``, runs a small
workload that touches what a run touches (Delta tables, Arrow, a Python streaming source with
``foreachBatch``), and keeps the archive the JVM writes when it exits. The session builder then
passes ``-XX:SharedArchiveFile`` to every local driver JVM (``jvm_options``, which names an archive for
the JVM and class path it is valid for), which maps those classes ready-made.

A JVM given a damaged archive can crash, so an archive only appears under its final name once the JVM
that wrote it has exited cleanly. Clusters, Databricks, spark-submit and Spark Connect start their JVMs
themselves and never use one.

Usage: ``python -m backlog_syphon.local_setup.class_archive [--dest DIR]`` prints the archive (building
it if missing).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from backlog_syphon.local_setup import jvm_options
from backlog_syphon.local_setup.jvm_options import DEFAULT_CACHE

_TRAINING_FLAG = "--train"


def build(cache: Path = DEFAULT_CACHE) -> Path:
    """Build the archive for this JVM and class path unless it exists; return it. Raises RuntimeError."""
    archive = jvm_options.archive_file(cache)
    if archive is None:
        raise RuntimeError("no JVM library found (JAVA_HOME or java on the PATH): no class archive to build")
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    print(f"building a class archive for Spark's JVM (once per Java and Spark install, about a minute): {archive}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        written = Path(work, archive.name)
        training = [sys.executable, "-m", "backlog_syphon.local_setup.class_archive", _TRAINING_FLAG,
                    str(written), work]
        result = subprocess.run(training, capture_output=True, text=True, timeout=600)
        if result.returncode != 0 or not written.is_file():
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
            raise RuntimeError(f"the training run wrote no class archive:\n{tail}")
        os.replace(written, archive)  # complete: its JVM has exited
    # This pyspark's archives for a JVM or JARs no longer installed (other Spark lines keep theirs).
    for stale in cache.glob(f"{archive.name.rsplit('-', 1)[0]}-*.jsa"):
        if stale != archive:
            stale.unlink(missing_ok=True)
    return archive


def _train(archive: str, work: str) -> None:
    """Run what a syphon run runs, in a JVM that writes the classes it loaded to ``archive`` on exit."""
    from pyspark import SparkContext
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from backlog_syphon.run.spark_session import build_spark_session

    class Counter(DataSource):
        @classmethod
        def name(cls):
            return "class_archive_training"

        def schema(self):
            return "n long"

        def streamReader(self, schema):
            return CounterReader()

    class CounterReader(DataSourceStreamReader):
        def initialOffset(self):
            return {"n": 0}

        def latestOffset(self):
            return {"n": 10}

        def partitions(self, start, end):
            return [InputPartition(start["n"])]

        def read(self, partition):
            yield from ((n,) for n in range(partition.value, 10))

    def record(frame, batch_id):
        rows = frame.mapInArrow(lambda batches: batches, frame.schema)
        rows.write.format("delta").mode("append").option("txnAppId", "training").option("txnVersion", batch_id) \
            .save(f"{work}/table")
        frame.sparkSession.read.format("delta").load(f"{work}/table").groupBy("n").count().collect()

    dump = f"{jvm_options.DRIVER_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={archive}"
    spark = build_spark_session("backlog-syphon-class-archive",
                                extra_conf={"spark.ui.enabled": "false", "spark.driver.extraJavaOptions": dump})
    gateway = SparkContext._gateway
    spark.sql(f"CREATE TABLE delta.`{work}/created` (a STRING NOT NULL, d DATE) USING DELTA PARTITIONED BY (d)")
    spark.createDataFrame([("x", None)], "a string, d date").write.format("delta").mode("overwrite") \
        .save(f"{work}/created")
    spark.dataSource.register(Counter)
    query = (spark.readStream.format("class_archive_training").load().writeStream.foreachBatch(record)
             .option("checkpointLocation", f"{work}/stream").trigger(availableNow=True).start())
    query.awaitTermination(300)
    spark.stop()
    # The JVM writes the archive as it exits, which it does once its standard input closes.
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=300)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_TRAINING_FLAG]:
        _train(*argv[1:3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    try:
        print(build(args.dest))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
