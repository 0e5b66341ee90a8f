"""What `optimal`'s stall rule (`stall_time`, `checkmate.strategies.stall`) costs in plan quality and saves in time.

    .venv/bin/python benchmarks/stall_time.py --out
    .venv/bin/python benchmarks/stall_time.py --from-json

The graphs `checkmate.compile(..., executor="inductor")` solves: the six models of `benchmarks/peers.py` at their
full sizes, captured with the Inductor executor's options on FLOP costs (deterministic, so both searches see the same
problem). At each budget (a fraction of the peak without recomputation), `optimal` with compile's other defaults
(`time_limit` 120 s, `mip_gap` 0.01) searches once without the stall rule and once with each of `--stall-times`
(compile's default `stall_time` unless given); each row gives the seconds and the plan's cost, and the table the
cost ratio of each stalled search's plan to the unstalled one's.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import torch

import checkmate
from checkmate.errors import InfeasibleBudget
from checkmate.executors import executor_named
from checkmate.search_defaults import DEFAULT_GAP, DEFAULT_STALL_TIME, DEFAULT_TIME_LIMIT
from checkmate.torch_capture import capture
from peers_tools import prepare_model, workloads
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load

BUDGETS = (0.4, 0.6, 0.8)
STALL_TIMES = (DEFAULT_STALL_TIME,)


def measure(models: list[str], budgets: tuple[float, ...], stall_times: tuple[float, ...]) -> Iterator[Row]:
    options = executor_named("inductor").capture_options("profile", max_nodes=None, gradient_memory="when_made")
    for workload in workloads("full"):
        if workload.name not in models:
            continue
        model, loss_fn, batch = prepare_model(workload, torch.device("cpu"))
        graph = capture(
            model,
            loss_fn,
            batch,
            cost_model=options.cost_model,
            gradient_memory=options.gradient_memory,
            fused=options.fused,
        ).graph
        peak = checkmate.solve(graph, None).peak_memory
        for fraction in budgets:
            for stall_time in (None, *stall_times):
                started = time.perf_counter()
                row: Row = {"model": workload.name, "nodes": graph.size, "budget": fraction, "stall_time": stall_time}
                try:
                    plan = checkmate.solve(
                        graph,
                        int(fraction * peak),
                        method="optimal",
                        time_limit=DEFAULT_TIME_LIMIT,
                        mip_gap=DEFAULT_GAP,
                        stall_time=stall_time,
                        progress=False,
                    )
                except InfeasibleBudget:
                    yield row | {"feasible": False}
                    continue
                yield row | {
                    "feasible": True,
                    "seconds": time.perf_counter() - started,
                    "cost": plan.cost,
                    "gap": plan.gap,
                    "no_remat_cost": float(graph.costs.sum()),
                }


def render(stored: Stored) -> str:
    stall_times = sorted({row["stall_time"] for row in stored.rows if row["stall_time"] is not None})
    header = ["model", "nodes", "budget", "seconds, no stall rule"]
    header += [f"seconds, stall_time {stall:g} s" for stall in stall_times]
    header += ["gap left (no rule / " + " / ".join(f"{stall:g} s" for stall in stall_times) + ")"]
    header += [f"cost ratio ({stall:g} s / no rule)" for stall in stall_times]
    lines = []
    rows = {(row["model"], row["budget"], row["stall_time"]): row for row in stored.rows}
    for (model, budget, stall_time), row in rows.items():
        if stall_time is not None:
            continue
        stalled = [rows.get((model, budget, stall)) for stall in stall_times]
        if not row["feasible"] or any(each is None or not each["feasible"] for each in stalled):
            lines.append([model, str(row["nodes"]), f"{budget:.0%}", "no plan", *["no plan"] * len(stall_times), "—"])
            lines[-1] += ["—"] * len(stall_times)
            continue
        searched = [row, *(each for each in stalled if each is not None)]
        gaps = " / ".join("—" if each["gap"] is None else f"{100 * each['gap']:.2f} %" for each in searched)
        lines.append(
            [model, str(row["nodes"]), f"{budget:.0%}", *(f"{each['seconds']:.1f}" for each in searched), gaps]
            + [f"{each['cost'] / row['cost']:.4f}" for each in searched[1:]]
        )
    environment = stored.environment
    footer = f"\n\n(rows of: {environment.get('command', '')}; started {environment.get('started', '?')})"
    return markdown_table(header, lines) + footer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[workload.name for workload in workloads("full")])
    parser.add_argument("--budgets", nargs="+", type=float, default=list(BUDGETS))
    parser.add_argument("--stall-times", nargs="+", type=float, default=list(STALL_TIMES))
    add_row_arguments(parser)
    arguments = parser.parse_args()
    budgets, stall_times = tuple(arguments.budgets), tuple(arguments.stall_times)
    measure_or_load(arguments, "stall_time", lambda: measure(arguments.models, budgets, stall_times), render)


if __name__ == "__main__":
    main()
