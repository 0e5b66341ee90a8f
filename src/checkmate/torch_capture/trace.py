"""Trace one training step into a functional joint forward + backward ATen graph, on fake tensors.

AOTAutograd does the work (`aot_export_module(..., trace_joint=True)`): it runs the step under a
FakeTensorMode, so no activation is ever allocated, functionalizes it (BatchNorm's running-statistic
updates become ordinary outputs instead of in-place mutations of placeholders) and records the
backward pass that autograd would run. The placeholders come out as parameters, buffers, then the
flattened batch, which is the order the Captured contract promises.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from checkmate.errors import CaptureError
from checkmate.torch_capture.attribute_reads import AttributeRead, attribute_reads, recording_reads
from checkmate.torch_capture.loss_output import LossOutput, split_loss_output
from checkmate.torch_capture.model_state import ModelState, distinct_state, parameters_without_gradient
from checkmate.torch_capture.trace_errors import explain_trace_error, raised_in_checkmate
from checkmate.torch_capture.tracing_context import tracing_ahead_of_time

log = logging.getLogger(__name__)

LossFunction = Callable[..., Any]

_PARAMETER = "parameter_"
_BUFFER = "buffer_"
_BATCH = "batch tensor "


@dataclass(frozen=True)
class Trace:
    """The functional joint graph of one step and the names of what enters and leaves it.

    Attributes:
        module: the joint graph; placeholders are parameters, buffers, then batch leaves.
        parameter_names: model parameter names in placeholder order.
        buffer_names: model buffer names in placeholder order.
        batch_shapes: (shape, dtype name) of each flattened batch tensor.
        batch_spec: the pytree spec of the batch.
        loss: fx name of the scalar loss.
        gradients: for each parameter, the fx name of its gradient (None when it gets none).
        buffer_updates: for each buffer, the fx name of its new value (None when unchanged).
        attribute_reads: the module attributes the traced code read (`checkmate.torch_capture.attribute_reads`).
        input_gradients: for each batch leaf, the fx name of its gradient (None when it requires none).
        outputs: fx names of the other tensors loss_fn returned beside the loss, detached.
        loss_output: how loss_fn's result is rebuilt from the loss and `outputs`.
    """

    module: torch.fx.GraphModule
    parameter_names: tuple[str, ...]
    buffer_names: tuple[str, ...]
    batch_shapes: tuple[tuple[tuple[int, ...], str], ...]
    batch_spec: Any
    loss: str
    gradients: tuple[str | None, ...]
    buffer_updates: tuple[str | None, ...]
    attribute_reads: tuple[AttributeRead, ...]
    input_gradients: tuple[str | None, ...]
    outputs: tuple[str, ...]
    loss_output: LossOutput


class _Step(nn.Module):
    """`loss_fn(model, *batch)` as a module over the flattened batch, returning `(loss, *other tensors detached)`
    (`checkmate.torch_capture.loss_output`; `loss_output` says how to rebuild loss_fn's result).

    The model's distinct parameters and buffers are this module's own, under positional names (`parameter_3`), and
    the model itself is held outside the module tree: AOTAutograd lifts each tensor once however many names the
    model gives it. The forward swaps them into the model for the call with `_reparametrize_module`, the context
    manager behind `torch.func.functional_call` (which can only call the model's own forward, not `loss_fn`);
    `tie_weights=True` gives every name of a shared tensor the one lifted tensor. The model runs as under
    torch.export (`tracing_context`), so library code takes its tracing paths.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFunction, batch_spec: Any, state: ModelState) -> None:
        super().__init__()
        self.held = (model,)
        self.loss_fn = loss_fn
        self.batch_spec = batch_spec
        self.parameter_names = tuple(state.parameters)
        self.buffer_names = tuple(state.buffers)
        for index, parameter in enumerate(state.parameters.values()):
            self.register_parameter(f"{_PARAMETER}{index}", parameter)
        for index, buffer in enumerate(state.buffers.values()):
            self.register_buffer(f"{_BUFFER}{index}", buffer)
        self.loss_output: LossOutput | None = None

    def forward(self, *leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        loss, others, self.loss_output = split_loss_output(self.result(leaves))
        return (loss, *others)

    def result(self, leaves: Sequence[torch.Tensor]) -> Any:
        own = dict(self.named_parameters()) | dict(self.named_buffers())
        state = {name: own[f"{_PARAMETER}{index}"] for index, name in enumerate(self.parameter_names)}
        state |= {name: own[f"{_BUFFER}{index}"] for index, name in enumerate(self.buffer_names)}
        batch = pytree.tree_unflatten(list(leaves), self.batch_spec)
        with (
            tracing_ahead_of_time(),
            torch.nn.utils.stateless._reparametrize_module(self.held[0], state, tie_weights=True),
        ):
            return self.loss_fn(self.held[0], *batch)


def flatten_batch(batch: Sequence[Any]) -> tuple[list[torch.Tensor], Any]:
    """Flatten a batch (a tuple of tensors, dicts, lists...) into tensor leaves and a spec."""
    leaves, spec = pytree.tree_flatten(tuple(batch))
    for index, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            raise CaptureError(
                f"batch leaf {index} is a {type(leaf).__name__}, not a tensor: pass only tensors in the batch "
                "and bind other arguments (flags, sizes) inside loss_fn"
            )
    return leaves, spec


def trace_step(model: nn.Module, loss_fn: LossFunction, batch: Sequence[Any]) -> Trace:
    """Trace `loss_fn(model, *batch)` and its backward with fake tensors into a functional joint graph."""
    from torch._functorch.aot_autograd import aot_export_module

    leaves, spec = flatten_batch(batch)
    fake_model, fake_leaves = _fake_copies(model, leaves)
    state = distinct_state(fake_model)
    step = _Step(fake_model, loss_fn, spec, state)
    with recording_reads() as reads:
        inputs = {f"{_BATCH}{index}": leaf for index, leaf in enumerate(fake_leaves) if leaf.requires_grad}
        for name in _without_gradient(step, fake_leaves, {**state.parameters, **inputs}):
            (state.parameters[name] if name in state.parameters else inputs[name]).requires_grad_(False)
        with _explaining_failures():
            module, signature = aot_export_module(step, fake_leaves, trace_joint=True, output_loss_index=0)
    if not isinstance(module, torch.fx.GraphModule) or signature.backward_signature is None:
        raise CaptureError("internal: AOTAutograd returned no joint graph; is any parameter trainable?")
    model_name = {f"{_PARAMETER}{index}": name for index, name in enumerate(state.parameters)}
    model_name |= {f"{_BUFFER}{index}": name for index, name in enumerate(state.buffers)}
    _check_signature(signature, model_name)
    gradient_of = {param: out for out, param in signature.backward_signature.gradients_to_parameters.items()}
    update_of = {buffer: out for out, buffer in signature.buffers_to_mutate.items()}
    input_gradient_of = {leaf: out for out, leaf in signature.backward_signature.gradients_to_user_inputs.items()}
    loss, *outputs = signature.user_outputs
    _check_loss(module, loss)
    assert step.loss_output is not None
    return Trace(
        module=module,
        parameter_names=tuple(model_name[name] for name in signature.parameters),
        buffer_names=tuple(model_name[name] for name in signature.buffers),
        batch_shapes=tuple((tuple(leaf.shape), str(leaf.dtype).removeprefix("torch.")) for leaf in leaves),
        batch_spec=spec,
        loss=loss,
        gradients=tuple(gradient_of.get(name) for name in signature.parameters),
        buffer_updates=tuple(update_of.get(name) for name in signature.buffers),
        attribute_reads=attribute_reads(reads, fake_model, loss_fn),
        input_gradients=tuple(input_gradient_of.get(name) for name in signature.user_inputs),
        outputs=tuple(outputs),
        loss_output=step.loss_output,
    )


def _without_gradient(
    step: _Step, fake_leaves: list[torch.Tensor], trainable: dict[str, torch.Tensor]
) -> frozenset[str]:
    """The trainable parameters and batch tensors the loss does not depend on, from one forward and backward on the
    fake copy."""
    with _explaining_failures():
        return parameters_without_gradient(lambda: step(*fake_leaves)[0], trainable)


def _fake_copies(model: nn.Module, leaves: list[torch.Tensor]) -> tuple[nn.Module, list[torch.Tensor]]:
    """A copy of the model whose parameters and buffers are fake tensors, and fake batch leaves.

    AOTAutograd given real tensors runs the step for real (it would allocate every activation);
    given fake ones it only propagates shapes.
    """
    import copy

    from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with FakeCopyMode(fake_mode):
            fake_model = copy.deepcopy(model)
    except Exception as error:
        if raised_in_checkmate(error):
            raise
        raise CaptureError(
            f"cannot copy the model onto fake tensors ({type(error).__name__}: {error}); "
            "the model must support copy.deepcopy"
        ) from error
    return fake_model, [fake_mode.from_tensor(leaf.detach()).requires_grad_(leaf.requires_grad) for leaf in leaves]


def _check_signature(signature: Any, model_name: dict[str, str]) -> None:
    mutated = [model_name[name] for name in signature.parameters_to_mutate.values()]
    mutated += [
        f"batch tensor {signature.user_inputs.index(name)}" for name in signature.user_inputs_to_mutate.values()
    ]
    if mutated:
        raise CaptureError(
            f"the step mutates {mutated[0]} in place; checkmate plans a functional step: "
            "clone the tensor before changing it, or move the update out of loss_fn"
        )


def _check_loss(module: torch.fx.GraphModule, loss: str) -> None:
    node = next(node for node in module.graph.nodes if node.name == loss)
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise CaptureError(f"loss_fn must return a scalar tensor, got {shape}: reduce the loss (e.g. .mean())")


@contextlib.contextmanager
def _explaining_failures() -> Iterator[None]:
    """Turn a failure of the user's code or of torch's tracer into the CaptureError that explains it; a CaptureError,
    or an error raised in checkmate's own code (a bug of ours), passes unchanged."""
    try:
        yield
    except CaptureError:
        raise
    except Exception as error:
        if raised_in_checkmate(error):
            raise
        raise _explained(error) from None


def _explained(error: Exception) -> CaptureError:
    """The CaptureError for a tracing failure (raise it `from None`: the message names the construct, the model line
    and the fix; the traceback from inside the tracer is logged at DEBUG for a bug report)."""
    log.debug("tracing failed", exc_info=error)
    return CaptureError(explain_trace_error(error))
