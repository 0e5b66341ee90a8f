"""Why the CPU allocator meter counts every thread's frees: one compiled sharded step metered call by call, with
and without. 2 ranks, gloo, CPU.

    .venv/bin/python benchmarks/investigations/meter_threads.py --out        # rows to benchmarks/results/
    .venv/bin/python benchmarks/investigations/meter_threads.py --from-json  # the table again from them

The pre-norm model of `benchmarks/sharded.py`, ours compiled at `--budget` MiB per rank as that benchmark compiles it,
then metered `--calls` times as it meters a step (the per-rank peak over ranks, `per_rank_peak` with one call each):
first with the meter as it is (`checkmate.torch_capture.allocator.memory_profile`, which sets c10's
`caffe2_report_cpu_memory_usage` for its session), then with that flag left off, where a free counts only on the
profiled thread and a buffer a gloo worker thread lets go of stays in the total. Planned is `step.report()`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

import checkmate.torch_capture.allocator as allocator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load
from sharded import MODELS, WORLD_SIZE, compile_ours, hand_rows, per_rank_peak, ranks_rows

MiB = 2**20
METERS = ("every thread's frees", "the profiled thread's frees only")


def _worker(rank: int, directory: str, arguments: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=WORLD_SIZE)
    _, setup, sizes = MODELS["prenorm"]
    base, loss_fn, batch = setup(sizes["full"])
    options = argparse.Namespace(time_limit=arguments.time_limit, cost_model="profile")
    config = compile_ours((base, loss_fn, batch), int(arguments.budget * MiB), options)
    assert config.step is not None, config.note
    planned = config.step.report().planned_peak
    rows: list[Row] = []
    for meter in METERS:
        counting = contextlib.nullcontext if meter == METERS[1] else allocator._every_thread_counted
        with _meter_counting(counting):
            peaks = [per_rank_peak(config, batch, 1) for _ in range(arguments.calls)]
        rows.append({"meter": meter, "budget": arguments.budget * MiB, "planned": planned, "peaks": peaks})
    hand_rows(directory, rows if rank == 0 else [])


@contextlib.contextmanager
def _meter_counting(counting: object) -> Iterator[None]:
    """The meter's sessions with `counting` as their way of counting other threads' frees."""
    kept = allocator._every_thread_counted
    allocator._every_thread_counted = counting  # type: ignore[assignment]
    try:
        yield
    finally:
        allocator._every_thread_counted = kept


def measure(arguments: argparse.Namespace) -> Iterator[Row]:
    return ranks_rows(_worker, arguments)


def render(stored: Stored) -> str:
    header = ["meter", "budget MiB", "planned MiB", "calls", "measured MiB: least", "most", "calls over the plan"]
    lines = [
        [
            row["meter"],
            f"{row['budget'] / MiB:.2f}",
            f"{row['planned'] / MiB:.2f}",
            str(len(row["peaks"])),
            f"{min(row['peaks']) / MiB:.2f}",
            f"{max(row['peaks']) / MiB:.2f}",
            str(sum(peak > row["planned"] for peak in row["peaks"])),
        ]
        for row in stored.rows
    ]
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=14.82, help="ours' per-rank budget, MiB")
    parser.add_argument("--calls", type=int, default=12, help="steps metered with each meter")
    parser.add_argument("--time-limit", type=float, default=60.0, help="the optimal search's time limit, s")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "meter_threads", lambda: measure(arguments), render)


if __name__ == "__main__":
    main()
