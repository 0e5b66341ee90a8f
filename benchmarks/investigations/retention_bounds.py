"""The lower bounds of the large-graph search on the graph set (issue 20): retention, with and without the input
cover, and closure.

For each graph of `benchmarks/graphs/` and each budget (a fraction of the checkpoint_all peak), the proven lower
bound on extra compute over checkpoint_all: the retention MILP alone, with the input cover
(`checkmate.bounds.input_cover`; `retention_bound` solves the MILP alone first, then with the cover in the time
left), and the closure bound (`checkmate.bounds.closure`, at the 8 stages where memory is tightest), each with the
time limit given, and the seconds each took. The search counts the larger of the last two.

    .venv/bin/python benchmarks/investigations/retention_bounds.py --out \
        [--graphs gpt2 bert] [--fractions 0.6 0.8] [--time-limit 60]
    .venv/bin/python benchmarks/investigations/retention_bounds.py --from-json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import checkmate
from checkmate.bounds import ClosureBound, RetentionBound, closure_bound, retention_bound

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from large_graphs import GRAPHS, load
from rows import Row, Stored, add_row_arguments, measure_or_load

LABELS = ("plain", "cover", "closure")


def measure(names: list[str], fractions: list[float], time_limit: float) -> Iterator[Row]:
    for name in names:
        graph = load(name)
        reference = checkmate.solve(graph, None)
        for fraction in fractions:
            budget = int(fraction * reference.peak_memory)
            row: Row = {"graph": name, "nodes": graph.size, "fraction": fraction, "reference_cost": reference.cost}
            for label in LABELS:
                started = time.perf_counter()
                try:
                    found = bound(label, graph, budget, time_limit)
                except checkmate.InfeasibleBudget:
                    row[label] = None
                    continue
                row[label] = {"bound": found.bound, "proven": found.proven, "seconds": time.perf_counter() - started}
            print(line(row), file=sys.stderr, flush=True)
            yield row


def bound(label: str, graph: checkmate.Graph, budget: int, time_limit: float) -> RetentionBound | ClosureBound:
    if label == "closure":
        return closure_bound(graph, budget, time_limit=time_limit)
    return retention_bound(graph, budget, time_limit=time_limit, cover=label == "cover")


def line(row: Row) -> str:
    cells = []
    for label in LABELS:
        if label not in row:
            cells.append(f"{'-':>24}")
            continue
        found = row[label]
        if found is None:
            cells.append(f"{'no plan fits':>24}")
            continue
        extra = 100 * (found["bound"] / row["reference_cost"] - 1)
        cells.append(f"{extra:+7.2f}% {found['seconds']:6.1f}s {'proven' if found['proven'] else 'dual  '}")
    return f"{row['graph']:9} {row['nodes']:5d} {100 * row['fraction']:5.0f}%  " + "  ".join(cells)


def render(stored: Stored) -> str:
    header = (
        f"{'graph':9} {'nodes':>5} {'budget':>6}  {'retention MILP alone':>24}  {'with the input cover':>24}  "
        f"{'closure':>24}"
    )
    command = stored.environment.get("command", "")
    footer = f"(rows of: {command}; started {stored.environment.get('started', '?')})"
    return "\n".join([header, *(line(row) for row in stored.rows), footer])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="*", help="names in benchmarks/graphs (default: all)")
    parser.add_argument("--fractions", nargs="*", type=float, default=[0.6, 0.8])
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds for each MILP (default 60)")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    names = arguments.graphs or sorted(path.name.removesuffix(".json.gz") for path in GRAPHS.glob("*.json.gz"))
    measure_or_load(
        arguments, "retention_bounds", lambda: measure(names, arguments.fractions, arguments.time_limit), render
    )


if __name__ == "__main__":
    main()
