"""Peak memory against chain length: Chen's √n heuristic grows like √n, checkpoint_all like n.

For linear chains of n unit-cost, unit-size layers (2n + 1 nodes) it prints the peak and cost of checkpoint_all and
chen_sqrtn, the √n peak divided by √n and by n, and Griewank's revolve cost at the same budget as chen_sqrtn.

    .venv/bin/python benchmarks/sqrtn_scaling.py [--sizes 4,8,16,32,64,128,256]
"""

from __future__ import annotations

import argparse
import math
import time

from checkmate import solve
from checkmate.examples import linear_graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,8,16,32,64,128,256", help="comma-separated chain lengths n")
    sizes = [int(size) for size in parser.parse_args().sizes.split(",")]
    header = (
        f"{'n':>5} {'T':>5} | {'all peak':>8} {'all cost':>8} | {'√n peak':>7} {'√n cost':>7} "
        f"{'peak/√n':>7} {'peak/n':>6} | {'revolve cost':>12} | {'seconds':>7}"
    )
    print(header)
    print("-" * len(header))
    for n in sizes:
        started = time.perf_counter()
        graph = linear_graph(n)
        everything = solve(graph, None, method="checkpoint_all")
        sqrtn = solve(graph, None, method="chen_sqrtn")
        revolve = solve(graph, sqrtn.peak_memory, method="griewank")
        elapsed = time.perf_counter() - started
        print(
            f"{n:>5} {graph.size:>5} | {everything.peak_memory:>8} {everything.cost:>8.0f} | "
            f"{sqrtn.peak_memory:>7} {sqrtn.cost:>7.0f} {sqrtn.peak_memory / math.sqrt(n):>7.2f} "
            f"{sqrtn.peak_memory / n:>6.3f} | {revolve.cost:>12.0f} | {elapsed:>7.2f}"
        )


if __name__ == "__main__":
    main()
