"""`checkmate capture PACKAGE.MODULE:FACTORY --out graph.json`: capture a model into a graph JSON.

The factory is called with no arguments and returns `(model, loss_fn, batch)`, as the factories in
`checkmate.zoo` do. The JSON it writes is what `checkmate solve` reads.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

from checkmate.byte_sizes import format_bytes
from checkmate.errors import CaptureError
from checkmate.files import write_file
from checkmate.options import CostModel, GradientMemory
from checkmate.torch_capture import capture

log = logging.getLogger(__name__)


def load_factory(target: str) -> Callable[[], Any]:
    """Resolve "package.module:factory" to the factory function."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise CaptureError(f"target {target!r} must look like PACKAGE.MODULE:FACTORY, for example checkmate.zoo:vgg")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CaptureError(f"cannot import {module_name!r} ({error}); is it on PYTHONPATH?") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise CaptureError(f"{module_name} has no callable {attribute!r}")
    return factory


def run_capture(
    target: str, out: str, cost_model: CostModel, max_nodes: int | None, gradient_memory: GradientMemory = "whole_step"
) -> int:
    """Capture the step built by `target`, write its graph JSON to `out`, print a summary; returns 0."""
    produced = load_factory(target)()
    if not isinstance(produced, tuple) or len(produced) != 3:
        raise CaptureError(f"{target} must return (model, loss_fn, batch), got {type(produced).__name__}")
    model, loss_fn, batch = produced
    started = time.perf_counter()
    captured = capture(
        model, loss_fn, batch, cost_model=cost_model, max_nodes=max_nodes, gradient_memory=gradient_memory
    )
    elapsed = time.perf_counter() - started
    graph = captured.graph
    write_file(out, graph.to_json())
    backward = sum(node.backward for node in graph.nodes)
    print(
        f"{target}: {graph.size} nodes ({graph.size - backward} forward, {backward} backward), "
        f"{len(captured.module.graph.nodes)} fx nodes, fixed memory {format_bytes(graph.fixed_memory)}, "
        f"cost model {cost_model}, captured in {elapsed:.2f} s -> {out}"
    )
    return 0
