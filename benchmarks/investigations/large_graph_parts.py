"""What each part of the large-graph path of `optimal` gives on its own, on ResNet-50 and GPT-2 small at 60 %.

Rows (compute overhead over checkpoint_all, and seconds):
* the best baseline, and the same improved by `hold_more`;
* the retention bound, and the plan its answer starts (`cheapest_r` of what it keeps), then `hold_more`;
* the coarse MILP alone on HiGHS and on SCIP at 100 and 150 blocks (`--coarse-seconds` each), its plan expanded
  to the full graph, then `hold_more`;
* `swap_holds` on the best baseline after `hold_more` (`--swap-seconds`).

    .venv/bin/python benchmarks/investigations/large_graph_parts.py [--out] \
        [--graphs resnet50 gpt2] [--coarse-seconds 60]
    .venv/bin/python benchmarks/investigations/large_graph_parts.py --from-json   # again from stored rows
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import checkmate
from checkmate.bounds.retention import retention_bound
from checkmate.coarsen import choose_partition, coarsen, expand_plan
from checkmate.plan import cheapest_r, make_plan, prune_checkpoints
from checkmate.progress import SearchControl
from checkmate.strategies.hold_more import hold_more, swap_holds
from checkmate.strategies.warm_start import best_baseline

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from large_graphs import load
from rows import Row, Stored, add_row_arguments, measure_or_load


def row(name: str, label: str, cost: float | None, reference: float, seconds: float) -> Row:
    found = {"graph": name, "label": label, "cost": cost, "reference_cost": reference, "seconds": seconds}
    print(line(found), file=sys.stderr, flush=True)
    return found


def line(row: Row) -> str:
    cost = row["cost"]
    overhead = "no plan" if cost is None else f"{cost / row['reference_cost'] - 1:8.1%}"
    return f"{row['graph']:9} {row['label']:52} {overhead:>9} {row['seconds']:7.1f} s"


def render(stored: Stored) -> str:
    return "\n".join(line(row) for row in stored.rows)


def measure(arguments: argparse.Namespace) -> Iterator[Row]:
    for name in arguments.graphs:
        graph = load(name)
        reference = checkmate.solve(graph, None)
        budget = int(arguments.fraction * reference.peak_memory)
        started = time.perf_counter()
        baseline = best_baseline(graph, budget)
        yield row(
            name,
            f"best baseline ({baseline.method if baseline else '-'})",
            baseline and baseline.cost,
            reference.cost,
            time.perf_counter() - started,
        )
        held = None
        if baseline is not None:
            started = time.perf_counter()
            held = hold_more(graph, baseline, budget, SearchControl(), method="parts")
            yield row(name, "best baseline + hold_more", held.cost, reference.cost, time.perf_counter() - started)
        started = time.perf_counter()
        bound = retention_bound(graph, budget)
        yield row(name, "retention bound (a lower bound)", bound.bound, reference.cost, time.perf_counter() - started)
        if bound.held is not None:
            started = time.perf_counter()
            R, S = prune_checkpoints(graph, cheapest_r(graph, bound.held), bound.held)
            seed = make_plan(graph, R, S, method="parts")
            fits = seed.peak_memory <= budget
            yield row(
                name,
                f"retention answer as a plan ({'fits' if fits else 'over budget'})",
                seed.cost,
                reference.cost,
                time.perf_counter() - started,
            )
            if fits:
                improved = hold_more(graph, seed, budget, SearchControl(time_limit=120), method="parts")
                yield row(
                    name,
                    "retention answer + hold_more (120 s at most)",
                    improved.cost,
                    reference.cost,
                    time.perf_counter() - started,
                )
        for blocks in (100, 150):
            coarsening = coarsen(graph, choose_partition(graph, blocks))
            for backend in ("highs", "scip"):
                started = time.perf_counter()
                try:
                    coarse = checkmate.solve(
                        coarsening.coarse,
                        budget,
                        method="optimal",
                        backend=backend,
                        time_limit=arguments.coarse_seconds,
                        exact_nodes=blocks,
                    )
                except checkmate.InfeasibleBudget:
                    yield row(
                        name,
                        f"coarse MILP, {blocks} blocks, {backend}",
                        None,
                        reference.cost,
                        time.perf_counter() - started,
                    )
                    continue
                label = f"coarse MILP, {blocks} blocks, {backend} ({coarse.status})"
                yield row(name, label, coarse.cost, reference.cost, time.perf_counter() - started)
                expanded = expand_plan(coarsening, coarse, method="parts")
                improved = hold_more(graph, expanded, budget, SearchControl(), method="parts")
                yield row(name, "  expanded + hold_more", improved.cost, reference.cost, time.perf_counter() - started)
        if held is not None:
            started = time.perf_counter()
            swapped = swap_holds(graph, held, budget, SearchControl(time_limit=arguments.swap_seconds), method="parts")
            yield row(
                name,
                "best baseline + hold_more + swap_holds",
                swapped.cost,
                reference.cost,
                time.perf_counter() - started,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="*", default=["resnet50", "gpt2"])
    parser.add_argument("--fraction", type=float, default=0.6)
    parser.add_argument("--coarse-seconds", type=float, default=60.0)
    parser.add_argument("--swap-seconds", type=float, default=60.0)
    add_row_arguments(parser)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    measure_or_load(arguments, "large_graph_parts", lambda: measure(arguments), render)


if __name__ == "__main__":
    main()
