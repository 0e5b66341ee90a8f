"""Moves to host memory as the step runs them, on CPU: the joint plan (keep, recompute or move, `host_budget`) against
recomputation only, at the same budgets, measured.

Models: Hugging Face's GPT-2 from a config (4 layers, width 256, 8 x 256 tokens, random weights, its 0.1 dropout;
`benchmarks/gpu_check.py`'s) and a ResNet of ours (`checkmate.zoo.resnet`). The link is this machine's, measured by
the step's own copier at the first compile (`checkmate.execute.host_link`: copies to numpy memory on a worker
thread). For each budget (a fraction of the peak without recomputation), the two steps and eager's are timed
interleaved (one torch thread, median of `--repeats`); each compiled step's first call is measured on the allocator
meter against its plan, and its loss and gradients compared with eager's, bit for bit.

    .venv/bin/python benchmarks/offload_step.py --out
    .venv/bin/python benchmarks/offload_step.py --from-json
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import checkmate
from checkmate import zoo
from checkmate.execute.host_link import measured_link_speeds
from gpu_check import hugging_face_gpt2
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load
from timing import interleaved_medians

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "torch"))
from eager_oracle import measured_call

MODELS: dict[str, Callable[[], Any]] = {
    "GPT-2 (transformers)": lambda: hugging_face_gpt2(batch_size=8, length=256, width=256, layers=4, vocab=8192),
    "ResNet (ours)": lambda: zoo.resnet(batch_size=16, image_size=32, width=16, blocks=(1, 1, 1)),
}
FRACTIONS = (0.7, 0.5)


def measure(arguments: argparse.Namespace) -> Iterator[Row]:
    torch.set_num_threads(1)
    speeds = measured_link_speeds(torch.device("cpu"))
    print(f"link: {speeds}", file=sys.stderr)
    for name, factory in MODELS.items():
        model, loss_fn, batch = factory()
        eager_model = copy.deepcopy(model)

        def eager_step(eager_model: Any = eager_model, loss_fn: Any = loss_fn, batch: Any = batch) -> None:
            loss_fn(eager_model, *batch).backward()

        for fraction in arguments.fractions:
            steps = {}
            for label, options in (("recompute", {}), ("joint", {"host_budget": "8GiB"})):
                copied = copy.deepcopy(model)
                try:
                    steps[label] = checkmate.compile(
                        copied, loss_fn, batch, budget=fraction, cost_model="profile", measure_memory="never",
                        time_limit=arguments.time_limit, **options,
                    )  # fmt: skip
                except checkmate.InfeasibleBudget as error:
                    yield {"model": name, "fraction": fraction, "method": label, "error": str(error)[:200]}
            for step in steps.values():
                _check_exact(step, model, loss_fn, batch)
            functions = [functools.partial(step, *batch) for step in steps.values()] + [eager_step]
            seconds = interleaved_medians(functions, arguments.repeats)
            for (label, step), took in zip(steps.items(), seconds, strict=False):
                step.module.zero_grad(set_to_none=True)
                _, measured = measured_call(step, batch)
                report = step.report()
                moves = report.moves
                yield {
                    "model": name,
                    "fraction": fraction,
                    "method": label,
                    "seconds": took,
                    "eager_seconds": seconds[-1],
                    "planned_seconds": report.predicted_time,
                    "planned_peak": step.plan.peak_memory,
                    "measured_peak": measured,
                    "budget": step.plan.budget,
                    "moved": int(step.plan.moves.copy_out.sum()),
                    "host_bytes": 0 if moves is None else moves.host_peak,
                    "hidden": None if moves is None else moves.hidden,
                    "recomputed": int(step.plan.R.sum()) - step.graph.size,
                }


def _check_exact(step: Any, model: Any, loss_fn: Any, batch: Any) -> None:
    """One step against eager on fresh copies: equal loss and gradients, bit for bit."""
    reference = copy.deepcopy(model)
    step.module.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    loss = step(*batch)
    torch.manual_seed(7)
    expected = loss_fn(reference, *batch)
    expected.backward()
    assert torch.equal(loss, expected.detach()), "the step's loss differs from eager's"
    for got, want in zip(step.module.parameters(), reference.parameters(), strict=True):
        assert (got.grad is None) == (want.grad is None) and (got.grad is None or torch.equal(got.grad, want.grad))


def render(stored: Stored) -> str:
    lines = []
    by_key = {(row["model"], row["fraction"], row["method"]): row for row in stored.rows}
    for model, fraction in dict.fromkeys((row["model"], row["fraction"]) for row in stored.rows):
        recompute = by_key.get((model, fraction, "recompute"), {})
        for method in ("recompute", "joint"):
            row = by_key.get((model, fraction, method))
            if row is None or "error" in row:
                lines.append([model, f"{fraction:.0%}", method, "–", "–", "–", "–", "–", "–", "–"])
                continue
            against = f"{row['seconds'] / recompute['seconds']:.2f}" if "seconds" in recompute else "–"
            moved = f"{row['moved']} ({row['host_bytes'] / 2**20:.1f} MiB)" if row["moved"] else "0"
            lines.append(
                [
                    model,
                    f"{fraction:.0%}",
                    method,
                    f"{row['seconds'] * 1e3:.1f}",
                    against,
                    f"{row['seconds'] / row['eager_seconds']:.2f}",
                    f"{row['planned_peak'] / 2**20:.2f} / {row['measured_peak'] / 2**20:.2f}",
                    str(row["recomputed"]),
                    moved,
                    "–" if row["planned_seconds"] is None else f"{row['seconds'] / row['planned_seconds']:.2f}",
                ]
            )
    header = ["model", "budget", "plan", "step ms", "/ recompute", "/ eager", "peak MiB planned / measured",
              "recomputed", "moved (host)", "measured / predicted"]  # fmt: skip
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--time-limit", type=float, default=60.0)
    add_row_arguments(parser)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    measure_or_load(arguments, "offload_step", lambda: measure(arguments), render)


if __name__ == "__main__":
    main()
