"""A rerun of a benchmark beside its stored rows: the same configurations, their planned and measured peaks and step
times side by side, so that a refactoring can show it changed no plan and no peak, and time only within noise.

    python benchmarks/rerun.py benchmarks/results/sharded.json /tmp/sharded.json --keys config \
        --same ours_planned ours_budget --ratio peak ours_peak step_ms ours_ms

Rows are matched by `--keys`; `--same` fields must be equal (a planned peak is a plan's: the same plan gives the same
bytes), `--ratio` fields are printed as new/stored. A stored row without a rerun, or the reverse, is listed.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from rows import Row, markdown_table, read_rows


def compare(stored: list[Row], new: list[Row], keys: list[str], same: list[str], ratio: list[str]) -> tuple[str, int]:
    """The side-by-side table, and how many `--same` fields differ."""

    def key(row: Row) -> tuple[Any, ...]:
        return tuple(row.get(name) for name in keys)

    by_key = {key(row): row for row in new}
    lines, differing = [], 0
    for old in stored:
        row = by_key.pop(key(old), None)
        if row is None:
            lines.append([*map(str, key(old)), "not rerun", *[""] * (len(same) + len(ratio) - 1)])
            continue
        cells = []
        for name in same:
            equal = old.get(name) == row.get(name)
            differing += not equal
            cells.append("same" if equal else f"{old.get(name)} -> {row.get(name)}")
        for name in ratio:
            before, after = old.get(name), row.get(name)
            usable = isinstance(before, int | float) and isinstance(after, int | float) and before
            cells.append(f"{after / before:.3f}" if usable and math.isfinite(after / before) else "—")
        lines.append([*map(str, key(old)), *cells])
    for extra in by_key:
        lines.append([*map(str, extra), "new only", *[""] * (len(same) + len(ratio) - 1)])
    header = [*keys, *same, *(f"{name} new/stored" for name in ratio)]
    return markdown_table(header, lines), differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stored", type=Path)
    parser.add_argument("rerun", type=Path)
    parser.add_argument("--keys", nargs="+", required=True)
    parser.add_argument("--same", nargs="*", default=[])
    parser.add_argument("--ratio", nargs="*", default=[])
    args = parser.parse_args()
    table, differing = compare(
        read_rows(args.stored).rows, read_rows(args.rerun).rows, args.keys, args.same, args.ratio
    )
    print(table)
    print(f"\n{differing} field(s) of --same differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
