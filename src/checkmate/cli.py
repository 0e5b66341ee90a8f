"""The `checkmate` command: solve a graph, list the methods, compare them, capture a model.

    checkmate solve GRAPH.json --budget 512MiB --method chen_greedy [--out plan.json]
    checkmate methods
    checkmate compare GRAPH.json --budget 0.6 [--methods chen_sqrtn,griewank]
    checkmate sweep GRAPH.json [--points 8] [--methods ...] [--plot sweep.png]
    checkmate capture TARGET --out GRAPH.json [--cost-model profile|flops|unit] [--max-nodes N]

A budget (`--budget`) is read as `checkmate.compile` reads it (`units.parse_budget`): bytes (1000000), a size
(8GiB, 512MiB), or a fraction in (0, 1] of the peak without rematerialization (0.6: 0.6 times checkpoint_all's peak).

Errors the user can fix (a bad graph, an unknown method, a budget no plan meets) print one line to stderr and
exit with status 2.

While a searching method (optimal, approx) runs for more than two seconds, a status line on stderr (a terminal only)
shows the elapsed time, the phase, the best cost, the bound and the gap; Ctrl-C stops the search and the command
goes on with the best plan found so far (a second Ctrl-C aborts).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checkmate.compare import REFERENCE, accepted_options, compare, format_table
from checkmate.errors import CheckmateError, InvalidGraph
from checkmate.graph import Graph
from checkmate.progress_display import ProgressDisplay
from checkmate.solve import solve
from checkmate.strategies.registry import strategies
from checkmate.units import format_bytes, parse_budget, resolve_budget

USAGE_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 on success, 2 on an error the user can fix)."""
    arguments = _parser().parse_args(argv)
    try:
        status: int = arguments.command(arguments)
    except (CheckmateError, ValueError, OSError) as error:
        print(f"checkmate {arguments.command_name}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="checkmate", description="Optimal tensor rematerialization (Checkmate).")
    commands = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    solve_parser = commands.add_parser("solve", help="plan one graph within a memory budget")
    _graph_and_budget(solve_parser)
    solve_parser.add_argument("--method", default="checkpoint_all", help="a name from `checkmate methods`")
    solve_parser.add_argument("--out", type=Path, help="write the plan (R, S and its figures) to this JSON file")
    solve_parser.add_argument(
        "--plot", type=Path, help="write memory over the schedule, against checkpoint_all, to this PNG (matplotlib)"
    )
    solve_parser.set_defaults(command=_solve)

    methods_parser = commands.add_parser("methods", help="list the methods with one line each")
    methods_parser.set_defaults(command=_methods)

    compare_parser = commands.add_parser("compare", help="run several methods and tabulate cost, overhead and peak")
    _graph_and_budget(compare_parser)
    compare_parser.add_argument("--methods", help="comma-separated names (default: every method)")
    compare_parser.set_defaults(command=_compare)

    sweep_parser = commands.add_parser("sweep", help="compare the methods over a range of budgets, optionally plotted")
    _graph_and_budget(sweep_parser)
    sweep_parser.add_argument("--methods", help="comma-separated names (default: every method)")
    sweep_parser.add_argument("--points", type=int, default=8, help="budgets from the floor to checkpoint_all's peak")
    sweep_parser.add_argument("--plot", type=Path, help="write overhead against budget to this PNG (needs matplotlib)")
    sweep_parser.set_defaults(command=_sweep)

    capture_parser = commands.add_parser("capture", help="trace a PyTorch model into a graph JSON (needs torch)")
    capture_parser.add_argument(
        "target", metavar="TARGET", help="the model to capture, as `checkmate.capture` reads it"
    )
    capture_parser.add_argument("--out", required=True, help="the graph JSON file to write")
    capture_parser.add_argument("--cost-model", default="profile", choices=("profile", "flops", "unit"))
    capture_parser.add_argument("--max-nodes", type=int, help="merge ops until the graph has at most this many nodes")
    capture_parser.set_defaults(command=_capture)
    return parser


def _graph_and_budget(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("graph", type=Path, metavar="GRAPH.json", help="a graph saved by Graph.to_json or capture")
    parser.add_argument(
        "--budget",
        help="memory budget, fixed memory included: bytes (1000000), a size (512MiB, 8GiB) or a fraction in (0, 1] "
        "of the peak without rematerialization (0.6); default: none",
    )
    parser.add_argument(
        "--time-limit", type=float, help="seconds for each method that runs a solver (optimal, approx); default none"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the method (VALUE read as JSON when it parses, else as text); repeatable",
    )


def _method_options(arguments: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in arguments.option:
        key, separator, text = item.partition("=")
        if not separator or not key:
            raise ValueError(f"--option {item!r} must look like KEY=VALUE")
        try:
            options[key] = json.loads(text)
        except json.JSONDecodeError:
            options[key] = text
    if arguments.time_limit is not None:
        options["time_limit"] = arguments.time_limit
    return options


def _progress(method: str, display: ProgressDisplay) -> dict[str, Any]:
    """{"progress": display} for a method that reports progress (a search: optimal, approx), else {}."""
    return accepted_options(method, {"progress": display})


def _budget(arguments: argparse.Namespace, graph: Graph) -> tuple[int | None, float | None]:
    """--budget in bytes (None without one), and the fraction of the no-remat peak when it was given as one."""
    if arguments.budget is None:
        return None, None
    budget = parse_budget(arguments.budget)
    if isinstance(budget, float):
        return resolve_budget(budget, solve(graph, None, method=REFERENCE).peak_memory), budget
    return budget, None


def _budget_text(budget: int, fraction: float | None) -> str:
    share = "" if fraction is None else f"; {fraction:g} of the {REFERENCE} peak"
    return f"{format_bytes(budget)} ({budget} bytes{share})"


def _load_graph(path: Path) -> Graph:
    graph = Graph.from_json(path.read_text())
    if graph.size == 0:
        raise InvalidGraph(f"{path} holds a graph with no nodes; there is nothing to plan")
    return graph


def _solve(arguments: argparse.Namespace) -> int:
    graph = _load_graph(arguments.graph)
    budget, fraction = _budget(arguments, graph)
    options = _method_options(arguments)
    if "time_limit" not in accepted_options(arguments.method, {"time_limit": None}):
        options.pop("time_limit", None)  # --time-limit applies only to the methods that run a solver
    with ProgressDisplay() as display:
        options.update(_progress(arguments.method, display))
        plan = solve(graph, budget, method=arguments.method, **options)
    display.summarize(plan)
    reference = solve(graph, None, method=REFERENCE)
    print(f"method:   {plan.method} ({plan.status}, {plan.solve_time:.2f} s)")
    overhead = f"{plan.cost / reference.cost:.3f}x" if reference.cost > 0 else "-"
    print(f"cost:     {plan.cost:.6g} (overhead {overhead} against {REFERENCE}, cost {reference.cost:.6g})")
    print(f"peak:     {format_bytes(plan.peak_memory)} ({plan.peak_memory} bytes)")
    if plan.budget is not None:
        print(f"budget:   {_budget_text(plan.budget, fraction)}")
    if plan.lower_bound is not None and plan.gap is not None:
        print(f"bound:    {plan.lower_bound:.6g} (gap {plan.gap:.2%})")
    if arguments.out is not None:
        arguments.out.write_text(plan.to_json())
        print(f"plan written to {arguments.out}")
    if arguments.plot is not None:
        from checkmate.plots import plot_memory

        print(f"plot written to {plot_memory(graph, [plan, reference], arguments.plot, budget=plan.budget)}")
    return 0


def _methods(arguments: argparse.Namespace) -> int:
    width = max(len(strategy.name) for strategy in strategies())
    for strategy in strategies():
        print(f"{strategy.name.ljust(width)}  {strategy.description}")
    return 0


def _compare(arguments: argparse.Namespace) -> int:
    graph = _load_graph(arguments.graph)
    budget, fraction = _budget(arguments, graph)
    methods = None if arguments.methods is None else [name.strip() for name in arguments.methods.split(",")]
    with ProgressDisplay() as display:
        rows = compare(graph, budget, methods, options={**_method_options(arguments), "progress": display})
    print(format_table(rows))
    if budget is not None and fraction is not None:
        print(f"budget: {_budget_text(budget, fraction)}")  # the bytes a fraction came to
    return 0


def _sweep(arguments: argparse.Namespace) -> int:
    from checkmate.sweep import budget_grid, sweep

    graph = _load_graph(arguments.graph)
    if arguments.budget is not None:
        raise ValueError("sweep chooses its own budgets; use --points instead of --budget")
    methods = None if arguments.methods is None else [name.strip() for name in arguments.methods.split(",")]
    budgets = budget_grid(graph, arguments.points)
    with ProgressDisplay() as display:
        points = sweep(graph, budgets, methods, options={**_method_options(arguments), "progress": display})
    names = list(dict.fromkeys(point.row.method for point in points))
    print("budget".ljust(14) + "".join(name.rjust(max(len(name), 9) + 2) for name in names))
    for budget in budgets:
        cells = {point.row.method: point.row for point in points if point.budget == budget}
        text = "".join(
            ("-" if cells[name].overhead is None else f"{cells[name].overhead:.3f}x").rjust(max(len(name), 9) + 2)
            for name in names
        )
        print(format_bytes(budget).ljust(14) + text)
    print("(compute overhead against checkpoint_all; - means the method finds no plan within that budget)")
    if arguments.plot is not None:
        from checkmate.plots import plot_sweep

        print(f"plot written to {plot_sweep(points, arguments.plot, title=arguments.graph.name)}")
    return 0


def _capture(arguments: argparse.Namespace) -> int:
    try:
        from checkmate.capture.cli import run_capture
    except ImportError as error:
        hint = "; install torch: pip install 'checkmate-remat[torch]'" if (error.name or "").startswith("torch") else ""
        raise CheckmateError(f"capture is unavailable ({error}){hint}") from None
    status: int = run_capture(arguments.target, arguments.out, arguments.cost_model, arguments.max_nodes)
    return status
