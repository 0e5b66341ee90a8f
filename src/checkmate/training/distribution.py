"""How a compiled step runs across processes: the `Distribution` protocol, and the single process.

A compiled step (`checkmate.training.compiled.CompiledStep`) holds one distribution: `SingleProcess` here,
`checkmate.data_parallel.DataParallel` for a DistributedDataParallel model, `checkmate.sharded.Sharded` for a model
sharded with FSDP2's `fully_shard`. The step calls only this protocol; a distribution says

* planning: how a batch shape is planned (every rank together where the ranks must run one plan), and what it adds
  to the plan's fixed memory (`fixed_memory`) and to each stage's (FSDP2's gathered units, inside its planning);
* passes: which schedule passes it adds to a planned shape's program (`checkmate.execute.passes`), which hold its
  state for that shape, typed;
* running: what happens before each call (DDP's buffer broadcast), which tensors the step reads as parameters, where
  gradients go (and so which collectives run), and what a metered call starts with;
* memory: a planned shape's figures as the distribution holds it (`PlannedMemory`), which the report gives and a
  metered call is checked against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from checkmate.execute.gradients import GradientAccumulator, StepGradients
from checkmate.execute.memory import step_baseline
from checkmate.torch_capture.trace import LossFunction
from checkmate.training.planning import Compiled, Settings, plan_step


@dataclass(frozen=True)
class PlannedMemory:
    """A planned shape's memory as its distribution holds it.

    Attributes:
        no_remat_peak: the peak of the step without recomputation.
        budget: the budget in bytes it was planned within.
        planned_peak: the peak its plan predicts: what a metered call is checked against.
    """

    no_remat_peak: int
    budget: int
    planned_peak: int


class Distribution(Protocol):
    """What running the step over processes adds to the single-process step (see the module doc).

    Attributes:
        module: the module whose step is captured and planned (DDP: the wrapped one).
        plans_alone: a new batch shape is planned by this process alone, so it may run the plan of a larger shape
            (`checkmate.training.shape_reuse`); False where every rank must plan it together.
        fixed_memory: bytes the distribution holds beside the model's own tensors, counted in the plan's fixed
            memory (DDP's gradient buckets; FSDP2's shards in place of full parameters and gradients: negative).
        description: what it is, for messages ("the step", "the sharded step").
    """

    @property
    def module(self) -> nn.Module: ...

    @property
    def plans_alone(self) -> bool: ...

    @property
    def fixed_memory(self) -> int: ...

    @property
    def description(self) -> str: ...

    def plan(self, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings) -> Compiled:
        """`batch`'s step planned within `settings`, with this distribution's passes in its program and its step
        function generated.

        Raises:
            InfeasibleBudget: no plan of the method fits.
            RankFailed: planning failed on another rank.
        """
        ...

    def before_step(self) -> None:
        """Called at the start of each call, before the inputs are read."""
        ...

    def parameters(self, compiled: Compiled) -> list[torch.Tensor]:
        """The parameters a call reads and fills `.grad` of, in placeholder order."""
        ...

    def gradient_sink(self, compiled: Compiled, parameters: Sequence[torch.Tensor]) -> StepGradients:
        """Where a call's gradients go."""
        ...

    def baseline(self, leaves: Sequence[Any]) -> list[torch.Tensor]:
        """The tensors a metered call starts with that the plan counts as fixed (`checkmate.execute.memory`)."""
        ...

    def memory(self, compiled: Compiled) -> PlannedMemory:
        """`compiled`'s planned figures as this distribution holds it."""
        ...


@dataclass(frozen=True)
class SingleProcess:
    """One process: the plan's step as it is."""

    model: nn.Module
    plans_alone: bool = True
    fixed_memory: int = 0
    description: str = "the step"

    @property
    def module(self) -> nn.Module:
        return self.model

    def plan(self, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings) -> Compiled:
        return plan_step(self.model, loss_fn, batch, settings)

    def before_step(self) -> None:
        return None

    def parameters(self, compiled: Compiled) -> list[torch.Tensor]:
        """Those now in the model's slots (an optimizer's or a user's replacement is seen)."""
        return slotted_parameters(compiled)

    def gradient_sink(self, compiled: Compiled, parameters: Sequence[torch.Tensor]) -> StepGradients:
        """Into `.grad`, as eager autograd adds them."""
        return GradientAccumulator(parameters)

    def baseline(self, leaves: Sequence[Any]) -> list[torch.Tensor]:
        return step_baseline(self.model, leaves)

    def memory(self, compiled: Compiled) -> PlannedMemory:
        return plan_memory(compiled)


def slotted_parameters(compiled: Compiled) -> list[torch.Tensor]:
    """The parameters now in the slots of `compiled`'s captured parameters, in placeholder order."""
    return [getattr(module, name) for module, name in compiled.parameter_slots]


def plan_memory(compiled: Compiled) -> PlannedMemory:
    """The planned figures of a shape whose plan holds everything the step holds (no distribution around it)."""
    plan, no_remat = compiled.plan, compiled.no_remat
    budget = plan.budget if plan.budget is not None else no_remat.peak_memory
    return PlannedMemory(no_remat.peak_memory, budget, plan.peak_memory)
