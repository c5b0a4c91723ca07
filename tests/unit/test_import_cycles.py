"""No import circles: the modules of the library, ``tools`` and ``jobs`` import one another without
ever coming back to where they started. Checked from their source (parsed, never imported).

An import inside a function counts: it only moves the circle from import time to call time, where it
still ties the two modules into one. ``test_import_direction`` ranks packages against each other, so
it cannot see a circle between two modules of one package; this finds every strongly connected
component of the module graph (Tarjan's algorithm) and fails on any of more than one module. The
emulator (``emulator/``) checks its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where each top-level package's source is: the library under lib/, the others at the root.
SOURCE_ROOTS = {"backlog_syphon": ROOT / "lib", "tools": ROOT, "jobs": ROOT}


def modules() -> dict[str, Path]:
    """Every module of the checked packages, by name (a package by its ``__init__``); ``jobs/`` is a
    folder of scripts, each a module of its own."""
    found = {}
    for package, root in SOURCE_ROOTS.items():
        for path in sorted(root.joinpath(package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(source: str, module: str, known: set[str], *, is_package: bool = False) -> set[str]:
    """The modules of ``known`` that ``source`` (module ``module``) imports, anywhere in it: ``import a.b``
    and ``from a.b import x`` import ``a.b`` (the longest known part of the name), ``from p import x`` the
    module ``p.x`` where there is one; relative imports are resolved against the module's package. A
    module that imports its own package's ``__init__`` this way is in a circle with it where the
    ``__init__`` imports it back: that circle is real (the ``__init__`` is half run)."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()

    def add(name: str) -> None:
        parts = name.split(".")
        found.update([prefix for prefix in (".".join(parts[:n]) for n in range(len(parts), 0, -1))
                      if prefix in known][:1])

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: ``.`` is the module's package, ``..`` its parent, ...
                parts = package.split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            found.update(submodules)
            if len(submodules) < len(node.names):  # some names are the package's own
                add(base)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = modules()
    known = set(paths)
    return {module: imported_modules(path.read_text(), module, known, is_package=path.name == "__init__.py")
            for module, path in paths.items()}


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively (no recursion limit): every strongly connected component of ``graph``,
    each sorted. An edge to a node outside the graph is ignored."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    return sorted(component for component in strongly_connected_components(graph) if len(component) > 1)


def test_no_module_is_in_an_import_circle():
    graph = import_graph()
    assert len(graph) > 60 and {"backlog_syphon.run.syphon", "tools.local_run", "jobs.syphon"} <= set(graph)
    assert "backlog_syphon.run.progress" in graph["backlog_syphon.run.syphon"]  # the graph has its edges
    found = circles(graph)
    assert not found, "import circles (each closed by an import, maybe one inside a function):\n" + "\n".join(
        " <-> ".join(circle) for circle in found)


def test_the_finder_finds_a_planted_circle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"f", "outside"},
             "g": {"h"}, "h": {"g"}}
    assert circles(graph) == [["a", "b", "c"], ["g", "h"]]
    assert sorted(strongly_connected_components(graph)) == [["a", "b", "c"], ["d"], ["e"], ["f"], ["g", "h"]]


def test_imports_inside_functions_relative_ones_and_from_a_package_its_modules_count():
    known = {"p", "p.a", "p.b", "p.q", "p.sub", "p.sub.c", "q"}
    source = ("from p import a, helper\n"
              "def f():\n    from . import c\n    from ..q import thing\n"
              "class K:\n    def g(self):\n        import p.b\n        import q\n")
    assert imported_modules(source, "p.sub.d", known) == {"p", "p.a", "p.sub.c", "p.q", "p.b", "q"}
    assert imported_modules("from . import a\nfrom .sub import c\nimport p.sub.x\n", "p", known,
                            is_package=True) == {"p.a", "p.sub", "p.sub.c"}
    # A package's ``__init__`` re-exporting its modules' names is in a circle with none of them, unless
    # one of them imports the package itself back.
    assert circles({"p": {"p.a", "p.b"}, "p.a": {"p.b"}, "p.b": set()}) == []
    assert circles({"p": {"p.a", "p.b"}, "p.a": {"p.b"}, "p.b": {"p"}}) == [["p", "p.a", "p.b"]]
