"""The paper's Table 2 form: MILP size, build and solve time, status and gap of `optimal`, and the cost ratio of
every baseline and of `approx` to `optimal`, for linear chains and random branching graphs at 30-100 % of the
checkpoint_all peak. Also the build time of the model for graphs of about 1000 stages.

Usage: .venv/bin/python benchmarks/milp_table.py [--time-limit 30] [--chains 8 16 32 64 128] [--random 16 32]
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections import defaultdict

import checkmate
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph
from checkmate.milp.formulation import encode
from checkmate.milp.scaling import memory_scale
from checkmate.strategies.warm_start import BASELINES

FRACTIONS = (0.3, 0.5, 0.7, 1.0)
COLUMNS = ("approx", *BASELINES)


def build_stats(graph: Graph, budget: int) -> tuple[int, int, int, float]:
    started = time.perf_counter()
    scale = memory_scale(graph)
    problem, _ = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
    return problem.num_variables, problem.num_constraints, problem.num_nonzeros, time.perf_counter() - started


@functools.cache
def smallest_budget(graph: Graph) -> int | None:
    return checkmate.minimum_budget(graph, time_limit=20).upper


def ratio(graph: Graph, budget: int, method: str, optimum: float, time_limit: float) -> float | None:
    options = {"time_limit": time_limit} if method == "approx" else {}
    try:
        return checkmate.solve(graph, budget, method=method, **options).cost / optimum
    except (checkmate.InfeasibleBudget, ValueError):
        return None


def run_case(label: str, graph: Graph, fraction: float, time_limit: float, ratios: dict[str, list[float]]) -> None:
    peak = checkmate.solve(graph, None, method="checkpoint_all").peak_memory
    minimum = smallest_budget(graph) or peak
    budget = max(int(fraction * peak), minimum)
    variables, rows, nonzeros, build = build_stats(graph, budget)
    plan = checkmate.solve(graph, budget, method="optimal", time_limit=time_limit)
    cells = []
    for method in COLUMNS:
        value = ratio(graph, budget, method, plan.cost, time_limit)
        cells.append("-" if value is None else f"{value:.3f}")
        if value is not None:
            ratios[method].append(value)
    clamped = "*" if budget == minimum and budget > int(fraction * peak) else ""
    print(
        f"| {label} | {graph.size} | {fraction:.0%}{clamped} ({budget}) | {variables} | {rows} | {nonzeros} | "
        f"{build:.3f} | "
        f"{plan.solve_time:.2f} | {plan.status} | {100 * (plan.gap or 0):.2f}% | {plan.cost:.2f} | "
        + " | ".join(cells)
        + " |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--chains", type=int, nargs="*", default=[8, 16, 32, 64, 128])
    parser.add_argument("--random", type=int, nargs="*", default=[16, 32])
    parser.add_argument("--fractions", type=float, nargs="*", default=list(FRACTIONS))
    parser.add_argument("--skip-build", action="store_true")
    args = parser.parse_args()
    print(
        "| graph | T | budget (units) | vars | rows | nnz | build s | solve s | status | gap | optimal cost | "
        + " | ".join(COLUMNS)
        + " |"
    )
    print("|" + "---|" * (11 + len(COLUMNS)))
    ratios: dict[str, list[float]] = defaultdict(list)
    cases = [(f"chain n={n}", linear_graph(n)) for n in args.chains]
    cases += [(f"random {n} (seed {n})", random_training_graph(n, seed=n)) for n in args.random]
    for label, graph in cases:
        for fraction in args.fractions:
            run_case(label, graph, fraction, args.time_limit, ratios)
    print("\ngeometric mean cost ratio to optimal (over the cases where the method fits):")
    for method in COLUMNS:
        values = ratios[method]
        if values:
            mean = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"  {method:20} {mean:.3f}  (max {max(values):.3f}, {len(values)} cases)")
    if args.skip_build:
        return
    for label, graph in (("chain n=500", linear_graph(500)), ("random 500", random_training_graph(500, seed=0))):
        variables, rows, nonzeros, build = build_stats(graph, graph.size)
        print(f"build {label}: T={graph.size}, {variables} vars, {rows} rows, {nonzeros} nonzeros, {build:.2f} s")


if __name__ == "__main__":
    main()
