"""Hugging Face `transformers` models in a plain training loop through `torch.compile(backend=checkmate.backend(...))`,
beside the same loop eager and under `torch.compile`'s default backend (Inductor).

Each row builds a model of `benchmarks/real_models.py` (small configs, random weights, nothing downloaded), makes
three copies with dropout off (compiled random ops draw other numbers than eager's), and trains each for `--steps`
steps of SGD with momentum on the same batch: eager, Inductor and ours. It prints how many regions Dynamo handed
the backend, the budget each was planned within (a fraction a region cannot reach is planned at the smallest budget
known to fit), the planned peak and extra compute of the largest region, the largest difference of ours and of
Inductor from eager over the losses and the parameters after every step (relative to eager's largest loss, and
largest parameter), the median step time of each after the compiling step, and the peak of one more step of each
measured on the allocator's own events (Inductor's buffers and kernel scratch included; parameters and batch
counted, no `.grad` at the start).

    .venv/bin/python benchmarks/backend_models.py                  # every row at 1.0 and 0.6
    .venv/bin/python benchmarks/backend_models.py --rows gpt2 --budgets 0.6
    .venv/bin/python benchmarks/backend_models.py --out            # rows to benchmarks/results/backend_models.json
    .venv/bin/python benchmarks/backend_models.py --from-json      # the table again from them
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import transformers
from torch import nn

import checkmate
from checkmate.byte_sizes import format_bytes
from checkmate.execute.memory import measure_peak, step_baseline
from real_models import ROWS
from rows import Row as StoredRow
from rows import Stored, add_row_arguments, markdown_table, measure_or_load

DEFAULT_ROWS = ("gpt2", "bert", "vit", "t5", "resnet", "llama")


def _train(
    model: nn.Module,
    forward: Callable[..., Any],
    loss_fn: Callable[..., torch.Tensor],
    batch: tuple[Any, ...],
    steps: int,
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], list[float]]:
    """`steps` steps of SGD with momentum through `forward` (the model itself or a compiled one): the losses, the
    parameters after each step and the seconds each step took."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, parameters, seconds = [], [], []
    for step in range(steps):
        torch.manual_seed(100 + step)
        started = time.perf_counter()
        loss = loss_fn(forward, *batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - started)
        losses.append(loss.detach())
        parameters.append([parameter.detach().clone() for parameter in model.parameters()])
    return losses, parameters, seconds


def _difference(got: tuple[list[torch.Tensor], list[list[torch.Tensor]]], want: tuple[Any, Any]) -> float:
    """The largest difference over the losses and over the parameters after every step, each relative to eager's
    largest value of its kind (not per tensor: a key bias, whose gradient is zero but for rounding, stays at 1e-13
    and would make any rounding look large)."""
    worst = 0.0
    for got_tensors, want_tensors in ((got[0], want[0]), *zip(got[1], want[1], strict=True)):
        scale = max(expected.double().abs().max().item() for expected in want_tensors) or 1.0
        for value, expected in zip(got_tensors, want_tensors, strict=True):
            worst = max(worst, (value.double() - expected.double()).abs().max().item() / scale)
    return worst


def _measured_peak(model: nn.Module, forward: Callable[..., Any], loss_fn: Callable[..., Any], batch: Any) -> int:
    """One more step (from no `.grad`, compiled already) metered on the allocator's own events
    (`measure_peak(..., allocator=True)`: Inductor's buffers and kernel scratch included), parameters and batch
    counted as at the start."""
    with measure_peak(torch.device("cpu"), step_baseline(model, batch), allocator=True) as meter:
        loss_fn(forward, *batch).backward()
    model.zero_grad(set_to_none=True)
    return meter.peak_bytes


def _without_dropout(model: nn.Module) -> nn.Module:
    """`model` with every dropout probability 0 (`nn.Dropout` modules and the float `*dropout*` attributes that
    attention functions read): compiled random ops draw other numbers than eager's, so with dropout on no compiled
    loop can match eager."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for attribute, value in list(vars(module).items()):
            if "dropout" in attribute and isinstance(value, float):
                setattr(module, attribute, 0.0)
    return model


def run_row(name: str, budget: float, steps: int, time_limit: float) -> StoredRow:
    torch.manual_seed(0)
    model, loss_fn, batch = ROWS[name].build()
    _without_dropout(model).train()
    eager_model, inductor_model = copy.deepcopy(model), copy.deepcopy(model)
    eager = _train(eager_model, eager_model, loss_fn, batch, steps)
    torch._dynamo.reset()
    inductor_forward = torch.compile(inductor_model)
    inductor = _train(inductor_model, inductor_forward, loss_fn, batch, steps)
    torch._dynamo.reset()
    planner = checkmate.backend(budget, cost_model="flops", time_limit=time_limit)
    ours_forward = torch.compile(model, backend=planner)
    ours = _train(model, ours_forward, loss_fn, batch, steps)
    peaks = [
        _measured_peak(eager_model, eager_model, loss_fn, batch),
        _measured_peak(inductor_model, inductor_forward, loss_fn, batch),
        _measured_peak(model, ours_forward, loss_fn, batch),
    ]
    largest = max(planner.regions, key=lambda region: region.no_remat_peak)
    plan = largest.plan
    return {
        "model": name,
        "label": ROWS[name].label,
        "budget": budget,
        "regions": len(planner.regions),
        "region_budgets": [region.budget for region in planner.regions],
        "region_no_remat_peaks": [region.no_remat_peak for region in planner.regions],
        "largest_planned_peak": plan.peak_memory,
        "largest_extra_compute": plan.cost / largest.no_remat_cost - 1.0 if largest.no_remat_cost > 0 else 0.0,
        "ours_difference": _difference(ours[:2], eager[:2]),
        "inductor_difference": _difference(inductor[:2], eager[:2]),
        "eager_step_s": statistics.median(eager[2][1:]),
        "inductor_step_s": statistics.median(inductor[2][1:]),
        "ours_step_s": statistics.median(ours[2][1:]),
        "ours_first_step_s": ours[2][0],
        "measured_peaks": peaks,
    }


HEADER = [
    "model",
    "budget",
    "regions (budget of each, of its no-recomputation peak)",
    "largest region: planned peak, extra compute",
    "ours vs eager",
    "Inductor vs eager",
    "step ms: eager / Inductor / ours",
    "measured peak MiB: eager / Inductor / ours",
    "ours' first step s",
]


def cells(row: StoredRow) -> list[str]:
    if "error" in row:
        return [row["model"], f"{row['budget']:.2f}", f"fails: {row['error']}", *[""] * (len(HEADER) - 3)]
    regions = ", ".join(
        f"{budget / peak:.0%}" for budget, peak in zip(row["region_budgets"], row["region_no_remat_peaks"], strict=True)
    )
    return [
        row["model"],
        f"{row['budget']:.2f}",
        f"{row['regions']} ({regions})",
        f"{format_bytes(row['largest_planned_peak'])}, {row['largest_extra_compute']:+.1%}",
        f"{row['ours_difference']:.1e}",
        f"{row['inductor_difference']:.1e}",
        f"{row['eager_step_s'] * 1e3:.1f} / {row['inductor_step_s'] * 1e3:.1f} / {row['ours_step_s'] * 1e3:.1f}",
        " / ".join(f"{peak / 2**20:.2f}" for peak in row["measured_peaks"]),
        f"{row['ours_first_step_s']:.1f}",
    ]


def render(stored: Stored) -> str:
    return markdown_table(HEADER, map(cells, stored.rows))


def measure(names: list[str], budgets: list[float], steps: int, time_limit: float) -> Iterator[StoredRow]:
    for name in names:
        for budget in budgets:
            try:
                yield run_row(name, budget, steps, time_limit)
            except Exception as error:  # Dynamo wraps the backend's errors; the row says what failed
                yield {"model": name, "budget": budget, "error": f"{type(error).__name__}: {str(error)[:300]}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma-separated, from {', '.join(ROWS)}")
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.6], help="fractions (default 1.0 0.6)")
    parser.add_argument("--steps", type=int, default=5, help="training steps of each loop (default 5)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds for each region's solve (default 20)")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    transformers.logging.set_verbosity_error()
    names = arguments.rows.split(",")
    measure_or_load(
        arguments,
        "backend_models",
        lambda: measure(names, arguments.budgets, arguments.steps, arguments.time_limit),
        render,
    )


if __name__ == "__main__":
    main()
