"""The plan's peak against the measured peak of a step from `.grad = None` and of one that accumulates.

    .venv/bin/python benchmarks/investigations/accumulating_peaks.py [--out]
    .venv/bin/python benchmarks/investigations/accumulating_peaks.py --from-json   # again from stored rows

The models and budgets of `tests/torch/test_compile.py` (a small ResNet and GPT; `optimal` with a 20 s limit, FLOP
costs). Each compiled step runs twice with `measure_memory="every"`: first from `.grad = None`, then adding into the
gradients the first call left. Prints a markdown table of bytes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import checkmate
from checkmate import zoo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from rows import Row, Stored, add_row_arguments, measure_or_load

CASES: list[tuple[str, Callable[[], Any], float]] = [
    ("ResNet", lambda: zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1)), 1.0),
    ("ResNet", lambda: zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1)), 0.7),
    ("GPT", lambda: zoo.gpt(batch_size=8, length=32, dim=32, heads=2, layers=2, vocab=64), 1.0),
    ("GPT", lambda: zoo.gpt(batch_size=8, length=32, dim=32, heads=2, layers=2, vocab=64), 0.5),
]


def measure() -> Iterator[Row]:
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
        yield {
            "model": name,
            "budget": budget,
            "method": report.method,
            "status": report.status,
            "planned_peak": report.planned_peak,
            "measured_fresh": fresh,
            "measured_accumulating": report.measured_peak,
        }


def render(stored: Stored) -> str:
    lines = [
        "| model | budget | plan | planned peak | measured, from .grad = None | measured, accumulating |",
        "|---|---|---|---|---|---|",
    ]
    for row in stored.rows:
        lines.append(
            f"| {row['model']} | {row['budget']:.0%} | {row['method']} ({row['status']}) | {row['planned_peak']} | "
            f"{row['measured_fresh']} | {row['measured_accumulating']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser)
    measure_or_load(parser.parse_args(), "accumulating_peaks", measure, render)


if __name__ == "__main__":
    main()
