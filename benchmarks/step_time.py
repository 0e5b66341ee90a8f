"""Step time and memory of `checkmate.compile` against eager PyTorch, on CPU, at several budgets.

    .venv/bin/python benchmarks/step_time.py            # ResNet and GPT, budgets 100/80/65/50 %
    .venv/bin/python benchmarks/step_time.py --quick    # smaller models, two budgets
    .venv/bin/python benchmarks/step_time.py --overhead --repeats 50   # the executor's overhead alone

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
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import checkmate
from checkmate import zoo
from checkmate.execute import eager_peak
from checkmate.units import format_bytes

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


def interleaved_medians(functions: list[Callable[[], Any]], repeats: int) -> list[float]:
    """Median seconds of each function, called in turn (round robin) after two warm-up rounds."""
    for _ in range(2):
        for function in functions:
            function()
    times: list[list[float]] = [[] for _ in functions]
    for _ in range(repeats):
        for function, sink in zip(functions, times, strict=True):
            started = time.perf_counter()
            function()
            sink.append(time.perf_counter() - started)
    return [statistics.median(sink) for sink in times]


def benchmark_model(name: str, factory: Callable[[], Any], budgets: list[float], args: argparse.Namespace) -> list[str]:
    model, loss_fn, batch = factory()
    model.train()
    eager_model = copy.deepcopy(model)

    def eager_step() -> None:
        loss_fn(eager_model, *batch).backward()

    eager_bytes = eager_peak(copy.deepcopy(model), loss_fn, batch)
    no_remat_model = copy.deepcopy(model)
    no_remat = checkmate.compile(no_remat_model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    rows = []
    for budget in budgets:
        method = "checkpoint_all" if budget == 1.0 else "optimal"
        options = {"time_limit": args.time_limit} if method == "optimal" else {}
        try:
            step = checkmate.compile(
                model, loss_fn, batch, budget=budget, method=method, cost_model=args.cost_model, **options
            )
        except checkmate.InfeasibleBudget as error:
            rows.append(f"| {name} | {budget:.0%} | infeasible: {error} | | | | | | |")
            continue
        model.zero_grad(set_to_none=True)  # the measured first call starts without .grad, as after zero_grad()
        step(*batch)
        functions = [functools.partial(step, *batch), functools.partial(no_remat, *batch), eager_step]
        compiled_time, no_remat_time, eager_time = interleaved_medians(functions, args.repeats)
        report = step.report()
        slowdown = f"{compiled_time / no_remat_time - 1:+.1%}"
        rows.append(
            f"| {name} | {budget:.0%} | {report.method} ({report.status}) | {format_bytes(report.planned_peak)} | "
            f"{format_bytes(report.measured_peak or 0)} | {format_bytes(eager_bytes)} | "
            f"{report.planned_overhead:+.1%} | {slowdown} | {compiled_time * 1e3:.1f} / {eager_time * 1e3:.1f} "
            f"({compiled_time / eager_time - 1:+.1%}) |"
        )
        print(rows[-1], flush=True)
    return rows


def executor_overhead(name: str, factory: Callable[[], Any], repeats: int) -> str:
    """One table row: the compiled no-recomputation step and eager, interleaved medians, and their difference."""
    model, loss_fn, batch = factory()
    model.train()
    eager_model = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit", measure_memory="never"
    )

    def eager_step() -> None:
        loss_fn(eager_model, *batch).backward()

    compiled_time, eager_time = interleaved_medians([functools.partial(step, *batch), eager_step], repeats)
    return (
        f"| {name} | {step.graph.size} | {compiled_time * 1e3:.2f} | {eager_time * 1e3:.2f} | "
        f"{(compiled_time - eager_time) * 1e3:+.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small models and two budgets")
    parser.add_argument("--overhead", action="store_true", help="the executor's overhead against eager, only")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per optimal solve")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per configuration")
    parser.add_argument("--cost-model", default="profile", choices=("profile", "flops", "unit"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.overhead:
        print("| model | graph nodes | compiled no-remat ms | eager ms | overhead ms |\n|---|---|---|---|---|")
        for name, factory in OVERHEAD_MODELS.items():
            print(executor_overhead(name, factory, args.repeats), flush=True)
        return
    models = QUICK_MODELS if args.quick else MODELS
    budgets = [1.0, 0.5] if args.quick else [1.0, 0.8, 0.65, 0.5]
    header = (
        "| model | budget | plan | planned peak | measured peak | eager peak | planned overhead "
        "| measured slowdown vs no-remat | step ms compiled / eager (vs eager) |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    print(header, flush=True)
    rows = [row for name, factory in models.items() for row in benchmark_model(name, factory, budgets, args)]
    print()
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
