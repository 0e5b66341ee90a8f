"""Peak memory against chain length: Chen's √n heuristic grows like √n, checkpoint_all like n.

For linear chains of n unit-cost, unit-size layers (2n + 1 nodes) it prints the peak and cost of checkpoint_all and
chen_sqrtn, the √n peak divided by √n and by n, and Griewank's revolve cost at the same budget as chen_sqrtn.

    .venv/bin/python benchmarks/sqrtn_scaling.py [--sizes 4,8,16,32,64,128,256] [--out]
    .venv/bin/python benchmarks/sqrtn_scaling.py --from-json   # the table again from benchmarks/results/
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator

from checkmate import solve
from checkmate.examples import linear_graph
from rows import Row, Stored, add_row_arguments, measure_or_load


def measure(sizes: list[int]) -> Iterator[Row]:
    for n in sizes:
        started = time.perf_counter()
        graph = linear_graph(n)
        everything = solve(graph, None, method="checkpoint_all")
        sqrtn = solve(graph, None, method="chen_sqrtn")
        revolve = solve(graph, sqrtn.peak_memory, method="griewank")
        yield {
            "n": n,
            "nodes": graph.size,
            "all_peak": everything.peak_memory,
            "all_cost": everything.cost,
            "sqrtn_peak": sqrtn.peak_memory,
            "sqrtn_cost": sqrtn.cost,
            "revolve_cost": revolve.cost,
            "seconds": time.perf_counter() - started,
        }


def render(stored: Stored) -> str:
    header = (
        f"{'n':>5} {'T':>5} | {'all peak':>8} {'all cost':>8} | {'√n peak':>7} {'√n cost':>7} "
        f"{'peak/√n':>7} {'peak/n':>6} | {'revolve cost':>12} | {'seconds':>7}"
    )
    lines = [header, "-" * len(header)]
    for row in stored.rows:
        n = row["n"]
        lines.append(
            f"{n:>5} {row['nodes']:>5} | {row['all_peak']:>8} {row['all_cost']:>8.0f} | "
            f"{row['sqrtn_peak']:>7} {row['sqrtn_cost']:>7.0f} {row['sqrtn_peak'] / math.sqrt(n):>7.2f} "
            f"{row['sqrtn_peak'] / n:>6.3f} | {row['revolve_cost']:>12.0f} | {row['seconds']:>7.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,8,16,32,64,128,256", help="comma-separated chain lengths n")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    sizes = [int(size) for size in arguments.sizes.split(",")]
    measure_or_load(arguments, "sqrtn_scaling", lambda: measure(sizes), render)


if __name__ == "__main__":
    main()
