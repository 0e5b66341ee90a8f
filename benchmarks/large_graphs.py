"""`optimal` and `approx` on op-level graphs of real models (80-900 nodes), beside every baseline.

For each graph of `benchmarks/graphs/` (made by `benchmarks/graph_set.py`, flops costs) and each budget (a fraction
of the checkpoint_all peak, fixed memory included), it runs every baseline, `approx` and `optimal` with the same
time limit, and prints one row per method: seconds, compute overhead over checkpoint_all, the lower bound proven
for the graph given (as an overhead), and the gap. "before" is the best baseline: what `optimal` returned on these
graphs before the coarsened path (issue 9). `--out [PATH]` writes the rows as JSON too (default
benchmarks/results/large_graphs.json), and `--from-json [PATH]` prints the table again from them.

    .venv/bin/python benchmarks/large_graphs.py --time-limit 120 --fractions 0.4 0.6 0.8
    .venv/bin/python benchmarks/large_graphs.py --graphs resnet50 gpt2 --fractions 0.6 --time-limit 300
    .venv/bin/python benchmarks/large_graphs.py --from-json --markdown   # BENCHMARKS.md's table from the rows
"""

from __future__ import annotations

import argparse
import gzip
import logging
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import checkmate
from checkmate.search_defaults import DEFAULT_TIME_LIMIT
from checkmate.strategies.warm_start import BASELINES
from rows import Row, Stored, add_row_arguments, measure_or_load

GRAPHS = Path(__file__).parent / "graphs"
SEARCHES = ("approx", "optimal")


def load(name: str) -> checkmate.Graph:
    with gzip.open(GRAPHS / f"{name}.json.gz", "rt") as file:
        return checkmate.Graph.from_json(file.read())


def run(graph: checkmate.Graph, budget: int, method: str, time_limit: float) -> dict[str, Any]:
    options = {"time_limit": time_limit} if method in SEARCHES else {}
    started = time.perf_counter()
    try:
        plan = checkmate.solve(graph, budget, method=method, **options)
    except (checkmate.InfeasibleBudget, checkmate.InvalidGraph, checkmate.MethodNotApplicable) as error:
        return {"method": method, "seconds": time.perf_counter() - started, "status": type(error).__name__}
    return {
        "method": method,
        "seconds": time.perf_counter() - started,
        "status": plan.status,
        "cost": plan.cost,
        "peak": plan.peak_memory,
        "lower_bound": plan.lower_bound,
    }


def measure(arguments: argparse.Namespace) -> Iterator[Row]:
    names = arguments.graphs or sorted(path.name.removesuffix(".json.gz") for path in GRAPHS.glob("*.json.gz"))
    for name in names:
        graph = load(name)
        reference = checkmate.solve(graph, None)
        for fraction in arguments.fractions:
            budget = int(fraction * reference.peak_memory)
            for method in arguments.methods:
                row = {"graph": name, "nodes": graph.size, "fraction": fraction, "budget": budget}
                row |= {"reference_cost": reference.cost}
                row |= run(graph, budget, method, arguments.time_limit)
                print(format_row(row, reference.cost), file=sys.stderr, flush=True)
                yield row


def render(stored: Stored) -> str:
    """One line per row; after each graph and budget, the best baseline ("before")."""
    lines = [f"{'graph':10} {'nodes':>5} {'budget':>6} {'method':20} {'s':>6} {'overhead':>9} {'bound':>8} {'gap':>7}"]
    groups: dict[tuple[str, float], list[Row]] = {}
    for row in stored.rows:
        groups.setdefault((row["graph"], row["fraction"]), []).append(row)
    for group in groups.values():
        reference_cost = group[0]["reference_cost"]
        lines += [format_row(row, reference_cost) for row in group]
        before = min((row["cost"] for row in group if "cost" in row and row["method"] in BASELINES), default=None)
        if before is not None:
            overhead = before / reference_cost - 1
            lines.append(f"{'':10} {'':5} {'':6} {'before (best baseline)':20} {'':6} {overhead:9.1%}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="*", help="names in benchmarks/graphs (default: all)")
    parser.add_argument("--fractions", nargs="*", type=float, default=[0.4, 0.6, 0.8])
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT)
    parser.add_argument("--methods", nargs="*", default=[*BASELINES, *SEARCHES])
    parser.add_argument("--markdown", action="store_true", help="print one markdown row per graph and budget")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    measure_or_load(arguments, "large_graphs", lambda: measure(arguments), markdown if arguments.markdown else render)


MARKDOWN_BASELINES = ("chen_sqrtn", "chen_greedy", "chen_sqrtn_linear", "chen_greedy_linear")


def markdown(stored: Stored) -> str:
    """One row per graph and budget: each Chen baseline's overhead, the best baseline, the search's (bold), its
    bound, gap, seconds and status (a search that has no plan: why)."""
    search = next((row["method"] for row in stored.rows if row["method"] in SEARCHES), "optimal")
    lines = [
        f"| graph | nodes | budget | {' | '.join(MARKDOWN_BASELINES)} | best baseline | `{search}` | bound | gap | s "
        "| status |",
        "|---|---:|---:|" + "---:|" * len(MARKDOWN_BASELINES) + "---|---:|---:|---:|---:|---|",
    ]
    groups: dict[tuple[str, float], dict[str, Row]] = {}
    for row in stored.rows:
        groups.setdefault((row["graph"], row["fraction"]), {})[row["method"]] = row
    for (graph, fraction), rows in groups.items():
        reference = next(iter(rows.values()))["reference_cost"]
        overhead = partial(_overhead, reference=reference)
        baselines = [rows[name] for name in BASELINES if name in rows and "cost" in rows[name]]
        best = min(baselines, key=lambda row: row["cost"], default=None)
        best_cell = "–" if best is None else f"{best['method']} {overhead(best)}"
        found = rows.get(search)
        cells = [overhead(rows.get(name)) for name in MARKDOWN_BASELINES] + [best_cell]
        if found is None or "cost" not in found:
            status = "below the smallest budget" if found and found["status"] == "InfeasibleBudget" else "no plan"
            seconds = "" if found is None else f"{found['seconds']:.0f}"
            cells += [status, "", "", seconds, ""]
        else:
            bound = found["lower_bound"]
            gap = "" if bound is None else f"{(found['cost'] - bound) / found['cost']:.1%}"
            bound_cell = "" if bound is None else f"{bound / reference - 1:+.1%}"
            cells += [f"**{overhead(found)}**", bound_cell, gap, f"{found['seconds']:.0f}", found["status"]]
        lines.append(f"| {graph} | {next(iter(rows.values()))['nodes']} | {fraction:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _overhead(row: Row | None, reference: float) -> str:
    return "–" if row is None or "cost" not in row else f"{row['cost'] / reference - 1:+.1%}"


def format_row(row: dict[str, Any], reference_cost: float) -> str:
    head = f"{row['graph']:10} {row['nodes']:5d} {row['fraction']:6.0%} {row['method']:20} {row['seconds']:6.1f}"
    if "cost" not in row:
        return f"{head} {row['status']}"
    overhead = f"{row['cost'] / reference_cost - 1:9.1%}"
    if row["lower_bound"] is None:
        return f"{head} {overhead}"
    bound = row["lower_bound"] / reference_cost - 1
    gap = (row["cost"] - row["lower_bound"]) / row["cost"]
    return f"{head} {overhead} {bound:8.1%} {gap:7.3%}"


if __name__ == "__main__":
    main()
