"""Time to the first step of `checkmate.compile` with every default, as a new user meets it (issue 19, item 2).

    .venv/bin/python benchmarks/time_to_first_step.py --out      # rows to benchmarks/results/time_to_first_step.json
    .venv/bin/python benchmarks/time_to_first_step.py --profiles 10 --out   # ten fresh profiles, then flops
    .venv/bin/python benchmarks/time_to_first_step.py --from-json

The model is the graph set's `resnet50` (Hugging Face `ResNetForImageClassification(ResNetConfig())`, batch 32,
128x128, `benchmarks/graph_set.py`). In a fresh `CHECKMATE_CACHE_DIR` (no cached profiles or plans), it times
`checkmate.compile(model, logits_loss, batch, budget=0.6)` with nothing else set, then the first call of the step.
Of the compile, the solve is `step.plan.solve_time`; capture with profiling is the rest. The row also gives the
plan's cost against its proven lower bound (the gap the default stop rule accepts) and the measured peak against
the plan's. Then, for reference, the same with `cost_model="flops"` (no profiling: costs from FLOP formulas).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch

import checkmate
from graph_set import resnet50
from rows import Row, Stored, add_row_arguments, measure_or_load


def measure(budget: float, cost_models: list[str], profiles: int) -> Iterator[Row]:
    repeats = {"profile": profiles}
    runs = [(cost_model, run) for cost_model in cost_models for run in range(repeats.get(cost_model, 1))]
    for cost_model, run in runs:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["CHECKMATE_CACHE_DIR"] = cache
            model, loss_fn, batch = resnet50()
            options: dict[str, Any] = {} if cost_model == "profile" else {"cost_model": cost_model}
            started = time.perf_counter()
            step = checkmate.compile(model, loss_fn, batch, budget=budget, **options)
            compiled = time.perf_counter() - started
            step(*batch)
            first_step = time.perf_counter() - started - compiled
            plan, report = step.plan, step.report()
            yield {
                "model": "resnet50 (HF, batch 32, 128x128)",
                "cost_model": cost_model,
                "run": run,
                "budget": budget,
                "nodes": step.graph.size,
                "capture_and_profile_s": compiled - plan.solve_time,
                "solve_s": plan.solve_time,
                "first_step_s": first_step,
                "time_to_first_step_s": compiled + first_step,
                "status": plan.status,
                "cost": plan.cost,
                "lower_bound": plan.lower_bound,
                "gap": plan.gap,
                "planned_peak": plan.peak_memory,
                "measured_peak": report.measured_peak,
                "torch_threads": torch.get_num_threads(),
            }


def render(stored: Stored) -> str:
    lines = [
        f"{'cost model':10} {'nodes':>5} {'capture+profile':>15} {'solve':>6} {'1st step':>8} {'total':>6} "
        f"{'status':>8} {'gap':>6}  planned / measured peak"
    ]
    for row in stored.rows:
        gap = "-" if row["gap"] is None else f"{100 * row['gap']:.2f}%"
        lines.append(
            f"{row['cost_model']:10} {row['nodes']:5d} {row['capture_and_profile_s']:14.1f}s "
            f"{row['solve_s']:5.1f}s {row['first_step_s']:7.1f}s {row['time_to_first_step_s']:5.1f}s "
            f"{row['status']:>8} {gap:>6}  {checkmate.format_bytes(row['planned_peak'])} / "
            f"{checkmate.format_bytes(row['measured_peak'] or 0)}"
        )
    profiled = [row for row in stored.rows if row["cost_model"] == "profile"]
    if len(profiled) > 1:
        within = sum(1 for row in profiled if row["gap"] is not None and row["gap"] <= 0.01)
        slowest = max(row["time_to_first_step_s"] for row in profiled)
        lines.append(
            f"fresh profiles: {within} of {len(profiled)} within 1 % of the bound; time to the first step at most "
            f"{slowest:.1f} s"
        )
    command = stored.environment.get("command", "")
    return "\n".join([*lines, f"(rows of: {command}; started {stored.environment.get('started', '?')})"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=0.6, help="fraction of the no-remat peak (default 0.6)")
    parser.add_argument("--cost-models", default="profile,flops", help="comma-separated (default profile,flops)")
    parser.add_argument("--profiles", type=int, default=1, help="fresh profiles (compiles) with the profile cost model")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(
        arguments,
        "time_to_first_step",
        lambda: measure(arguments.budget, arguments.cost_models.split(","), arguments.profiles),
        render,
    )


if __name__ == "__main__":
    main()
