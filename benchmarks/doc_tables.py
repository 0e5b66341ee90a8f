"""The tables of the documents, printed again from stored rows: each marked block holds what its command prints.

A block in README.md, BENCHMARKS.md or docs/*.md is marked with the command that prints it, a script's
`--from-json`, which reads rows under `benchmarks/results/` and measures nothing:

    <!-- table: python benchmarks/peers.py --from-json benchmarks/results/peers_full_resnet_gpt.json -->
    ... what the command prints (markdown), verbatim ...
    <!-- /table -->

`<!-- text: COMMAND -->` marks a block whose output is fixed-width text: it is held in a ```text fence.

    .venv/bin/python benchmarks/doc_tables.py           # rewrite every block from its command (make bench-tables)
    .venv/bin/python benchmarks/doc_tables.py --check   # name each block that differs; exit 1 if one does

Commands run from the repository root, `python` meaning this interpreter, with `src/` first on the import path.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- (?P<kind>table|text): (?P<command>.+?) -->\n(?P<body>.*?)<!-- /(?P=kind) -->", re.DOTALL)

Kind = Literal["table", "text"]
Runner = Callable[[str], str]


@dataclass(frozen=True)
class Block:
    """One marked block of a document: its kind, its command and what it holds now."""

    document: Path
    kind: Kind
    command: str
    body: str


def documents(root: Path = ROOT) -> list[Path]:
    """The documents whose blocks are checked: README.md, BENCHMARKS.md and docs/*.md."""
    return [root / "README.md", root / "BENCHMARKS.md", *sorted((root / "docs").glob("*.md"))]


def blocks(text: str, document: Path) -> list[Block]:
    """The marked blocks of `text`, in order."""
    return [
        Block(document, cast(Kind, match["kind"]), match["command"], match["body"]) for match in BLOCK.finditer(text)
    ]


def body(kind: Kind, output: str) -> str:
    """What a block of `kind` holds for a command that printed `output`."""
    printed = output.rstrip("\n") + "\n"
    return printed if kind == "table" else f"```text\n{printed}```\n"


def run_command(command: str, root: Path = ROOT) -> str:
    """What `command` prints on stdout, run from `root` with `python` as this interpreter and `src/` on the path."""
    words = shlex.split(command)
    if words[0] == "python":
        words[0] = sys.executable
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), environment.get("PYTHONPATH")]))
    done = subprocess.run(words, cwd=root, env=environment, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command!r} exited with status {done.returncode}:\n{done.stderr[-2000:]}")
    return done.stdout


def outputs(commands: Iterable[str], runner: Runner = run_command) -> dict[str, str]:
    """Each distinct command's output, run two at a time."""
    distinct = list(dict.fromkeys(commands))
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(distinct, pool.map(runner, distinct), strict=True))


def regenerate(text: str, printed: dict[str, str]) -> str:
    """`text` with every marked block holding what its command printed (`printed[command]`)."""

    def replace(match: re.Match[str]) -> str:
        kind = match["kind"]
        new_body = body(cast(Kind, kind), printed[match["command"]])
        return f"<!-- {kind}: {match['command']} -->\n{new_body}<!-- /{kind} -->"

    return BLOCK.sub(replace, text)


def stale_blocks(paths: Iterable[Path], runner: Runner = run_command) -> list[Block]:
    """The blocks of `paths` whose body differs from what their command prints now."""
    found = [block for path in paths for block in blocks(path.read_text(), path)]
    printed = outputs((block.command for block in found), runner)
    return [block for block in found if block.body != body(block.kind, printed[block.command])]


def rewrite(paths: Iterable[Path], runner: Runner = run_command) -> list[Path]:
    """Rewrite every block of `paths` in place from its command; returns the documents that changed."""
    texts = {path: path.read_text() for path in paths}
    printed = outputs((block.command for path, text in texts.items() for block in blocks(text, path)), runner)
    changed = []
    for path, text in texts.items():
        new_text = regenerate(text, printed)
        if new_text != text:
            path.write_text(new_text)
            changed.append(path)
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only name the blocks that differ; exit 1 if one does")
    arguments = parser.parse_args()
    if arguments.check:
        stale = stale_blocks(documents())
        for block in stale:
            print(f"{block.document.relative_to(ROOT)}: block of {block.command!r} differs from what it prints")
        return 1 if stale else 0
    for path in rewrite(documents()):
        print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
