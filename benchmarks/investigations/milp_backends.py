"""HiGHS against SCIP on the same warm-started MILP, and our model against a straightforward HiGHS model.

Usage: .venv/bin/python benchmarks/investigations/milp_backends.py [--time-limit 60] [--skip-reference] [--out]
       .venv/bin/python benchmarks/investigations/milp_backends.py --from-json   # again from stored rows

Prints one row per (graph, budget, backend): stages, budget, status, cost, bound and solver seconds for our model
handed straight to each backend with the best baseline as warm start; then, for the 32-layer chain at the sqrt(n)
peak budget, our model cold and a straightforward HiGHS model (paper rows typed in one by one) cold.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import highspy

import checkmate
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph
from checkmate.milp.backends import get_backend
from checkmate.milp.formulation import decode, encode, encode_solution
from checkmate.milp.problem import SolveOptions
from checkmate.milp.scaling import memory_scale
from checkmate.strategies.warm_start import best_baseline

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from rows import Row, Stored, add_row_arguments, measure_or_load

CASES = [
    ("chain n=16", linear_graph(16), 0.5),
    ("chain n=32", linear_graph(32), "sqrtn"),
    ("random 24", random_training_graph(24, seed=0), 0.5),
    ("chain n=64", linear_graph(64), 0.5),
    ("chain n=64", linear_graph(64), "sqrtn"),
]


def budget_of(graph: Graph, fraction: float | str) -> int:
    if fraction == "sqrtn":
        return checkmate.solve(graph, None, method="chen_sqrtn").peak_memory
    peak = checkmate.solve(graph, None, method="checkpoint_all").peak_memory
    floor = checkmate.minimum_budget(graph, time_limit=20).upper or peak
    return max(int(float(fraction) * peak), floor)


def straightforward_highs(graph: Graph, budget: int, time_limit: float) -> tuple[str, float, float]:
    """The paper's eq. 9 typed in row by row with highspy's expression API: binary FREE, rows (7b) and (7c)."""
    T, M, users = graph.size, graph.memory, graph.users
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 1e-4)
    R = {(t, i): h.addBinary(obj=graph.costs[i]) for t in range(T) for i in range(t + 1)}
    S = {(t, i): h.addBinary() for t in range(T) for i in range(t)}
    U = {(t, k): h.addVariable(lb=0, ub=budget - graph.fixed_memory) for t in range(T) for k in range(t + 1)}
    for t in range(T):
        h.addConstr(R[t, t] == 1)  # (8a)
        for i, j in graph.edges.tolist():
            if j <= t:
                h.addConstr(R[t, j] <= R[t, i] + (S[t, i] if i < t else 0))  # (1b)
        for i in range(t):
            if t > 0 and (t - 1, i) in S:
                h.addConstr(S[t, i] <= R[t - 1, i] + S[t - 1, i])  # (1c)
            elif t > 0:
                h.addConstr(S[t, i] <= R[t - 1, i])
        h.addConstr(U[t, 0] == sum(int(M[i]) * S[t, i] for i in range(t)) + int(M[0]) * R[t, 0])  # (2)
        for k in range(t):
            freed = 0
            for i in graph.predecessors[k]:
                free = h.addBinary()
                later = [R[t, j] for j in users[i] if k < j <= t]
                hazards = (1 - R[t, k]) + (S[t + 1, i] if t + 1 < T else 0) + sum(later)
                kappa = 1 + (t + 1 < T) + len(later)
                h.addConstr(1 - free <= hazards)  # (7b)
                h.addConstr(kappa * (1 - free) >= hazards)  # (7c)
                freed = freed + int(M[i]) * free
            h.addConstr(U[t, k + 1] == U[t, k] - freed + int(M[k + 1]) * R[t, k + 1])  # (3), (4)
    started = time.perf_counter()
    h.run()
    info = h.getInfo()
    return h.modelStatusToString(h.getModelStatus()), info.objective_function_value, time.perf_counter() - started


def solve_raw(
    graph: Graph, budget: int, backend: str, time_limit: float, warm: bool
) -> tuple[str, float, float, float]:
    """Our model handed straight to one backend (no LP-first shortcut), warm-started from the best baseline."""
    scale = memory_scale(graph)
    problem, index = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
    baseline = best_baseline(graph, budget)
    start = encode_solution(graph, index, baseline.R, baseline.S) if warm and baseline is not None else None
    solution = get_backend(backend).solve(problem, SolveOptions(time_limit=time_limit, threads=1), start)
    assert solution.x is not None
    cost, peak = checkmate.simulate(graph, *decode(solution.x, index))
    assert peak <= budget
    return solution.status.value, cost, solution.bound or float("nan"), solution.solve_time


def measure(time_limit: float, skip_reference: bool) -> Iterator[Row]:
    for label, graph, fraction in CASES:
        budget = budget_of(graph, fraction)
        for backend in ("highs", "scip"):
            status, cost, bound, seconds = solve_raw(graph, budget, backend, time_limit, warm=True)
            yield {
                "kind": "warm",
                "graph": label,
                "nodes": graph.size,
                "fraction": fraction,
                "budget": budget,
                "backend": backend,
                "status": status,
                "cost": cost,
                "bound": bound,
                "seconds": seconds,
            }
    if skip_reference:
        return
    graph = linear_graph(32)
    budget = budget_of(graph, "sqrtn")
    status, cost, bound, cold = solve_raw(graph, budget, "highs", time_limit, warm=False)
    yield {"kind": "cold", "budget": budget, "status": status, "cost": cost, "seconds": cold}
    status, cost, seconds = straightforward_highs(graph, budget, time_limit)
    yield {"kind": "straightforward", "budget": budget, "status": status, "cost": cost, "seconds": seconds}


def render(stored: Stored) -> str:
    lines = [
        f"{'graph':12} {'T':>4} {'budget':>6} {'backend':8} {'start':5} {'status':9} {'cost':>8} {'bound':>8} {'s':>7}"
    ]
    rows = {row["kind"]: row for row in stored.rows if row["kind"] != "warm"}
    warm_chain = None
    for row in stored.rows:
        if row["kind"] != "warm":
            continue
        if (row["graph"], row["fraction"], row["backend"]) == ("chain n=32", "sqrtn", "highs"):
            warm_chain = row["seconds"]
        lines.append(
            f"{row['graph']:12} {row['nodes']:4d} {row['budget']:6d} {row['backend']:8} {'warm':5} {row['status']:9} "
            f"{row['cost']:8.2f} {row['bound']:8.2f} {row['seconds']:7.2f}"
        )
    if "cold" in rows and "straightforward" in rows and warm_chain is not None:
        cold, straight = rows["cold"], rows["straightforward"]
        lines += [
            f"ours, HiGHS, no warm start, chain n=32 at the sqrt(n) peak {cold['budget']}: {cold['status']}, "
            f"cost {cold['cost']:.2f}, {cold['seconds']:.2f} s",
            f"straightforward HiGHS model, same budget, no warm start: {straight['status']}, "
            f"cost {straight['cost']:.2f}, {straight['seconds']:.2f} s",
            f"time ratio straightforward / ours: cold {straight['seconds'] / cold['seconds']:.2f}, "
            f"warm-started {straight['seconds'] / warm_chain:.2f}",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--skip-reference", action="store_true")
    add_row_arguments(parser)
    args = parser.parse_args()
    measure_or_load(args, "milp_backends", lambda: measure(args.time_limit, args.skip_reference), render)


if __name__ == "__main__":
    main()
