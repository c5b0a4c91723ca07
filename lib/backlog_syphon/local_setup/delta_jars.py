"""Fetch Delta Lake's JARs for the pinned Spark into a project-local folder.

Why not Spark's own ``spark.jars.packages``: that resolves with Ivy at every session start,
needs its own cache set-up on each machine and, for delta-spark 4.4, drags transitive
dependencies (Hadoop, Scala, Jackson) that already ship with pyspark at other versions.
Here Maven resolves the artifact once, and only the JARs that pyspark does not already ship are
kept in ``.cache/jars/<artifact>-<delta version>/`` (one folder per Spark line and Delta release, so
the runtimes of ``make test-runtimes`` share the cache without colliding); the session builder passes
them as ``spark.jars``. Maven is used when it is installed; otherwise the session builder falls back
to ``spark.jars.packages`` (see ``run/spark_session.py``) with the same coordinates, which works for users
without Maven.

Which artifact: Delta 4.0.x published one JAR per Scala version (``delta-spark_2.13``), built for
Spark 4.0. From Delta 4.1 on, every artifact names the Spark line it was built for
(``delta-spark_4.1_2.13``, ...), and the name without a Spark version is only an alias for the release's
default Spark line, which moved (Spark 4.1 for Delta 4.1-4.3, Spark 4.2 for Delta 4.4): it is never the
right one to guess. ``SUPPORTED_SPARK_LINES`` lists, per Spark line, the Delta release lines that
publish a JAR for it; anything else is refused with a message naming what is supported.

Usage: ``python -m backlog_syphon.local_setup.delta_jars [--dest DIR] [--jars]`` prints the folder it filled
(or, with ``--jars``, its JARs as a ``spark-submit --jars`` list).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCALA_BINARY_VERSION = "2.13"
# The delta-spark wheel's version names the JAR version to fetch; they must be equal.

# pyspark major.minor -> the delta-spark release lines (major.minor) with a JAR built for that Spark
# line, as published in the Maven registry (each checked with `mvn dependency:get`). The pairs that
# `make test-runtimes` and `make test` run are in docs/running/compute.md ("Supported runtimes").
SUPPORTED_SPARK_LINES: dict[str, tuple[str, ...]] = {
    "4.0": ("4.0", "4.1", "4.2", "4.3", "4.4"),  # Delta 4.0.x: delta-spark_2.13; later: delta-spark_4.0_2.13
    "4.1": ("4.1", "4.2", "4.3", "4.4"),  # delta-spark_4.1_2.13
    "4.2": ("4.4",),  # delta-spark_4.2_2.13
}
# Delta release lines whose artifact carries no Spark version (one JAR per Scala version).
UNSUFFIXED_DELTA_LINES = frozenset({"4.0"})

DEFAULT_CACHE = Path(__file__).resolve().parents[3] / ".cache" / "jars"  # <repo>/lib/backlog_syphon/local_setup/

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.backlog-syphon</groupId><artifactId>delta-jars</artifactId><version>1</version>
  <dependencies>
    <dependency>
      <groupId>io.delta</groupId><artifactId>{artifact}</artifactId><version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""

_VERSIONED_JAR = re.compile(r"^(?P<name>.+?)-(?P<version>\d[^-]*(?:-[^-]+)*)\.jar$")


class UnsupportedRuntimeError(RuntimeError):
    """The installed pyspark (or its pairing with delta-spark) is not one the syphon supports."""


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _supported() -> str:
    return ", ".join(f"pyspark {spark}.x with delta-spark {'/'.join(f'{line}.x' for line in delta)}"
                     for spark, delta in SUPPORTED_SPARK_LINES.items())


def delta_artifact(spark_version: str, delta_version: str) -> str:
    """The Maven artifact id of Delta's JAR for pyspark ``spark_version`` and delta-spark ``delta_version``.

    Raises ``UnsupportedRuntimeError`` naming the supported versions when the pair is not in
    ``SUPPORTED_SPARK_LINES``.
    """
    spark_line, delta_line = _major_minor(spark_version), _major_minor(delta_version)
    delta_lines = SUPPORTED_SPARK_LINES.get(spark_line)
    if delta_lines is None:
        raise UnsupportedRuntimeError(
            f"pyspark {spark_version} is not supported: the syphon runs on Spark "
            f"{', '.join(SUPPORTED_SPARK_LINES)} ({_supported()})")
    if delta_line not in delta_lines:
        raise UnsupportedRuntimeError(
            f"delta-spark {delta_version} has no JAR built for Spark {spark_line} (pyspark {spark_version}): "
            f"install delta-spark {' or '.join(f'{line}.x' for line in delta_lines)} with it "
            f"(supported: {_supported()})")
    if delta_line in UNSUFFIXED_DELTA_LINES:
        return f"delta-spark_{SCALA_BINARY_VERSION}"
    return f"delta-spark_{spark_line}_{SCALA_BINARY_VERSION}"


def delta_coordinates() -> tuple[str, str]:
    """(artifact id, version) of the Delta JAR that pairs with the installed pyspark and delta-spark."""
    from importlib.metadata import PackageNotFoundError, version

    import pyspark

    try:
        delta_version = version("delta-spark")
    except PackageNotFoundError:
        raise UnsupportedRuntimeError(
            f"delta-spark is not installed next to pyspark {pyspark.__version__}: install the release that "
            f"pairs with it ({_supported()})") from None
    return delta_artifact(pyspark.__version__, delta_version), delta_version


def jar_folder(cache: Path = DEFAULT_CACHE) -> Path:
    artifact, version = delta_coordinates()
    return cache / f"{artifact}-{version}"


def fetched_jars(cache: Path = DEFAULT_CACHE) -> list[str]:
    """The JARs fetched earlier for this pyspark/delta pair, or [] when not fetched yet."""
    folder = jar_folder(cache)
    if not (folder / ".complete").exists():
        return []
    return sorted(str(p) for p in folder.glob("*.jar"))


def _artifact_name(jar_file_name: str) -> str:
    match = _VERSIONED_JAR.match(jar_file_name)
    return match.group("name") if match else jar_file_name


def _jars_shipped_with_pyspark() -> set[str]:
    import pyspark

    return {_artifact_name(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def fetch(cache: Path = DEFAULT_CACHE) -> Path:
    """Resolve Delta with Maven into the cache folder; idempotent. Raises RuntimeError on failure."""
    folder = jar_folder(cache)
    if (folder / ".complete").exists():
        return folder
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven (mvn) is not installed, so Delta's JARs cannot be pre-fetched. Install Maven, or "
            "let Spark resolve them itself (the session builder does that when no JARs are cached)."
        )
    artifact, version = delta_coordinates()
    with tempfile.TemporaryDirectory() as work:
        Path(work, "pom.xml").write_text(_POM.format(artifact=artifact, version=version))
        staging = Path(work, "jars")
        result = subprocess.run(
            [mvn, "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
             "-DincludeScope=runtime"],
            cwd=work, capture_output=True, text=True,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:])
            raise RuntimeError(f"Maven could not fetch io.delta:{artifact}:{version}:\n{tail}")
        shipped = _jars_shipped_with_pyspark()
        folder.mkdir(parents=True, exist_ok=True)
        for jar in staging.glob("*.jar"):
            # pyspark already ships Hadoop, Scala, Jackson, Parquet...: two versions on one
            # classpath break at run time, so keep only what Spark lacks.
            if _artifact_name(jar.name) not in shipped:
                shutil.copy2(jar, folder / jar.name)
    (folder / ".complete").write_text(f"io.delta:{artifact}:{version}\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(os.environ.get("SYPHON_JAR_CACHE", DEFAULT_CACHE)))
    parser.add_argument("--jars", action="store_true",
                        help="print the JARs comma-separated, as spark-submit --jars wants them")
    args = parser.parse_args(argv)
    try:
        folder = fetch(args.dest)
        print(",".join(sorted(str(p) for p in folder.glob("*.jar"))) if args.jars else folder)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
