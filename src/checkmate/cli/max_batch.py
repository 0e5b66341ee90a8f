"""`checkmate max-batch TARGET --memory 16GiB`: the largest batch size of a model per method (the paper's Figure 6).

    checkmate max-batch zoo:mobilenet --memory 16GiB --methods checkpoint_all,chen_sqrtn,optimal \
        --max-extra-forward-passes 1.0

TARGET is a factory `MODULE:FACTORY` (`zoo:NAME` is short for `checkmate.zoo:NAME`) called with `batch_size`, and
`--factory-option KEY=VALUE` for its other arguments (`width=0.25`). Each method's size is searched on fake tensors
(`checkmate.experiments.batch_search`), then checked by compiling the real step at that size with
`checkmate.compile`'s defaults (profiled costs, kernel scratch), stepping down while it does not fit
(`checkmate.model_max_batch`); `--no-check` skips the check, for memories this machine cannot hold.
Methods run in the order given, each starting its search at the largest batch size found so far. While one searches,
a status line on stderr (a terminal only) shows the size being tried and the solver's phase; each method's row is
printed when it finishes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from checkmate.byte_sizes import format_bytes, parse_bytes
from checkmate.cli.arguments import key_values
from checkmate.cli.progress_display import ProgressDisplay
from checkmate.errors import CheckmateError, InfeasibleBudget
from checkmate.experiments.batch_search import REFERENCE, GraphAt, MaxBatch, search_max_batch
from checkmate.experiments.compare import accepted_options
from checkmate.strategies.registry import get_strategy

ZOO_PREFIX = "zoo:"
DEFAULT_METHODS = ("checkpoint_all", "chen_sqrtn", "chen_greedy", "optimal")
HEADER = (
    "method",
    "max batch",
    f"vs {REFERENCE}",
    "compute ratio",
    "extra fwd",
    "peak",
    "sizes (solves)",
    "time (s)",
)


@dataclass(frozen=True)
class MaxBatchRow:
    """One method's line of the table: its result, or why not even batch size 1 fits."""

    method: str
    result: MaxBatch | None
    error: str | None = None


@dataclass(frozen=True)
class Target:
    """The model searched: its factory, the factory's other arguments, and its graphs on fake tensors by size."""

    factory: Callable[..., Any]
    factory_options: dict[str, Any]
    graph_at: GraphAt


def run_max_batch(arguments: argparse.Namespace, options: dict[str, Any]) -> int:
    """Search each method's largest batch size for the target and print the table; returns 0."""
    try:
        from checkmate.cli.capture import load_factory
        from checkmate.torch_capture.fake_factory import fake_graph_at
    except ImportError as error:
        hint = "; install torch: pip install 'checkmate-remat[torch]'" if (error.name or "").startswith("torch") else ""
        raise CheckmateError(f"max-batch needs capture, which is unavailable ({error}){hint}") from None
    memory = parse_bytes(arguments.memory)
    methods = DEFAULT_METHODS if arguments.methods is None else [name.strip() for name in arguments.methods.split(",")]
    for method in methods:
        get_strategy(method)
    spec = arguments.target
    spec = "checkmate.zoo:" + spec.removeprefix(ZOO_PREFIX) if spec.startswith(ZOO_PREFIX) else spec
    factory = load_factory(spec)
    factory_options = key_values(arguments.factory_option, "--factory-option")
    target = Target(
        factory, factory_options, fake_graph_at(factory, cost_model=arguments.cost_model, **factory_options)
    )
    cap = (
        "no cap on extra compute"
        if arguments.max_extra_forward_passes is None
        else f"at most {arguments.max_extra_forward_passes:g} extra forward passes over no rematerialization"
    )
    checked = (
        "checked by compiling the real step (checkmate.compile's defaults)"
        if arguments.check
        else "on fake tensors only (no kernel scratch; a compiled step may need more)"
    )
    print(f"{spec} within {format_bytes(memory)} ({memory} bytes), {arguments.cost_model} costs, {cap}, {checked}")
    print(format_row(HEADER))
    rows: list[MaxBatchRow] = []
    for method in methods:
        row = _search(target, memory, method, arguments, options, start=_best(rows))
        rows.append(row)
        print(format_row(row_cells(row, rows)), flush=True)
    print(
        "(compute ratio: the plan's cost over the cost without rematerialization at that batch size; extra fwd: that "
        "extra cost in forward passes, what --max-extra-forward-passes caps; "
        f"vs {REFERENCE}: max batch over {REFERENCE}'s)"
    )
    return 0


def _search(
    target: Target, memory: int, method: str, arguments: argparse.Namespace, options: dict[str, Any], *, start: int
) -> MaxBatchRow:
    from checkmate.model_max_batch import check_by_compiling, compile_keywords

    solve_options = accepted_options(method, options)
    with ProgressDisplay() as display:
        try:
            result = search_max_batch(
                target.graph_at,
                memory,
                method=method,
                max_extra_forward_passes=arguments.max_extra_forward_passes,
                start=start,
                tolerance=arguments.tolerance,
                progress=display,
                **solve_options,
            )
            if arguments.check:
                result = check_by_compiling(
                    result,
                    target.factory,
                    factory_options=target.factory_options,
                    keywords=compile_keywords(method, solve_options),
                    tolerance=arguments.tolerance,
                    progress=display,
                )
        except InfeasibleBudget as error:
            return MaxBatchRow(method, None, str(error))
    return MaxBatchRow(method, result)


def _best(rows: Sequence[MaxBatchRow]) -> int:
    return max((row.result.batch_size for row in rows if row.result is not None), default=1)


def row_cells(row: MaxBatchRow, rows: Sequence[MaxBatchRow]) -> tuple[str, ...]:
    """The table's cells for `row`; `rows` holds the reference method's row when it ran."""
    result = row.result
    if result is None:
        return (row.method, "-", f"error: {row.error}")
    reference = next((other.result for other in rows if other.method == REFERENCE and other.result), None)
    ratio = "-" if reference is None else f"{result.batch_size / reference.batch_size:.2f}x"
    solves = sum(attempt.solved for attempt in result.attempts)
    limit = " (the search's limit)" if result.reached_limit else ""
    return (
        row.method,
        f"{result.batch_size}{limit}",
        ratio,
        f"{result.compute_ratio:.3f}x",
        f"{result.extra_forward_passes:.2f}",
        format_bytes(result.plan.peak_memory),
        f"{len(result.attempts)} ({solves})",
        f"{result.seconds:.1f}",
    )


def format_row(cells: Sequence[str]) -> str:
    """Cells in fixed-width columns; the last cell runs on (an error message)."""
    widths = (16, 10, 18, 13, 9, 11, 14)
    return "  ".join(cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=False)) + "  " + cells[-1]
