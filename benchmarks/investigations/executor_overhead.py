"""What the executor adds to a step: eager PyTorch, the captured fx graph run whole, and the compiled step.

    .venv/bin/python benchmarks/investigations/executor_overhead.py [--repeats 25] [--out]
    .venv/bin/python benchmarks/investigations/executor_overhead.py --from-json   # again from stored rows

For each model, with one torch thread and the `checkpoint_all` plan (no recomputation), it times, interleaved:
* eager: `loss_fn(model, *batch).backward()`;
* fx graph: the captured joint graph called as one torch.fx GraphModule (what any fx-based executor starts from);
* compiled: `checkmate.compile(...)` running the plan node by node (memory measurement off).
It prints medians in milliseconds and the compiled step's overhead against eager as a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import checkmate
from checkmate import zoo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from rows import Row, Stored, add_row_arguments, measure_or_load

MODELS: dict[str, Callable[[], Any]] = {
    "ResNet (BN, skips)": lambda: zoo.resnet(batch_size=32, image_size=32, width=16, blocks=(1, 1, 1)),
    "GPT (attention, dropout)": lambda: zoo.gpt(batch_size=8, length=64, dim=128, heads=4, layers=2, vocab=256),
}


def _runners(factory: Callable[[], Any]) -> tuple[dict[str, Callable[[], None]], int]:
    model, loss_fn, batch = factory()
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="flops", measure_memory="never"
    )
    module = step.captured.module
    inputs = [p.detach() for p in model.parameters()] + list(model.buffers()) + list(batch)

    def eager() -> None:
        torch.manual_seed(0)
        loss_fn(model, *batch).backward()
        model.zero_grad(set_to_none=True)

    def fx_graph() -> None:
        torch.manual_seed(0)
        with torch.no_grad():
            module(*inputs)

    def compiled() -> None:
        torch.manual_seed(0)
        step(*batch)
        model.zero_grad(set_to_none=True)

    operations = sum(len(members) for members in step.captured.members)
    return {"eager": eager, "fx graph": fx_graph, "compiled": compiled}, operations


def measure(repeats: int) -> Iterator[Row]:
    torch.set_num_threads(1)
    for name, factory in MODELS.items():
        runners, operations = _runners(factory)
        times: dict[str, list[float]] = {key: [] for key in runners}
        for run in runners.values():
            run()
            run()
        for _ in range(repeats):
            for key, run in runners.items():
                started = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - started)
        median = {key: statistics.median(values) * 1e3 for key, values in times.items()}
        yield {
            "model": name,
            "operations": operations,
            "eager_ms": median["eager"],
            "fx_graph_ms": median["fx graph"],
            "compiled_ms": median["compiled"],
        }


def render(stored: Stored) -> str:
    lines = [
        "| model | fx ops | eager ms | fx graph ms | compiled ms | compiled vs eager |",
        "|---|---|---|---|---|---|",
    ]
    for row in stored.rows:
        overhead = row["compiled_ms"] / row["eager_ms"] - 1
        lines.append(
            f"| {row['model']} | {row['operations']} | {row['eager_ms']:.1f} | {row['fx_graph_ms']:.1f} | "
            f"{row['compiled_ms']:.1f} | {overhead:+.1%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25, help="timed steps per runner")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "executor_overhead", lambda: measure(arguments.repeats), render)


if __name__ == "__main__":
    main()
