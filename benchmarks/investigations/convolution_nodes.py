"""Planning nodes that are one convolution: compiled by Inductor against run as their ATen op, on the full-size CNNs of
`benchmarks/peers.py` (why `checkmate.inductor.kernels` never compiles them).

    .venv/bin/python benchmarks/investigations/convolution_nodes.py [--out]
    .venv/bin/python benchmarks/investigations/convolution_nodes.py --from-json   # again from stored rows

Per model and layout (as traced, and with the batch in channels-last, as `checkmate.compile` first captures a CNN for
`executor="inductor"`), the fused capture's nodes that are one convolution (forward or backward, with views:
`checkmate.torch_capture.fusion.convolution_call`), each distinct one compiled by Inductor alone (a fresh Inductor
cache, its kernels built together as `checkmate.inductor.kernels` builds them), then both ways measured by
`checkmate.inductor.measure` (graph order, real tensors, medians): the seconds spent compiling, the step's time in
those nodes compiled and as ATen ops, and the node whose compiled function is slowest against its ATen op.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import checkmate
from checkmate.inductor.kernels import GraphToCompile, NodeKernel, as_aten_ops, compile_graphs, node_graphs
from checkmate.inductor.measure import measure_kernels
from checkmate.torch_capture.channels_last import channels_last_step
from checkmate.torch_capture.fusion import convolution_call
from checkmate.torch_capture.trace import LossFunction

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from peers_tools import prepare_model, workloads
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load

CNNS = ("VGG (chain)", "ResNet", "U-Net", "ConvNeXt")


def measure() -> Iterator[Row]:
    torch.set_num_threads(1)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
    os.environ["CHECKMATE_CACHE_DIR"] = tempfile.mkdtemp()
    for workload in workloads("full"):
        if workload.name not in CNNS:
            continue
        model, loss_fn, batch = prepare_model(workload, torch.device("cpu"))
        for layout, step in (("contiguous", loss_fn), ("channels-last", channels_last_step(loss_fn))):
            yield {"model": workload.name, "layout": layout, **_measured(model, step, batch)}


def _measured(model: torch.nn.Module, loss_fn: LossFunction, batch: tuple[Any, ...]) -> Row:
    """Compile and measure the single-convolution nodes of a fused capture of `loss_fn`."""
    captured = checkmate.capture(model, loss_fn, batch, fused=True)
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    graphs = node_graphs(captured)
    convolutions = [index for index, members in enumerate(captured.members) if convolution_call(members, fx_nodes)]
    wanted = {
        graphs[index][3]: GraphToCompile(graphs[index][3], *graphs[index][:3], f"planning node {index}")
        for index in convolutions
    }
    started = time.perf_counter()
    functions = dict(zip(wanted, compile_graphs(list(wanted.values()), fx_nodes), strict=True))
    compile_seconds = time.perf_counter() - started
    aten = [as_aten_ops(NodeKernel(index, inputs, outputs, key, module, module, False))
            for index, (module, inputs, outputs, key) in enumerate(graphs)]  # fmt: skip
    compiled = list(aten)
    for index in convolutions:
        module, inputs, outputs, key = graphs[index]
        function = functions[key]
        if function is not None:
            compiled[index] = NodeKernel(index, inputs, outputs, key, module, function, True)
    parameters, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    values: list[torch.Tensor] = [parameters[name] for name in captured.parameter_names]
    values += [buffers[name] for name in captured.buffer_names] + list(batch)
    by_inductor = measure_kernels(captured, compiled, values, torch.device("cpu"))
    by_aten = measure_kernels(captured, aten, values, torch.device("cpu"))
    measured = [index for index in convolutions if compiled[index].compiled]
    ratios = [by_inductor[index].seconds / by_aten[index].seconds for index in measured]
    return {
        "nodes": len(convolutions),
        "distinct": len(wanted),
        "compile_s": compile_seconds,
        "inductor_ms": 1e3 * sum(by_inductor[index].seconds for index in measured),
        "aten_ms": 1e3 * sum(by_aten[index].seconds for index in measured),
        "fastest_ratio": min(ratios),
        "slowest_ratio": max(ratios),
    }


def render(stored: Stored) -> str:
    header = [
        "model", "layout", "convolution nodes (distinct)", "Inductor compile s", "step ms in them: compiled",
        "as ATen ops", "compiled / ATen, per node: best", "worst",
    ]  # fmt: skip
    lines = [
        [
            row["model"],
            row["layout"],
            f"{row['nodes']} ({row['distinct']})",
            f"{row['compile_s']:.1f}",
            f"{row['inductor_ms']:.1f}",
            f"{row['aten_ms']:.1f}",
            f"{row['fastest_ratio']:.2f}",
            f"{row['slowest_ratio']:.2f}",
        ]
        for row in stored.rows
    ]
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser)
    measure_or_load(parser.parse_args(), "convolution_nodes", measure, render)


if __name__ == "__main__":
    main()
