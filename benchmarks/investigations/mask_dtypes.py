"""Why the leaner capture keeps ReLU masks as bfloat16: Inductor's CPU code for each mask dtype, make and read.

    .venv/bin/python benchmarks/investigations/mask_dtypes.py [--out]
    .venv/bin/python benchmarks/investigations/mask_dtypes.py --from-json   # again from stored rows

On a 4 MiB float32 `y` (64x16x32x32, ReLU'd), one torch thread: the time of Inductor's function that makes the mask
`le(y, 0)` in the given dtype, and of the one that reads it in the backward, `where(mask != 0, 0, grad)`; median of
15 calls after 3 warm-up calls. Eager `le` for reference. The read is checked to equal `threshold_backward`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch._inductor.compile_fx import compile_fx
from torch.fx.experimental.proxy_tensor import make_fx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from rows import Row, Stored, add_row_arguments, measure_or_load

aten = torch.ops.aten


def milliseconds(function: Callable[..., Any], *arguments: Any) -> float:
    for _ in range(3):
        function(*arguments)
    times = []
    for _ in range(15):
        started = time.perf_counter()
        function(*arguments)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def mask_maker(dtype: torch.dtype) -> Callable[[torch.Tensor], tuple[torch.Tensor]]:
    def make(y: torch.Tensor) -> tuple[torch.Tensor]:
        compared = aten.le.Scalar(y, 0)
        return (compared if dtype is torch.bool else aten._to_copy.default(compared, dtype=dtype),)

    return make


def measure() -> Iterator[Row]:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    y = torch.relu(torch.randn(64, 16, 32, 32, generator=generator))
    grad = torch.randn(y.shape, generator=generator)
    with torch.no_grad():
        for dtype in (torch.bool, torch.uint8, torch.bfloat16):

            def read(mask: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor]:
                return (aten.where.ScalarSelf(aten.ne.Scalar(mask, 0), 0.0, grad),)

            made = compile_fx(make_fx(mask_maker(dtype))(y), [y])
            mask = made(y)[0]
            reading = compile_fx(make_fx(read)(mask, grad), [mask, grad])
            yield {
                "dtype": str(dtype).removeprefix("torch."),
                "make_ms": milliseconds(made, y),
                "read_ms": milliseconds(reading, mask, grad),
                "equal": torch.equal(reading(mask, grad)[0], aten.threshold_backward(grad, y, 0)),
            }
        yield {"dtype": "eager le", "make_ms": milliseconds(lambda: aten.le.Scalar(y, 0))}


def render(stored: Stored) -> str:
    lines = [
        "| mask dtype | make (Inductor) ms | read (Inductor) ms | read equals threshold_backward |",
        "|---|---:|---:|---|",
    ]
    eager = ""
    for row in stored.rows:
        if row["dtype"] == "eager le":
            eager = f"\n\nEager `le(y, 0)`: {row['make_ms']:.2f} ms"
            continue
        lines.append(f"| {row['dtype']} | {row['make_ms']:.2f} | {row['read_ms']:.2f} | {row['equal']} |")
    return "\n".join(lines) + eager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser)
    measure_or_load(parser.parse_args(), "mask_dtypes", measure, render)


if __name__ == "__main__":
    main()
