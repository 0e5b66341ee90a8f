"""How close `approx` (LP relaxation + two-phase rounding) comes to the optimum on small graphs.

For unit chains (n = 8..32 forward nodes), random forward DAGs with their backward graphs (each forward node
reads its predecessor and up to two earlier nodes; costs and sizes 1-9) and random skip-connection graphs
(`checkmate.examples.random_training_graph`, 15-59 nodes), at `--points` budgets spread evenly from the smallest
feasible budget (the smallest peak `checkmate.minimum_budget` finds in 60 s) to the checkpoint_all peak, it solves
`method="optimal"` (HiGHS, `--optimal-time-limit` seconds, 60 by default: the optimum is proven on most of these)
and `method="approx"` (or `--method`), and prints per case the cost ratio approx / optimal (inf where approx found
no plan), whether the optimum was proven, and approx's seconds; then per family and overall the failures, the max
and the geometric mean ratio of the cases approx solved.
A ratio below 1 can occur only where the optimum was not proven in time; a budget where `optimal` found no
plan in time is skipped.

    .venv/bin/python benchmarks/approx_quality.py
    .venv/bin/python benchmarks/approx_quality.py --cache /tmp/optima.json   # reuse budgets and optima across runs
    .venv/bin/python benchmarks/approx_quality.py --only chain --approx-time-limit 10
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import checkmate
from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.graph import Graph


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=6, help="budgets per graph")
    parser.add_argument("--optimal-time-limit", type=float, default=60.0)
    parser.add_argument("--approx-time-limit", type=float, default=None)
    parser.add_argument("--method", default="approx", help="the method to compare with optimal")
    parser.add_argument("--only", nargs="*", default=None, help="families to run: chain, dag, skip")
    parser.add_argument("--cache", type=Path, default=None, help="JSON file of budgets and optima to reuse and extend")
    args = parser.parse_args()

    cache: dict[str, Any] = {}  # "<graph> smallest": bytes; "<graph> b=<budget> tl=<s>": [cost or None, proven]
    if args.cache is not None and args.cache.exists():
        cache = json.loads(args.cache.read_text())
    ratios: list[float] = []
    families: dict[str, list[float]] = {}
    approx_seconds: list[float] = []
    print(f"{'graph':<16} {'T':>3} {'budget':>6} {'optimal':>9} {'proven':>6} {'approx':>9} {'ratio':>6} approx s")
    for family, label, graph in graphs():
        if args.only and family not in args.only:
            continue
        if f"{label} smallest" not in cache:
            cache[f"{label} smallest"] = smallest_budget(graph)
        for budget in budgets(graph, args.points, cache[f"{label} smallest"]):
            key = f"{label} b={budget} tl={args.optimal_time_limit:g}"
            if key not in cache:
                try:
                    best = checkmate.solve(graph, budget, method="optimal", time_limit=args.optimal_time_limit)
                    cache[key] = [best.cost, best.status == "optimal"]
                except checkmate.InfeasibleBudget:
                    cache[key] = [None, False]
                if args.cache is not None:
                    args.cache.write_text(json.dumps(cache, indent=0))
            optimum, proven = cache[key]
            if optimum is None:
                print(f"{label:<16} {graph.size:>3} {budget:>6}   optimal found no plan in its time limit: skipped")
                continue
            started = time.perf_counter()
            try:
                cost = checkmate.solve(graph, budget, method=args.method, time_limit=args.approx_time_limit).cost
            except checkmate.InfeasibleBudget:
                cost = math.inf  # approx found no plan within a budget that `optimal` met
            seconds = time.perf_counter() - started
            ratio = cost / optimum
            ratios.append(ratio)
            families.setdefault(family, []).append(ratio)
            approx_seconds.append(seconds)
            print(
                f"{label:<16} {graph.size:>3} {budget:>6} {optimum:>9.2f} {'yes' if proven else 'no':>6} "
                f"{cost:>9.2f} {ratio:>6.3f} {seconds:>8.2f}",
                flush=True,
            )
    if not ratios:
        return
    print()
    for family, values in families.items():
        print(f"{family:<6} {_summary(values)}")
    print(f"all    {_summary(ratios)}  approx seconds: total {sum(approx_seconds):.1f}, max {max(approx_seconds):.2f}")


def _summary(ratios: list[float]) -> str:
    """Max and geometric mean over the cases approx solved; the cases it failed are counted apart."""
    solved = [r for r in ratios if math.isfinite(r)]
    geomean = math.exp(sum(math.log(r) for r in solved) / len(solved)) if solved else math.nan
    return (
        f"cases {len(ratios):>3}  failed {len(ratios) - len(solved)}  "
        f"max {max(solved, default=math.nan):.3f}  geomean {geomean:.4f}"
    )


if __name__ == "__main__":
    main()
