"""Which Inductor-compiled nodes move a model's gradients away from eager's: one node compiled at a time.

    .venv/bin/python benchmarks/inductor_drift.py U-Net

Captures the named full-size model of `benchmarks/peers.py` as `executor="inductor"` does, compiles every node, then
runs one step without recomputation with only one node's Inductor function (the others as ATen ops), for every
node, and prints the nodes whose gradients differ from eager's by more than 1e-4 (relative to each parameter's
largest eager gradient), with the parameter where the difference is largest.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

import torch

from checkmate import lower, solve
from checkmate.execute.interpreter import run_schedule
from checkmate.inductor.kernels import compile_kernels
from checkmate.inductor.program import inductor_program
from checkmate.torch_capture import capture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_tools import prepare_model, workloads

THRESHOLD = 1e-4


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "U-Net"
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
        program = dataclasses.replace(inductor_program(captured, chosen, torch.device("cpu")), fuse=None)  # per node
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
    together, alone = drift(everything)[0], drift(set())[0]
    print(f"{workload.name}: all {len(everything)} compiled nodes: {together:.1e}; none: {alone:.1e}")
    print("| node | ops | drift | parameter |")
    print("|---|---|---:|---|")
    for index in sorted(everything):
        error, parameter = drift({index})
        if error > THRESHOLD:
            print(f"| {index} | {captured.graph.nodes[index].name} | {error:.1e} | {parameter} |")


if __name__ == "__main__":
    main()
