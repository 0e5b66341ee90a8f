"""The options a compiled step captures with: each keyword of `checkmate.torch_capture.capture`, named and typed.

The executor fixes some (`checkmate.executors.protocol.Executor.capture_options`), `checkmate.compile`'s arguments
others, and a capture choice `lean_backward` (`Executor.capture_choices`).
"""

from __future__ import annotations

from dataclasses import dataclass

from checkmate.options import CostModel, GradientMemory


@dataclass(frozen=True)
class CaptureOptions:
    """The keywords `checkmate.torch_capture.capture` is called with (its docstring says what each does).

    Attributes:
        cost_model: how capture prices ops: "profile", "flops" or "unit".
        max_nodes: merge cheap neighbouring nodes until at most this many remain (None: no merging).
        gradient_memory: "whole_step" or "when_made": when the plan counts the parameters' gradients.
        fused: group ops as Inductor fuses them (the Inductor executor).
        lean_backward: let ReLU and max-pool backward read a mask and a shape instead of forward tensors.
    """

    cost_model: CostModel = "profile"
    max_nodes: int | None = None
    gradient_memory: GradientMemory = "whole_step"
    fused: bool = False
    lean_backward: bool = False
