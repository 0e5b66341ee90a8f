"""Step time of `checkmate.compile` on a DistributedDataParallel module against eager DDP: 2 ranks, gloo, CPU.

    .venv/bin/python benchmarks/data_parallel.py                  # ResNet, budgets 100 % and 60 %
    .venv/bin/python benchmarks/data_parallel.py --quick          # a smaller ResNet, fewer repeats
    .venv/bin/python benchmarks/data_parallel.py --repeats 25 --out   # rows to benchmarks/results/data_parallel.json
    .venv/bin/python benchmarks/data_parallel.py --from-json      # the table again from them

Each rank runs one torch thread on its own batch. Per budget it times, interleaved (the same sequence on every
rank, since each step is a collective): the compiled DDP step, eager DDP (`loss_fn(ddp, *batch).backward()`),
and both again under `no_sync()`, which skips the all-reduce: a step's time minus its `no_sync` time is the
communication the backward did not hide. Times are medians over the repeats, the slower rank's (each rank's
median, then the max). Gradients accumulate across the timed steps on both sides alike. It prints a markdown table
(each row also as rank 0 measures it), and checks once per budget that the compiled step's gradients equal eager
DDP's.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import checkmate
import timing
from checkmate import zoo
from checkmate.byte_sizes import format_bytes
from checkmate.files import write_file
from checkmate.options import CostModel, choices
from rows import Row, Stored, add_row_arguments, measure_or_load

WORLD_SIZE = 2


def _interleaved_medians(functions: list[Callable[[], Any]], repeats: int) -> list[float]:
    """Median seconds of each function, called in turn after two warm-up rounds; the slowest rank's median."""
    medians = timing.interleaved_medians(functions, repeats, warmup_rounds=2, before_each=lambda _: dist.barrier())
    slowest = torch.tensor(medians, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def _check_gradients(step: Any, reference: DistributedDataParallel, batch: tuple[Any, ...]) -> bool:
    step.model.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)
    loss = step(*batch)
    expected = step.loss_fn(reference, *batch)
    expected.backward()
    pairs = zip(step.model.parameters(), reference.parameters(), strict=True)
    same = torch.equal(loss, expected.detach()) and all(torch.equal(got.grad, want.grad) for got, want in pairs)
    flag = torch.tensor([0 if same else 1])
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def _time_steps(step: Any, reference: DistributedDataParallel, batch: tuple[Any, ...], repeats: int) -> list[float]:
    """Medians of the compiled DDP step, eager DDP, and both under no_sync()."""

    def compiled_local() -> None:
        with step.distribution.ddp.no_sync():
            step(*batch)

    def eager_local() -> None:
        with reference.no_sync():
            step.loss_fn(reference, *batch).backward()

    def eager() -> None:
        step.loss_fn(reference, *batch).backward()

    return _interleaved_medians([lambda: step(*batch), eager, compiled_local, eager_local], repeats)


def _row(budget: float, step: Any, times: list[float], exact: bool) -> Row:
    compiled, eager, compiled_local, eager_local = times
    report = step.report()
    return {
        "budget": budget,
        "method": report.method,
        "planned_overhead": report.planned_extra_compute,
        "buckets": len(step.distribution.reduction.buckets),
        "planned_peak": report.planned_peak,
        "measured_peak": report.measured_peak or 0,
        "compiled_ms": compiled * 1e3,
        "eager_ms": eager * 1e3,
        "compiled_no_sync_ms": compiled_local * 1e3,
        "eager_no_sync_ms": eager_local * 1e3,
        "gradients_equal": exact,
    }


def _line(row: Row) -> str:
    compiled, eager = row["compiled_ms"], row["eager_ms"]
    return (
        f"| {row['budget']:.0%} | {row['method']} | {row['planned_overhead']:+.1%} | {row['buckets']} | "
        f"{format_bytes(row['planned_peak'])} | {format_bytes(row['measured_peak'])} | {compiled:.1f} | "
        f"{eager:.1f} | {compiled / eager:.3f} | {compiled - row['compiled_no_sync_ms']:.1f} | "
        f"{eager - row['eager_no_sync_ms']:.1f} | {'yes' if row['gradients_equal'] else 'NO'} |"
    )


def render(stored: Stored) -> str:
    return (
        "| budget | plan | planned overhead | buckets | planned peak | measured peak | compiled ms "
        "| eager DDP ms | ratio | compiled unhidden comm ms | eager unhidden comm ms | grads = eager DDP |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(_line(row) for row in stored.rows)
    )


def _worker(rank: int, directory: str, args: argparse.Namespace) -> None:
    """One rank: every budget compiled, checked and timed; rank 0 writes the rows to `directory`/rows.json."""
    init_file = f"{directory}/rendezvous"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    if args.quick:
        model, loss_fn, (images, labels) = zoo.resnet(args.batch_size, image_size=16, width=8, blocks=(1, 1))
    else:
        model, loss_fn, (images, labels) = zoo.resnet(args.batch_size, image_size=32, width=32, blocks=(1, 1, 1))
    generator = torch.Generator().manual_seed(rank)
    batch = (torch.randn(images.shape, generator=generator), labels)
    reference = DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=args.bucket_cap_mb)
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    rows = []
    for budget in args.budgets:
        method = "checkpoint_all" if budget == 1.0 else "optimal"
        options = {"time_limit": args.time_limit} if method == "optimal" else {}
        step = checkmate.compile(
            ddp, loss_fn, batch, budget=budget, method=method, cost_model=args.cost_model, **options
        )
        exact = _check_gradients(step, reference, batch)
        rows.append(_row(budget, step, _time_steps(step, reference, batch, args.repeats), exact))
        if rank == 0:
            print(_line(rows[-1]), file=sys.stderr, flush=True)
    if rank == 0:
        write_file(Path(directory, "rows.json"), json.dumps(rows))
    dist.destroy_process_group()


def measure(args: argparse.Namespace) -> Iterator[Row]:
    with tempfile.TemporaryDirectory() as directory:
        mp.spawn(_worker, args=(directory, args), nprocs=WORLD_SIZE, join=True)
        yield from json.loads(Path(directory, "rows.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller ResNet and 5 repeats")
    parser.add_argument("--batch-size", type=int, default=16, help="images per rank")
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.6], help="fractions of the no-remat peak")
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's bucket_cap_mb (default 25)")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per optimal solve")
    parser.add_argument("--cost-model", default="flops", choices=choices(CostModel))
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per configuration")
    add_row_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 5
    measure_or_load(args, "data_parallel", lambda: measure(args), render)


if __name__ == "__main__":
    main()
