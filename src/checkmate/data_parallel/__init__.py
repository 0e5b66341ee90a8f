"""Data-parallel training: `checkmate.compile` of a DistributedDataParallel module gives DDP's gradients.

    torch.distributed.init_process_group("gloo")                    # or "nccl"; torchrun sets the environment
    model = DistributedDataParallel(model)
    step = checkmate.compile(model, loss_fn, batch, budget=0.5)     # loss_fn(model.module, *batch) is captured
    loss = step(*batch); optimizer.step(); optimizer.zero_grad()

The wrapped module's step is captured and planned as a single-process step; what DDP adds around it is
reproduced here, with eager DDP's arithmetic, so that `.grad` on each rank equals eager DDP's bit for bit:

* Gradients (DDP's Reducer). Each gradient is first added into `.grad` as AccumulateGrad adds it; then
  `.grad * (1 / world_size)` is written into that parameter's view of a flat bucket. When every gradient of a
  bucket is in, a sum all-reduce of the bucket starts (`async_op=True`) on the DDP's process group and runs
  while the schedule goes on with the backward. Buckets start in order, as DDP's do. At the end the step waits
  for them and copies each bucket back into `.grad`. So `.grad` ends as the sum over ranks of
  (`.grad` before the step + the new gradient) / world_size: a step that accumulates into existing gradients
  averages the whole `.grad` again, as eager DDP does.
* Buckets (DDP's `compute_bucket_assignment_by_size`). Parameters are taken in the order the schedule makes
  their gradients (node by node; recomputation never moves a gradient, which is taken at its node's first run),
  and cut into buckets of at least the first limit (1 MiB with the default `bucket_cap_mb`), then
  `bucket_cap_mb` (25 MiB by default): a bucket is complete at its last gradient, as early as the schedule
  allows. Rank 0's order is broadcast once at compile time, as DDP broadcasts its rebuilt buckets, so that
  every rank starts the same all-reduces in the same order whatever plan it solved for.
* Memory. A bucket is allocated at its first gradient and freed when the step ends; the plan counts the bytes
  of all buckets in the fixed memory (`DataParallel.fixed_memory`), so the budget holds at the end
  of the backward, when every bucket is in flight. DDP's own Reducer keeps its buckets (one more copy of the
  gradients, allocated when DDP is constructed); the compiled step does not use them.
* Buffers. With `broadcast_buffers` (the default), rank 0's buffers are broadcast at the start of each step,
  as DDP's forward does, through one flat copy per dtype. Gloo's worker thread may let go of those copies only
  after the step has begun (on some runs), so the plan's fixed memory counts them too.
* `ddp.no_sync()`: a step called inside it only accumulates locally, and the next step outside reduces the
  accumulated `.grad`, as in eager DDP (the buffer broadcast follows DDP's `require_forward_param_sync` too).
* Parameters without a gradient keep `.grad` as it was. DDP needs `find_unused_parameters=True` (or
  `static_graph=True`) for them; without it eager DDP fails at the next step, and `compile` refuses at once.

Every rank must run the same graph (the same model; batch shapes may differ per rank, and a new shape is
planned on its rank alone). The sums are eager DDP's bit for bit with two ranks (a + b is commutative). With more,
the all-reduce sums an element in an order set by its place in the bucket, so the last bit can differ from eager
DDP's where the bucket layouts differ (eager DDP's first iteration uses one bucket, and later ones follow eager
autograd's gradient order, which the schedule's order usually matches).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from checkmate.byte_sizes import format_bytes
from checkmate.captured import Captured
from checkmate.data_parallel.buckets import assign_buckets, bucket_limits, make_buckets, tensor_bytes
from checkmate.data_parallel.reducer import BucketedGradients, Reduction
from checkmate.errors import DataParallelError
from checkmate.execute.gradients import GradientAccumulator, StepGradients
from checkmate.execute.memory import step_baseline
from checkmate.torch_capture.trace import LossFunction
from checkmate.training.compiled import CompiledStep
from checkmate.training.distribution import PlannedMemory, plan_memory, slotted_parameters
from checkmate.training.planning import Compiled, Settings, plan_step, signature_of
from checkmate.training.ranks import on_every_rank

log = logging.getLogger(__name__)

__all__ = ["BucketedGradients", "DataParallel", "Reduction", "assign_buckets", "compile_data_parallel"]


def compile_data_parallel(
    ddp: DistributedDataParallel, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings
) -> CompiledStep:
    """Plan the step of `ddp.module` with room for the gradient buckets, and agree on the buckets with every rank.

    This is a collective call: every rank of the DDP's process group must make it (as it must construct the DDP).
    A rank that fails to check or plan the step tells the others at once (`checkmate.training.ranks`).

    Raises:
        DataParallelError: the DDP uses a setting the compiled step does not reproduce.
        RankFailed: another rank failed to check or plan the step.
    """
    reduced = _reduced_parameters(ddp)
    held = tensor_bytes(reduced.values()) + _broadcast_bytes(ddp)
    group = ddp.process_group
    device = next(iter(reduced.values())).device

    def planned() -> Compiled:
        _check_supported(ddp)
        compiled = plan_step(ddp.module, loss_fn, batch, settings, fixed_memory=held)
        _check_unused(ddp, compiled.captured, reduced)
        return compiled

    compiled = on_every_rank(planned, group, device, what="compiling the data-parallel step")
    order = _agree_on_order(_production_order(compiled.captured, list(reduced)), list(reduced), group, device)
    reduction = Reduction(group, dist.get_world_size(group), make_buckets(order, reduced, bucket_limits(ddp)))
    log.info(
        "data parallel over %d ranks: %d gradient buckets, %s held in the plan's fixed memory",
        reduction.world_size,
        len(reduction.buckets),
        format_bytes(reduction.bucket_bytes),
    )
    distribution = DataParallel(ddp, reduction, fixed_memory=held)
    return CompiledStep(ddp, loss_fn, settings, {signature_of(batch): compiled}, distribution)


@dataclass(frozen=True)
class DataParallel:
    """DDP as the distribution of a compiled step (`checkmate.training.distribution`): the plan's step, with DDP's
    buffer broadcast before it and its gradient all-reduce in buckets.

    Attributes:
        ddp: the DistributedDataParallel wrapper given to `compile` (its `parameters()` are the module's).
        reduction: the process group and the gradient buckets.
        fixed_memory: the bytes of the buckets and of the buffers' broadcast copies, in the plan's fixed memory.
    """

    ddp: DistributedDataParallel
    reduction: Reduction
    fixed_memory: int
    plans_alone: bool = True  # batch shapes may differ per rank: a new one is planned on its rank alone
    description: str = "the data-parallel step"

    @property
    def module(self) -> nn.Module:
        """The wrapped module, whose step is captured and planned."""
        return self.ddp.module

    def plan(self, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings) -> Compiled:
        return plan_step(self.ddp.module, loss_fn, batch, settings, fixed_memory=self.fixed_memory)

    def before_step(self) -> None:
        """As DDP's forward: broadcast rank 0's buffers unless the previous step ran under `no_sync()`."""
        ddp = self.ddp
        if ddp.require_forward_param_sync and ddp.broadcast_buffers:
            _broadcast(_synced_buffers(ddp), self.reduction.group)
        ddp.require_forward_param_sync = ddp.require_backward_grad_sync

    def parameters(self, compiled: Compiled) -> list[torch.Tensor]:
        return slotted_parameters(compiled)

    def gradient_sink(self, compiled: Compiled, parameters: Sequence[torch.Tensor]) -> StepGradients:
        """Into `.grad`, then all-reduced in buckets as each completes; only into `.grad` under `ddp.no_sync()`."""
        if not self.ddp.require_backward_grad_sync:
            return GradientAccumulator(parameters)
        return BucketedGradients(parameters, compiled.captured, self.reduction)

    def baseline(self, leaves: Sequence[Any]) -> list[torch.Tensor]:
        return step_baseline(self.ddp, leaves)

    def memory(self, compiled: Compiled) -> PlannedMemory:
        return plan_memory(compiled)


def _check_supported(ddp: DistributedDataParallel) -> None:
    problems = []
    if ddp.gradient_as_bucket_view:
        problems.append("gradient_as_bucket_view=True (the step keeps its own buckets; leave it False)")
    if getattr(ddp, "_comm_hooks", None):
        problems.append("a communication hook (register_comm_hook): the step all-reduces with a plain sum")
    if getattr(ddp, "mixed_precision", None) is not None:
        problems.append("mixed_precision (plan the model in the precision it trains in instead)")
    if getattr(ddp, "_delay_all_reduce_params", None):
        problems.append("delay_all_reduce_named_params")
    sparse = [
        name
        for name, module in ddp.module.named_modules()
        if isinstance(module, nn.Embedding | nn.EmbeddingBag) and module.sparse
    ]
    if sparse:
        problems.append(f"sparse gradients (the embeddings {sparse}; construct them with sparse=False)")
    if problems:
        raise DataParallelError(
            "checkmate.compile cannot reproduce this DistributedDataParallel's " + "; ".join(problems)
        )


def _reduced_parameters(ddp: DistributedDataParallel) -> dict[str, torch.Tensor]:
    """The parameters DDP reduces, by name: those that require a gradient and that DDP is not told to ignore."""
    return {
        name: parameter
        for name, parameter in ddp.module.named_parameters()
        if parameter.requires_grad and name not in ddp.parameters_to_ignore
    }


def _check_unused(ddp: DistributedDataParallel, captured: Captured, reduced: dict[str, torch.Tensor]) -> None:
    gradient_of = dict(zip(captured.parameter_names, captured.gradients, strict=True))
    unused = [name for name in reduced if gradient_of.get(name) is None]
    if unused and not (ddp.find_unused_parameters or ddp.static_graph):
        raise DataParallelError(
            f"the loss does not depend on the parameters {unused}, which eager DDP cannot reduce either (it fails "
            "at the next step): construct the DistributedDataParallel with find_unused_parameters=True, or freeze "
            "them with requires_grad_(False)"
        )


def _production_order(captured: Captured, names: list[str]) -> list[str]:
    """`names` in the order the schedule makes their gradients: by graph node, then by place among its members
    (a gradient is taken at its node's first run, stage i of node i). Parameters without a gradient come first:
    they are ready from the start, as DDP marks them."""
    place = {
        member: (node, position)
        for node, members in enumerate(captured.members)
        for position, member in enumerate(members)
    }
    gradient_of = dict(zip(captured.parameter_names, captured.gradients, strict=True))

    def made_at(name: str) -> tuple[int, int]:
        gradient = gradient_of.get(name)
        return (-1, -1) if gradient is None else place[gradient]

    return sorted(names, key=made_at)


def _agree_on_order(order: list[str], names: list[str], group: Any, device: torch.device) -> list[str]:
    """Rank 0's order, on every rank (DDP's sync_bucket_indices): buckets must match across ranks. The message is
    on the parameters' device, which NCCL needs."""
    index_of = {name: index for index, name in enumerate(names)}
    positions = torch.tensor([index_of[name] for name in order], dtype=torch.int64, device=device)
    dist.broadcast(positions, src=dist.get_global_rank(group, 0), group=group)
    return [names[index] for index in positions.tolist()]


def _broadcast_bytes(ddp: DistributedDataParallel) -> int:
    """Bytes of the flat copies `_broadcast` makes of the synced buffers (none without `broadcast_buffers`)."""
    return tensor_bytes(_synced_buffers(ddp)) if ddp.broadcast_buffers else 0


def _synced_buffers(ddp: DistributedDataParallel) -> list[torch.Tensor]:
    return [buffer for name, buffer in ddp.module.named_buffers() if name not in ddp.parameters_to_ignore]


def _broadcast(tensors: list[torch.Tensor], group: Any) -> None:
    """Overwrite `tensors` with rank 0's, one broadcast per dtype and device (DDP's `_broadcast_coalesced`)."""
    kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        kinds.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    source = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for same_kind in kinds.values():
            flat = torch.cat([tensor.reshape(-1) for tensor in same_kind])
            dist.broadcast(flat, src=source, group=group)
            offset = 0
            for tensor in same_kind:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
