"""Seams the module splits must not leave behind, checked from the library's source (parsed, never imported)."""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "lib" / "backlog_syphon"


def library_sources():
    for path in sorted(LIB.rglob("*.py")):
        yield path.relative_to(LIB.parent), ast.parse(path.read_text())


def named_loggers(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that name a logger with a literal (``logging.getLogger("x")``) instead of ``__name__``."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getLogger"
            and node.args and isinstance(node.args[0], ast.Constant)]


def test_the_check_sees_a_logger_named_by_a_literal():
    tree = ast.parse("import logging\na = logging.getLogger(__name__)\nb = logging.getLogger('x.y')\nc = logging.getLogger()\n")
    assert named_loggers(tree) == [3]


def test_every_library_logger_is_named_after_its_module():
    """A logger named by hand keeps the name of a module that may no longer exist (a split moved its code)."""
    offenders = {str(path): lines for path, tree in library_sources() for lines in [named_loggers(tree)] if lines}
    assert not offenders, f"loggers named by a literal (use __name__): {offenders}"


def private_names_imported(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """``module.name`` for each private name (one leading underscore) ``tree`` imports from another library
    module, or reads as an attribute of a library module it imported."""
    package = module if is_package else module.rsplit(".", 1)[0]
    imported_modules: dict[str, str] = {}  # local name -> library module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            if base != "backlog_syphon" and not base.startswith("backlog_syphon."):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and base != module:
                    found.append(f"{base}.{alias.name}")
                imported_modules[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("backlog_syphon"):
                    imported_modules[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in imported_modules):
            found.append(f"{imported_modules[node.value.id]}.{node.attr}")
    return sorted(set(found))


def test_the_check_sees_private_names_taken_from_other_modules():
    source = ("from backlog_syphon.restore.amqp.wire import _U8, U16\nfrom . import sections\n"
              "from .message import _helper as helper\nimport os\nx = sections._split(b'')\ny = os._exit\n")
    assert private_names_imported(ast.parse(source), "backlog_syphon.restore.amqp.decoding", False) == [
        "backlog_syphon.restore.amqp.message._helper", "backlog_syphon.restore.amqp.sections._split",
        "backlog_syphon.restore.amqp.wire._U8"]


def test_no_private_name_crosses_a_module_line():
    """A leading underscore says "this module's own": a name another library module needs is public, so a
    reader can tell what a module offers from its names alone."""
    offenders = {}
    for path in sorted(LIB.rglob("*.py")):
        parts = path.relative_to(LIB.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        names = private_names_imported(ast.parse(path.read_text()), module, is_package)
        if names:
            offenders[module] = names
    assert not offenders, f"private names used across module lines: {offenders}"
