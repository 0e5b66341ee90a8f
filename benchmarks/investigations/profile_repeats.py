"""How many timed runs the "profile" cost model needs: plans priced by few runs against plans priced by many.

    .venv/bin/python benchmarks/profile_repeats.py --out    # rows to benchmarks/results/profile_repeats.json
    .venv/bin/python benchmarks/profile_repeats.py --from-json

The graph set's `resnet50` (Hugging Face ResNet-50, batch 32, 128x128; `benchmarks/graph_set.py`) is captured three
times with `cost_model="profile"`, each in a fresh cache: with 11 timed runs per op (the reference), with 11 again
(run-to-run noise), and with 3. Each graph is planned by `optimal` at 60 % of its no-remat peak (60 s, 1 % gap).
Every plan is then priced by the reference's costs: a plan made from cheaper profiling is as good as its price under
the reference. Also: the median relative difference of per-op costs against the reference (ops of at least 0.1 %
of the step), and the seconds each capture took.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import checkmate
from checkmate.torch_capture.profile import ProfileRepeats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from graph_set import resnet50
from rows import Row, Stored, add_row_arguments, measure_or_load

VARIANTS = (("reference", 11), ("again", 11), ("three", 3))


def measure(budget: float, time_limit: float) -> Iterator[Row]:
    graphs = {}
    for name, repeats in VARIANTS:
        runs = ProfileRepeats(minimum=repeats, maximum=repeats)
        with tempfile.TemporaryDirectory() as cache:
            os.environ["CHECKMATE_CACHE_DIR"] = cache
            model, loss_fn, batch = resnet50()
            started = time.perf_counter()
            graphs[name] = checkmate.capture(model, loss_fn, batch, cost_model="profile", profile_repeats=runs).graph
            seconds = time.perf_counter() - started
        graph = graphs[name]
        no_remat = checkmate.solve(graph, None).peak_memory
        plan = checkmate.solve(graph, int(budget * no_remat), method="optimal", time_limit=time_limit, mip_gap=0.01)
        reference = graphs["reference"]
        large = reference.costs >= 1e-3 * reference.costs.sum()
        relative = np.abs(graph.costs[large] - reference.costs[large]) / reference.costs[large]
        yield {
            "variant": name,
            "timed_runs": repeats,
            "capture_s": seconds,
            "plan_cost_own": plan.cost,
            "plan_cost_by_reference": float(reference.costs @ plan.R.sum(axis=0)),
            "no_remat_cost_by_reference": float(reference.costs.sum()),
            "median_op_difference": float(np.median(relative)),
            "status": plan.status,
        }


def render(stored: Stored) -> str:
    rows = stored.rows
    best = min(row["plan_cost_by_reference"] for row in rows)
    lines = [f"{'variant':10} {'runs':>4} {'capture':>8} {'plan priced by reference':>25} {'op cost diff':>12}"]
    for row in rows:
        extra = row["plan_cost_by_reference"] / best - 1
        lines.append(
            f"{row['variant']:10} {row['timed_runs']:4d} {row['capture_s']:7.1f}s "
            f"{row['plan_cost_by_reference']:17.4f} (+{100 * extra:.2f}%) {100 * row['median_op_difference']:11.1f}%"
        )
    return "\n".join([*lines, f"(rows of: {stored.environment.get('command', '')})"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=0.6)
    parser.add_argument("--time-limit", type=float, default=60.0)
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "profile_repeats", lambda: measure(arguments.budget, arguments.time_limit), render)


if __name__ == "__main__":
    main()
