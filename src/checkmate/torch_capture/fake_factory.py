"""Planning graphs of a model factory at any batch size, without allocating the model, the batch or activations.

    graph_at = fake_graph_at(checkmate.zoo.vgg19, cost_model="flops")
    graph_at(1024)   # VGG19's training graph at batch 1024, its activations never allocated

The factory is called under a `FakeTensorMode`: its weights and batch are fake tensors that carry shapes and dtypes
but no storage, and `checkmate.capture` traces them as it traces any model. This is what `checkmate.max_batch`
captures at each candidate batch size. Fake tensors run no kernel, so these graphs count no kernel scratch (the
memory a kernel holds inside itself, which the "profile" cost model measures on real tensors).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from checkmate.errors import CaptureError
from checkmate.graph import Graph
from checkmate.options import FakeCostModel, choices
from checkmate.torch_capture import capture


def fake_graph_at(
    factory: Callable[..., Any], *, cost_model: FakeCostModel = "flops", **factory_options: Any
) -> Callable[[int], Graph]:
    """A function from batch size to the planning graph of `factory(batch_size=n, **factory_options)`'s step.

    It captures each size once (later calls at the same size return the same graph).

    Args:
        factory: returns `(model, loss_fn, batch)`, as the factories of `checkmate.zoo` do, and builds its tensors
            with torch's factory functions and modules (which a FakeTensorMode intercepts).
        cost_model: "flops" or "unit".
        **factory_options: more keyword arguments for the factory.

    Raises:
        CaptureError: a cost model that needs real tensors, or a factory that does not return a training step.
    """
    if cost_model not in choices(FakeCostModel):
        raise CaptureError(
            f"cost model {cost_model!r} cannot price a step on fake tensors; "
            f"use one of {', '.join(choices(FakeCostModel))}"
        )

    @functools.cache
    def graph_at(batch_size: int) -> Graph:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            model, loss_fn, batch = training_step(factory, batch_size, **factory_options)
        return capture(model, loss_fn, batch, cost_model=cost_model).graph

    return graph_at


def training_step(factory: Callable[..., Any], batch_size: int, **factory_options: Any) -> tuple[Any, Any, Any]:
    """`factory(batch_size=batch_size, **factory_options)`: the `(model, loss_fn, batch)` of a training step.

    Raises:
        CaptureError: the factory returned something else.
    """
    produced = factory(batch_size=batch_size, **factory_options)
    if not isinstance(produced, tuple) or len(produced) != 3:
        raise CaptureError(
            f"{getattr(factory, '__name__', factory)!r} must return (model, loss_fn, batch), "
            f"got {type(produced).__name__}"
        )
    return produced
