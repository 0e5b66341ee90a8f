"""The plan's peak against the measured peak of a step from `.grad = None` and of one that accumulates.

    .venv/bin/python benchmarks/accumulating_peaks.py

The models and budgets of `tests/torch/test_compile.py` (a small ResNet and GPT; `optimal` with a 20 s limit, FLOP
costs). Each compiled step runs twice with `measure_memory="every"`: first from `.grad = None`, then adding into the
gradients the first call left. Prints a markdown table of bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import checkmate
from checkmate import zoo

CASES: list[tuple[str, Callable[[], Any], float]] = [
    ("ResNet", lambda: zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1)), 1.0),
    ("ResNet", lambda: zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1)), 0.7),
    ("GPT", lambda: zoo.gpt(batch_size=8, length=32, dim=32, heads=2, layers=2, vocab=64), 1.0),
    ("GPT", lambda: zoo.gpt(batch_size=8, length=32, dim=32, heads=2, layers=2, vocab=64), 0.5),
]


def main() -> None:
    print("| model | budget | plan | planned peak | measured, from .grad = None | measured, accumulating |")
    print("|---|---|---|---|---|---|")
    for name, factory, budget in CASES:
        model, loss_fn, batch = factory()
        method, options = ("checkpoint_all", {}) if budget == 1.0 else ("optimal", {"time_limit": 20})
        step = checkmate.compile(
            model, loss_fn, batch, budget=budget, method=method, cost_model="flops", measure_memory="every", **options
        )
        model.zero_grad(set_to_none=True)
        step(*batch)
        fresh = step.report().measured_peak
        step(*batch)
        report = step.report()
        print(
            f"| {name} | {budget:.0%} | {report.method} ({report.status}) | {report.planned_peak} | {fresh} | "
            f"{report.measured_peak} |"
        )


if __name__ == "__main__":
    main()
