"""How much a rounding-sized change of one activation moves the gradients of the full-size ResNet of `peers.py`.

    .venv/bin/python benchmarks/investigations/rounding_sensitivity.py [--out]
    .venv/bin/python benchmarks/investigations/rounding_sensitivity.py --from-json   # again from stored rows

Fused runs (`checkmate.inductor.segments`) compute BatchNorm, the residual add and ReLU in one Inductor loop, which
rounds otherwise than one function per node: on this model the output of `stages.2` differs by a few 1e-6. This
script shows what such a difference does in plain eager PyTorch: it adds uniform noise of a given size to the
positive entries of `stages.2`'s output and prints the largest gradient difference from the unperturbed step
(relative to each parameter's largest gradient), then the same figure for `checkmate.compile` with the Inductor
executor in the model's own (contiguous) layout at a budget whose plan recomputes (fused runs, then one function per
node).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import checkmate
import checkmate.inductor.segments

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from peers_tools import prepare_model, workloads
from rows import Row, Stored, add_row_arguments, measure_or_load


def worst(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    return max(
        ((mine.grad - theirs.grad).abs().max() / theirs.grad.abs().max()).item()
        for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True)
    )


def perturbed(model: torch.nn.Module, loss_fn: Any, batch: Any, reference: torch.nn.Module, size: float) -> float:
    copied = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)

    def add_noise(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        noise = (torch.rand(output.shape, generator=generator) - 0.5) * 2 * size
        return output + noise * (output > 0)

    copied.get_submodule("stages.2").register_forward_hook(add_noise)
    loss_fn(copied, *batch).backward()
    return worst(copied, reference)


def compiled(model: torch.nn.Module, loss_fn: Any, batch: Any, reference: torch.nn.Module, mib: float) -> float:
    copied = copy.deepcopy(model)
    step = checkmate.compile(
        copied, loss_fn, batch, budget=int(mib * 2**20), executor="inductor", time_limit=15,
        gradient_memory="when_made", measure_memory="first", channels_last=False,
    )  # fmt: skip
    step(*batch)
    return worst(copied, reference)


def measure(mib: float) -> Iterator[Row]:
    torch.set_num_threads(1)
    workload = {workload.name: workload for workload in workloads("full")}["ResNet"]
    model, loss_fn, batch = prepare_model(workload, torch.device("cpu"))
    reference = copy.deepcopy(model)
    loss_fn(reference, *batch).backward()
    for size in (1e-6, 3e-6, 1e-5):
        yield {"change": "noise", "size": size, "difference": perturbed(model, loss_fn, batch, reference, size)}
    yield {"change": "fused", "mib": mib, "difference": compiled(model, loss_fn, batch, reference, mib)}
    segments_module = checkmate.inductor.segments
    segments_module.fused_steps = lambda captured, kernels, device, lowering: lowering.steps  # type: ignore[assignment]
    yield {"change": "per node", "mib": mib, "difference": compiled(model, loss_fn, batch, reference, mib)}


def render(stored: Stored) -> str:
    lines = ["| change | largest gradient difference from eager |", "|---|---:|"]
    for row in stored.rows:
        if row["change"] == "noise":
            change = f"eager, `stages.2` output ±{row['size']:.0e}"
        elif row["change"] == "fused":
            change = f"`executor='inductor'` at {row['mib']} MiB, fused runs"
        else:
            change = "the same, one function per node"
        lines.append(f"| {change} | {row['difference']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=19.9, help="the budget of the compiled step, MiB")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "rounding_sensitivity", lambda: measure(arguments.mib), render)


if __name__ == "__main__":
    main()
