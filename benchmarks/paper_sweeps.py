"""The paper's budget sweeps (its Figure 5) and Table 2 on VGG16 and U-Net at the paper's batch sizes.

Each model comes from `checkmate.zoo` (VGG16 at batch 256, 224x224; U-Net at batch 32, 416x608, as in the paper's
Figure 5), captured with the flops cost model on fake tensors. Every method runs at `--points` budgets from the
smallest feasible to the no-remat peak, all solves of both models in one pool of local worker processes (or on Ray
with `--ray ADDRESS`). The script writes the rows (`<out>/paper_sweeps.json`) and one plot per model
(`<out>/paper_sweep_<model>.png`), prints the overhead tables, the solve times, Table 2 beside the paper's ratios,
and checks that `optimal` is at or below every other method at every budget (it exits with status 1 if not).
`--from-json` prints the same tables and check from stored rows, solving nothing, and exits with status 0 whatever
the check says (the documents print those tables; the check's line says whether it held).

    .venv/bin/python benchmarks/paper_sweeps.py --points 8 --time-limit 30
    .venv/bin/python benchmarks/paper_sweeps.py --models vgg16 --points 4 --ray local
    .venv/bin/python benchmarks/paper_sweeps.py --from-json benchmarks/results/paper_sweeps_unet60.json

The paper's U-Net is keras_segmentation's `vgg_unet` (a VGG16 encoder); the zoo's is the original U-Net. The paper's
Table 2 uses FLOP costs like this script, its Figure 5 a V100 profile.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from checkmate.cli.sweep import capture_target
from checkmate.experiments.parallel import make_runner
from checkmate.experiments.plots import plot_sweep
from checkmate.experiments.sweep import SweepRow, budget_grid, rows_from_json, rows_to_json, run_tasks, sweep_tasks
from checkmate.experiments.tables import approximation_ratios, format_solve_times, format_sweep, solve_times
from checkmate.files import write_file

# name -> (factory, the paper's batch size)
MODELS = {"vgg16": ("zoo:vgg16", 256), "unet": ("zoo:unet", 32)}

# The paper's Table 2 (FLOP costs): method -> (its column, ratio per model; None where the paper has none).
PAPER_TABLE2 = {
    "chen_sqrtn": ("AP √n", {"vgg16": 1.28, "unet": 1.27}),
    "chen_greedy": ("AP greedy", {"vgg16": 1.06, "unet": 1.23}),
    "griewank": ("Griewank log n", {"vgg16": 1.44, "unet": None}),
    "approx": ("Two-phase LP rounding", {"vgg16": 1.01, "unet": 1.03}),
}

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--points", type=int, default=8, help="budgets per model")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per solve of optimal and approx")
    parser.add_argument("--methods", help="comma-separated (default: every method)")
    parser.add_argument("--workers", type=int, help="local worker processes (default: one per CPU)")
    parser.add_argument("--ray", metavar="ADDRESS", help="run on Ray ('local' starts an instance here)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for rows JSON and plots")
    parser.add_argument("--tag", default="paper_sweeps", help="file name of the rows JSON, without .json")
    parser.add_argument(
        "--from-json", type=Path, nargs="?", const=DEFAULT_OUT / "paper_sweeps.json", metavar="PATH",
        help="print the tables from stored rows, solving nothing (default benchmarks/results/paper_sweeps.json)",
    )  # fmt: skip
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if arguments.from_json is not None:
        print_tables(rows_from_json(arguments.from_json.read_text()))
        return 0
    methods = None if arguments.methods is None else arguments.methods.split(",")
    started = time.perf_counter()
    tasks = []
    for name in arguments.models:
        spec, batch_size = MODELS[name]
        model, graph = capture_target(spec, batch_size)
        budgets = budget_grid(graph, arguments.points)
        print(f"{model}: {graph.size} nodes, {len(graph.edges)} edges, budgets {budgets[0]} .. {budgets[-1]} bytes")
        tasks += sweep_tasks(model, graph, budgets, methods, {"time_limit": arguments.time_limit})
    print(f"{len(tasks)} solves; set-up {time.perf_counter() - started:.1f} s", flush=True)
    done = 0

    def report(row: SweepRow) -> None:
        nonlocal done
        done += 1
        ratio = "-" if row.compute_ratio is None else f"{row.compute_ratio:.4f}x"
        where = f"[{done}/{len(tasks)} {time.perf_counter() - started:6.0f} s]"
        print(f"{where} {row.model} {row.method} {row.budget} {ratio} {row.status} {row.seconds:.1f} s", flush=True)

    solving = time.perf_counter()
    rows = run_tasks(tasks, make_runner(arguments.workers, arguments.ray), report)
    print(f"\nsolves took {time.perf_counter() - solving:.0f} s\n")
    arguments.out.mkdir(parents=True, exist_ok=True)
    write_file(arguments.out / f"{arguments.tag}.json", rows_to_json(rows))
    for model in dict.fromkeys(row.model for row in rows):
        plot_sweep([row for row in rows if row.model == model], arguments.out / f"{arguments.tag}_{model}.png")
    status = print_tables(rows)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; rows and plots in {arguments.out}")
    return status


def print_tables(rows: list[SweepRow]) -> int:
    """Print the overhead tables, the solve times, Table 2 beside the paper's and the check that `optimal` is at or
    below every other method; 1 when the check fails, else 0."""
    print(format_sweep(rows))
    print()
    print(format_solve_times(solve_times(rows)))
    print()
    print(table2_beside_paper(rows))
    violations = optimal_violations(rows)
    print()
    print("optimal at or below every other method at every budget: " + ("yes" if not violations else "NO"))
    for line in violations:
        print("  " + line)
    return 1 if violations else 0


def table2_beside_paper(rows: list[SweepRow]) -> str:
    """Each method's geometric-mean ratio to optimal, per model, next to the paper's Table 2 value; the mean is over
    the budgets where both have a plan, and the cell says how many of the budgets tried that is."""
    lines = [
        "| model | method | paper column | ours: geomean (max, budgets with both plans of those tried) | paper |",
        "|---|---|---|---:|---:|",
    ]
    for ratio in approximation_ratios(rows):
        column, paper = PAPER_TABLE2.get(ratio.method, ("-", {}))
        base = ratio.model.split("_b")[0]
        theirs = paper.get(base)
        tried = len({row.budget for row in rows if (row.model, row.method) == (ratio.model, ratio.method)})
        ours = f"- (0 of {tried})"
        if ratio.geomean is not None:
            ours = f"{ratio.geomean:.2f}x ({ratio.maximum:.2f}x, {ratio.budgets} of {tried})"
        paper_text = "-" if theirs is None else f"{theirs:.2f}x"
        lines.append(f"| {ratio.model} | {ratio.method} | {column} | {ours} | {paper_text} |")
    return "\n".join(lines)


def optimal_violations(rows: list[SweepRow]) -> list[str]:
    """Budgets where another method has a plan cheaper than optimal's, or a plan where optimal has none."""
    best = {(row.model, row.budget): row.cost for row in rows if row.method == "optimal"}
    found = []
    for row in rows:
        if row.method == "optimal" or row.cost is None or (row.model, row.budget) not in best:
            continue
        reference = best[row.model, row.budget]
        if reference is None or row.cost < reference * (1 - 1e-9):
            found.append(f"{row.model} at {row.budget} bytes: {row.method} {row.cost:.12g} < optimal {reference:.12g}")
    return found


if __name__ == "__main__":
    sys.exit(main())
