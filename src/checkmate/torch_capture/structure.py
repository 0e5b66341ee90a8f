"""When two traces of a training step have the same structure, so that a plan of one is a schedule of the other.

A plan is R and S over planning nodes (`checkmate.plan`): which node runs and which output is held in each stage.
It says nothing about sizes. Traced for a batch of other sizes (a smaller last batch, a shorter sequence), a step
usually runs the same ops on the same values; only the sizes given to views and reductions, and the tensors' shapes,
differ. Such a trace groups into the same planning nodes with the same edges, so the plan is a valid schedule of it,
and the simulator prices its memory at the new sizes.
"""

from __future__ import annotations

from checkmate.captured import Captured
from checkmate.torch_capture.trace import Trace


def structure_difference(like: Captured, trace: Trace) -> str | None:
    """The first way `trace` (prepared, `trace_prepared`) differs in structure from the capture `like`, for the log,
    or None when they have the same structure.

    Same structure: the joint fx graphs have the same nodes in the same order, each with the same name, kind (`op`),
    target (the ATen op) and input nodes in the same order; and the step has the same parameters, buffers, batch
    layout (pytree spec and number of tensors), loss, gradients (of parameters and batch tensors), buffer updates
    and other outputs of loss_fn. Everything else may differ: arguments that are not nodes (sizes, dims, Python
    scalars) and the tensors' shapes, strides and values. Then the trace groups into `like`'s planning nodes (grouping
    reads only ops and edges) and `like`'s plan is a schedule of it.
    """
    if (like.parameter_names, like.buffer_names) != (trace.parameter_names, trace.buffer_names):
        return "the parameters or buffers differ"
    if like.batch_spec != trace.batch_spec:
        return f"the batch's structure differs ({trace.batch_spec} against {like.batch_spec})"
    outputs = (like.loss, like.gradients, like.input_gradients, like.buffer_updates, like.region_outputs)
    if outputs != (trace.loss, trace.gradients, trace.input_gradients, trace.buffer_updates, trace.outputs):
        return "the loss, gradients, buffer updates or other outputs are other values"
    planned, traced = list(like.module.graph.nodes), list(trace.module.graph.nodes)
    if len(planned) != len(traced):
        return f"{len(traced)} fx nodes against {len(planned)}"
    for index, (old, new) in enumerate(zip(planned, traced, strict=True)):
        if (old.name, old.op, old.target) != (new.name, new.op, new.target):
            return f"fx node {index} is {new.name} ({new.target}) against {old.name} ({old.target})"
        old_inputs = [node.name for node in old.all_input_nodes]
        new_inputs = [node.name for node in new.all_input_nodes]
        if old_inputs != new_inputs:
            return f"fx node {new.name} reads {new_inputs} against {old_inputs}"
    return None
