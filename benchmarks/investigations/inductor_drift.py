"""Which Inductor-compiled nodes move a model's gradients away from eager's: one node compiled at a time.

    .venv/bin/python benchmarks/investigations/inductor_drift.py U-Net [--out]
    .venv/bin/python benchmarks/investigations/inductor_drift.py --from-json   # again from stored rows

Captures the named full-size model of `benchmarks/peers.py` as `executor="inductor"` does, compiles every node, then
runs one step without recomputation with only one node's Inductor function (the others as ATen ops), for every
node, and prints the nodes whose gradients differ from eager's by more than 1e-4 (relative to each parameter's
largest eager gradient), with the parameter where the difference is largest.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from checkmate import lower, solve
from checkmate.execute.program import run_schedule
from checkmate.inductor.kernels import compile_kernels
from checkmate.inductor.program import inductor_program
from checkmate.torch_capture import capture

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: rows and the scripts it shares
from peers_tools import prepare_model, workloads
from rows import Row, Stored, add_row_arguments, measure_or_load

THRESHOLD = 1e-4


def measure(name: str) -> Iterator[Row]:
    workload = next(workload for workload in workloads("full") if workload.name.startswith(name))
    model, loss_fn, batch = prepare_model(workload, torch.device("cpu"))
    reference = copy.deepcopy(model)
    loss_fn(reference, *batch).backward()
    expected = dict(reference.named_parameters())
    captured = capture(model, loss_fn, batch, fused=True, cost_model="flops")
    kernels = compile_kernels(captured)
    plan = solve(captured.graph, None, method="checkpoint_all")
    schedule = lower(captured.graph, plan.R, plan.S)
    state = dict(model.named_parameters()) | dict(model.named_buffers())

    def drift(compiled: set[int]) -> tuple[float, str]:
        chosen = tuple(
            kernel if kernel.index in compiled else dataclasses.replace(kernel, compiled=False) for kernel in kernels
        )
        inputs = [state[n].detach() for n in captured.parameter_names]
        inputs += [state[n].detach().clone() for n in captured.buffer_names] + list(batch)
        gradients: dict[int, torch.Tensor] = {}
        program = dataclasses.replace(inductor_program(captured, chosen, torch.device("cpu")), passes=())  # per node
        with torch.no_grad():
            run_schedule(program, schedule, inputs, on_gradient=gradients.__setitem__)
        worst = (0.0, "")
        for index, parameter in enumerate(captured.parameter_names):
            want = expected[parameter].grad
            if index in gradients and want is not None:
                error = ((gradients[index] - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
                worst = max(worst, (error, parameter))
        return worst

    everything = {kernel.index for kernel in kernels if kernel.compiled}
    yield {
        "model": workload.name,
        "compiled": len(everything),
        "all": drift(everything)[0],
        "none": drift(set())[0],
    }
    for index in sorted(everything):
        error, parameter = drift({index})
        yield {"node": index, "ops": captured.graph.nodes[index].name, "drift": error, "parameter": parameter}


def render(stored: Stored) -> str:
    summary, *nodes = stored.rows
    lines = [
        f"{summary['model']}: all {summary['compiled']} compiled nodes: {summary['all']:.1e}; "
        f"none: {summary['none']:.1e}",
        "| node | ops | drift | parameter |",
        "|---|---|---:|---|",
    ]
    for row in nodes:
        if row["drift"] > THRESHOLD:
            lines.append(f"| {row['node']} | {row['ops']} | {row['drift']:.1e} | {row['parameter']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="U-Net", help="a full-size model of benchmarks/peers.py")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "inductor_drift", lambda: measure(arguments.model), render)


if __name__ == "__main__":
    main()
