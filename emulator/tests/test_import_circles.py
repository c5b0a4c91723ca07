"""No import circles among the emulator's modules: every strongly connected component of the import
graph is one module. An import inside a function counts (that is how a circle usually hides), and so do
relative imports, resolved against the importing module's package."""
import ast
from pathlib import Path
from typing import Dict, List, Set

import servicebus_emulator

PACKAGE = servicebus_emulator.__name__
ROOT = Path(servicebus_emulator.__file__).parent


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path, modules: Set[str]) -> Set[str]:
    """The package's modules that ``path`` imports anywhere in its body (functions included)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from . import codec` imports the module codec; `from .codec import owned` the module codec
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    """Module -> the modules of the same package it imports."""
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    return {module_name(p, root): imported_modules(p, root, modules) for p in paths}


def strongly_connected_components(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to meet on a long chain)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[Set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


def test_the_components_are_found_in_a_graph_with_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert sorted(map(sorted, strongly_connected_components(graph))) == [["a", "b", "c"], ["d"], ["e"]]


def test_relative_imports_and_imports_inside_functions_are_edges(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import thing\n",
        "a.py": "import os\nfrom . import b\n",
        "b.py": "def late():\n    from .sub.c import x\n",
        "sub/__init__.py": "",
        "sub/c.py": "from .. import a\nimport pkg.b\nfrom ..sub import d\n",
        "sub/d.py": "from pkg import thing\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    assert import_graph(root) == {
        "pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"}, "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a", "pkg.b", "pkg.sub.d"}, "pkg.sub.d": {"pkg"},
    }
    circles = [sorted(c) for c in strongly_connected_components(import_graph(root)) if len(c) > 1]
    assert circles == [["pkg", "pkg.a", "pkg.b", "pkg.sub.c", "pkg.sub.d"]]


def test_the_graph_is_the_whole_emulator():
    graph = import_graph()
    assert f"{PACKAGE}.emulator" in graph[PACKAGE]                       # `from .emulator import Emulator`
    assert f"{PACKAGE}.codec" in graph[f"{PACKAGE}.broker"]               # `from . import codec`
    assert {path.stem for path in ROOT.glob("*.py")} - {"__init__"} == {m.rpartition(".")[2] for m in graph} - {PACKAGE}


def test_the_emulator_has_no_import_circle():
    circles = [sorted(c) for c in strongly_connected_components(import_graph()) if len(c) > 1]
    assert circles == []
