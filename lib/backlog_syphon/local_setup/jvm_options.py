"""The options of a local Spark driver JVM: a quick start, and the class archive ``make setup`` built for
this JVM and class path (``class_archive``), where there is one. The session builder
(``run.spark_session``) passes them; the class archive's training run starts its JVM with them too.

An archive is only valid for the JVM build and the class path that made it, so its file name carries a
fingerprint of both (``fingerprint``): another Java, another pyspark, other Delta JARs simply find no
archive and start as before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pyspark

from backlog_syphon.local_setup import delta_jars

# The driver JVM of a local run does little heavy computing (the messages are handled in Python):
# the quick compiler alone and one GC thread start it and its first Delta commits about a third
# sooner (measured: session 4.0 s against 5.9 s, the lease 6.7 s against 8.9 s). The quick compiler alone
# gets the small code cache of a JVM without tiers (48 MB): a continuous run filled it in about 400
# batches, and from then on the JVM flushed and compiled its methods again without end (its sweeper
# thread at a quarter of a core, 213,000 compilations in 45 minutes), and every step of a batch took
# 2.5 times as long. The tiered default (240 MB) leaves room: only what is used is resident.
# The JVM collects the whole heap each time the classes it loaded outgrow a threshold that starts at about
# 20 MB (``MetaspaceSize``), and a run's classes outside the archive reach some 35 MB: two full collections
# during the start, the first of them 4.0 s of a 20,000-message run's start on a busy machine (Flight
# Recorder, 2026-12-07). With the first threshold at 128 MB a run makes none; the space is committed only
# as it is used.
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC -XX:MetaspaceSize=128m"
DEFAULT_CACHE = delta_jars.DEFAULT_CACHE.parent / "jvm"  # <repo>/.cache/jvm, beside the Delta JARs
# How the session builder lays out the class path (Delta's JARs after pyspark's own, on the driver's
# class path): an archive made for another layout would not match it.
_LAYOUT = "delta-on-driver-class-path"


def _java_home() -> Path | None:
    """The Java that pyspark's launcher runs: ``JAVA_HOME``'s, else the one on the PATH."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"]).resolve()
    java = shutil.which("java")
    return Path(java).resolve().parents[1] if java else None


def fingerprint() -> str | None:
    """What an archive depends on: the JVM build (its ``libjvm.so``, by path, size and time), pyspark's
    JARs and Delta's. None where no JVM library is found (then no archive is used)."""
    home = _java_home()
    libjvm = home / "lib" / "server" / "libjvm.so" if home else None
    if libjvm is None or not libjvm.exists():
        return None
    stat = libjvm.stat()
    parts = [_LAYOUT, str(libjvm), str(stat.st_size), str(int(stat.st_mtime)), pyspark.__version__]
    parts += sorted(str(p) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    parts += delta_jars.fetched_jars()
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_file(cache: Path = DEFAULT_CACHE) -> Path | None:
    key = fingerprint()
    return cache / f"spark-{pyspark.__version__}-{key}.jsa" if key else None


def java_option(cache: Path = DEFAULT_CACHE) -> str | None:
    """``-XX:SharedArchiveFile=...`` for this JVM and class path, or None where no archive was built."""
    try:
        archive = archive_file(cache)
    except Exception:  # noqa: BLE001 - pyspark/Delta unsupported: the session builder says so itself
        return None
    return f"-XX:SharedArchiveFile={archive}" if archive is not None and archive.is_file() else None


def driver_java_options(*, class_path_extended: bool = False) -> str:
    """``DRIVER_JAVA_OPTIONS``, with the class archive ``make setup`` built for this JVM and class path
    where there is one. No archive is used where the caller extends the class path (its own
    ``spark.driver.extraClassPath``, ``SPARK_CLASSPATH``), which the archive would not match."""
    extended = class_path_extended or os.environ.get("SPARK_CLASSPATH")
    archive = None if extended else java_option()
    return f"{DRIVER_JAVA_OPTIONS} {archive}" if archive else DRIVER_JAVA_OPTIONS
