"""The tables of the documents, printed again from stored rows: each marked block holds what its command prints.

A block in README.md, BENCHMARKS.md or docs/*.md is marked with the command that prints it, a script's
`--from-json`, which reads rows under `benchmarks/results/` and measures nothing:

    <!-- table: python benchmarks/peers.py --from-json benchmarks/results/peers_full_resnet_gpt.json -->
    ... what the command prints (markdown), verbatim ...
    <!-- /table -->

`<!-- text: COMMAND -->` marks a block whose output is fixed-width text: it is held in a ```text fence.

    .venv/bin/python benchmarks/doc_tables.py           # rewrite every block from its command (make bench-tables)
    .venv/bin/python benchmarks/doc_tables.py --check   # name each block that differs; exit 1 if one does

Each command is `python SCRIPT.py ARGUMENTS...`; all of them run from the repository root in one child process of this
interpreter (so torch is imported once), with `src/` first on the import path.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from checkmate.files import write_file

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- (?P<kind>table|text): (?P<command>.+?) -->\n(?P<body>.*?)<!-- /(?P=kind) -->", re.DOTALL)

Kind = Literal["table", "text"]
Runner = Callable[[list[str]], dict[str, str]]


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


def run_scripts(commands: list[str], root: Path = ROOT) -> dict[str, str]:
    """What each command prints on stdout. Every command is `python SCRIPT ARGUMENTS...`; they run one after another
    in one child process (torch imported once), from `root`, with `src/` first on the import path."""
    for command in commands:
        words = shlex.split(command)
        if len(words) < 2 or words[0] != "python" or not words[1].endswith(".py"):
            raise ValueError(f"a block's command must be `python SCRIPT.py ...`, not {command!r}")
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), environment.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--run-each"], input=json.dumps(commands), cwd=root,
        env=environment, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the commands of the blocks failed:\n{done.stderr[-3000:]}")
    printed: dict[str, str] = json.loads(done.stdout)
    return printed


def _run_each(commands: list[str]) -> dict[str, str]:
    """In this process, run each `python SCRIPT ARGUMENTS...` as `__main__` and collect what it prints."""
    printed = {}
    for command in commands:
        script, *arguments = shlex.split(command)[1:]
        sys.argv = [script, *arguments]
        sys.path[:0] = [str(Path(script).resolve().parent), str(ROOT / "benchmarks")]
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                runpy.run_path(script, run_name="__main__")
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise RuntimeError(f"{command!r} exited with status {exit_.code}") from None
        printed[command] = output.getvalue()
    return printed


def regenerate(text: str, printed: dict[str, str]) -> str:
    """`text` with every marked block holding what its command printed (`printed[command]`)."""

    def replace(match: re.Match[str]) -> str:
        kind = match["kind"]
        new_body = body(cast(Kind, kind), printed[match["command"]])
        return f"<!-- {kind}: {match['command']} -->\n{new_body}<!-- /{kind} -->"

    return BLOCK.sub(replace, text)


def stale_blocks(paths: Iterable[Path], runner: Runner = run_scripts) -> list[Block]:
    """The blocks of `paths` whose body differs from what their command prints now."""
    found = [block for path in paths for block in blocks(path.read_text(), path)]
    printed = runner(list(dict.fromkeys(block.command for block in found)))
    return [block for block in found if block.body != body(block.kind, printed[block.command])]


def rewrite(paths: Iterable[Path], runner: Runner = run_scripts) -> list[Path]:
    """Rewrite every block of `paths` in place from its command; returns the documents that changed."""
    texts = {path: path.read_text() for path in paths}
    printed = runner(list(dict.fromkeys(block.command for path, text in texts.items() for block in blocks(text, path))))
    changed = []
    for path, text in texts.items():
        new_text = regenerate(text, printed)
        if new_text != text:
            write_file(path, new_text)
            changed.append(path)
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-each", action="store_true", help=argparse.SUPPRESS)  # the child of run_scripts
    parser.add_argument("--check", action="store_true", help="only name the blocks that differ; exit 1 if one does")
    arguments = parser.parse_args()
    if arguments.run_each:
        printed = _run_each(json.loads(sys.stdin.read()))
        sys.stdout.write(json.dumps(printed))
        return 0
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
