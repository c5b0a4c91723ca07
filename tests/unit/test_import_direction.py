"""Pure modules import no I/O, and packages import only downwards: checked from their source (parsed,
never imported).

A pure module decides on plain values (or builds Spark column expressions) and is tested with fakes
in milliseconds; the I/O lives in ``servicebus`` (Service Bus), ``storage`` (Delta), ``run``
(sessions, threads, wiring), and the Spark-facing modules ``sink.foreach_batch``, ``sink.spark_ports``,
``sink.send_task`` and ``source.data_source``. Every import counts, also one inside a function.

The one exception is Spark's DataFrame API: ``restore.rules``, ``run.dry_run_plan`` and the row
schemas of ``rows`` are pure transforms built from column expressions and types
(``pyspark.sql.functions``, ``Column``, ``DataFrame``, ``pyspark.sql.types``), which touch no
session, no table and no stream. They may import those, and nothing else of ``pyspark.sql``.

The packages have ranks, and a module imports only from its own rank or below (``RANKS``): the
vocabulary first, then the I/O of one system each, then the source and the sink, then the wiring,
then the command line. Packages of one rank may use each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "lib"

PURE_MODULES = (
    "backlog_syphon.model",
    "backlog_syphon.model.vocabulary",
    "backlog_syphon.model.records",
    "backlog_syphon.model.sending",
    "backlog_syphon.model.migration",
    "backlog_syphon.migration",
    "backlog_syphon.migration.selection",
    "backlog_syphon.migration.routes",
    "backlog_syphon.migration.copy_rules",
    "backlog_syphon.migration.fan_out",
    "backlog_syphon.restore.copied_message",
    "backlog_syphon.config",
    "backlog_syphon.config.types",
    "backlog_syphon.config.validation",
    "backlog_syphon.config.loading",
    "backlog_syphon.errors",
    "backlog_syphon.probing",
    "backlog_syphon.partitions",
    "backlog_syphon.restore.amqp",
    "backlog_syphon.restore.amqp.wire",
    "backlog_syphon.restore.amqp.decimals",
    "backlog_syphon.restore.amqp.values",
    "backlog_syphon.restore.amqp.decoding",
    "backlog_syphon.restore.amqp.encoding",
    "backlog_syphon.restore.amqp.annotations",
    "backlog_syphon.restore.amqp.describing",
    "backlog_syphon.restore.amqp.sections",
    "backlog_syphon.restore.amqp.message",
    "backlog_syphon.restore.amqp.message_decoding",
    "backlog_syphon.restore.restored_message",
    "backlog_syphon.restore.legacy_properties",
    "backlog_syphon.restore.queue_names",
    "backlog_syphon.restore.backlog_rows",
    "backlog_syphon.rows",
    "backlog_syphon.restore.rules",
    "backlog_syphon.restore.destination_fit",
    "backlog_syphon.restore.redrive",
    "backlog_syphon.source.offsets",
    "backlog_syphon.source.partition_lanes",
    "backlog_syphon.source.planning",
    "backlog_syphon.source.window_planner",
    "backlog_syphon.source.window_search",
    "backlog_syphon.source.options",
    "backlog_syphon.sink.delivery",
    "backlog_syphon.sink.pacing",
    "backlog_syphon.sink.send_shape",
    "backlog_syphon.sink.queue_marks",
    "backlog_syphon.sink.micro_batch",
    "backlog_syphon.sink.outcome_aggregate",
    "backlog_syphon.sink.classifiers",
    "backlog_syphon.purge",
    "backlog_syphon.purge.plan",
    "backlog_syphon.purge.progress",
    "backlog_syphon.purge.bulk_settlement",
    "backlog_syphon.purge.settle_timing",
    "backlog_syphon.purge.lock_wait",
    "backlog_syphon.peek_pages",
    "backlog_syphon.worker_process",
    "backlog_syphon.rate_control",
    "backlog_syphon.credits",
    "backlog_syphon.servicebus.access",
    "backlog_syphon.servicebus.network",
    "backlog_syphon.run.lease",
    "backlog_syphon.run.run_start",
    "backlog_syphon.run.dry_run_plan",
    "backlog_syphon.run.run_end",
    "backlog_syphon.run.status_report",
    "backlog_syphon.run.decommission_plan",
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
    "backlog_syphon.sink.spark_ports",
    "backlog_syphon.sink.send_task",
    "backlog_syphon.source.data_source",
)

# Spark's DataFrame API without a session (see the module docstring): pure transforms and schemas.
SPARK_TRANSFORMS = ("pyspark.sql.functions", "pyspark.sql.types", "pyspark.sql.Column", "pyspark.sql.DataFrame",
                    "pyspark.sql.column", "pyspark.sql.dataframe")
ALLOWED = {
    "backlog_syphon.restore.rules": SPARK_TRANSFORMS,
    "backlog_syphon.restore.redrive": SPARK_TRANSFORMS,
    "backlog_syphon.migration.copy_rules": SPARK_TRANSFORMS,
    "backlog_syphon.rows": ("pyspark.sql.types", "pyspark.sql.pandas.types"),
    "backlog_syphon.run.dry_run_plan": SPARK_TRANSFORMS,
}


def module_path(module: str) -> Path:
    """A module's file: ``a/b.py``, or ``a/b/__init__.py`` for a package."""
    path = LIB.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


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
    source = ("from backlog_syphon.sink import queue_marks\n"
              "def f():\n    from pyspark.sql import SparkSession\n    import azure.servicebus\n"
              "    from ..storage import audit_table\n")
    found = {name for name in imports_in(source, "backlog_syphon.sink.delivery")
             if is_forbidden(name, "backlog_syphon.sink.delivery")}
    assert found == {"pyspark.sql", "pyspark.sql.SparkSession", "azure.servicebus", "backlog_syphon.storage",
                     "backlog_syphon.storage.audit_table"}
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


def reads_of_the_environment(source: str) -> list[int]:
    """Lines of ``source`` that read the process's environment (``os.environ``, ``os.getenv``, ``environ``
    imported from ``os``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb")
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                alias.name in ("environ", "getenv", "environb") for alias in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_source_the_sink_and_servicebus_never_read_the_environment():
    """Their settings (a test harness's hooks too) come in from the entry point: nothing on an executor depends
    on the environment it happens to run in."""
    sample = "import os\nfrom os import environ\ndef f():\n    return os.getenv('X')\n"
    assert reads_of_the_environment(sample) == [2, 4]
    offenders = {module: lines for path, module, _ in library_modules()
                 if package_of(module) in ("source", "sink", "servicebus")
                 for lines in [reads_of_the_environment(path.read_text())] if lines}
    assert not offenders, f"modules that read the environment (line numbers): {offenders}"


def test_the_library_ships_no_fault_code_and_imports_nothing_of_the_tools():
    """The fault harness (``tools/fault_plan.py``, ``tools/fault_hooks.py``, ``tools/faulty_job.py``) stays out of
    the wheel, which is this folder: the library keeps only its no-op hooks (``sink.micro_batch.NO_HOOKS``), takes
    a harness's as an argument, and reads no ``SYPHON_FAULT_*`` variable."""
    offenders = [module for _, module, _ in library_modules() if "fault" in module.rsplit(".", 1)[-1]]
    offenders += [f"{module} imports {name}" for path, module, _ in library_modules()
                  for name in imports_in(path.read_text(), module) if name == "tools" or name.startswith("tools.")]
    offenders += [f"{module} names SYPHON_FAULT_" for path, module, _ in library_modules()
                  if "SYPHON_FAULT_" in path.read_text()]
    assert not offenders, offenders


def test_importing_the_package_stays_cheap_and_the_public_api_loads_on_use():
    import subprocess
    import sys

    check = ("import sys, backlog_syphon\n"
             "assert not [m for m in sys.modules if m.startswith(('pyspark', 'azure', 'delta'))], 'eager import'\n"
             "assert sorted(backlog_syphon.__all__) == ['SyphonConfig', 'dry_run', 'load_config', 'run_syphon', "
             "'status']\n"
             "from backlog_syphon import SyphonConfig, load_config\n"
             "from backlog_syphon.config import SyphonConfig as Config\n"
             "assert SyphonConfig is Config and callable(load_config)\n")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            env={"PYTHONPATH": str(LIB), "PATH": ""})
    assert result.returncode == 0, result.stderr


# --- ranks: packages import only from their own rank or below ------------------------------------------

RANKS = {
    "model": 1, "config": 1, "errors": 1, "timeline": 1, "restore": 1,  # the vocabulary, the settings, pure restoring
    "partitions": 1,  # a partitioned queue's sequence numbers, which source, servicebus and sink share
    "probing": 1,  # the probe searches, which the planner (source) and the counts (servicebus) share
    "peek_pages": 1,  # reading a range with peeks that come back short or empty: the source's, the purge's, the counts'
    "purge": 1,  # the purge's decisions, which its I/O (servicebus) and its runner (sink) share
    "migration": 1,  # the migration mode's decisions: selection, routes, copy rules
    "rows": 1,  # the row schemas and their Arrow form: the source's, the sink's and the tables'
    "worker_process": 1,  # what a Spark Python worker does once, for the source's reads and the send tasks
    "rate_control": 1,  # a token bucket and an AIMD controller: the sends' pacing and the credits'
    "credits": 1,  # pacing a namespace's credits, which the I/O (servicebus) and the source's options share
    "servicebus": 2, "storage": 2,  # the I/O of one system each
    "source": 3, "sink": 3,
    "run": 4,  # the wiring
    # A local Spark's set-up (Delta's JARs, the JVM's class archive) and how a local session finds it: the
    # session builder (``run``) reads it, and the archive's training run builds a session.
    "local_setup": 4,
    "cli": 5, "": 5,  # the command line, and the package itself (its ``__init__``)
}


def package_of(module: str) -> str:
    """``backlog_syphon.sink.micro_batch`` -> ``sink``; ``backlog_syphon.model`` -> ``model``; the package -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def library_imports(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import of the library in ``source``, anywhere (also inside functions);
    ``from backlog_syphon import x`` imports ``backlog_syphon.x``."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the module's package
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [f"{base}.{alias.name}" for alias in node.names] if base == "backlog_syphon" else [base]
        else:
            continue
        found += [(node.lineno, target) for target in targets
                  if target == "backlog_syphon" or target.startswith("backlog_syphon.")]
    return found


def rank_violations(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Imports of ``source`` from a higher rank than ``module``'s (and of packages without a rank)."""
    own = RANKS.get(package_of(module))
    if own is None:
        return [f"{module} is in a package without a rank: give it one in RANKS"]
    violations = []
    for line, target in library_imports(source, module, is_package=is_package):
        rank = RANKS.get(package_of(target))
        if rank is None or rank > own:
            violations.append(f"{module}:{line} (rank {own}) imports {target} (rank {rank})")
    return violations


def library_modules():
    for path in sorted(LIB.joinpath("backlog_syphon").rglob("*.py")):
        parts = path.relative_to(LIB).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        yield path, ".".join(parts[:-1] if is_package else parts), is_package


def test_every_package_has_a_rank():
    packages = {package_of(module) for _, module, _ in library_modules()}
    assert packages == set(RANKS), f"packages and RANKS differ: {sorted(packages ^ set(RANKS))}"


def test_packages_import_only_from_their_own_rank_or_below():
    violations = [violation for path, module, is_package in library_modules()
                  for violation in rank_violations(path.read_text(), module, is_package=is_package)]
    assert not violations, "imports from a higher rank:\n" + "\n".join(violations)


def test_the_rank_check_sees_imports_inside_functions_relative_ones_and_the_package_itself():
    source = ("from backlog_syphon import errors, model\n"
              "from backlog_syphon.storage import audit_table\n"
              "from . import purge_plan\n"
              "def f():\n    from backlog_syphon.sink.delivery import Outgoing\n"
              "    from ..run import lease\n    import backlog_syphon\n")
    assert library_imports(source, "backlog_syphon.servicebus.send") == [
        (1, "backlog_syphon.errors"), (1, "backlog_syphon.model"), (2, "backlog_syphon.storage"),
        (3, "backlog_syphon.servicebus"), (5, "backlog_syphon.sink.delivery"), (6, "backlog_syphon.run"),
        (7, "backlog_syphon")]
    assert rank_violations(source, "backlog_syphon.servicebus.send") == [
        "backlog_syphon.servicebus.send:5 (rank 2) imports backlog_syphon.sink.delivery (rank 3)",
        "backlog_syphon.servicebus.send:6 (rank 2) imports backlog_syphon.run (rank 4)",
        "backlog_syphon.servicebus.send:7 (rank 2) imports backlog_syphon (rank 5)"]
    # same rank, another package: allowed; downwards: allowed
    assert rank_violations("from backlog_syphon.sink import micro_batch\n", "backlog_syphon.source.data_source") == []
    assert rank_violations("import backlog_syphon.run.syphon\n", "backlog_syphon.cli") == []
    assert rank_violations("from backlog_syphon.run import lease\n", "backlog_syphon.sink.foreach_batch") == [
        "backlog_syphon.sink.foreach_batch:1 (rank 3) imports backlog_syphon.run (rank 4)"]
    assert rank_violations("from backlog_syphon import cli\n", "backlog_syphon.run.syphon") == [
        "backlog_syphon.run.syphon:1 (rank 4) imports backlog_syphon.cli (rank 5)"]
    assert rank_violations("from . import rules\n", "backlog_syphon.restore", is_package=True) == []
    assert rank_violations("", "backlog_syphon.plugins.x") == [
        "backlog_syphon.plugins.x is in a package without a rank: give it one in RANKS"]


def test_the_amqp_package_imports_nothing_from_the_rest_of_restore():
    """The codec knows AMQP and Service Bus's annotations, not the legacy client: ``restore.amqp`` imports only
    itself from ``restore``."""
    offenders = [f"{module}:{line} imports {target}"
                 for path, module, is_package in library_modules() if module.startswith("backlog_syphon.restore.amqp")
                 for line, target in library_imports(path.read_text(), module, is_package=is_package)
                 if target.startswith("backlog_syphon.restore") and not target.startswith("backlog_syphon.restore.amqp")]
    assert not offenders, offenders

