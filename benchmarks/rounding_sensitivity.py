"""How much a rounding-sized change of one activation moves the gradients of the full-size ResNet of `peers.py`.

    .venv/bin/python benchmarks/rounding_sensitivity.py

Fused runs (`checkmate.inductor.segments`) compute BatchNorm, the residual add and ReLU in one Inductor loop, which
rounds otherwise than one function per node: on this model the output of `stages.2` differs by a few 1e-6. This
script shows what such a difference does in plain eager PyTorch: it adds uniform noise of a given size to the
positive entries of `stages.2`'s output and prints the largest gradient difference from the unperturbed step
(relative to each parameter's largest gradient), then the same figure for `checkmate.compile` with the Inductor
executor at a budget whose plan recomputes (fused runs, then one function per node).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import torch

import checkmate
import checkmate.inductor.program

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_tools import prepare_model, workloads


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
        gradient_memory="when_made", measure_memory="first",
    )  # fmt: skip
    step(*batch)
    return worst(copied, reference)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=19.9, help="the budget of the compiled step, MiB")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    workload = {workload.name: workload for workload in workloads("full")}["ResNet"]
    model, loss_fn, batch = prepare_model(workload, torch.device("cpu"))
    reference = copy.deepcopy(model)
    loss_fn(reference, *batch).backward()
    print("| change | largest gradient difference from eager |")
    print("|---|---:|")
    for size in (1e-6, 3e-6, 1e-5):
        print(f"| eager, `stages.2` output ±{size:.0e} | {perturbed(model, loss_fn, batch, reference, size):.1e} |")
    fused = compiled(model, loss_fn, batch, reference, arguments.mib)
    print(f"| `executor='inductor'` at {arguments.mib} MiB, fused runs | {fused:.1e} |")
    program_module = checkmate.inductor.program
    program_module.fused_steps = lambda captured, kernels, device, schedule: schedule.steps  # type: ignore[assignment]
    per_node = compiled(model, loss_fn, batch, reference, arguments.mib)
    print(f"| the same, one function per node | {per_node:.1e} |")


if __name__ == "__main__":
    main()
