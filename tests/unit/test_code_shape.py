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
