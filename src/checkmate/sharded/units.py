"""The FSDP2 units of a model sharded with `fully_shard`, and what a compiled step supports of them.

A unit is one FSDP2 parameter group: the parameters of one `fully_shard` call (a block, or the root's own
parameters), all-gathered together and reduce-scattered together. `units_of` lists them in the order of the model's
modules, which is the same on every rank, and `check_supported` refuses what the compiled step does not reproduce.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

import checkmate.sharded.fsdp2 as fsdp2
from checkmate.errors import ShardedTrainingError
from checkmate.options import GradientMemory

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Unit:
    """One FSDP2 parameter group of the model.

    Attributes:
        name: the qualified name of the module `fully_shard` was applied to ("" for the root).
        module: that module.
        group: its FSDP2 parameter group (FSDP2's own object: it gathers, frees and reduces the unit; read through
            `checkmate.sharded.fsdp2`).
        reshard_after_forward: whether FSDP2 frees the gathered parameters after the unit's forward (the root's
            are kept: FSDP2 sets that at its lazy initialization).
    """

    name: str
    module: FSDPModule
    group: Any
    reshard_after_forward: bool

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The unit's full (unsharded) parameters: the tensors whose storage a gather fills and a free empties."""
        return [fsdp2.unsharded_parameter(param) for param in fsdp2.params(self.group)]

    @property
    def world_size(self) -> int:
        """How many ranks the unit is sharded over."""
        return fsdp2.shard_world_size(self.group)

    @property
    def shard_bytes(self) -> int:
        """Bytes this rank holds of the unit's parameters: its padded shards."""
        return sum(fsdp2.padded_shard_bytes(param) for param in fsdp2.params(self.group))

    @property
    def params_with_gradients(self) -> tuple[fsdp2.Param, ...]:
        """The unit's parameters that take a gradient."""
        return tuple(param for param in fsdp2.params(self.group) if fsdp2.sharded_parameter(param).requires_grad)

    @property
    def gradient_shard_bytes(self) -> int:
        """Bytes of the unit's sharded gradients on this rank (of the parameters that take a gradient)."""
        return sum(fsdp2.padded_shard_bytes(param) for param in self.params_with_gradients)


def initialize(root: nn.Module) -> None:
    """FSDP2's lazy initialization, which its first forward would do: `root` becomes the root of every unit below
    it (its own parameters stay gathered after the forward) and each unit learns its dtypes."""
    assert isinstance(root, FSDPModule)
    fsdp2.lazy_init(root)


def units_of(root: nn.Module) -> tuple[Unit, ...]:
    """The units of an initialized FSDP2 model (`initialize`), in the order of `root.named_modules()`."""
    units = []
    for name, module in root.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        for group in fsdp2.param_groups(module):
            units.append(Unit(name, module, group, fsdp2.reshards_after_forward(group)))
    return tuple(units)


def check_root(model: nn.Module) -> None:
    """Refuse a model whose root is not an FSDP2 module (`fully_shard` applied to submodules only).

    Raises:
        ShardedTrainingError: the root is not sharded.
    """
    if not isinstance(model, FSDPModule):
        wrapped = [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
        raise ShardedTrainingError(
            f"the model's root is not sharded, only its submodules {wrapped[:5]}: apply fully_shard to the root "
            "module too (after its blocks), as FSDP2 expects, and pass that root to checkmate.compile"
        )


def check_supported(root: nn.Module) -> None:
    """Refuse an initialized FSDP2 model (`initialize`) whose training the compiled step does not reproduce, naming
    every such feature at once.

    Raises:
        ShardedTrainingError: a unit uses CPU offload, a mixed-precision policy, a 2-D (HSDP) mesh, a reshard to
            another mesh size after the forward, parameters that were DTensors before `fully_shard` (tensor
            parallel), all-gather extensions or several parameter groups; or a parameter is a DTensor that
            `fully_shard` does not manage.
    """
    problems: list[str] = []
    managed: set[int] = set()
    for name, module in root.named_modules():
        if isinstance(module, FSDPModule):
            problems += _unit_problems(name or "the root", fsdp2.param_groups(module))
            for group in fsdp2.param_groups(module):
                managed.update(id(fsdp2.sharded_parameter(param)) for param in fsdp2.params(group))
    foreign = [name for name, parameter in root.named_parameters() if id(parameter) not in managed]
    foreign_dtensors = [name for name in foreign if isinstance(root.get_parameter(name), DTensor)]
    if foreign_dtensors:
        problems.append(f"tensor-parallel (DTensor) parameters not sharded by fully_shard: {foreign_dtensors[:5]}")
    if problems:
        raise ShardedTrainingError(
            "checkmate.compile cannot reproduce this FSDP2 model's training yet: " + "; ".join(dict.fromkeys(problems))
        )


def _unit_problems(name: str, groups: Iterable[fsdp2.ParamGroup]) -> list[str]:
    groups = list(groups)
    problems = []
    if len(groups) > 1:
        problems.append(f"{name}: several parameter groups in one fully_shard (shard_placement_fn with meshes)")
    for group in groups:
        if fsdp2.offloads_to_cpu(group):
            problems.append("CPU offload (offload_policy=CPUOffloadPolicy()): shard without offload_policy")
        if fsdp2.casts_precision(group):
            problems.append(
                "a mixed-precision policy (mp_policy): shard without one, with the model in the dtype it trains in"
            )
        if fsdp2.mesh_dimensions(group) != 1:
            problems.append(
                f"a {fsdp2.mesh_dimensions(group)}-D device mesh (HSDP or replication): shard over a 1-D mesh"
            )
        elif fsdp2.reshards_to_another_mesh(group):
            problems.append("reshard_after_forward as an int (a smaller mesh after the forward): use True or False")
        tensor_parallel = [fsdp2.parameter_name(param) for param in fsdp2.params(group) if fsdp2.was_dtensor(param)]
        if tensor_parallel:
            problems.append(f"tensor-parallel (DTensor) parameters {tensor_parallel[:5]} sharded again by fully_shard")
        extended = [
            fsdp2.parameter_name(param) for param in fsdp2.params(group) if fsdp2.has_all_gather_extension(param)
        ]
        if extended:
            problems.append(f"all-gather extensions (fsdp_pre_all_gather) on {extended[:5]}")
    return problems


def shard_bytes_held(units: Iterable[Unit], gradient_memory: GradientMemory) -> int:
    """Bytes of parameter shards, and of gradient shards unless the step makes them (`gradient_memory="when_made"`),
    this rank holds through a step: the plan's fixed memory of them."""
    gradients = gradient_memory == "whole_step"
    return sum(unit.shard_bytes + (unit.gradient_shard_bytes if gradients else 0) for unit in units)


def sharding_fixed_memory(units: Sequence[Unit], gradient_memory: GradientMemory) -> int:
    """What sharding changes in the fixed memory of a capture of the unsharded step, which counts the full parameters
    and, unless the step starts with no `.grad`s (`gradient_memory="when_made"`), their gradients: this rank holds
    their shards instead (a negative number of bytes)."""
    parameters = [parameter for unit in units for parameter in unit.parameters]
    full = full_bytes(parameters)
    if gradient_memory == "whole_step":
        full += full_bytes(parameter for parameter in parameters if parameter.requires_grad)
    return shard_bytes_held(units, gradient_memory) - full


def full_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors' elements."""
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
