"""Files written whole or not at all (`checkmate.files`), and every writer of the project going through it."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from checkmate.files import replacing, write_file

ROOT = Path(__file__).resolve().parents[2]


def test_a_file_is_replaced_whole_with_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")
    target.chmod(0o640)
    write_file(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓" and target.stat().st_mode & 0o777 == 0o640
    write_file(tmp_path / "figure.png", b"\x89PNG")
    assert (tmp_path / "figure.png").read_bytes() == b"\x89PNG"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["figure.png", "plan.json"], "no temporary left"


def test_a_writer_that_fails_midway_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "rows.json"
    target.write_text("the previous rows")
    with pytest.raises(KeyboardInterrupt), replacing(target) as file:
        file.write("half of the new ro")
        raise KeyboardInterrupt  # Ctrl-C while writing
    assert target.read_text() == "the previous rows"
    assert [path.name for path in tmp_path.iterdir()] == ["rows.json"], "the temporary file is removed"


WRITER = """
import sys, time
from checkmate.files import replacing
with replacing(sys.argv[1]) as file:
    file.write("x" * 100_000)
    file.flush()
    print("writing", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGTERM])
def test_a_process_killed_while_writing_leaves_the_old_file(tmp_path: Path, signal_number: int) -> None:
    target = tmp_path / "graph.json"
    target.write_text("the previous graph")
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True, env=environment
    ) as writer:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        writer.send_signal(signal_number)
        assert writer.wait(timeout=30) == -signal_number
    assert target.read_text() == "the previous graph"


# Calls that write a file in place; every file the project writes goes through checkmate.files instead.
IN_PLACE = {"write_text", "write_bytes", "savefig", "dump", "save", "to_csv"}


def _in_place_writes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        modes = [arg.value for arg in node.args[1:2] if isinstance(arg, ast.Constant)]
        keywords = [word.value for word in node.keywords if word.arg == "mode"]
        modes += [keyword.value for keyword in keywords if isinstance(keyword, ast.Constant)]
        writes = any(isinstance(mode, str) and ("w" in mode or "a" in mode) for mode in modes)
        if name in IN_PLACE or (name == "open" and writes):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_every_file_the_project_writes_goes_through_checkmate_files() -> None:
    sources = [*sorted((ROOT / "src" / "checkmate").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
    allowed = {
        "src/checkmate/files.py",  # the helper itself (savefig on its temporary file)
        "src/checkmate/milp/mps.py",  # the MPS file handed to SCIP lives in a temporary directory of its own
        "src/checkmate/milp/backends/highs.py",  # opens os.devnull to silence the solver
    }
    found = [write for path in sources for write in _in_place_writes(path) if write.split(":")[0] not in allowed]
    assert found == []
