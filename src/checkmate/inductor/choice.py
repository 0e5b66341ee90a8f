"""A node with a library kernel runs the faster of its Inductor function and its own ATen ops, as measured.

Inductor's code for one planning node is not always faster than ATen's kernels (on a CPU, a depthwise convolution's
backward or a matrix product can run slower compiled than as library calls: BENCHMARKS.md, "Time as Inductor runs it"),
and a plan priced by the slower pays for it at every step. A node that is one convolution is never compiled
(`checkmate.inductor.kernels`); every other node with a library kernel (a matrix product, attention, a convolution with
other ops: `checkmate.torch_capture.fusion.fusible` is False) is measured both ways (`checkmate.inductor.measure`, each
cached by its own key), and runs as its ATen ops where they save more than MARGIN of its function's time and more than
MIN_SAVING seconds, as a node Inductor could not compile does: priced by that measure (time, memory, workspace), and
outside every fused run of the schedule (`checkmate.inductor.segments` fuses compiled nodes only). A node Inductor fuses
stays compiled: what it gains in a fused run with its neighbours is in neither measure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from checkmate.captured import Captured
from checkmate.inductor.kernels import NodeKernel, as_aten_ops
from checkmate.inductor.measure import KernelMeasure, measure_kernels
from checkmate.torch_capture.fusion import fusible

log = logging.getLogger(__name__)

# A node runs as ATen ops (and a run of the schedule unfused, `checkmate.inductor.segments`) only when that measures
# faster by more than this fraction and these seconds: the two are measured in separate passes (medians of
# `measure.REPEATS` calls), whose sub-millisecond figures move by tens of microseconds beside another process on this
# machine, and a node that leaves Inductor also leaves the fused runs, whose savings are in neither measure.
MARGIN = 0.1
MIN_SAVING = 100e-6


def faster_kernels(
    captured: Captured, kernels: Sequence[NodeKernel], inputs: Sequence[Any], device: torch.device
) -> tuple[tuple[NodeKernel, ...], tuple[KernelMeasure, ...]]:
    """Each node's kernel and measure: its Inductor function's, or, for a node with a library kernel, its ATen ops'
    where those are faster."""
    compiled = measure_kernels(captured, kernels, inputs, device)
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    candidates = [
        kernel.compiled and not fusible(members, fx_nodes)
        for kernel, members in zip(kernels, captured.members, strict=True)
    ]
    alternatives = [as_aten_ops(kernel) if can else kernel for kernel, can in zip(kernels, candidates, strict=True)]
    aten = measure_kernels(captured, alternatives, inputs, device)
    chosen = [
        (alternative, by_aten) if can and saves_enough(by_aten.seconds, by_inductor.seconds) else (kernel, by_inductor)
        for kernel, alternative, can, by_inductor, by_aten in zip(
            kernels, alternatives, candidates, compiled, aten, strict=True
        )
    ]
    switched = sum(1 for kernel, (made, _) in zip(kernels, chosen, strict=True) if made.compiled != kernel.compiled)
    if switched:
        seconds = sum(measure.seconds for _, measure in chosen)
        log.info(
            "Inductor: %d of %d nodes run as ATen ops, faster than their compiled functions (%.1f ms a step without "
            "recomputation, %.1f ms with every function compiled)",
            switched,
            len(kernels),
            1e3 * seconds,
            1e3 * sum(measure.seconds for measure in compiled),
        )
    return tuple(kernel for kernel, _ in chosen), tuple(measure for _, measure in chosen)


def saves_enough(faster: float, slower: float) -> bool:
    """Whether a way that takes `faster` seconds saves enough over one that takes `slower` to choose it by
    measurement: more than MARGIN of `slower`, and more than MIN_SAVING."""
    saving = slower - faster
    return saving > MARGIN * slower and saving > MIN_SAVING
