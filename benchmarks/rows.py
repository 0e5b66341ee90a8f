"""Stored rows of a benchmark: what a script measured, as JSON under `benchmarks/results/`, and its tables again.

Each script of `benchmarks/` measures into rows (plain dicts that JSON can hold) and prints its tables from rows
alone, so that the same tables come from a run or from a file. `add_row_arguments` gives a script two options:

    --out [PATH]        write the rows, with the command and when it ran (default benchmarks/results/<name>.json)
    --from-json [PATH]  print the tables from stored rows, measuring nothing (default the same file)

where <name> is the one the script gives `measure_or_load` (its file name, or a variant's), and `measure_or_load`
does one or the other. A run writes its file after every row, so that a long run that stops keeps what it measured.
A script whose rows each name what they measured (a `merge_key` field, such as a graph's "name") can also offer

    --merge             with --out: keep the file's rows of other keys; a new row replaces the stored row of its key

so that a run of some of its rows lands beside the rows stored before; the file then records the earlier run's
environment under "merged_with".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkmate.files import write_file

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT = Path("<default>")  # what --out or --from-json holds when given without a path

Row = dict[str, Any]


@dataclass(frozen=True)
class Stored:
    """A benchmark's rows and how they were made.

    Attributes:
        rows: one dict per measured thing, in the order measured.
        environment: the command, Python, the load average and the UTC times the run started and ended.
    """

    rows: list[Row]
    environment: dict[str, Any] = field(default_factory=dict)


def default_path(name: str) -> Path:
    """Where the rows of benchmark `name` are kept: `benchmarks/results/<name>.json`."""
    return RESULTS / f"{name}.json"


def add_row_arguments(parser: argparse.ArgumentParser, merge_key: str | None = None) -> None:
    """Add `--out [PATH]` and `--from-json [PATH]`; given without a path, each means `default_path(name)` of the
    name that `measure_or_load` is called with. With `merge_key`, add `--merge` too, which merges the new rows into
    the file by the row field `merge_key` (see `merge_rows`)."""
    parser.add_argument(
        "--out", type=Path, nargs="?", const=DEFAULT, metavar="PATH",
        help="write the rows as JSON (default benchmarks/results/<name>.json)",
    )  # fmt: skip
    parser.add_argument(
        "--from-json", type=Path, nargs="?", const=DEFAULT, metavar="PATH",
        help="print the tables from stored rows without running anything (default benchmarks/results/<name>.json)",
    )  # fmt: skip
    parser.set_defaults(merge=None)
    if merge_key is not None:
        parser.add_argument(
            "--merge", action="store_const", const=merge_key,
            help=f"with --out: keep the stored rows whose {merge_key!r} no new row has, replace the others",
        )  # fmt: skip


def markdown_table(header: list[str], lines: Iterable[list[str]]) -> str:
    """A markdown table of `header` and one row of cells per item of `lines`."""
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(table)


def environment() -> dict[str, Any]:
    """The command as typed (relative to the repository root) and the state of the machine as a run starts."""
    return {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "started": _now(),
    }


def write_rows(path: Path, stored: Stored) -> None:
    """Write `stored` as JSON to `path` (its folder made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"environment": stored.environment, "rows": stored.rows}, indent=1, default=_plain)
    write_file(path, text + "\n")


def read_rows(path: Path) -> Stored:
    """Rows written by `write_rows`."""
    saved = json.loads(path.read_text())
    return Stored(rows=saved["rows"], environment=saved.get("environment", {}))


def merge_rows(stored: list[Row], new: list[Row], key: str) -> list[Row]:
    """The `stored` rows in order, each replaced by the last `new` row of the same `key` value, then the `new`
    rows whose value no stored row has."""
    new_by_key = {row[key]: row for row in new}
    merged = [new_by_key.pop(row.get(key), row) for row in stored]
    return merged + list(new_by_key.values())


def measure_or_load(
    arguments: argparse.Namespace, name: str, measure: Callable[[], Iterable[Row]], render: Callable[[Stored], str]
) -> Stored:
    """With `--from-json`, print `render` of the stored rows and measure nothing; otherwise collect the rows
    `measure` yields (writing them after each one with `--out`) and print `render` of them. `name` names the default
    file, `benchmarks/results/<name>.json`. With `--merge` the rows written, printed and returned are the file's
    rows merged with the new ones (`merge_rows`). Returns the rows."""
    out = None if arguments.out is None else _resolve(arguments.out, name)
    if arguments.from_json is not None:
        stored = read_rows(_resolve(arguments.from_json, name))
    else:
        stored = Stored(rows=[], environment=environment())
        earlier = _earlier_rows(arguments.merge, out, stored)
        stored.rows.extend(earlier)
        measured: list[Row] = []
        for row in measure():
            measured.append(row)
            stored.rows[:] = measured if arguments.merge is None else merge_rows(earlier, measured, arguments.merge)
            if out is not None:
                write_rows(out, stored)
        stored.environment["finished"] = _now()
        if out is not None:
            write_rows(out, stored)
            print(f"rows written to {out}", file=sys.stderr)
    print(render(stored))
    return stored


def _earlier_rows(merge_key: str | None, out: Path | None, stored: Stored) -> list[Row]:
    """With `--merge`, the rows `out` holds (none if it does not exist yet), its environment recorded in `stored`."""
    if merge_key is None:
        return []
    if out is None:
        raise SystemExit("--merge merges into the file --out writes: give --out too")
    if not out.exists():
        return []
    earlier = read_rows(out)
    stored.environment["merged_with"] = earlier.environment
    return earlier.rows


def _resolve(path: Path, name: str) -> Path:
    return default_path(name) if path == DEFAULT else path


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _plain(value: Any) -> Any:
    """JSON for what `json` does not know: numbers of numpy or torch as numbers, anything else as text."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)
