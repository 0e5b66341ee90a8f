"""No import cycles in the package: between modules, or between its folders (issue 19, item 1).

Every import of a checkmate module counts, including those inside function bodies (an import deferred into a
function to break a cycle is still a cycle). Run as a script to print the import graph's cycles:

    .venv/bin/python tests/unit/test_import_structure.py
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "checkmate"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in (SOURCE / PACKAGE).rglob("*.py"):
        name = ".".join(path.relative_to(SOURCE).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The checkmate modules that module `name` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        yield from (target for target in targets if target in known and target != name)


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports; the package's own `__init__` (the public facade) is left out."""
    found = modules()
    known = set(found)
    graph = {name: set(imports(name, path, known)) - {PACKAGE} for name, path in found.items() if name != PACKAGE}
    return graph


def folder_of(name: str) -> str:
    """The first-level folder of a module (`checkmate.strategies.optimal` -> `strategies`), or the module itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and (SOURCE / PACKAGE / parts[1]).is_dir() else name


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = defaultdict(set)
    for name, targets in graph.items():
        folders[folder_of(name)] |= {folder_of(target) for target in targets} - {folder_of(name)}
    return folders


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_analysis_sees_the_package() -> None:
    graph = module_graph()
    assert len(graph) > 100, "the package's modules were found"
    assert "checkmate.strategies.large_graph" in graph["checkmate.strategies.optimal"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(module_graph()) == []


def test_no_folder_imports_itself_through_others() -> None:
    assert cycles(folder_graph(module_graph())) == []


if __name__ == "__main__":
    graph = module_graph()
    print("module cycles:", cycles(graph) or "none")
    print("folder cycles:", cycles(folder_graph(graph)) or "none")
