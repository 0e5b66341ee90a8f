"""How much of `torch.compile`'s peak memory comes from Inductor writing results into dying buffers, on the full-size
models of `benchmarks/peers.py` (a saving our plans do not model: each op's output is allocated while its inputs live).

    .venv/bin/python benchmarks/investigations/inductor_inplace.py [--out] [--models VGG (chain) U-Net]
    .venv/bin/python benchmarks/investigations/inductor_inplace.py --from-json   # again from stored rows

Per model and `activation_memory_budget`, `torch.compile` of the training step (caches off) with Inductor's
`inplace_buffers` on (the default) and off, and the step's peak on `benchmarks/peers.py`'s meter (the CPU allocator's
events, plus what is alive at the start).
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch._functorch.config
import torch._inductor.config

from checkmate.execute.memory import storage_bytes
from checkmate.torch_capture.allocator import allocator_peak

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from peers_tools import prepare_model, workloads
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load

LEVELS = (1.0, 0.5)


def measure(models: list[str]) -> Iterator[Row]:
    torch.set_num_threads(1)
    for workload in workloads("full"):
        if workload.name not in models:
            continue
        model, loss_fn, batch = prepare_model(workload, torch.device("cpu"))
        alive = storage_bytes([*model.parameters(), *model.buffers(), *batch])
        for level in LEVELS:
            inplace, not_inplace = (alive + step_peak(model, loss_fn, batch, level, on) for on in (True, False))
            yield {"model": workload.name, "level": level, "inplace": inplace, "not_inplace": not_inplace}


def step_peak(
    model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor], batch: tuple[Any, ...], level: float, inplace: bool
) -> int:
    """The allocator's peak over a `torch.compile`d step's second call (the first compiles), above its start."""
    torch._dynamo.reset()

    def loss(*inputs: Any) -> torch.Tensor:
        return loss_fn(model, *inputs)

    step = torch.compile(loss, fullgraph=True, dynamic=False)
    with (
        torch._functorch.config.patch(activation_memory_budget=level, enable_autograd_cache=False),
        torch._inductor.config.patch(fx_graph_cache=False, inplace_buffers=inplace),
    ):
        step(*batch).backward()
        model.zero_grad(set_to_none=True)
        gc.collect()
        peak = allocator_peak(lambda: step(*batch).backward())
        model.zero_grad(set_to_none=True)
    return peak


def render(stored: Stored) -> str:
    header = ["model", "activation_memory_budget", "peak MiB, in-place buffers", "without", "saved MiB"]
    lines = [
        [
            row["model"],
            str(row["level"]),
            f"{row['inplace'] / 2**20:.2f}",
            f"{row['not_inplace'] / 2**20:.2f}",
            f"{(row['not_inplace'] - row['inplace']) / 2**20:.2f}",
        ]
        for row in stored.rows
    ]
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["VGG (chain)", "U-Net"])
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "inductor_inplace", lambda: measure(arguments.models), render)


if __name__ == "__main__":
    main()
