"""Why the leaner capture keeps ReLU masks as bfloat16: Inductor's CPU code for each mask dtype, make and read.

    .venv/bin/python benchmarks/mask_dtypes.py

On a 4 MiB float32 `y` (64x16x32x32, ReLU'd), one torch thread: the time of Inductor's function that makes the mask
`le(y, 0)` in the given dtype, and of the one that reads it in the backward, `where(mask != 0, 0, grad)`; median of
15 calls after 3 warm-up calls. Eager `le` for reference. The read is checked to equal `threshold_backward`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch._inductor.compile_fx import compile_fx
from torch.fx.experimental.proxy_tensor import make_fx

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


def main() -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    y = torch.relu(torch.randn(64, 16, 32, 32, generator=generator))
    grad = torch.randn(y.shape, generator=generator)
    print("| mask dtype | make (Inductor) ms | read (Inductor) ms | read equals threshold_backward |")
    print("|---|---:|---:|---|")
    with torch.no_grad():
        for dtype in (torch.bool, torch.uint8, torch.bfloat16):

            def read(mask: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor]:
                return (aten.where.ScalarSelf(aten.ne.Scalar(mask, 0), 0.0, grad),)

            made = compile_fx(make_fx(mask_maker(dtype))(y), [y])
            mask = made(y)[0]
            reading = compile_fx(make_fx(read)(mask, grad), [mask, grad])
            equal = torch.equal(reading(mask, grad)[0], aten.threshold_backward(grad, y, 0))
            print(
                f"| {str(dtype).removeprefix('torch.')} | {milliseconds(made, y):.2f} | "
                f"{milliseconds(reading, mask, grad):.2f} | {equal} |"
            )
        print(f"\nEager `le(y, 0)`: {milliseconds(lambda: aten.le.Scalar(y, 0)):.2f} ms")


if __name__ == "__main__":
    main()
