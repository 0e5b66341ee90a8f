"""The layouts the traced graph assumed, and how to hold a kernel to them at run time.

Capture traces on fake tensors, whose strides come from each op's meta function. A few real kernels lay their
output out otherwise: CPU batch norm returns a contiguous tensor for a transposed input, where its meta function
keeps the input's strides. The traced graph then holds a `view` that was valid for the traced layout and fails on
the real one (eager code called `.flatten()`, which copies when it must). The executor and the profiler copy such
an output into the traced layout as soon as it is made.

That copy is not in the plan: for a moment both layouts are live, so the step can measure up to that tensor's
bytes above the plan's peak. The executor logs it once per op.
"""

from __future__ import annotations

import torch
import torch.fx


def traced_stride(fx_node: torch.fx.Node) -> tuple[int, ...] | None:
    """The strides of the node's value when traced, unless it is a view (a view's strides follow its input's)."""
    value = fx_node.meta.get("val")
    is_view = isinstance(fx_node.target, torch._ops.OpOverload) and fx_node.target.is_view
    if not isinstance(value, torch.Tensor) or is_view:
        return None
    return tuple(int(step) for step in value.stride())


def conform_layout(tensor: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """`tensor` laid out with the traced `stride` (a copy) when they differ on a dimension longer than 1."""
    if all(got == want for got, want, size in zip(tensor.stride(), stride, tensor.shape, strict=True) if size > 1):
        return tensor
    laid_out = torch.empty_strided(tensor.shape, stride, dtype=tensor.dtype, device=tensor.device)
    return laid_out.copy_(tensor)
