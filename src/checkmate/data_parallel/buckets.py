"""Gradient buckets as DDP's Reducer cuts them: which parameters share a flat all-reduce buffer, and where.

DDP all-reduces gradients in flat buckets rather than one by one: fewer, larger collectives, each started as
soon as its last gradient is made. `assign_buckets` is the Reducer's cut (`compute_bucket_assignment_by_size`
in torch/csrc/distributed/c10d/reducer.cpp), `make_buckets` places each parameter's gradient in its bucket
with the parameter's own layout, as the Reducer's bucket views do.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

FIRST_BUCKET_BYTES = 1024 * 1024
"""DDP's first-bucket limit with the default `bucket_cap_mb` (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`)."""


@dataclass(frozen=True)
class BucketSlot:
    """Where one parameter's gradient sits in its bucket.

    Attributes:
        name: the parameter's name in the wrapped module.
        offset: its first element in the flat bucket.
        shape: the parameter's shape.
        stride: the parameter's strides when it is dense (the view then has its layout, as DDP's does), else
            None for a contiguous view.
    """

    name: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None

    def view(self, flat: torch.Tensor) -> torch.Tensor:
        """This parameter's view of the flat bucket `flat`."""
        if self.stride is not None:
            return flat.as_strided(self.shape, self.stride, flat.storage_offset() + self.offset)
        return flat[self.offset : self.offset + math.prod(self.shape)].view(self.shape)


@dataclass(frozen=True)
class Bucket:
    """One flat buffer that is all-reduced at once: its parameters, its size in elements, its dtype and device."""

    slots: tuple[BucketSlot, ...]
    numel: int
    dtype: torch.dtype
    device: torch.device


def assign_buckets(sizes: Sequence[int], keys: Sequence[Hashable], limits: Sequence[int]) -> list[list[int]]:
    """Cut tensors, in the order their gradients are made, into buckets as DDP's Reducer does.

    This is `compute_bucket_assignment_by_size` of torch/csrc/distributed/c10d/reducer.cpp when it rebuilds buckets
    from the gradients' order: tensors of one key (dtype, device) fill one open bucket; a bucket closes as soon as
    its bytes reach the current limit, and the next bucket of that key gets the next limit (the last one repeats).
    Buckets still open at the end follow, in the order their keys first appeared.

    Args:
        sizes: bytes of each tensor, in gradient order.
        keys: the (dtype, device) of each tensor; only tensors of one key share a bucket.
        limits: the bucket limits in bytes, such as [1 MiB, 25 MiB].

    Returns:
        The buckets, each a list of positions in `sizes`.
    """
    open_buckets: dict[Hashable, list[int]] = {}
    filled: dict[Hashable, int] = {}
    limit_of: dict[Hashable, int] = {}
    buckets: list[list[int]] = []
    for position, (size, key) in enumerate(zip(sizes, keys, strict=True)):
        open_buckets.setdefault(key, []).append(position)
        filled[key] = filled.get(key, 0) + size
        limit = limit_of.setdefault(key, 0)
        if filled[key] >= limits[limit]:
            buckets.append(open_buckets[key])
            open_buckets[key] = []
            filled[key] = 0
            limit_of[key] = min(limit + 1, len(limits) - 1)
    buckets.extend(bucket for bucket in open_buckets.values() if bucket)
    return buckets


def bucket_limits(ddp: Any) -> list[int]:
    """DDP's limits for rebuilt buckets: `bucket_cap_mb_list` when given; else a 1 MiB first bucket with the
    default `bucket_cap_mb` (25 MiB), and `bucket_cap_mb` for every bucket when the user set it."""
    per_bucket = list(getattr(ddp, "bucket_bytes_cap_list", None) or [])
    if per_bucket:
        return per_bucket
    if getattr(ddp, "bucket_bytes_cap_default", True) and ddp.bucket_bytes_cap > FIRST_BUCKET_BYTES:
        return [FIRST_BUCKET_BYTES, ddp.bucket_bytes_cap]
    return [ddp.bucket_bytes_cap]


def make_buckets(order: list[str], parameters: dict[str, torch.Tensor], limits: list[int]) -> tuple[Bucket, ...]:
    """The buckets of `parameters` (by name) taken in `order` (the order their gradients are made), cut at `limits`."""
    tensors = [parameters[name] for name in order]
    positions = assign_buckets(
        [tensor_bytes([tensor]) for tensor in tensors], [(tensor.dtype, tensor.device) for tensor in tensors], limits
    )
    buckets = []
    for members in positions:
        slots = []
        offset = 0
        for position in members:
            tensor = tensors[position]
            slots.append(BucketSlot(order[position], offset, tuple(tensor.shape), _dense_stride(tensor)))
            offset += tensor.numel()
        first = tensors[members[0]]
        buckets.append(Bucket(tuple(slots), offset, first.dtype, first.device))
    return tuple(buckets)


def _dense_stride(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """The tensor's strides when its elements fill a block without gaps or overlaps (what `empty_like` keeps)."""
    dense = torch.empty_like(tensor, device="meta").stride() == tensor.stride()
    return tuple(tensor.stride()) if dense else None


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors' elements."""
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
