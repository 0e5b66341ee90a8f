"""Step time and memory of `checkmate.compile` against eager PyTorch, on CPU, at several budgets.

    .venv/bin/python benchmarks/step_time.py            # ResNet and GPT, budgets 100/80/65/50 %
    .venv/bin/python benchmarks/step_time.py --quick    # smaller models, two budgets
    .venv/bin/python benchmarks/step_time.py --overhead --repeats 50   # the executor's overhead alone
    .venv/bin/python benchmarks/step_time.py --out        # rows to benchmarks/results/step_time.json
    .venv/bin/python benchmarks/step_time.py --from-json  # the table again from them

For each model: eager's step time and live-tensor peak; then, per budget, the plan (method, planned peak,
planned compute overhead from profiled op times) beside the measured peak of the first call and the
median step time, as a slowdown against the compiled step without recomputation (what the plan's
overhead predicts) and against eager. Runs with one torch thread; the steps of the compiled plan, the
compiled no-recomputation plan and eager are interleaved so drift on a shared machine hits all three
alike. Prints a markdown table.

With --overhead: what the executor adds to eager PyTorch at the same work, on the peers benchmark's quick
U-Net (`benchmarks/peers_tools.py`, 139 graph nodes) and the quick models: the compiled step without
recomputation (`checkpoint_all`, so it runs the ops eager runs) against `loss_fn(model, *batch).backward()`,
interleaved, one thread; the difference of the medians is the per-step overhead.
"""

from __future__ import annotations

import argparse
import copy
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

import checkmate
from checkmate import zoo
from checkmate.byte_sizes import format_bytes
from checkmate.execute import eager_peak
from checkmate.options import CostModel, choices
from rows import Row, Stored, add_row_arguments, measure_or_load
from timing import interleaved_medians

MODELS: dict[str, Callable[[], Any]] = {
    "ResNet (BN, skips)": lambda: zoo.resnet(batch_size=32, image_size=32, width=16, blocks=(1, 1, 1)),
    "GPT (attention, dropout)": lambda: zoo.gpt(batch_size=8, length=64, dim=128, heads=4, layers=2, vocab=256),
}
QUICK_MODELS: dict[str, Callable[[], Any]] = {
    "ResNet (BN, skips)": lambda: zoo.resnet(batch_size=8, image_size=16, width=8, blocks=(1, 1)),
    "GPT (attention, dropout)": lambda: zoo.gpt(batch_size=8, length=32, dim=32, heads=2, layers=2, vocab=64),
}
OVERHEAD_MODELS: dict[str, Callable[[], Any]] = {
    "U-Net (peers, quick)": lambda: zoo.unet(4, image_size=(32, 48), width=1 / 16),
    **QUICK_MODELS,
}


def benchmark_model(
    name: str, factory: Callable[[], Any], budgets: list[float], args: argparse.Namespace
) -> Iterator[Row]:
    model, loss_fn, batch = factory()
    model.train()
    eager_model = copy.deepcopy(model)

    def eager_step() -> None:
        loss_fn(eager_model, *batch).backward()

    eager_bytes = eager_peak(copy.deepcopy(model), loss_fn, batch)
    no_remat_model = copy.deepcopy(model)
    no_remat = checkmate.compile(no_remat_model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    for budget in budgets:
        method = "checkpoint_all" if budget == 1.0 else "optimal"
        options = {"time_limit": args.time_limit} if method == "optimal" else {}
        try:
            step = checkmate.compile(
                model, loss_fn, batch, budget=budget, method=method, cost_model=args.cost_model, **options
            )
        except checkmate.InfeasibleBudget as error:
            yield {"kind": "budget", "model": name, "budget": budget, "error": str(error)}
            continue
        model.zero_grad(set_to_none=True)  # the measured first call starts without .grad, as after zero_grad()
        step(*batch)
        functions = [functools.partial(step, *batch), functools.partial(no_remat, *batch), eager_step]
        compiled_time, no_remat_time, eager_time = interleaved_medians(functions, args.repeats, warmup_rounds=2)
        report = step.report()
        yield {
            "kind": "budget",
            "model": name,
            "budget": budget,
            "method": report.method,
            "status": report.status,
            "planned_peak": report.planned_peak,
            "measured_peak": report.measured_peak or 0,
            "eager_peak": eager_bytes,
            "planned_overhead": report.planned_extra_compute,
            "compiled_ms": compiled_time * 1e3,
            "no_remat_ms": no_remat_time * 1e3,
            "eager_ms": eager_time * 1e3,
        }


def executor_overhead(name: str, factory: Callable[[], Any], repeats: int) -> Row:
    """The compiled no-recomputation step and eager, interleaved medians."""
    model, loss_fn, batch = factory()
    model.train()
    eager_model = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit", measure_memory="never"
    )

    def eager_step() -> None:
        loss_fn(eager_model, *batch).backward()

    compiled_time, eager_time = interleaved_medians(
        [functools.partial(step, *batch), eager_step], repeats, warmup_rounds=2
    )
    return {
        "kind": "overhead",
        "model": name,
        "nodes": step.graph.size,
        "compiled_ms": compiled_time * 1e3,
        "eager_ms": eager_time * 1e3,
    }


BUDGET_HEADER = (
    "| model | budget | plan | planned peak | measured peak | eager peak | planned overhead "
    "| measured slowdown vs no-remat | step ms compiled / eager (vs eager) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)
OVERHEAD_HEADER = "| model | graph nodes | compiled no-remat ms | eager ms | overhead ms |\n|---|---|---|---|---|"


def line(row: Row) -> str:
    """One markdown row of the budget table or of the overhead table."""
    if "error" in row:
        return f"| {row['model']} | {row['budget']:.0%} | infeasible: {row['error']} | | | | | | |"
    compiled, eager = row["compiled_ms"], row["eager_ms"]
    if row["kind"] == "overhead":
        return f"| {row['model']} | {row['nodes']} | {compiled:.2f} | {eager:.2f} | {compiled - eager:+.2f} |"
    return (
        f"| {row['model']} | {row['budget']:.0%} | {row['method']} ({row['status']}) | "
        f"{format_bytes(row['planned_peak'])} | {format_bytes(row['measured_peak'])} | "
        f"{format_bytes(row['eager_peak'])} | {row['planned_overhead']:+.1%} | "
        f"{compiled / row['no_remat_ms'] - 1:+.1%} | {compiled:.1f} / {eager:.1f} ({compiled / eager - 1:+.1%}) |"
    )


def measure(args: argparse.Namespace) -> Iterator[Row]:
    torch.set_num_threads(1)
    if args.overhead:
        rows = (executor_overhead(name, factory, args.repeats) for name, factory in OVERHEAD_MODELS.items())
    else:
        models = QUICK_MODELS if args.quick else MODELS
        budgets = [1.0, 0.5] if args.quick else [1.0, 0.8, 0.65, 0.5]
        rows = (row for name, factory in models.items() for row in benchmark_model(name, factory, budgets, args))
    for row in rows:
        print(line(row), file=sys.stderr, flush=True)
        yield row


def render(stored: Stored) -> str:
    lines = [line(row) for row in stored.rows]
    header = OVERHEAD_HEADER if stored.rows and stored.rows[0]["kind"] == "overhead" else BUDGET_HEADER
    return header + "\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small models and two budgets")
    parser.add_argument("--overhead", action="store_true", help="the executor's overhead against eager, only")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per optimal solve")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per configuration")
    parser.add_argument("--cost-model", default="profile", choices=choices(CostModel))
    add_row_arguments(parser)
    args = parser.parse_args()
    measure_or_load(args, "step_time_overhead" if args.overhead else "step_time", lambda: measure(args), render)


if __name__ == "__main__":
    main()
