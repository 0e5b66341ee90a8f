"""`optimal` and `approx` on op-level graphs of real models (80-900 nodes), beside every baseline.

For each graph of `benchmarks/graphs/` (made by `benchmarks/graph_set.py`, flops costs) and each budget (a fraction
of the checkpoint_all peak, fixed memory included), it runs every baseline, `approx` and `optimal` with the same
time limit, and prints one row per method: seconds, compute overhead over checkpoint_all, the lower bound proven
for the graph given (as an overhead), and the gap. "before" is the best baseline: what `optimal` returned on these
graphs before the coarsened path (issue 9). With `--out rows.json` the rows are written as JSON too.

    .venv/bin/python benchmarks/large_graphs.py --time-limit 120 --fractions 0.4 0.6 0.8
    .venv/bin/python benchmarks/large_graphs.py --graphs resnet50 gpt2 --fractions 0.6 --time-limit 300
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import time
from pathlib import Path
from typing import Any

import checkmate
from checkmate.strategies.warm_start import BASELINES

GRAPHS = Path(__file__).parent / "graphs"
SEARCHES = ("approx", "optimal")


def load(name: str) -> checkmate.Graph:
    with gzip.open(GRAPHS / f"{name}.json.gz", "rt") as file:
        return checkmate.Graph.from_json(file.read())


def run(graph: checkmate.Graph, budget: int, method: str, time_limit: float) -> dict[str, Any]:
    options = {"time_limit": time_limit} if method in SEARCHES else {}
    started = time.perf_counter()
    try:
        plan = checkmate.solve(graph, budget, method=method, **options)
    except (checkmate.InfeasibleBudget, checkmate.InvalidGraph) as error:
        return {"method": method, "seconds": time.perf_counter() - started, "status": type(error).__name__}
    return {
        "method": method,
        "seconds": time.perf_counter() - started,
        "status": plan.status,
        "cost": plan.cost,
        "peak": plan.peak_memory,
        "lower_bound": plan.lower_bound,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="*", help="names in benchmarks/graphs (default: all)")
    parser.add_argument("--fractions", nargs="*", type=float, default=[0.4, 0.6, 0.8])
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--methods", nargs="*", default=[*BASELINES, *SEARCHES])
    parser.add_argument("--out", type=Path, help="write every row to this JSON file")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    names = arguments.graphs or sorted(path.name.removesuffix(".json.gz") for path in GRAPHS.glob("*.json.gz"))
    rows: list[dict[str, Any]] = []
    print(f"{'graph':10} {'nodes':>5} {'budget':>6} {'method':20} {'s':>6} {'overhead':>9} {'bound':>8} {'gap':>7}")
    for name in names:
        graph = load(name)
        reference = checkmate.solve(graph, None)
        for fraction in arguments.fractions:
            budget = int(fraction * reference.peak_memory)
            for method in arguments.methods:
                row = {"graph": name, "nodes": graph.size, "fraction": fraction, "budget": budget}
                row |= run(graph, budget, method, arguments.time_limit)
                rows.append(row)
                print(format_row(row, reference.cost), flush=True)
            found = [row for row in rows[-len(arguments.methods) :] if "cost" in row]
            before = min((row["cost"] for row in found if row["method"] in BASELINES), default=None)
            if before is not None:
                print(f"{'':10} {'':5} {'':6} {'before (best baseline)':20} {'':6} {before / reference.cost - 1:9.1%}")
    if arguments.out:
        arguments.out.write_text(json.dumps(rows, indent=1))


def format_row(row: dict[str, Any], reference_cost: float) -> str:
    head = f"{row['graph']:10} {row['nodes']:5d} {row['fraction']:6.0%} {row['method']:20} {row['seconds']:6.1f}"
    if "cost" not in row:
        return f"{head} {row['status']}"
    overhead = f"{row['cost'] / reference_cost - 1:9.1%}"
    if row["lower_bound"] is None:
        return f"{head} {overhead}"
    bound = row["lower_bound"] / reference_cost - 1
    gap = (row["cost"] - row["lower_bound"]) / row["cost"]
    return f"{head} {overhead} {bound:8.1%} {gap:7.1%}"


if __name__ == "__main__":
    main()
