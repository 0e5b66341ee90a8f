"""The paper's Figure 6: the largest batch size each method trains within 16 GB, as a ratio over checkpoint_all.

For MobileNet (v1, 224x224), U-Net (416x608) and VGG19 (224x224) from `checkmate.zoo`, captured on fake tensors
with the FLOP cost model at each batch size tried (as the paper: "Costs are measured in FLOPs, determined
statically"), it runs `checkmate.experiments.batch_search.search_max_batch` for checkpoint_all, chen_sqrtn,
chen_greedy and
optimal within `--memory` bytes (default 16e9, the paper's V100 figure `platform_memory("p32xlarge")`), first with
the paper's cap of one extra forward pass over the step without rematerialization (its eq. 10, applied to every
method as the paper filtered its baselines), then without a cap. `optimal` gets `--time-limit` seconds per solve.
Each method starts its search at the largest size found so far for the model.

It prints, per model and method, the largest batch size with and without the cap, the ratio over checkpoint_all's
(with the cap) beside the paper's, the overhead of the plan at that size (cost over no rematerialization, and in
extra forward passes), the sizes tried (and how many needed a solve) and the seconds.

The paper's ratios, from its text: MobileNet 5.1x (Checkmate 1105 against about 217 for checkpoint all), U-Net
3.8x (61 against 16), VGG19 1.73x (289 against 167; Chen et al.'s heuristic 197: 1.18x; Figure 7). For VGG19 the
artifact README gives greedy 266 (1.59x). The paper's Checkmate numbers are lower bounds from a one-day MILP with
the batch size as a variable; its checkpoint-all numbers for MobileNet and U-Net assume linear memory scaling.

    .venv/bin/python benchmarks/max_batch.py
    .venv/bin/python benchmarks/max_batch.py --models vgg19 --time-limit 30 --memory 16GiB
    .venv/bin/python benchmarks/max_batch.py --time-limit 45 --out   # rows to benchmarks/results/max_batch.json
    .venv/bin/python benchmarks/max_batch.py --from-json             # the table again from them
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from checkmate import InfeasibleBudget, zoo
from checkmate.byte_sizes import format_bytes, parse_bytes
from checkmate.experiments.batch_search import REFERENCE, MaxBatch, search_max_batch
from checkmate.graph import Graph
from checkmate.search_defaults import TIMED_METHODS
from checkmate.torch_capture.fake_factory import fake_graph_at
from rows import Row, Stored, add_row_arguments, measure_or_load

METHODS = ("checkpoint_all", "chen_sqrtn", "chen_greedy", "optimal")
MODELS = ("mobilenet", "unet", "vgg19")
PAPER_CAP = 1.0  # extra forward passes
PAPER_RATIOS: dict[tuple[str, str], float] = {
    ("mobilenet", "optimal"): 5.1,
    ("unet", "optimal"): 3.8,
    ("vgg19", "chen_sqrtn"): 197 / 167,
    ("vgg19", "chen_greedy"): 266 / 167,
    ("vgg19", "optimal"): 289 / 167,
}


def search(
    graph_at: Callable[[int], Graph], memory: int, method: str, cap: float | None, start: int, time_limit: float
) -> MaxBatch | str:
    """The method's result, or why not even batch size 1 fits."""
    options: dict[str, Any] = {"time_limit": time_limit} if method in TIMED_METHODS else {}
    try:
        return search_max_batch(graph_at, memory, method=method, max_extra_forward_passes=cap, start=start, **options)
    except InfeasibleBudget as error:
        return str(error)


def model_rows(name: str, memory: int, time_limit: float) -> Iterator[Row]:
    """One row per method for one model: its largest batch with the paper's cap and without, or why none fits."""
    graph_at = fake_graph_at(zoo.FACTORIES[name], cost_model="flops")
    capped: dict[str, MaxBatch | str] = {}
    best = 1
    for method in METHODS:
        result = capped[method] = search(graph_at, memory, method, PAPER_CAP, best, time_limit)
        if isinstance(result, MaxBatch):
            best = max(best, result.batch_size)
    for method in METHODS:
        result = capped[method]
        start = result.batch_size if isinstance(result, MaxBatch) else 1
        uncapped = search(graph_at, memory, method, None, start, time_limit)
        row: Row = {"model": name, "method": method, "uncapped": _size(uncapped)}
        if isinstance(result, MaxBatch):
            row |= {
                "capped": result.batch_size,
                "overhead": result.compute_ratio,
                "extra_forward_passes": result.extra_forward_passes,
                "nodes": result.graph_size,
                "sizes": len(result.attempts),
                "solves": sum(attempt.solved for attempt in result.attempts),
                "seconds": result.seconds,
            }
        else:
            row |= {"capped": None, "why": result.split(": ", 2)[-1]}
        print(f"{name} {method}: {row}", file=sys.stderr, flush=True)
        yield row


def _size(result: MaxBatch | str) -> int | None:
    return result.batch_size if isinstance(result, MaxBatch) else None


def measure(models: list[str], memory: int, time_limit: float) -> Iterator[Row]:
    started = time.perf_counter()
    yield {"kind": "settings", "memory": memory, "time_limit": time_limit, "cap": PAPER_CAP}
    for name in models:
        yield from model_rows(name, memory, time_limit)
    yield {"kind": "total", "seconds": time.perf_counter() - started}


HEADER = (
    "model",
    "method",
    "max batch (cap)",
    "max batch (no cap)",
    f"vs {REFERENCE}",
    "paper",
    "overhead",
    "extra fwd",
    "nodes",
    "sizes (solves)",
    "seconds",
)


def cells(row: Row, reference: int | None) -> list[str]:
    """The table's cells for one method on one model; `reference` is checkpoint_all's capped batch size."""
    name, method, capped = row["model"], row["method"], row["capped"]
    paper = PAPER_RATIOS.get((name, method), 1.0 if method == REFERENCE else None)
    ratio = "-" if capped is None or reference is None else f"{capped / reference:.2f}x"
    line = [name, method, _text(capped), _text(row["uncapped"]), ratio, "-" if paper is None else f"{paper:.2f}x"]
    if capped is None:
        return [*line, "-", "-", "-", "-", row["why"]]
    return [
        *line,
        f"{row['overhead']:.3f}x",
        f"{row['extra_forward_passes']:.2f}",
        str(row["nodes"]),
        f"{row['sizes']} ({row['solves']})",
        f"{row['seconds']:.0f}",
    ]


def _text(size: int | None) -> str:
    return "-" if size is None else str(size)


def render(stored: Stored) -> str:
    settings = next(row for row in stored.rows if row.get("kind") == "settings")
    memory = settings["memory"]
    lines = [
        f"memory {format_bytes(memory)} ({memory} bytes), FLOP costs, cap {settings['cap']:g} extra forward pass "
        f"(the 'no cap' column: none), optimal {settings['time_limit']:g} s per solve\n",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    methods = [row for row in stored.rows if "method" in row]
    references = {row["model"]: row["capped"] for row in methods if row["method"] == REFERENCE}
    lines += ["| " + " | ".join(cells(row, references.get(row["model"]))) + " |" for row in methods]
    lines += [f"\nrun time {row['seconds']:.0f} s" for row in stored.rows if row.get("kind") == "total"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names from checkmate.zoo")
    parser.add_argument("--memory", default="16e9", help="bytes or a size (default 16e9, the paper's V100)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per optimal solve")
    parser.add_argument("--verbose", action="store_true", help="log every batch size tried")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO if arguments.verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("checkmate").setLevel(logging.WARNING)
    search_level = logging.INFO if arguments.verbose else logging.WARNING
    logging.getLogger("checkmate.experiments.batch_search").setLevel(search_level)
    models = [name.strip() for name in arguments.models.split(",")]
    memory = parse_bytes(arguments.memory)
    measure_or_load(arguments, "max_batch", lambda: measure(models, memory, arguments.time_limit), render)


if __name__ == "__main__":
    main()
