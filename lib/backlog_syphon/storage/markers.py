"""Files beside the tables, read and written through Spark so that they work on any file system a run
uses, over Spark Connect too: the stop marker a run leaves for a Connect server, and the id in a
streaming checkpoint."""

from __future__ import annotations

import json
import os

from pyspark.sql import SparkSession


def write_marker(spark: SparkSession, path: str) -> None:
    """Leave a marker at ``path`` (a one-line text dataset), written through Spark so that a Connect
    server sees it on its own file system."""
    spark.createDataFrame([("stop",)], "marker string").coalesce(1).write.mode("overwrite").text(path)


def marker_exists(spark: SparkSession, path: str) -> bool:
    try:
        return spark.read.text(path).limit(1).count() > 0
    except Exception:  # noqa: BLE001 - no marker (the path does not exist)
        return False


def streaming_query_id(spark: SparkSession, checkpoint_location: str) -> str | None:
    """The id Spark keeps in a streaming checkpoint's ``metadata`` file (it changes when the checkpoint
    is deleted and created again); None when it cannot be read. Read through Spark, so it works for
    any file system the query uses, over Spark Connect too."""
    metadata = checkpoint_location.rstrip("/") + "/metadata"
    local = metadata.removeprefix("file:") if ":" not in metadata.removeprefix("file:") else None
    try:
        if local is not None and os.path.exists(local):  # a local folder: no Spark job for one line
            with open(local, encoding="utf-8") as handle:
                return json.loads(handle.readline())["id"]
        line = spark.read.text(metadata).first()
        return json.loads(line[0])["id"] if line is not None else None
    except Exception:  # noqa: BLE001 - no checkpoint yet, or unreadable: the caller falls back
        return None
