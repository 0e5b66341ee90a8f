"""What the guards add to each call of a compiled step: the snapshot of what the trace depended on, and the plan lookup.

    .venv/bin/python benchmarks/guard_overhead.py [--calls 2000] [--out]
    .venv/bin/python benchmarks/guard_overhead.py --from-json   # the table again from benchmarks/results/

For each model, compiled with the `checkpoint_all` plan (no recomputation) and one torch thread, it times:
* state(): `Guards.state()`, the snapshot a call takes of every guarded value (`checkmate.training.guards`);
* lookup: finding the plan of a batch signature and a state taken before (hashing and comparing the key);
* step: one compiled step, guards included (median of `--steps` calls).
The guard times are the median over 5 rounds of the mean of `--calls` calls. It prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

import checkmate
from checkmate.training.compiled import PlanKey
from real_models import ROWS
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load


def _stack() -> tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
    """100 modules: 50 Linear(16, 16) layers, each followed by a ReLU."""
    layers = [module for _ in range(50) for module in (nn.Linear(16, 16), nn.ReLU())]
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(8, 16, generator=generator), torch.randn(8, 16, generator=generator))
    return nn.Sequential(*layers), lambda model, x, y: nn.functional.mse_loss(model(x), y), batch


MODELS: dict[str, Callable[[], Any]] = {
    "100-module stack (Linear, ReLU)": _stack,
    "HF GPT-2, 4 layers": ROWS["gpt2"].build,
    "HF Llama, 4 layers": ROWS["llama"].build,
}


def _per_call_us(run: Callable[[], Any], calls: int) -> float:
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            run()
        rounds.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(rounds)


def measure(calls: int, steps: int) -> Iterator[Row]:
    torch.set_num_threads(1)
    for name, factory in MODELS.items():
        torch.manual_seed(0)
        model, loss_fn, batch = factory()
        step = checkmate.compile(
            model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="flops", measure_memory="never"
        )
        step(*batch)
        # The guards and the plans by key are the step's own: no public handle times them apart from the step.
        guards, plans = step._guards, step._compiled
        key = PlanKey(step._current.batch, guards.state())
        assert plans.get(key) is not None
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            step(*batch)
            times.append(time.perf_counter() - started)
            model.zero_grad(set_to_none=True)
        labels = guards.labels
        yield {
            "model": name,
            "modules": len(list(model.modules())),
            "guarded_values": len(labels),
            "object_values": sum(" of `" in label for label in labels),
            "state_us": _per_call_us(guards.state, calls),
            "lookup_us": _per_call_us(functools.partial(plans.get, key), calls),
            "step_ms": statistics.median(times) * 1e3,
        }


def render(stored: Stored) -> str:
    header = ["model", "modules", "guarded values (of objects' state)", "state() µs", "lookup µs", "step ms"]
    return markdown_table(
        header,
        (
            [
                row["model"],
                str(row["modules"]),
                f"{row['guarded_values']} ({row['object_values']})",
                f"{row['state_us']:.1f}",
                f"{row['lookup_us']:.1f}",
                f"{row['step_ms']:.1f}",
            ]
            for row in stored.rows
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round when timing the guards")
    parser.add_argument("--steps", type=int, default=15, help="timed compiled steps per model")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "guard_overhead", lambda: measure(arguments.calls, arguments.steps), render)


if __name__ == "__main__":
    main()
