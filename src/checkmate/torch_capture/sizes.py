"""Sizes of fx values: which storages each value lives in and how many bytes they take.

The fake tensors in `meta["val"]` give shapes and dtypes without allocating anything, but in a
functionalized graph they do not share storage objects the way real views would. Aliasing is
therefore read from the op schemas instead: an output annotated as an alias of an input (`Tensor(a)`
in `view`, `t`, `expand`, `detach`, `alias`...), an `_unsafe_view`, or a `getitem` of a multi-output
op lives in its source's storage. Every other tensor output gets a new storage whose size is what
the device's allocator takes for the fake tensor's storage (`allocated_bytes`), except where the kernel's
storage is known to be larger than its fake tensor's: a loss reduced to a scalar in the buffer of its
elementwise values (`mse_loss` and the others of `_REDUCED_IN_ELEMENTWISE_BUFFER`) keeps that buffer.
Bytes are then counted per storage, never per tensor.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

StorageKey = int

_UNSAFE_VIEWS = frozenset({"aten::_unsafe_view"})
# Losses whose kernel makes the output at the broadcast shape of (input, target), writes the elementwise losses there
# and resizes it to the reduced scalar (`mean` or `sum` reduction), which keeps the storage: the scalar holds the
# elementwise buffer for as long as it lives (the structured `mse_loss` and `smooth_l1_loss` allocate it in their
# meta function, `binary_cross_entropy` and `soft_margin_loss` resize their `empty_like(input)` result). Their fake
# tensors hold one element.
_REDUCED_IN_ELEMENTWISE_BUFFER = frozenset(
    {"aten::mse_loss", "aten::smooth_l1_loss", "aten::binary_cross_entropy", "aten::soft_margin_loss"}
)
# CUDA's caching allocator hands out blocks in multiples of 512 bytes (`kMinBlockSize` in c10/cuda/
# CUDACachingAllocator.cpp), and `torch.cuda.max_memory_allocated` counts the blocks: a 4-byte loss takes 512.
CUDA_BLOCK_BYTES = 512


def allocated_bytes(tensor: torch.Tensor) -> int:
    """Bytes the tensor's device allocator takes for its storage: the storage's size, rounded up to whole
    512-byte blocks on CUDA (an empty storage takes none)."""
    return _device_bytes(int(tensor.untyped_storage().nbytes()), tensor.device)


def _device_bytes(size: int, device: torch.device) -> int:
    """Bytes the device's allocator takes for a storage of `size` bytes."""
    if device.type != "cuda":
        return size
    return -(-size // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def tensors_of(value: Any) -> Iterator[torch.Tensor]:
    """The tensors inside a node value (a tensor, or a nested tuple/list of tensors and None)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_of(item)


@dataclass(frozen=True)
class StorageTable:
    """For each fx node name, the storages its value lives in, as {storage id: bytes}, one per output slot.

    `slots[name]` lists the storage id of each output (None where the output is not a tensor),
    so that `getitem` can find the storage of one output of a multi-output op.
    """

    slots: dict[str, tuple[StorageKey | None, ...]]
    sizes: dict[StorageKey, int]

    def storages(self, name: str) -> dict[StorageKey, int]:
        """{storage id: bytes} of the node's value (empty when it holds no tensor)."""
        return {key: self.sizes[key] for key in self.slots.get(name, ()) if key is not None}


def storage_table(graph: torch.fx.Graph) -> StorageTable:
    """Assign storage ids to every tensor value of the graph, following aliasing through op schemas."""
    slots: dict[str, tuple[StorageKey | None, ...]] = {}
    sizes: dict[StorageKey, int] = {}
    for node in graph.nodes:
        if node.op == "output":
            continue
        value = node.meta.get("val")
        outputs = list(value) if isinstance(value, (tuple, list)) else [value]
        aliases = _aliased_sources(node, slots)
        keys: list[StorageKey | None] = []
        for position, output in enumerate(outputs):
            source = aliases[position] if position < len(aliases) else None
            if source is not None:
                keys.append(source)
            elif isinstance(output, torch.Tensor):
                keys.append(len(sizes))
                sizes[len(sizes)] = _output_bytes(node, output)
            else:
                keys.append(None)
        slots[node.name] = tuple(keys)
    return StorageTable(slots, sizes)


def _output_bytes(node: torch.fx.Node, output: torch.Tensor) -> int:
    """Bytes of the new storage `output` of `node` lives in when the step runs: the fake tensor's storage, or for a
    loss reduced in its elementwise buffer, that buffer."""
    target = node.target
    if not (
        isinstance(target, torch._ops.OpOverload)
        and target._schema.name in _REDUCED_IN_ELEMENTWISE_BUFFER
        and output.dim() == 0
    ):
        return allocated_bytes(output)
    shapes = [argument.meta["val"].shape for argument in node.args[:2] if isinstance(argument, torch.fx.Node)]
    elements = math.prod(torch.broadcast_shapes(*shapes))
    return max(allocated_bytes(output), _device_bytes(elements * output.element_size(), output.device))


def _aliased_sources(node: torch.fx.Node, slots: dict[str, tuple[StorageKey | None, ...]]) -> list[StorageKey | None]:
    """For each output of the node, the storage of the input it aliases, or None for a fresh output."""
    if node.op != "call_function":
        return []
    if node.target is operator.getitem:
        source, index = node.args[0], node.args[1]
        if isinstance(source, torch.fx.Node) and isinstance(index, int):
            return [slots[source.name][index]]
        return []
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return []
    schema = target._schema
    first_tensor = _first_tensor_input(node, slots)
    if schema.name in _UNSAFE_VIEWS:
        return [first_tensor]
    by_alias_set = _input_storages_by_alias_set(node, slots)
    result: list[StorageKey | None] = []
    for returned in schema.returns:
        alias = returned.alias_info
        result.append(by_alias_set.get(next(iter(alias.before_set), ""), first_tensor) if alias else None)
    if len(schema.returns) == 1 and isinstance(node.meta.get("val"), (tuple, list)):
        return result * len(node.meta["val"])
    return result


def _input_storages_by_alias_set(
    node: torch.fx.Node, slots: dict[str, tuple[StorageKey | None, ...]]
) -> dict[str, StorageKey | None]:
    assert isinstance(node.target, torch._ops.OpOverload)
    mapping: dict[str, StorageKey | None] = {}
    arguments = node.target._schema.arguments
    for position, argument in enumerate(arguments):
        if argument.alias_info is None:
            continue
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        if isinstance(value, torch.fx.Node) and slots.get(value.name):
            for alias_set in argument.alias_info.before_set:
                mapping[alias_set] = slots[value.name][0]
    return mapping


def _first_tensor_input(node: torch.fx.Node, slots: dict[str, tuple[StorageKey | None, ...]]) -> StorageKey | None:
    for argument in node.all_input_nodes:
        keys = slots.get(argument.name, ())
        if keys and keys[0] is not None:
            return keys[0]
    return None
