"""No import cycles in the package, between modules or between its folders; and a core that imports no torch.

Every import of a checkmate module counts, including those inside function bodies (an import deferred into a
function to break a cycle is still a cycle, and one that reaches torch still needs torch). Run as a script to print
the import graph's cycles and the torch-free modules that reach torch:

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
# The core: planning on a graph, its searches, bounds, solvers and experiments run without torch installed.
TORCH_FREE_FOLDERS = ("bounds", "coarsen", "experiments", "milp", "strategies")
TORCH_FREE_MODULES = (
    "captured",
    "disk_cache",
    "errors",
    "examples",
    "files",
    "graph",
    "json_cache",
    "options",
    "plan",
    "progress",
    "progress_lines",
    "search_defaults",
    "simulate",
    "solve",
    "byte_sizes",
)


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


def imports_torch(path: Path) -> bool:
    """Whether the module imports torch anywhere in its body (an import for type checking only does not count)."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "torch" for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            return True
    return False


def torch_free_modules() -> list[str]:
    """The modules of the core, by dotted name."""
    return sorted(
        name
        for name in modules()
        if folder_of(name) in TORCH_FREE_FOLDERS or name.removeprefix(f"{PACKAGE}.") in TORCH_FREE_MODULES
    )


def reaching_torch(graph: dict[str, set[str]], found: dict[str, Path]) -> dict[str, list[str]]:
    """Each torch-free module that reaches torch: the chain of imports from it to a module that imports torch."""
    reached: dict[str, list[str]] = {}
    for start in torch_free_modules():
        chains = {start: [start]}
        queue = [start]
        while queue:
            name = queue.pop(0)
            if imports_torch(found[name]):
                reached[start] = [*chains[name], "torch"]
                break
            for target in sorted(graph.get(name, ())):
                if target not in chains:
                    chains[target] = [*chains[name], target]
                    queue.append(target)
    return reached


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


def test_the_core_reaches_no_torch() -> None:
    found = modules()
    assert f"{PACKAGE}.experiments.batch_search" in torch_free_modules(), "the torch-free folders were found"
    assert imports_torch(found[f"{PACKAGE}.torch_capture.trace"]) and not imports_torch(found[f"{PACKAGE}.captured"])
    assert reaching_torch(module_graph(), found) == {}


if __name__ == "__main__":
    graph = module_graph()
    print("module cycles:", cycles(graph) or "none")
    print("folder cycles:", cycles(folder_graph(graph)) or "none")
    print("torch-free modules reaching torch:", reaching_torch(graph, modules()) or "none")
