"""The `checkmate` command: solve a graph, list the methods, compare them, capture a model.

    checkmate solve GRAPH.json --budget 512MiB --method chen_greedy [--out plan.json]
    checkmate methods
    checkmate compare GRAPH.json --budget 0.6 [--methods chen_sqrtn,griewank]
    checkmate sweep TARGET... [--points 8] [--methods ...] [--workers N | --ray ADDRESS] [--plot sweep.png]
        [--out rows.json] [--table2]           (TARGET: a graph file, or a model MODULE:FACTORY such as zoo:vgg16)
    checkmate table2 ROWS.json...
    checkmate capture TARGET --out GRAPH.json [--cost-model profile|flops|unit] [--max-nodes N]
                      [--gradient-memory whole_step|when_made]
    checkmate max-batch TARGET --memory 16GiB [--methods checkpoint_all,chen_sqrtn,optimal]
        [--max-extra-forward-passes 1.0] [--no-check] [--time-limit S] [--factory-option KEY=VALUE]
                                                       (TARGET: a model MODULE:FACTORY such as zoo:mobilenet)

A budget (`--budget`) is read as `checkmate.compile` reads it (`byte_sizes.parse_budget`): bytes (1000000), a size
(8GiB, 512MiB), or a fraction in (0, 1] of the peak without rematerialization (0.6: 0.6 times checkpoint_all's peak).

Errors the user can fix (a bad graph, an unknown method, a budget no plan meets) print one line to stderr and
exit with status 2.

While a searching method (optimal, approx) runs for more than two seconds, a status line on stderr (a terminal only)
shows the elapsed time, the phase, the best cost, the bound and the gap; Ctrl-C stops the search and the command
goes on with the best plan found so far (a second Ctrl-C aborts).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checkmate.byte_sizes import format_bytes, parse_budget, resolve_budget
from checkmate.cli.arguments import host_link_options, key_values, with_host_link
from checkmate.cli.progress_display import ProgressDisplay
from checkmate.errors import CheckmateError, ExecutionError, InvalidGraph, InvalidSchedule
from checkmate.experiments.compare import REFERENCE, accepted_options, compare, format_table
from checkmate.files import write_file
from checkmate.graph import Graph
from checkmate.options import CostModel, FakeCostModel, GradientMemory, choices
from checkmate.solve import solve
from checkmate.strategies.registry import strategies

USAGE_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 on success, 2 on an error the user can fix)."""
    arguments = _parser().parse_args(argv)
    try:
        status: int = arguments.command(arguments)
    except (InvalidSchedule, ExecutionError):
        raise  # a broken plan or run is a bug, not a usage error: its traceback is the report
    except (CheckmateError, OSError) as error:
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

    compare_parser = commands.add_parser(
        "compare", help="run several methods and tabulate cost, compute ratio and peak"
    )
    _graph_and_budget(compare_parser)
    compare_parser.add_argument("--methods", help="comma-separated names (default: every method)")
    compare_parser.set_defaults(command=_compare)

    sweep_parser = commands.add_parser(
        "sweep", help="every method over a range of budgets, in parallel: tables, plot, rows as JSON"
    )
    sweep_parser.add_argument(
        "targets",
        nargs="+",
        metavar="TARGET",
        help="a graph file (.json, .json.gz), or a model MODULE:FACTORY (zoo:NAME for checkmate.zoo:NAME) captured "
        "with the flops cost model (needs torch)",
    )
    sweep_parser.add_argument("--budget", help=argparse.SUPPRESS)  # refused with advice: a sweep picks its budgets
    _solver_options(sweep_parser)
    host_link_options(sweep_parser)
    sweep_parser.add_argument("--methods", help="comma-separated names (default: every method)")
    sweep_parser.add_argument(
        "--points", type=int, default=8, help="budgets from the smallest feasible to checkpoint_all's peak"
    )
    sweep_parser.add_argument("--batch-size", type=int, help="the factory's batch_size (models only)")
    sweep_parser.add_argument("--workers", type=int, help="local worker processes (default: one per CPU)")
    sweep_parser.add_argument(
        "--ray", metavar="ADDRESS", help="run on Ray: 'auto', HOST:PORT, ray://HOST:PORT, or 'local' (needs ray)"
    )
    sweep_parser.add_argument("--out", type=Path, help="write the rows to this JSON file (`checkmate table2` reads it)")
    sweep_parser.add_argument(
        "--plot", type=Path, help="write compute ratio against budget to this PNG (needs matplotlib)"
    )
    sweep_parser.add_argument("--table2", action="store_true", help="also print the paper's Table 2 (against optimal)")
    sweep_parser.set_defaults(command=_sweep)

    table2_parser = commands.add_parser("table2", help="the paper's Table 2 and solve times from saved sweep rows")
    table2_parser.add_argument("rows", nargs="+", type=Path, metavar="ROWS.json", help="written by sweep --out")
    table2_parser.add_argument("--reference", default="optimal", help="the method others are divided by")
    table2_parser.set_defaults(command=_table2)

    capture_parser = commands.add_parser("capture", help="trace a PyTorch model into a graph JSON (needs torch)")
    capture_parser.add_argument(
        "target", metavar="TARGET", help="the model to capture, as `checkmate.capture` reads it"
    )
    capture_parser.add_argument("--out", required=True, help="the graph JSON file to write")
    capture_parser.add_argument("--cost-model", default="profile", choices=choices(CostModel))
    capture_parser.add_argument("--max-nodes", type=int, help="merge ops until the graph has at most this many nodes")
    capture_parser.add_argument(
        "--gradient-memory",
        default="whole_step",
        choices=choices(GradientMemory),
        help="count parameter gradients for the whole step (fixed memory) or from the node that makes each",
    )
    capture_parser.set_defaults(command=_capture)

    max_batch_parser = commands.add_parser(
        "max-batch", help="the largest batch size each method plans within a memory (needs torch)"
    )
    max_batch_parser.add_argument(
        "target", metavar="TARGET", help="a model MODULE:FACTORY taking batch_size (zoo:NAME for checkmate.zoo:NAME)"
    )
    max_batch_parser.add_argument("--memory", required=True, help="bytes or a size (16GiB), fixed memory included")
    max_batch_parser.add_argument(
        "--methods", help="comma-separated names (default: checkpoint_all,chen_sqrtn,chen_greedy,optimal)"
    )
    max_batch_parser.add_argument(
        "--max-extra-forward-passes",
        type=float,
        help="at most this many extra forward passes of compute over no rematerialization at the same batch size "
        "(1.0: the paper's cap for its Figure 6); default no cap",
    )
    max_batch_parser.add_argument(
        "--cost-model",
        default="flops",
        choices=choices(FakeCostModel),
        help="how the search prices ops on fake tensors",
    )
    max_batch_parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip compiling the real step at each answer (checkmate.compile's defaults: profiled costs and kernel "
        "scratch); the sizes then hold only for planning on fake tensors. For memories this machine cannot hold",
    )
    max_batch_parser.add_argument(
        "--tolerance", type=float, default=0.0, help="stop within this fraction of the batch size (default exact)"
    )
    max_batch_parser.add_argument(
        "--factory-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another argument of the factory (VALUE read as JSON when it parses, else as text); repeatable",
    )
    _solver_options(max_batch_parser)
    max_batch_parser.set_defaults(command=_max_batch)
    return parser


def _graph_and_budget(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("graph", type=Path, metavar="GRAPH.json", help="a graph saved by Graph.to_json or capture")
    parser.add_argument(
        "--budget",
        help="memory budget, fixed memory included: bytes (1000000), a size (512MiB, 8GiB) or a fraction in (0, 1] "
        "of the peak without rematerialization (0.6); default: none",
    )
    _solver_options(parser)
    host_link_options(parser)


def _solver_options(parser: argparse.ArgumentParser) -> None:
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
    options = key_values(arguments.option, "--option")
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
    graph = with_host_link(arguments, _load_graph(arguments.graph))
    budget, fraction = _budget(arguments, graph)
    options = _method_options(arguments)
    if "time_limit" not in accepted_options(arguments.method, {"time_limit": None}):
        options.pop("time_limit", None)  # --time-limit applies only to the methods that run a solver
    with ProgressDisplay() as display:
        options.update(_progress(arguments.method, display))
        plan = solve(graph, budget, method=arguments.method, **options)
    display.summarize(plan)
    reference = solve(graph, None, method=REFERENCE)
    print(f"method:   {plan.method} ({plan.describe()}, {plan.solve_time:.2f} s)")
    ratio = f"{plan.cost / reference.cost:.3f}x" if reference.cost > 0 else "-"
    print(f"cost:     {plan.cost:.6g} ({ratio} the cost of {REFERENCE}, {reference.cost:.6g})")
    print(f"peak:     {format_bytes(plan.peak_memory)} ({plan.peak_memory} bytes)")
    if plan.moves.any:
        print(
            f"moves:    {int(plan.moves.copy_out.sum())} outputs to host memory, {int(plan.moves.copy_in.sum())} "
            f"copies back; host peak {format_bytes(plan.host_peak)} ({plan.host_peak} bytes)"
        )
    if plan.budget is not None:
        print(f"budget:   {_budget_text(plan.budget, fraction)}")
    if plan.lower_bound is not None and plan.gap is not None:
        print(f"bound:    {plan.lower_bound:.6g} (gap {plan.gap:.2%})")
    if arguments.out is not None:
        write_file(arguments.out, plan.to_json())
        print(f"plan written to {arguments.out}")
    if arguments.plot is not None:
        from checkmate.experiments.plots import plot_memory

        print(f"plot written to {plot_memory(graph, [plan, reference], arguments.plot, budget=plan.budget)}")
    return 0


def _methods(arguments: argparse.Namespace) -> int:
    width = max(len(strategy.name) for strategy in strategies())
    for strategy in strategies():
        print(f"{strategy.name.ljust(width)}  {strategy.description}")
    return 0


def _compare(arguments: argparse.Namespace) -> int:
    graph = with_host_link(arguments, _load_graph(arguments.graph))
    budget, fraction = _budget(arguments, graph)
    methods = None if arguments.methods is None else [name.strip() for name in arguments.methods.split(",")]
    with ProgressDisplay() as display:
        rows = compare(graph, budget, methods, options={**_method_options(arguments), "progress": display})
    print(format_table(rows))
    if budget is not None and fraction is not None:
        print(f"budget: {_budget_text(budget, fraction)}")  # the bytes a fraction came to
    return 0


def _sweep(arguments: argparse.Namespace) -> int:
    from checkmate.cli.sweep import run_sweep

    return run_sweep(arguments, _method_options(arguments))


def _table2(arguments: argparse.Namespace) -> int:
    from checkmate.cli.sweep import run_table2

    return run_table2(arguments)


def _capture(arguments: argparse.Namespace) -> int:
    try:
        from checkmate.cli.capture import run_capture
    except ImportError as error:
        hint = "; install torch: pip install 'checkmate-remat[torch]'" if (error.name or "").startswith("torch") else ""
        raise CheckmateError(f"capture is unavailable ({error}){hint}") from None
    status: int = run_capture(
        arguments.target, arguments.out, arguments.cost_model, arguments.max_nodes, arguments.gradient_memory
    )
    return status


def _max_batch(arguments: argparse.Namespace) -> int:
    from checkmate.cli.max_batch import run_max_batch

    return run_max_batch(arguments, _method_options(arguments))
