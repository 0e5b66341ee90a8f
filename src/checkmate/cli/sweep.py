"""`checkmate sweep` and `checkmate table2`: budget sweeps of graph files or models, and the tables over their rows.

    checkmate sweep zoo:vgg16 --batch-size 256 --time-limit 60 --plot vgg16.png --out rows.json --table2
    checkmate sweep graph.json other.json.gz --workers 2 --methods chen_greedy,optimal
    checkmate sweep graph.json --ray auto                       # on the Ray cluster this machine belongs to
    checkmate table2 rows.json

A TARGET is a graph file (`.json`, `.json.gz`, as `Graph.to_json` or `checkmate capture` writes it) or a model
`MODULE:FACTORY` (`zoo:NAME` is short for `checkmate.zoo:NAME`), called with `batch_size` (`--batch-size`, default
the factory's own) under a FakeTensorMode and captured with the flops cost model
(`checkmate.torch_capture.fake_factory`;
this needs torch, and a sweep of graph files does not import it). Every solve of every target goes to one runner:
local worker processes (`--workers`, default one per CPU) or Ray (`--ray ADDRESS`).
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkmate.byte_sizes import format_bytes
from checkmate.cli.arguments import with_host_link
from checkmate.errors import CaptureError, InvalidArgument, InvalidGraph
from checkmate.experiments.parallel import LocalRunner, RayRunner, Runner, available_cpus, make_runner
from checkmate.experiments.sweep import (
    SweepRow,
    SweepTask,
    budget_grid,
    rows_from_json,
    rows_to_json,
    run_tasks,
    sweep_tasks,
)
from checkmate.experiments.tables import (
    OPTIMAL,
    approximation_ratios,
    format_solve_times,
    format_sweep,
    format_table2,
    solve_times,
)
from checkmate.files import write_file
from checkmate.graph import Graph

log = logging.getLogger(__name__)

ZOO_PREFIX = "zoo:"
GRAPH_SUFFIXES = (".json.gz", ".json")


def run_sweep(arguments: argparse.Namespace, options: dict[str, Any]) -> int:
    """Sweep every target over `arguments.points` budgets with every method asked, print the tables, and write
    the rows (`--out`) and the plot (`--plot`); returns 0."""
    if arguments.budget is not None:
        raise InvalidArgument("sweep chooses its own budgets; use --points instead of --budget")
    methods = None if arguments.methods is None else [name.strip() for name in arguments.methods.split(",")]
    graphs = {
        name: with_host_link(arguments, graph)
        for name, graph in load_targets(arguments.targets, arguments.batch_size).items()
    }
    runner = make_runner(arguments.workers, arguments.ray)
    tasks = []
    for model, graph in graphs.items():
        budgets = budget_grid(graph, arguments.points)
        tasks += sweep_tasks(model, graph, budgets, methods, options)
        span = f"{format_bytes(budgets[0])} .. {format_bytes(budgets[-1])}"
        print(f"{model}: {graph.size} nodes, {len(budgets)} budgets {span}")
    print(f"{len(tasks)} solves on {_where(runner)}", flush=True)
    started = time.perf_counter()
    rows = _run_with_progress(tasks, runner)
    print(format_sweep(rows))
    print()
    print(format_solve_times(solve_times(rows)))
    if arguments.table2:
        print()
        print(_table2_text(rows))
    print(f"\n{len(tasks)} solves in {time.perf_counter() - started:.1f} s")
    if arguments.out is not None:
        write_file(arguments.out, rows_to_json(rows))
        print(f"rows written to {arguments.out}")
    if arguments.plot is not None:
        from checkmate.experiments.plots import plot_sweep

        print(f"plot written to {plot_sweep(rows, arguments.plot, title=', '.join(graphs))}")
    return 0


def run_table2(arguments: argparse.Namespace) -> int:
    """Print Table 2 and the solve-time table of the rows saved by `checkmate sweep --out`; returns 0."""
    rows = [row for path in arguments.rows for row in rows_from_json(path.read_text())]
    print(_table2_text(rows, arguments.reference))
    print()
    print(format_solve_times(solve_times(rows)))
    return 0


def load_targets(targets: list[str], batch_size: int | None) -> dict[str, Graph]:
    """Each target's graph under its name: a graph file's name without its suffix, a factory's name with the batch
    size (`vgg16_b256`)."""
    graphs: dict[str, Graph] = {}
    for target in targets:
        if target.endswith(GRAPH_SUFFIXES) or Path(target).is_file():
            if batch_size is not None:
                raise InvalidArgument(f"--batch-size applies to models (MODULE:FACTORY); {target} is a graph file")
            name, graph = _graph_name(Path(target)), _read_graph(Path(target))
        elif ":" in target:
            name, graph = capture_target(target, batch_size)
        else:
            raise InvalidArgument(
                f"{target!r} is neither a graph file (.json, .json.gz) nor a model MODULE:FACTORY (zoo:NAME)"
            )
        if name in graphs:
            raise InvalidArgument(f"two targets are named {name!r}; sweep each under its own name")
        graphs[name] = graph
    return graphs


def capture_target(target: str, batch_size: int | None) -> tuple[str, Graph]:
    """Capture the training step of the model `MODULE:FACTORY` (or `zoo:NAME`) at `batch_size` (default: the
    factory's own default), with the flops cost model on fake tensors; returns its name ("vgg16_b256") and graph."""
    spec = "checkmate.zoo:" + target.removeprefix(ZOO_PREFIX) if target.startswith(ZOO_PREFIX) else target
    try:
        from checkmate.cli.capture import load_factory
        from checkmate.torch_capture.fake_factory import fake_graph_at
    except ImportError as error:
        raise CaptureError(f"capturing {target} needs torch ({error}): pip install 'checkmate-remat[torch]'") from None
    factory = load_factory(spec)
    size = batch_size if batch_size is not None else _default_batch_size(spec, factory)
    name = f"{spec.partition(':')[2]}_b{size}"
    started = time.perf_counter()
    graph = fake_graph_at(factory, cost_model="flops")(size)
    log.info("%s: captured %d nodes in %.1f s", name, graph.size, time.perf_counter() - started)
    return name, graph


def _default_batch_size(spec: str, factory: Callable[..., Any]) -> int:
    parameter = inspect.signature(factory).parameters.get("batch_size")
    if parameter is None or not isinstance(parameter.default, int):
        raise CaptureError(f"{spec} has no default batch_size; give one with --batch-size")
    return parameter.default


def _graph_name(path: Path) -> str:
    for suffix in GRAPH_SUFFIXES:
        if path.name.endswith(suffix):
            return path.name.removesuffix(suffix)
    return path.stem


def _read_graph(path: Path) -> Graph:
    text = gzip.decompress(path.read_bytes()).decode() if path.name.endswith(".gz") else path.read_text()
    graph = Graph.from_json(text)
    if graph.size == 0:
        raise InvalidGraph(f"{path} holds a graph with no nodes; there is nothing to plan")
    return graph


def _where(runner: Runner) -> str:
    if isinstance(runner, RayRunner):
        return f"Ray ({runner.address})"
    workers = runner.workers if isinstance(runner, LocalRunner) and runner.workers else available_cpus()
    return "this process" if workers == 1 else f"{workers} worker processes"


def _run_with_progress(tasks: list[SweepTask], runner: Runner) -> list[SweepRow]:
    """Run the tasks with a tqdm bar on stderr: solves done of all, elapsed, and the estimated time left."""
    from tqdm import tqdm

    with tqdm(total=len(tasks), desc="sweep", unit="solve", file=sys.stderr, dynamic_ncols=True) as bar:
        return run_tasks(tasks, runner, lambda row: bar.update())


def _table2_text(rows: list[SweepRow], reference: str = OPTIMAL) -> str:
    if not any(row.method == reference for row in rows):
        return f"(Table 2 compares each method with {reference}; sweep with {reference} among --methods)"
    return format_table2(approximation_ratios(rows, reference), reference)
