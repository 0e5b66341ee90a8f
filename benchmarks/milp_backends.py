"""HiGHS against SCIP on the same warm-started MILP, and our model against a straightforward HiGHS model.

Usage: .venv/bin/python benchmarks/milp_backends.py [--time-limit 60] [--skip-reference]

Prints one row per (graph, budget, backend): stages, budget, status, cost, bound, gap, seconds; then the ratio
of solve times for the 32-layer chain at the sqrt(n) peak budget: straightforward HiGHS model / ours.
"""

from __future__ import annotations

import argparse
import time

import highspy
import numpy as np

import checkmate
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph

CASES = [
    ("chain n=16", linear_graph(16), 0.5),
    ("chain n=32", linear_graph(32), "sqrtn"),
    ("chain n=32", linear_graph(32), 0.3),
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    print(
        f"{'graph':12} {'T':>4} {'budget':>6} {'backend':8} {'status':9} {'cost':>8} {'bound':>8} {'gap':>7} {'s':>7}"
    )
    ours: dict[str, float] = {}
    for label, graph, fraction in CASES:
        budget = budget_of(graph, fraction)
        for backend in ("highs", "scip"):
            plan = checkmate.solve(
                graph, budget, method="optimal", backend=backend, time_limit=args.time_limit, threads=1
            )
            ours[f"{label} {fraction} {backend}"] = plan.solve_time
            print(
                f"{label:12} {graph.size:4d} {budget:6d} {backend:8} {plan.status:9} {plan.cost:8.2f} "
                f"{plan.lower_bound or float('nan'):8.2f} {100 * (plan.gap or 0):6.2f}% {plan.solve_time:7.2f}",
                flush=True,
            )
    if not args.skip_reference:
        graph = linear_graph(32)
        budget = budget_of(graph, "sqrtn")
        cold = checkmate.solve(graph, budget, method="optimal", backend="highs", warm_start=False, threads=1)
        print(f"ours without warm start (HiGHS): {cold.status}, cost {cold.cost:.2f}, {cold.solve_time:.2f} s")
        status, cost, seconds = straightforward_highs(graph, budget, args.time_limit)
        mine = ours["chain n=32 sqrtn highs"]
        print(
            f"straightforward HiGHS model, chain n=32 at the sqrt(n) peak {budget}: "
            f"{status}, cost {cost:.2f}, {seconds:.2f} s"
        )
        print(
            f"ratio straightforward / ours (HiGHS): {seconds / mine:.2f}; "
            f"(SCIP): {seconds / ours['chain n=32 sqrtn scip']:.2f}; "
            f"(HiGHS, no warm start): {seconds / cold.solve_time:.2f}"
        )


if __name__ == "__main__":
    np.set_printoptions(linewidth=120)
    main()
