"""What `optimal`'s stall rule (`stall_time`, `checkmate.strategies.stall`) costs in plan quality and saves in time.

    .venv/bin/python benchmarks/stall_time.py --out
    .venv/bin/python benchmarks/stall_time.py --from-json

The graphs `checkmate.compile(..., executor="inductor")` solves: the six models of `benchmarks/peers.py` at their
full sizes, captured with the Inductor executor's options on FLOP costs (deterministic, so both searches see the same
problem). At each budget (a fraction of the peak without recomputation), `optimal` with compile's other defaults
(`time_limit` 120 s, `mip_gap` 0.01) searches once without the stall rule and once with `stall_time` 20 s (compile's
default); each row gives the seconds and the plan's cost, and the table the cost ratio of the stalled search's
plan to the unstalled one's.
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
from rows import Row, Stored, add_row_arguments, measure_or_load

BUDGETS = (0.4, 0.6, 0.8)
STALL_TIMES = (None, DEFAULT_STALL_TIME)


def measure(models: list[str], budgets: tuple[float, ...]) -> Iterator[Row]:
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
            for stall_time in STALL_TIMES:
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
    lines = [
        "| model | nodes | budget | seconds, no stall rule | seconds, stall_time 20 s | gap left (no rule / rule) "
        "| cost ratio (rule / no rule) |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = {(row["model"], row["budget"], row["stall_time"]): row for row in stored.rows}
    for (model, budget, stall_time), row in rows.items():
        if stall_time is not None:
            continue
        stalled = rows.get((model, budget, DEFAULT_STALL_TIME))
        if stalled is None or not row["feasible"] or not stalled["feasible"]:
            lines.append(f"| {model} | {row['nodes']} | {budget:.0%} | no plan | no plan | — | — |")
            continue
        gaps = " / ".join("—" if each["gap"] is None else f"{100 * each['gap']:.2f} %" for each in (row, stalled))
        lines.append(
            f"| {model} | {row['nodes']} | {budget:.0%} | {row['seconds']:.1f} | {stalled['seconds']:.1f} | {gaps} "
            f"| {stalled['cost'] / row['cost']:.4f} |"
        )
    environment = stored.environment
    lines.append(f"\n(rows of: {environment.get('command', '')}; started {environment.get('started', '?')})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[workload.name for workload in workloads("full")])
    parser.add_argument("--budgets", nargs="+", type=float, default=list(BUDGETS))
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "stall_time", lambda: measure(arguments.models, tuple(arguments.budgets)), render)


if __name__ == "__main__":
    main()
