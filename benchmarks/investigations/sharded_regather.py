"""Does holding a unit's gathered parameters from the forward to the backward pay, against gathering them again?
2 ranks, gloo, CPU (issue 21).

    .venv/bin/python benchmarks/investigations/sharded_regather.py --out        # rows to benchmarks/results/
    .venv/bin/python benchmarks/investigations/sharded_regather.py --from-json  # the table again from them

FSDP2 frees a unit's gathered parameters after its forward and gathers them again for its backward
(`reshard_after_forward=True`, the default); holding them instead saves one all-gather per unit and step, and costs
the unit's gathered parameters from its forward to its backward. The same model as `benchmarks/sharded.py` (Hugging
Face's GPT-2, `fully_shard` on each block and on the root) in three layouts: every block freed after its forward
(FSDP2's default), every block but the last (torchtitan's layout) and none. Each layout runs eager FSDP2 and ours
(`checkmate.compile` at budget 1.0, no recomputation: the step follows each unit's `reshard_after_forward`), with
the meter and the interleaved timing of `benchmarks/sharded.py`; in FSDP2's default layout, ours also with its holds
turned off (`checkmate.options.ShardedOptions`), and ours with a budget in bytes of ours' planned peak with no
block freed: the memory that lets the step hold every block, and what that buys. Beside them, the price of the
communication that a hold saves: the median time of an all-gather of one block's parameters on the process group
(`all_gather_into_tensor`, `--gathers` calls), the slower rank's.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import checkmate
from checkmate.options import ShardedOptions
from checkmate.sharded import Sharded
from checkmate.training.compiled import CompiledStep

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from rows import Row, Stored, add_row_arguments, measure_or_load
from sharded import (
    MODEL,
    SIZES,
    WORLD_SIZE,
    Config,
    Setup,
    _max_over_ranks,
    blocks_of,
    check_and_meter,
    gpt2,
    hand_rows,
    interleaved_medians,
    ranks_rows,
)


def layouts(blocks: int) -> dict[str, frozenset[int]]:
    """Per layout, the blocks held from the forward to the backward (`reshard_after_forward=False`)."""
    return {
        "every block freed after its forward (FSDP2's default)": frozenset(),
        "every block but the last (torchtitan)": frozenset({blocks - 1}),
        "no block freed": frozenset(range(blocks)),
    }


def sharded(base: nn.Module, held: frozenset[int]) -> nn.Module:
    """A copy of `base` with each block and the root sharded, the blocks in `held` not freed after their forward."""
    model = copy.deepcopy(base)
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    blocks = blocks_of(model)
    for index in range(len(blocks)):
        fully_shard(blocks[index], mesh=mesh, reshard_after_forward=index not in held)
    fully_shard(model, mesh=mesh)
    return model


def configs(setup: Setup, held: frozenset[int], layout: str) -> list[Config]:
    """Eager FSDP2 and ours in `layout`; in FSDP2's default layout also ours with its holds turned off."""
    base, loss_fn, batch = setup
    eager = sharded(base, held)
    made = [Config("eager FSDP2", layout, eager, lambda: loss_fn(eager, *batch).backward())]
    for tool in ("ours", "ours, holds off") if not held else ("ours",):
        made.append(_ours(tool, setup, held, layout))
    return made


def _ours(tool: str, setup: Setup, held: frozenset[int], layout: str, budget: float = 1.0) -> Config:
    """Ours at `budget` (1.0: the peak without recomputation in FSDP2's layout). "ours, holds off" places its
    schedule with `ShardedOptions.hold_gathered` off."""
    base, loss_fn, batch = setup
    model = sharded(base, held)
    options = ShardedOptions(hold_gathered=tool != "ours, holds off")
    step = checkmate.compile(
        model, loss_fn, batch, budget=budget, method="checkpoint_all", cache=False, measure_memory="never",
        sharded=options,
    )  # fmt: skip
    return Config(tool, layout, model, lambda: step(*batch), step=None if tool == "ours, holds off" else step)


def gather_seconds(base: nn.Module, calls: int) -> tuple[int, float]:
    """Bytes of one block's gathered parameters and the slower rank's median seconds to all-gather them."""
    size = sum(parameter.numel() for parameter in blocks_of(base)[0].parameters())
    shard = -(-size // WORLD_SIZE)
    local, gathered = torch.ones(shard), torch.empty(shard * WORLD_SIZE)
    times = []
    for _ in range(calls + 1):
        dist.barrier()
        started = time.perf_counter()
        dist.all_gather_into_tensor(gathered, local)
        times.append(time.perf_counter() - started)
    return gathered.numel() * gathered.element_size(), _max_over_ranks(statistics.median(times[1:]))


def _worker(rank: int, directory: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format=f"rank {rank} %(message)s")
    logging.getLogger("checkmate").setLevel(logging.WARNING)
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=WORLD_SIZE)
    setup = gpt2(SIZES["full"])
    everyone: list[Config] = []
    for layout, held in layouts(len(blocks_of(setup[0]))).items():
        everyone += configs(setup, held, layout)
    roomy = everyone[-1].step.report().planned_peak  # ours with no block freed
    default = next(iter(layouts(len(blocks_of(setup[0])))))
    everyone.append(_ours(f"ours, budget {roomy / 2**20:.2f} MiB", setup, frozenset(), default, roomy))
    check_and_meter(everyone, setup[2], args.meter_calls)
    seconds = interleaved_medians(everyone, args.repeats)
    gathered_bytes, gather = gather_seconds(setup[0], args.gathers)
    rows: list[Row] = [_row(config, time_) for config, time_ in zip(everyone, seconds, strict=True)]
    rows.append({"model": MODEL, "tool": "all-gather", "bytes": gathered_bytes, "step_ms": gather * 1e3})
    hand_rows(directory, rows if rank == 0 else [])


def _held_names(step: CompiledStep) -> list[str]:
    """The module names of the units `step` holds from their forward to their backward."""
    distribution = step.distribution
    assert isinstance(distribution, Sharded)
    return [distribution.units[unit].name for unit in distribution.held_units(step.compiled)]


def _row(config: Config, seconds: float | None) -> Row:
    return {
        "model": MODEL, "tool": config.tool, "layout": config.name, "peak": config.peak,
        "planned": None if config.step is None else config.step.report().planned_peak,
        "holds": None if config.step is None else _held_names(config.step),
        "step_ms": None if seconds is None else seconds * 1e3, "grad_diff": config.grad_diff,
    }  # fmt: skip


def measure(args: argparse.Namespace) -> Iterator[Row]:
    return ranks_rows(_worker, args)


def render(stored: Stored) -> str:
    steps = [row for row in stored.rows if row["tool"] != "all-gather"]
    default = {row["tool"]: row["step_ms"] for row in steps if "default" in row["layout"]}
    default |= {row["tool"]: default["ours"] for row in steps if row["tool"].startswith("ours")}
    lines = [
        "| step | blocks held from forward to backward | per-rank peak MiB | planned MiB | step ms "
        "| against the default layout | ours also holds | grads = eager FSDP2, default layout |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in steps:
        planned = "—" if row["planned"] is None else f"{row['planned'] / 2**20:.2f}"
        also = "—" if row["holds"] is None else ", ".join(row["holds"]) or "none"
        grads = "bitwise" if row["grad_diff"] == 0 else f"max abs diff {row['grad_diff']:.1e}"
        lines.append(
            f"| {row['tool']} | {row['layout']} | {row['peak'] / 2**20:.2f} | {planned} | {row['step_ms']:.1f} "
            f"| {row['step_ms'] / default[row['tool']]:.3f} | {also} | {grads} |"
        )
    for row in stored.rows:
        if row["tool"] == "all-gather":
            lines.append(
                f"\nOne block's all-gather ({row['bytes'] / 2**20:.2f} MiB gathered): {row['step_ms']:.2f} ms, "
                f"{row['bytes'] / row['step_ms'] / 1e6:.2f} GB/s; a hold saves one per block and step."
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=80, help="timed rounds (median)")
    parser.add_argument("--meter-calls", type=int, default=3, help="metered steps per configuration (max)")
    parser.add_argument("--gathers", type=int, default=50, help="timed all-gathers (median)")
    add_row_arguments(parser)
    args = parser.parse_args()
    measure_or_load(args, "sharded_regather", lambda: measure(args), render)


if __name__ == "__main__":
    main()
