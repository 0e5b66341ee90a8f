"""The package's structure, for comparing two versions of it: for each package of `SRC/checkmate`, the packages and
top-level modules it imports (from an `ast` walk, imports inside functions included), and the size of named classes.

    python benchmarks/investigations/code_structure.py src CompiledStep Sharded DataParallel
    git archive e4a2768 src | tar -x -C /tmp/before && python ... /tmp/before/src CompiledStep ShardedStep
"""

from __future__ import annotations

import argparse
import ast
import collections
from pathlib import Path


def structure(source: Path) -> tuple[dict[str, set[str]], dict[str, tuple[int, int, str]]]:
    """(package -> what it imports, class -> (methods, lines, module)) of the `checkmate` package under `source`."""
    root = source / "checkmate"
    imports: dict[str, set[str]] = collections.defaultdict(set)
    classes: dict[str, tuple[int, int, str]] = {}
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        package = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("checkmate."):
                names = [node.module]
            elif isinstance(node, ast.ImportFrom) and node.module == "checkmate":
                names = [f"checkmate.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("checkmate.")]
            imports[package].update(name.split(".")[1] for name in names if name.split(".")[1] != package)
            if isinstance(node, ast.ClassDef):
                methods = [item for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)]
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                classes[node.name] = (len(methods), lines, str(relative))
    return imports, classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="the folder holding the checkmate package")
    parser.add_argument("classes", nargs="*", help="classes to size")
    args = parser.parse_args()
    imports, classes = structure(args.source)
    root = args.source / "checkmate"
    packages = sorted(path.name for path in root.iterdir() if path.is_dir() and path.name != "__pycache__")
    print("## package -> packages and top-level modules it imports")
    for package in packages:
        print(f"{package}: {', '.join(sorted(imports[package])) or '-'}")
    print("## classes")
    for name in args.classes:
        if name in classes:
            methods, lines, module = classes[name]
            print(f"{name} ({module}): {methods} methods, {lines} lines")


if __name__ == "__main__":
    main()
