"""Pure modules import no I/O: checked from their source (parsed, never imported).

A pure module decides on plain values (or builds Spark column expressions) and is tested with fakes
in milliseconds; the I/O lives in ``servicebus`` (Service Bus), ``storage`` (Delta), ``run``
(sessions, threads, wiring) and the two Spark-facing modules ``sink.foreach_batch`` and
``source.data_source``. Every import counts, also one inside a function.

The one exception is Spark's DataFrame API: ``restore.rules``, ``run.dry_run_plan`` and the row
schemas of ``restore.rows`` are pure transforms built from column expressions and types
(``pyspark.sql.functions``, ``Column``, ``DataFrame``, ``pyspark.sql.types``), which touch no
session, no table and no stream. They may import those, and nothing else of ``pyspark.sql``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "lib"

PURE_MODULES = (
    "backlog_syphon.model",
    "backlog_syphon.config",
    "backlog_syphon.restore.amqp_codec",
    "backlog_syphon.restore.amqp_message",
    "backlog_syphon.restore.legacy_properties",
    "backlog_syphon.restore.queue_names",
    "backlog_syphon.restore.rows",
    "backlog_syphon.restore.rules",
    "backlog_syphon.source.planning",
    "backlog_syphon.source.options",
    "backlog_syphon.sink.delivery",
    "backlog_syphon.sink.bookkeeping",
    "backlog_syphon.servicebus.purge_plan",
    "backlog_syphon.run.lease",
    "backlog_syphon.run.dry_run_plan",
)

FORBIDDEN_PREFIXES = (
    "azure",
    "pyspark.sql",
    "delta",
    "socket",
    "subprocess",
    "threading",
    "backlog_syphon.servicebus",
    "backlog_syphon.storage",
    "backlog_syphon.run",
    "backlog_syphon.sink.foreach_batch",
    "backlog_syphon.source.data_source",
)

# Spark's DataFrame API without a session (see the module docstring): pure transforms and schemas.
SPARK_TRANSFORMS = ("pyspark.sql.functions", "pyspark.sql.types", "pyspark.sql.Column", "pyspark.sql.DataFrame",
                    "pyspark.sql.column", "pyspark.sql.dataframe")
ALLOWED = {
    "backlog_syphon.restore.rules": SPARK_TRANSFORMS,
    "backlog_syphon.restore.rows": ("pyspark.sql.types",),
    "backlog_syphon.run.dry_run_plan": SPARK_TRANSFORMS,
}


def module_path(module: str) -> Path:
    return LIB.joinpath(*module.split(".")).with_suffix(".py")


def imports_in(source: str, module: str) -> set[str]:
    """Every module (and ``module.name`` for ``from module import name``) ``source`` imports, anywhere."""
    package = module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the module's package
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def is_forbidden(name: str, module: str) -> bool:
    def under(prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    if any(under(pure) for pure in PURE_MODULES):
        return False  # a pure module may use another pure module (``run.lease`` from ``run``, say)
    if any(under(allowed) for allowed in ALLOWED.get(module, ())):
        return False
    if module in ALLOWED and name == "pyspark.sql":  # ``from pyspark.sql import functions``: judged by its names
        return False
    return any(under(prefix) for prefix in FORBIDDEN_PREFIXES)


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_import_no_io(module):
    assert module_path(module).exists(), f"{module} moved: update PURE_MODULES"
    forbidden = sorted(name for name in imports_in(module_path(module).read_text(), module)
                       if is_forbidden(name, module))
    assert not forbidden, f"{module} is pure but imports {forbidden}"


def test_the_check_sees_imports_inside_functions_and_tells_sessions_from_transforms():
    source = ("from backlog_syphon.sink import bookkeeping\n"
              "def f():\n    from pyspark.sql import SparkSession\n    import azure.servicebus\n"
              "    from ..storage import tables\n")
    found = {name for name in imports_in(source, "backlog_syphon.sink.delivery")
             if is_forbidden(name, "backlog_syphon.sink.delivery")}
    assert found == {"pyspark.sql", "pyspark.sql.SparkSession", "azure.servicebus", "backlog_syphon.storage",
                     "backlog_syphon.storage.tables"}
    assert is_forbidden("pyspark.sql.SparkSession", "backlog_syphon.restore.rules")
    assert is_forbidden("pyspark.sql.streaming", "backlog_syphon.run.dry_run_plan")
    assert not is_forbidden("pyspark.sql.functions", "backlog_syphon.restore.rules")
    assert is_forbidden("pyspark.sql.functions", "backlog_syphon.sink.delivery")


def test_only_the_servicebus_package_imports_the_sdk():
    offenders = []
    for path in sorted(LIB.rglob("*.py")):
        module = ".".join(path.relative_to(LIB).with_suffix("").parts)
        if module.startswith("backlog_syphon.servicebus"):
            continue
        if any(name == "azure" or name.startswith("azure.") for name in imports_in(path.read_text(), module)):
            offenders.append(module)
    assert not offenders, f"only backlog_syphon.servicebus may import azure.*: {offenders}"


def test_importing_the_package_stays_cheap_and_the_public_api_loads_on_use():
    import subprocess
    import sys

    check = ("import sys, backlog_syphon\n"
             "assert not [m for m in sys.modules if m.startswith(('pyspark', 'azure', 'delta'))], 'eager import'\n"
             "assert sorted(backlog_syphon.__all__) == ['SyphonConfig', 'dry_run', 'load_config', 'run_syphon']\n"
             "from backlog_syphon import SyphonConfig, load_config\n"
             "from backlog_syphon.config import SyphonConfig as Config\n"
             "assert SyphonConfig is Config and callable(load_config)\n")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            env={"PYTHONPATH": str(LIB), "PATH": ""})
    assert result.returncode == 0, result.stderr
