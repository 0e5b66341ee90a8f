"""Does pricing a recomputation inside its reader's kernel make the Inductor executor's steps faster?

    .venv/bin/python benchmarks/fused_recompute.py --out          # full-size models of peers.py; rows stored
    .venv/bin/python benchmarks/fused_recompute.py --quick        # the small models
    .venv/bin/python benchmarks/fused_recompute.py --from-json    # the table again from stored rows

For each model and budget (a fraction of its peak without recomputation), `checkmate.compile(..., executor=
"inductor")` plans with its time model, in which a recomputation fused into its reader's kernel costs its call less
the memory traffic it saves (`Node.recompute_cost`). The same graph is then solved with every recomputation priced
as its node's first run (per-node costs, the model before), at the same budget. Where the two plans differ, both run
on the same compiled step (`step.use_plan`), timed interleaved round by round (`benchmarks/timing.py`), and each
plan is priced by both models and predicted as it runs (`step.report().predicted_time`: fused calls at their measured
time). A ratio below 1 means the fused model's plan is the faster step.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

import checkmate
from checkmate.graph import Graph
from checkmate.simulate import plan_cost

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_tools import prepare_model, workloads
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load
from timing import interleaved_times

MODELS = ("ConvNeXt", "GPT", "HF GPT-2")


def per_node(graph: Graph) -> Graph:
    """`graph` with every recomputation priced as its node's first run."""
    nodes = tuple(dataclasses.replace(node, recompute_cost=None) for node in graph.nodes)
    return dataclasses.replace(graph, nodes=nodes)


def measure(args: argparse.Namespace) -> Iterator[Row]:
    torch.set_num_threads(1)
    for workload in workloads("quick" if args.quick else "full"):
        if not workload.name.startswith(tuple(args.models)):
            continue
        model, loss_fn, batch = prepare_model(workload, torch.device("cpu"))
        for fraction in args.budgets:
            step = checkmate.compile(
                model, loss_fn, batch, budget=fraction, executor="inductor", gradient_memory="when_made",
                measure_memory="never", time_limit=args.time_limit,
            )  # fmt: skip
            graph, fused_plan = step.graph, step.plan
            budget = fused_plan.budget
            cheaper = sum(node.recompute_cost is not None for node in graph.nodes)
            plain = checkmate.solve(per_node(graph), budget, method="optimal", time_limit=args.time_limit)
            row: Row = {
                "model": workload.name,
                "fraction": fraction,
                "nodes": graph.size,
                "fused_priced_nodes": cheaper,
                "fused_plan_fused_cost": fused_plan.cost,
                "plain_plan_fused_cost": plan_cost(graph, plain.R),
                "fused_plan_plain_cost": plan_cost(per_node(graph), fused_plan.R),
                "plain_plan_plain_cost": plain.cost,
                "same_plan": bool((plain.R == fused_plan.R).all() and (plain.S == fused_plan.S).all()),
            }
            if not row["same_plan"]:
                other = checkmate.compile(
                    model, loss_fn, batch, budget=fraction, executor="inductor", gradient_memory="when_made",
                    measure_memory="never", time_limit=args.time_limit,
                )  # fmt: skip
                other.use_plan(dataclasses.replace(plain, cost=plan_cost(graph, plain.R)))
                times = _interleaved(step, other, model, batch, args.repeats)
                row["fused_plan_ms"] = statistics.median(times[0]) * 1e3
                row["plain_plan_ms"] = statistics.median(times[1]) * 1e3
                row["predicted_fused_plan_ms"] = (step.report().predicted_time or 0.0) * 1e3
                row["predicted_plain_plan_ms"] = (other.report().predicted_time or 0.0) * 1e3
            yield row


def _interleaved(
    first: Any, second: Any, model: torch.nn.Module, batch: Sequence[Any], repeats: int
) -> list[list[float]]:
    """Seconds of each step's calls, interleaved round by round, gradients cleared before each."""

    def reset(_: int) -> None:
        model.zero_grad(set_to_none=True)

    return interleaved_times([lambda: first(*batch), lambda: second(*batch)], repeats, before_each=reset)


def render(stored: Stored) -> str:
    lines = []
    for row in stored.rows:
        timed = "fused_plan_ms" in row
        lines.append(
            [
                row["model"],
                f"{row['fraction']:.0%}",
                f"{row['fused_priced_nodes']} of {row['nodes']}",
                "same" if row["same_plan"] else "differ",
                f"{row['fused_plan_fused_cost'] * 1e3:.1f} / {row['plain_plan_fused_cost'] * 1e3:.1f}",
                f"{row['fused_plan_plain_cost'] * 1e3:.1f} / {row['plain_plan_plain_cost'] * 1e3:.1f}",
                f"{row['predicted_fused_plan_ms']:.1f} / {row['predicted_plain_plan_ms']:.1f}" if timed else "—",
                f"{row['fused_plan_ms']:.1f} / {row['plain_plan_ms']:.1f}" if timed else "—",
                f"{row['fused_plan_ms'] / row['plain_plan_ms']:.3f}" if timed else "—",
            ]
        )
    header = [
        "model", "budget", "nodes with a fused recompute cost", "plans", "fused model: ms (fused plan / per-node plan)",
        "per-node model: ms (fused / per-node plan)", "predicted as it runs: ms (fused / per-node plan)",
        "measured ms (fused / per-node plan)", "measured ratio",
    ]  # fmt: skip
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small models of peers.py --quick")
    parser.add_argument("--models", nargs="*", default=list(MODELS), help="names (or prefixes) of peers.py models")
    parser.add_argument("--budgets", type=float, nargs="*", default=[0.8, 0.6, 0.45])
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (median)")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per solve")
    add_row_arguments(parser)
    args = parser.parse_args()
    measure_or_load(args, "fused_recompute_quick" if args.quick else "fused_recompute", lambda: measure(args), render)


if __name__ == "__main__":
    main()
