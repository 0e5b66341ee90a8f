"""How close `approx` (LP relaxation + two-phase rounding) comes to the optimum on small graphs.

For unit chains (n = 8..32 forward nodes), random forward DAGs with their backward graphs (each forward node
reads its predecessor and up to two earlier nodes; costs and sizes 1-9) and random skip-connection graphs
(`checkmate.examples.random_training_graph`, 15-59 nodes), at `--points` budgets spread evenly from the smallest
feasible budget (the smallest peak `checkmate.minimum_budget` finds in 60 s) to the checkpoint_all peak, it solves
`method="optimal"` (HiGHS, `--optimal-time-limit` seconds, 60 by default: the optimum is proven on most of these)
and `method="approx"` (or `--method`), and prints per case the cost ratio approx / optimal ("no plan" where approx
found none), whether the optimum was proven, and approx's seconds; then per family and overall in how many cases
approx has a plan, and the max and the geometric mean ratio over those.
A ratio below 1 can occur only where the optimum was not proven in time; a budget where `optimal` found no
plan in time has no reference and is listed apart ("skipped").

The smallest budgets and the optima are kept in `--optima` (default benchmarks/results/approx_quality_optima.json,
written after every solve), so a second run, or a run of another method, solves only what is not there.

    .venv/bin/python benchmarks/approx_quality.py --out       # rows to benchmarks/results/approx_quality.json
    .venv/bin/python benchmarks/approx_quality.py --from-json # the table again from them
    .venv/bin/python benchmarks/approx_quality.py --only chain --approx-time-limit 10
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import checkmate
from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.files import write_file
from checkmate.graph import Graph
from rows import RESULTS, Row, Stored, add_row_arguments, measure_or_load


def random_dag(forward_nodes: int, seed: int) -> Graph:
    """A forward DAG: node j reads j - 1 and up to two random earlier nodes; costs and sizes uniform in 1..9."""
    rng = np.random.default_rng(seed)
    forward_inputs: list[list[int]] = [[]]
    for j in range(1, forward_nodes):
        skips = rng.integers(0, j, size=int(rng.integers(0, 3))).tolist() if j >= 2 else []
        forward_inputs.append(sorted({j - 1, *skips}))
    costs = rng.integers(1, 10, forward_nodes).tolist()
    memory = rng.integers(1, 10, forward_nodes).tolist()
    return training_graph(forward_inputs, costs=costs, memory=memory)


def graphs() -> Iterator[tuple[str, str, Graph]]:
    for n in (8, 12, 16, 24, 32):
        yield "chain", f"chain n={n}", linear_graph(n)
    for forward, seed in ((6, 0), (8, 1), (10, 2), (12, 3)):
        yield "dag", f"dag f={forward} s={seed}", random_dag(forward, seed)
    for forward, seed in ((7, 0), (12, 1), (20, 2), (29, 3)):
        yield "skip", f"skip f={forward} s={seed}", random_training_graph(forward, seed=seed)


def budgets(graph: Graph, points: int, smallest: int) -> list[int]:
    peak = checkmate.solve(graph, None, method="checkpoint_all").peak_memory
    return sorted({round(b) for b in np.linspace(smallest, peak, points)})


def smallest_budget(graph: Graph) -> int:
    """The lowest budget: the smallest peak `minimum_budget` finds in 60 s (its MILP is not always proven)."""
    found = checkmate.minimum_budget(graph, time_limit=60).upper
    return found if found is not None else checkmate.solve(graph, None, method="checkpoint_all").peak_memory


def measure(arguments: argparse.Namespace) -> Iterator[Row]:
    optima: dict[str, Any] = {}  # "<graph> smallest": bytes; "<graph> b=<budget> tl=<s>": [cost or None, proven]
    if arguments.optima.exists():
        optima = json.loads(arguments.optima.read_text())
    for family, label, graph in graphs():
        if arguments.only and family not in arguments.only:
            continue
        if f"{label} smallest" not in optima:
            optima[f"{label} smallest"] = smallest_budget(graph)
            _keep(arguments.optima, optima)
        for budget in budgets(graph, arguments.points, optima[f"{label} smallest"]):
            key = f"{label} b={budget} tl={arguments.optimal_time_limit:g}"
            if key not in optima:
                try:
                    best = checkmate.solve(graph, budget, method="optimal", time_limit=arguments.optimal_time_limit)
                    optima[key] = [best.cost, best.status == "optimal"]
                except checkmate.InfeasibleBudget:
                    optima[key] = [None, False]
                _keep(arguments.optima, optima)
            optimum, proven = optima[key]
            row: Row = {"family": family, "graph": label, "nodes": graph.size, "budget": budget, "optimum": optimum}
            if optimum is not None:
                started = time.perf_counter()
                try:
                    options = {"time_limit": arguments.approx_time_limit}
                    row["cost"] = checkmate.solve(graph, budget, method=arguments.method, **options).cost
                except checkmate.InfeasibleBudget:
                    row["cost"] = None  # approx found no plan within a budget that `optimal` met
                row |= {"proven": proven, "seconds": time.perf_counter() - started}
            print(line(row), file=sys.stderr, flush=True)
            yield row


def _keep(path: Path, optima: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(optima, indent=0))


def line(row: Row) -> str:
    head = f"{row['graph']:<16} {row['nodes']:>3} {row['budget']:>6}"
    if row["optimum"] is None:
        return f"{head}   optimal found no plan in its time limit: skipped"
    cost = row["cost"]
    shown = "no plan" if cost is None else f"{cost:9.2f}"
    ratio = "-" if cost is None else f"{cost / row['optimum']:6.3f}"
    return (
        f"{head} {row['optimum']:>9.2f} {'yes' if row['proven'] else 'no':>6} {shown:>9} {ratio:>6} "
        f"{row['seconds']:>8.2f}"
    )


def render(stored: Stored) -> str:
    header = f"{'graph':<16} {'T':>3} {'budget':>6} {'optimal':>9} {'proven':>6} {'approx':>9} {'ratio':>6} approx s"
    lines = [header, *(line(row) for row in stored.rows)]
    compared = [row for row in stored.rows if row["optimum"] is not None]
    if not compared:
        return "\n".join(lines)
    lines.append("")
    for family in dict.fromkeys(row["family"] for row in compared):
        lines.append(f"{family:<6} {_summary([row for row in compared if row['family'] == family])}")
    seconds = [row["seconds"] for row in compared]
    skipped = len(stored.rows) - len(compared)
    lines.append(
        f"all    {_summary(compared)}  approx seconds: total {sum(seconds):.1f}, max {max(seconds):.2f}; "
        f"skipped (no optimum in time) {skipped}"
    )
    return "\n".join(lines)


def _summary(rows: list[Row]) -> str:
    """In how many cases approx has a plan, and the max and geometric mean of its ratio over those."""
    ratios = [row["cost"] / row["optimum"] for row in rows if row["cost"] is not None]
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else math.nan
    return (
        f"cases {len(rows):>3}  with a plan {len(ratios)} of {len(rows)}  "
        f"max {max(ratios, default=math.nan):.3f}  geomean {geomean:.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=6, help="budgets per graph")
    parser.add_argument("--optimal-time-limit", type=float, default=60.0)
    parser.add_argument("--approx-time-limit", type=float, default=None)
    parser.add_argument("--method", default="approx", help="the method to compare with optimal")
    parser.add_argument("--only", nargs="*", default=None, help="families to run: chain, dag, skip")
    parser.add_argument(
        "--optima", type=Path, default=RESULTS / "approx_quality_optima.json",
        help="JSON file of smallest budgets and optima to reuse and extend "
        "(default benchmarks/results/approx_quality_optima.json)",
    )  # fmt: skip
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "approx_quality", lambda: measure(arguments), render)


if __name__ == "__main__":
    main()
