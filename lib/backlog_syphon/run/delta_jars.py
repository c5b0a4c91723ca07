"""Fetch Delta Lake's JARs for the pinned Spark into a project-local folder.

Why not Spark's own ``spark.jars.packages``: that resolves with Ivy at every session start,
needs its own cache set-up on each machine and, for delta-spark 4.4, drags transitive
dependencies (Hadoop, Scala, Jackson) that already ship with pyspark at other versions.
Here Maven resolves the artifact once, and only the JARs that pyspark does not already ship are
kept in ``.cache/jars/<delta version>-spark<major.minor>/``; the session builder passes them as
``spark.jars``. Maven is used when it is installed; otherwise the session builder falls back
to ``spark.jars.packages`` (see ``spark_session.py``), which works for users without Maven.

Usage: ``python -m backlog_syphon.run.delta_jars [--dest DIR] [--jars]`` prints the folder it filled
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
DEFAULT_CACHE = Path(__file__).resolve().parents[3] / ".cache" / "jars"  # <repo>/lib/backlog_syphon/run/

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


def delta_coordinates() -> tuple[str, str]:
    """(artifact id, version) of the Delta JAR that pairs with the installed pyspark and delta-spark."""
    from importlib.metadata import version

    import pyspark

    spark_major_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"delta-spark_{spark_major_minor}_{SCALA_BINARY_VERSION}", version("delta-spark")


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
