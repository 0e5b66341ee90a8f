"""The paper's Table 2 form: MILP size, build and solve time, status and gap of `optimal`, and the cost ratio of
every baseline and of `approx` to `optimal`, for linear chains and random branching graphs at 30-100 % of the
checkpoint_all peak. Also the build time of the model for graphs of about 1000 stages.

Usage: .venv/bin/python benchmarks/milp_table.py [--time-limit 30] [--chains 8 16 32 64 128] [--random 16 32] [--out]
       .venv/bin/python benchmarks/milp_table.py --from-json   # the table again from benchmarks/results/

The geometric mean of each method's ratio is over the cases where it has a plan, and says in how many of all cases
that is.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Iterator

import checkmate
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph
from checkmate.milp.formulation import encode
from checkmate.milp.scaling import memory_scale
from checkmate.strategies.registry import get_strategy
from checkmate.strategies.warm_start import BASELINES
from rows import Row, Stored, add_row_arguments, measure_or_load

FRACTIONS = (0.3, 0.5, 0.7, 1.0)
COLUMNS = ("approx", *(name for name in BASELINES if not get_strategy(name).needs_host_link))  # no host links here


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


def run_case(label: str, graph: Graph, fraction: float, time_limit: float) -> Row:
    peak = checkmate.solve(graph, None, method="checkpoint_all").peak_memory
    minimum = smallest_budget(graph) or peak
    budget = max(int(fraction * peak), minimum)
    variables, rows, nonzeros, build = build_stats(graph, budget)
    plan = checkmate.solve(graph, budget, method="optimal", time_limit=time_limit)
    return {
        "kind": "case",
        "graph": label,
        "nodes": graph.size,
        "fraction": fraction,
        "budget": budget,
        "clamped": budget == minimum and budget > int(fraction * peak),
        "variables": variables,
        "rows": rows,
        "nonzeros": nonzeros,
        "build_seconds": build,
        "solve_seconds": plan.solve_time,
        "status": plan.status,
        "gap": plan.gap or 0,
        "cost": plan.cost,
        "ratios": {method: ratio(graph, budget, method, plan.cost, time_limit) for method in COLUMNS},
    }


def measure(arguments: argparse.Namespace) -> Iterator[Row]:
    cases = [(f"chain n={n}", linear_graph(n)) for n in arguments.chains]
    cases += [(f"random {n} (seed {n})", random_training_graph(n, seed=n)) for n in arguments.random]
    for label, graph in cases:
        for fraction in arguments.fractions:
            row = run_case(label, graph, fraction, arguments.time_limit)
            print(case_line(row), file=sys.stderr, flush=True)
            yield row
    if arguments.skip_build:
        return
    for label, graph in (("chain n=500", linear_graph(500)), ("random 500", random_training_graph(500, seed=0))):
        variables, rows, nonzeros, build = build_stats(graph, graph.size)
        yield {
            "kind": "build",
            "graph": label,
            "nodes": graph.size,
            "variables": variables,
            "rows": rows,
            "nonzeros": nonzeros,
            "build_seconds": build,
        }


def case_line(row: Row) -> str:
    cells = ["-" if row["ratios"][method] is None else f"{row['ratios'][method]:.3f}" for method in COLUMNS]
    return (
        f"| {row['graph']} | {row['nodes']} | {row['fraction']:.0%}{'*' if row['clamped'] else ''} ({row['budget']}) | "
        f"{row['variables']} | {row['rows']} | {row['nonzeros']} | {row['build_seconds']:.3f} | "
        f"{row['solve_seconds']:.2f} | {row['status']} | {100 * row['gap']:.2f}% | {row['cost']:.2f} | "
        + " | ".join(cells)
        + " |"
    )


def render(stored: Stored) -> str:
    cases = [row for row in stored.rows if row["kind"] == "case"]
    lines = [
        "| graph | T | budget (units) | vars | rows | nnz | build s | solve s | status | gap | optimal cost | "
        + " | ".join(COLUMNS)
        + " |",
        "|" + "---|" * (11 + len(COLUMNS)),
        *(case_line(row) for row in cases),
        "",
        "geometric mean cost ratio to optimal (over the cases where the method has a plan; n of all cases):",
    ]
    for method in COLUMNS:
        values = [row["ratios"][method] for row in cases if row["ratios"][method] is not None]
        if values:
            mean = math.exp(sum(math.log(v) for v in values) / len(values))
            lines.append(f"  {method:20} {mean:.3f}  (max {max(values):.3f}, {len(values)} of {len(cases)} cases)")
        else:
            lines.append(f"  {method:20} -      (no plan in any of {len(cases)} cases)")
    for row in stored.rows:
        if row["kind"] == "build":
            lines.append(
                f"build {row['graph']}: T={row['nodes']}, {row['variables']} vars, {row['rows']} rows, "
                f"{row['nonzeros']} nonzeros, {row['build_seconds']:.2f} s"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--chains", type=int, nargs="*", default=[8, 16, 32, 64, 128])
    parser.add_argument("--random", type=int, nargs="*", default=[16, 32])
    parser.add_argument("--fractions", type=float, nargs="*", default=list(FRACTIONS))
    parser.add_argument("--skip-build", action="store_true")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "milp_table", lambda: measure(arguments), render)


if __name__ == "__main__":
    main()
