"""How far each layout's float32 gradients are from float64 ones, on the full-size CNNs of `benchmarks/peers.py`.

    .venv/bin/python benchmarks/investigations/layout_numerics.py [--out]
    .venv/bin/python benchmarks/investigations/layout_numerics.py --from-json   # again from stored rows

One eager backward per model in float64 (the reference), float32 contiguous, float32 with the batch in channels-last
(what `channels_last=True` and `torch.compile`'s layout optimization run), and float32 through
`checkmate.compile(..., executor="inductor")` without recomputation. Printed per model: the largest difference over
parameters, relative to each parameter's largest float64 gradient.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import checkmate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from peers_tools import prepare_model, workloads
from rows import Row, Stored, add_row_arguments, measure_or_load


def gradients(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor], batch: Any) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss_fn(model, *batch).backward()
    return [parameter.grad.double() for parameter in model.parameters() if parameter.grad is not None]


def worst(got: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    return max(
        ((value - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()
        for value, expected in zip(got, reference, strict=True)
    )


def measure() -> Iterator[Row]:
    torch.set_num_threads(1)
    for workload in workloads("full"):
        if workload.name.startswith("GPT"):
            continue
        model, loss_fn, batch = prepare_model(workload, torch.device("cpu"))
        wide = copy.deepcopy(model).double()
        reference = gradients(wide, loss_fn, [b.double() if b.is_floating_point() else b for b in batch])
        contiguous = gradients(copy.deepcopy(model), loss_fn, batch)
        last = [b.contiguous(memory_format=torch.channels_last) if b.dim() == 4 else b for b in batch]
        channels_last = gradients(copy.deepcopy(model), loss_fn, last)
        compiled_model = copy.deepcopy(model)
        step = checkmate.compile(
            compiled_model, loss_fn, batch, budget=1.0, method="checkpoint_all", executor="inductor",
            cost_model="flops", cache=False, channels_last=False,
        )  # fmt: skip
        step(*batch)
        inductor = [p.grad.double() for p in compiled_model.parameters() if p.grad is not None]
        yield {
            "model": workload.name,
            "contiguous": worst(contiguous, reference),
            "channels_last": worst(channels_last, reference),
            "inductor": worst(inductor, reference),
        }


def render(stored: Stored) -> str:
    lines = [
        "| model | float32 contiguous | float32 channels-last | executor='inductor' (contiguous) |",
        "|---|---:|---:|---:|",
    ]
    for row in stored.rows:
        lines.append(
            f"| {row['model']} | {row['contiguous']:.1e} | {row['channels_last']:.1e} | {row['inductor']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser)
    measure_or_load(parser.parse_args(), "layout_numerics", measure, render)


if __name__ == "__main__":
    main()
