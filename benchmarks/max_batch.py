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
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import Any

from checkmate import InfeasibleBudget, zoo
from checkmate.experiments.batch_search import REFERENCE, MaxBatch, search_max_batch
from checkmate.graph import Graph
from checkmate.torch_capture.fake_factory import fake_graph_at
from checkmate.units import format_bytes, parse_bytes

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
SOLVER_METHODS = ("optimal", "approx")


def search(
    graph_at: Callable[[int], Graph], memory: int, method: str, cap: float | None, start: int, time_limit: float
) -> MaxBatch | str:
    """The method's result, or why not even batch size 1 fits."""
    options: dict[str, Any] = {"time_limit": time_limit} if method in SOLVER_METHODS else {}
    try:
        return search_max_batch(graph_at, memory, method=method, max_overhead=cap, start=start, **options)
    except InfeasibleBudget as error:
        return str(error)


def model_rows(name: str, memory: int, time_limit: float) -> list[tuple[str, ...]]:
    """One row per method for one model."""
    graph_at = fake_graph_at(zoo.FACTORIES[name], cost_model="flops")
    capped: dict[str, MaxBatch | str] = {}
    best = 1
    for method in METHODS:
        result = capped[method] = search(graph_at, memory, method, PAPER_CAP, best, time_limit)
        if isinstance(result, MaxBatch):
            best = max(best, result.batch_size)
    reference = capped[REFERENCE]
    rows = []
    for method in METHODS:
        result = capped[method]
        start = result.batch_size if isinstance(result, MaxBatch) else 1
        uncapped = search(graph_at, memory, method, None, start, time_limit)
        paper = PAPER_RATIOS.get((name, method), 1.0 if method == REFERENCE else None)
        row = [name, method, _size(result), _size(uncapped)]
        if isinstance(result, MaxBatch) and isinstance(reference, MaxBatch):
            row.append(f"{result.batch_size / reference.batch_size:.2f}x")
        else:
            row.append("-")
        row.append("-" if paper is None else f"{paper:.2f}x")
        if isinstance(result, MaxBatch):
            solves = sum(attempt.solved for attempt in result.attempts)
            row += [
                f"{result.overhead:.3f}x",
                f"{result.extra_forward_passes:.2f}",
                str(result.graph_size),
                f"{len(result.attempts)} ({solves})",
                f"{result.seconds:.0f}",
            ]
        else:
            row += ["-", "-", "-", "-", result.split(": ", 2)[-1]]
        rows.append(tuple(row))
        print("| " + " | ".join(row) + " |", flush=True)
    return rows


def _size(result: MaxBatch | str) -> str:
    return str(result.batch_size) if isinstance(result, MaxBatch) else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names from checkmate.zoo")
    parser.add_argument("--memory", default="16e9", help="bytes or a size (default 16e9, the paper's V100)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per optimal solve")
    parser.add_argument("--verbose", action="store_true", help="log every batch size tried")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO if arguments.verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("checkmate").setLevel(logging.WARNING)
    search_level = logging.INFO if arguments.verbose else logging.WARNING
    logging.getLogger("checkmate.experiments.batch_search").setLevel(search_level)
    memory = parse_bytes(arguments.memory)
    started = time.perf_counter()
    print(
        f"memory {format_bytes(memory)} ({memory} bytes), FLOP costs, cap {PAPER_CAP:g} extra forward pass "
        f"(the 'no cap' column: none), optimal {arguments.time_limit:g} s per solve\n"
    )
    header = (
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
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in arguments.models.split(","):
        model_rows(name.strip(), memory, arguments.time_limit)
    print(f"\nrun time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
