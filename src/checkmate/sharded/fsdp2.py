"""FSDP2's private API in one place: what the sharded step reads and drives of `fully_shard`'s internal objects.

FSDP2's public face is the `FSDPModule` (`unshard`, `reshard`, ...). The sharded step needs more: the parameter
groups behind each module (`FSDPParamGroup`: the unit that gathers, frees and reduces together), their per-parameter
records (`FSDPParam`), FSDP2's end of backward, and a copy of the model without `fully_shard`'s classes, hooks and
state. Those live in torch's private modules and underscore attributes, which a torch release may change. This
module is the only one of `checkmate.sharded` that imports them or touches those attributes
(tests/unit/test_fsdp2_adapter.py checks it); each function names the internals it wraps, as read from torch 2.13.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy
from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, TrainingState
from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

from checkmate.errors import ShardedTrainingError

log = logging.getLogger(__name__)

ParamGroup = FSDPParamGroup
"""One FSDP2 parameter group: the parameters of one `fully_shard` call, gathered and reduced together."""

Param = FSDPParam
"""FSDP2's record of one parameter of a group: its shard, its full parameter, its name."""


def lazy_init(root: FSDPModule) -> None:
    """FSDP2's lazy initialization of the root's state (`FSDPModule._get_fsdp_state()._lazy_init()`, torch 2.13)."""
    root._get_fsdp_state()._lazy_init()


def param_groups(module: FSDPModule) -> tuple[ParamGroup, ...]:
    """The parameter groups of one `fully_shard` module (`FSDPState._fsdp_param_groups`, torch 2.13)."""
    return tuple(module._get_fsdp_state()._fsdp_param_groups)


def params(group: ParamGroup) -> tuple[Param, ...]:
    """The parameter records of a group, in its order (`FSDPParamGroup.fsdp_params`, torch 2.13)."""
    return tuple(group.fsdp_params)


def parameter_name(param: Param) -> str:
    """The parameter's qualified name from the root module (`FSDPParam._param_fqn`, torch 2.13)."""
    assert param._param_fqn is not None, "FSDP2 names the parameters at its lazy initialization"
    return param._param_fqn


def unsharded_parameter(param: Param) -> nn.Parameter:
    """The full parameter, whose storage a gather fills and a free empties (`FSDPParam.unsharded_param`, torch 2.13)."""
    return param.unsharded_param


def sharded_parameter(param: Param) -> nn.Parameter:
    """This rank's shard, the DTensor the optimizer updates (`FSDPParam.sharded_param`, torch 2.13)."""
    return param.sharded_param


def padded_shard_bytes(param: Param) -> int:
    """Bytes of this rank's shard padded as FSDP2 pads it (`FSDPParam.padded_sharded_param_size`, torch 2.13)."""
    return param.padded_sharded_param_size.numel() * param.sharded_param.element_size()


def was_dtensor(param: Param) -> bool:
    """Whether the parameter was a DTensor (tensor parallel) before `fully_shard` (`FSDPParam.is_dtensor`, 2.13)."""
    return bool(param.is_dtensor)


def has_all_gather_extension(param: Param) -> bool:
    """Whether the parameter's local tensor defines `fsdp_pre_all_gather` (`FSDPParam._sharded_local_tensor`,
    torch 2.13)."""
    return hasattr(param._sharded_local_tensor, "fsdp_pre_all_gather")


def shard_process_group(group: ParamGroup) -> dist.ProcessGroup:
    """The process group the group is sharded over (`FSDPParamGroup.mesh_info.shard_process_group`, torch 2.13)."""
    return cast(FSDPMeshInfo, group.mesh_info).shard_process_group


def shard_world_size(group: ParamGroup) -> int:
    """How many ranks the group is sharded over (`FSDPParamGroup.mesh_info.shard_mesh_size`, torch 2.13)."""
    return cast(FSDPMeshInfo, group.mesh_info).shard_mesh_size


def mesh_dimensions(group: ParamGroup) -> int:
    """The number of dimensions of the group's device mesh (`FSDPParamGroup.mesh_info.mesh`, torch 2.13)."""
    return int(group.mesh_info.mesh.ndim)


def device(group: ParamGroup) -> torch.device:
    """The device the group's parameters are gathered on (`FSDPParamGroup.device`, torch 2.13)."""
    return group.device


def reshards_after_forward(group: ParamGroup) -> bool:
    """Whether FSDP2 frees the gathered parameters after the forward (`FSDPParamGroup.post_forward_mesh_info`, set at
    the lazy initialization; torch 2.13)."""
    return group.post_forward_mesh_info is not None


def reshards_to_another_mesh(group: ParamGroup) -> bool:
    """Whether `reshard_after_forward` was an int: a smaller mesh after the forward
    (`FSDPParamGroup.post_forward_mesh_info` against `.mesh_info`, torch 2.13)."""
    return group.post_forward_mesh_info is not None and group.post_forward_mesh_info != group.mesh_info


def offloads_to_cpu(group: ParamGroup) -> bool:
    """Whether the group offloads its shards to the CPU (`FSDPParamGroup.offload_policy`, torch 2.13)."""
    return isinstance(group.offload_policy, CPUOffloadPolicy)


def casts_precision(group: ParamGroup) -> bool:
    """Whether the group has a mixed-precision policy that casts anything (`FSDPParamGroup.mp_policy`, torch 2.13)."""
    policy = group.mp_policy
    return (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) != (None, None, None) or not isinstance(
        policy, MixedPrecisionPolicy
    )


def post_backward(group: ParamGroup) -> None:
    """FSDP2's post-backward of a group: reduce-scatter (`foreach_reduce`) or accumulate its gradients, and free its
    gathered parameters (`FSDPParamGroup.post_backward`, torch 2.13)."""
    group.post_backward()


def finish_backward(units: Iterable[tuple[FSDPModule, ParamGroup]]) -> None:
    """FSDP2's end of backward for the (module, group) pairs in order: every group and state idle, and on the last
    backward each group finalized and the pending reduce-scatters dropped (`FSDPState._training_state`,
    `._state_ctx.is_last_backward`, `FSDPParamGroup._training_state`, `.finalize_backward`, `.comm_ctx`, as in
    `FSDPState._root_post_backward_final_callback`, torch 2.13)."""
    last_backward = True
    first_group: ParamGroup | None = None
    for module, group in units:
        if first_group is None:
            first_group = group
        state = module._get_fsdp_state()
        group._training_state = TrainingState.IDLE
        state._training_state = TrainingState.IDLE
        last_backward = state._state_ctx.is_last_backward
        if last_backward:
            group.finalize_backward()
    if last_backward and first_group is not None:
        communication = first_group.comm_ctx
        communication.post_forward_order.clear()
        communication.reduce_scatter_states.clear()


def plain_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree that shares the model's parameters and buffers as they are now registered, with
    each FSDP2 module back in the class `fully_shard` wrapped, without FSDP2's forward hooks and without the record of
    its state (`FSDPModule._get_fsdp_state`, the module's `__dict__` keys `REGISTRY_KEY` and `STATE_KEY` of
    `torch.distributed._composable.contract`, `nn.Module._forward_pre_hooks` and its companions, torch 2.13)."""
    wrapped: list[nn.Module] = [module for module in model.modules() if isinstance(module, FSDPModule)]
    classes = [type(module) for module in wrapped]
    states = [fsdp_module._get_fsdp_state() for fsdp_module in model.modules() if isinstance(fsdp_module, FSDPModule)]
    shared: dict[int, Any] = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    shared |= {id(state): state for state in states}
    try:
        for module, wrapper in zip(wrapped, classes, strict=True):
            module.__class__ = _unwrapped_class(wrapper)
        plain = copy.deepcopy(model, shared)
    finally:
        for module, wrapper in zip(wrapped, classes, strict=True):
            module.__class__ = wrapper
    fsdp_states = tuple(states)
    for module in plain.modules():
        for key in (STATE_KEY, REGISTRY_KEY):  # fully_shard's record of its state, kept in the module's __dict__
            module.__dict__.pop(key, None)
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key in [key for key, hook in hooks.items() if getattr(hook, "__self__", None) in fsdp_states]:
                del hooks[key]
                module._forward_pre_hooks_with_kwargs.pop(key, None)
                module._forward_hooks_with_kwargs.pop(key, None)
                module._forward_hooks_always_called.pop(key, None)
    return plain


def _unwrapped_class(wrapper: type) -> type:
    """The class `fully_shard` wrapped: its wrapper class is `FSDP<name>(FSDPModule, <class>)`."""
    bases = [base for base in wrapper.__bases__ if base is not FSDPModule]
    if len(bases) != 1:
        raise ShardedTrainingError(
            f"cannot tell which class fully_shard wrapped in {wrapper.__name__} (bases {wrapper.__bases__})"
        )
    return bases[0]
