"""What each FSDP2 unit call of ours' sharded step allocates that outlives it, and for how long: the evidence behind
the gloo terms of `checkmate.sharded.memory`. 2 ranks, gloo, CPU.

    .venv/bin/python benchmarks/investigations/gloo_copies.py --out        # rows to benchmarks/results/
    .venv/bin/python benchmarks/investigations/gloo_copies.py --from-json  # the table again from them

The model of `benchmarks/sharded.py` (Hugging Face's GPT-2, `fully_shard` on each block and on the root), ours at
budget 1.0 (`checkpoint_all`, each all-gather but the first prefetched). Each unit call is bracketed by two small
allocations of sizes that name it, and `--steps` steps run under the allocator's profiler; every allocation of at least
64 KiB made inside a call, or on another thread than the step's, is followed to its free, counted in unit calls
begun after the one that made it (0: freed inside it). Per kind of call, thread and size: how many such
allocations, how many outlived their call, and the most calls later one was freed. The gathered parameters, a
prefetch's flat buffer and FSDP2's kept reduce-scatter input outlive their calls by design; gloo's own copies (the
full buffer of an all-gather, made on a worker thread; a reduce-scatter's on the calling thread) are the question.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import checkmate
from checkmate.sharded import Sharded
from checkmate.sharded.timeline import UnitCall
from checkmate.torch_capture.allocator import event_tree, memory_profile, walk

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load
from sharded import SIZES, WORLD_SIZE, gpt2, hand_rows, ranks_rows, sharded

MARKER = 1_000_003 * 8  # marker k (start) and k + 1 (end) of call n: MARKER + 16 n and MARKER + 16 n + 8 bytes
SMALLEST = 64 * 1024


def _marked(calls: list[UnitCall]) -> Any:
    """Sharded._act with a marker allocation before and after each call, recording the calls in order."""
    act = Sharded._act

    def marked(self: Sharded, call: UnitCall) -> None:
        number = len(calls)
        calls.append(call)
        torch.empty(MARKER + 16 * number, dtype=torch.uint8)
        act(self, call)
        torch.empty(MARKER + 16 * number + 8, dtype=torch.uint8)

    return marked


def _lifetimes(profiler: Any, calls: list[UnitCall]) -> Iterator[tuple[str, str, float, int]]:
    """(call action, thread, MiB, unit calls begun before its free) of each followed allocation of one step."""
    events = sorted(
        (event.start_time_ns, event.extra_fields.alloc_size, event.extra_fields.ptr, event.start_tid)
        for event in walk(event_tree(profiler))
        if isinstance(event.extra_fields, torch._C._profiler._ExtraFields_Allocation)
        and event.extra_fields.device.type == "cpu"
    )
    begun, inside, main_thread = -1, None, None
    live: dict[int, tuple[int, str, float, int]] = {}
    for _, size, pointer, thread in events:
        if MARKER <= size < MARKER + 16 * len(calls):
            number, end = divmod(size - MARKER, 16)
            begun, inside, main_thread = max(begun, number), (None if end else number), thread
            continue
        if size > 0 and size >= SMALLEST and (inside is not None or thread != main_thread):
            made_in = inside if inside is not None else begun
            where = "step" if thread == main_thread else "worker"
            live[pointer] = (made_in, where, size / 2**20, begun)
        elif size < 0 and pointer in live:
            made_in, where, mib, _ = live.pop(pointer)
            yield calls[made_in].action.value if made_in >= 0 else "start", where, mib, begun - made_in


def _worker(rank: int, directory: str, steps: int) -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=WORLD_SIZE)
    base, loss_fn, batch = gpt2(SIZES["full"])
    calls: list[UnitCall] = []
    Sharded._act = _marked(calls)  # before compile: the step binds it
    model = sharded(base)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cache=False, measure_memory="never",
        gradient_memory="when_made",
    )  # fmt: skip
    step(*batch)
    found: dict[tuple[str, str, float], list[int]] = defaultdict(list)
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        calls.clear()
        with memory_profile() as profiler:
            step(*batch)
        for action, where, mib, later in _lifetimes(profiler, calls):
            found[(action, where, round(mib, 3))].append(later)
    rows = [
        {"rank": rank, "call": action, "thread": where, "mib": mib, "count": len(later),
         "outlived": sum(1 for each in later if each > 0), "most_later": max(later)}
        for (action, where, mib), later in sorted(found.items())
    ]  # fmt: skip
    hand_rows(directory, rows)


def measure(steps: int) -> Iterator[Row]:
    return ranks_rows(_worker, steps)


def render(stored: Stored) -> str:
    header = ["rank", "unit call", "made on", "MiB", "allocations", "outlived the call", "most calls later freed"]
    lines = [
        [str(row["rank"]), row["call"], row["thread"], f"{row['mib']:.3f}", str(row["count"]), str(row["outlived"]),
         str(row["most_later"])]
        for row in stored.rows
    ]  # fmt: skip
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="profiled steps per rank")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "gloo_copies", lambda: measure(arguments.steps), render)


if __name__ == "__main__":
    main()
