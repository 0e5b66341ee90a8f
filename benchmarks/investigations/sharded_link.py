"""How long FSDP2's collectives take on the process group, against a latency + bytes model fitted on bare collectives:
the data a plan that prices communication would need. 2 ranks, gloo, CPU.

    .venv/bin/python benchmarks/investigations/sharded_link.py --out        # rows to benchmarks/results/
    .venv/bin/python benchmarks/investigations/sharded_link.py --from-json  # the table again from them

First the link: `all_gather_into_tensor` and `reduce_scatter_single` of flat float32 buffers of `--sizes` bytes per
rank's shard, `--repeats` calls each (the slower rank's median), and a least-squares fit of seconds = latency +
bytes / bandwidth per collective. Then the step: the model of `benchmarks/sharded.py` (Hugging Face's GPT-2,
`fully_shard` on each block and on the root), ours at budget 1.0 without prefetching (each GATHER and REDUCE then
runs its collective where it stands), each unit call timed over `--steps` steps (per rank the median; of the ranks
the smaller, since the rank that reaches a collective last waits least for the other), beside what the fit predicts
for its unit's shard bytes, and beside what the plan priced it at (`planned`: a unit's all-gather as
`checkmate.sharded.link.gather_seconds` measured it at compile time, the plan's fetch cost; its reduce-scatter as
`checkmate.sharded.link.reduce_seconds` did, the plan's release cost), and the step's gathers and reduce-scatters
together. A unit call does more than its collective (FSDP2 copies the shards in and out, a REDUCE divides and
accumulates), which the difference shows.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import checkmate
from checkmate.fetched import fetches
from checkmate.options import ShardedOptions
from checkmate.sharded import Sharded
from checkmate.sharded.timeline import GATHER, REDUCE, UnitCall

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load
from sharded import SIZES, WORLD_SIZE, _max_over_ranks, gpt2, hand_rows, ranks_rows, sharded

COLLECTIVES = ("all-gather", "reduce-scatter")


def _collective(name: str, shard_bytes: int) -> Callable[[], None]:
    shard = torch.ones(shard_bytes // 4)
    full = torch.ones(shard.numel() * WORLD_SIZE)
    if name == "all-gather":
        return lambda: dist.all_gather_into_tensor(full, shard)
    return lambda: dist.reduce_scatter_single(shard, full)


def _median_seconds(call: Callable[[], None], repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return _max_over_ranks(statistics.median(times))


def _min_over_ranks(value: float) -> float:
    """The smallest of every rank's `value`: in a step, the rank that reaches a collective last waits least for the
    other, so its time is the collective's own."""
    reduced = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(reduced, op=dist.ReduceOp.MIN)
    return float(reduced.item())


def _timed(calls: list[tuple[UnitCall, float]]) -> Any:
    """Sharded._act timing each call it makes into `calls`."""
    act = Sharded._act

    def timed(self: Sharded, call: UnitCall) -> None:
        started = time.perf_counter()
        act(self, call)
        calls.append((call, time.perf_counter() - started))

    return timed


def _worker(rank: int, directory: str, arguments: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=WORLD_SIZE)
    rows: list[Row] = []
    fits = {}
    for name in COLLECTIVES:
        medians = [_median_seconds(_collective(name, size), arguments.repeats) for size in arguments.sizes]
        per_byte, latency = np.polyfit(np.array(arguments.sizes, dtype=float), np.array(medians), 1)
        fits[name] = (float(latency), float(per_byte))
        rows += [
            {"kind": "bare", "collective": name, "shard_bytes": size, "measured": each,
             "predicted": latency + per_byte * size, "planned": None}
            for size, each in zip(arguments.sizes, medians, strict=True)
        ]  # fmt: skip
    base, loss_fn, batch = gpt2(SIZES["full"])
    calls: list[tuple[UnitCall, float]] = []
    Sharded._act = _timed(calls)  # before compile: the step binds it
    model = sharded(base)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cache=False, measure_memory="never",
        sharded=ShardedOptions(prefetch_gathers=False),
    )  # fmt: skip
    assert isinstance(step.distribution, Sharded)
    units = step.distribution.units
    step(*batch)
    durations: dict[tuple[str, int], list[float]] = defaultdict(list)
    step_gathers, step_reduces = [], []
    for _ in range(arguments.steps):
        model.zero_grad(set_to_none=True)
        calls.clear()
        dist.barrier()
        step(*batch)
        for call, duration in calls:
            if call.action in (GATHER, REDUCE):
                durations[(call.action.value, call.unit)].append(duration)
        step_gathers.append(sum(duration for call, duration in calls if call.action == GATHER))
        step_reduces.append(sum(duration for call, duration in calls if call.action == REDUCE))
    fetched = step.graph.fetched  # priced in seconds: the profile cost model
    for (action, unit), timings in sorted(durations.items()):
        name = "all-gather" if action == GATHER.value else "reduce-scatter"
        shard_bytes = units[unit].shard_bytes if action == GATHER.value else units[unit].gradient_shard_bytes
        latency, per_byte = fits[name]
        rows.append({
            "kind": f"{action} unit {unit} ({units[unit].name or 'root'})", "collective": name,
            "shard_bytes": shard_bytes, "measured": _min_over_ranks(statistics.median(timings)),
            "predicted": latency + per_byte * shard_bytes,
            "planned": fetched[unit].fetch_cost if action == GATHER.value else fetched[unit].release_cost,
        })  # fmt: skip
    gathers = fetches(step.compiled.schedule.presence)
    rows.append({
        "kind": f"the step's {int(gathers.sum())} gathers", "collective": "all-gather",
        "shard_bytes": sum(int(count) * unit.shard_bytes for count, unit in zip(gathers, units, strict=True)),
        "measured": _min_over_ranks(statistics.median(step_gathers)), "predicted": None,
        "planned": float(gathers @ np.array([value.fetch_cost for value in fetched])),
    })  # fmt: skip
    rows.append({
        "kind": f"the step's {len(fetched)} reduce-scatters", "collective": "reduce-scatter",
        "shard_bytes": sum(unit.gradient_shard_bytes for unit in units),
        "measured": _min_over_ranks(statistics.median(step_reduces)), "predicted": None,
        "planned": sum(value.release_cost for value in fetched),
    })  # fmt: skip
    hand_rows(directory, rows if rank == 0 else [])


def measure(arguments: argparse.Namespace) -> Iterator[Row]:
    return ranks_rows(_worker, arguments)


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3f}"


def _ratio(measured: float, other: float | None) -> str:
    return "—" if other is None else f"{measured / other:.2f}"


def render(stored: Stored) -> str:
    header = [
        "what", "collective", "shard KiB", "measured ms", "fit ms", "measured / fit", "planned ms",
        "measured / planned",
    ]  # fmt: skip
    lines = [
        [row["kind"], row["collective"], f"{row['shard_bytes'] / 1024:.0f}", _ms(row["measured"]),
         _ms(row["predicted"]), _ratio(row["measured"], row["predicted"]), _ms(row.get("planned")),
         _ratio(row["measured"], row.get("planned"))]
        for row in stored.rows
    ]  # fmt: skip
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[2**14, 2**16, 2**18, 2**19, 2**20], help="shard bytes per rank"
    )
    parser.add_argument("--repeats", type=int, default=30, help="calls per bare collective and size (median)")
    parser.add_argument("--steps", type=int, default=15, help="timed steps (median per unit call)")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "sharded_link", lambda: measure(arguments), render)


if __name__ == "__main__":
    main()
