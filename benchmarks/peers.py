"""Side by side with the tools PyTorch users have today: at the memory I have, which tool trains fastest?

    # reduced run (small models, 3 repetitions; about half an hour on the shared 2-core box)
    .venv/bin/python benchmarks/peers.py --quick --repeats 3 \
        --out benchmarks/results/peers_quick.json --plot docs/peers_quick.png
    # full run (run it on a quiet machine; about 1.5 h on 2 CPU cores, most of it torch.compile and the solves)
    .venv/bin/python benchmarks/peers.py --out benchmarks/results/peers.json --plot docs/peers.png
    # the same comparison on a GPU (meter: torch.cuda.max_memory_allocated)
    .venv/bin/python benchmarks/peers.py --device cuda \
        --out benchmarks/results/peers_cuda.json --plot docs/peers_cuda.png
    # tables and plot again from saved rows, without measuring
    .venv/bin/python benchmarks/peers.py --from-json benchmarks/results/peers.json --plot docs/peers.png

For each model (a chain-like VGG, a ResNet, a U-Net and a GPT from `checkmate.zoo`) it runs one training step
(forward + backward, gradients into `.grad`) with:

* eager PyTorch, no recomputation;
* `torch.utils.checkpoint`: `checkpoint_sequential` over several segment counts on the chain-like model, `checkpoint`
  on every, every 2nd and every 4th block elsewhere;
* selective activation checkpointing (`create_selective_checkpoint_contexts`) on the same regions with two usual
  policies: save the compute-heavy ops (matmuls, convolutions, attention) and recompute the rest, and TorchTitan's
  op policy (save attention and every other matmul, here also every other convolution);
* `torch.compile` (Inductor, its caches off and a fresh `TORCHINDUCTOR_CACHE_DIR`, so compile times include building
  its kernels) at several `torch._functorch.config.activation_memory_budget` values;
* ours, `checkmate.compile` with `optimal` and `approx` (profiled op costs), with each peer's measured peak as budget.

One meter for every tool: on CPU the peak of bytes allocated through PyTorch's CPU allocator during the step, read
from the profiler's allocation events (`torch.profiler.profile(profile_memory=True)`), which also sees what
Inductor-compiled code allocates; on CUDA `torch.cuda.max_memory_allocated` over the step. Both add the bytes alive
when the step starts (parameters, buffers, the batch; `.grad` is None). Memory is measured on a separate call from
the timed ones. Step times are medians of interleaved calls (each round calls every configuration once, in a
shuffled order). Every configuration's gradients are compared with eager's on its first call.

The models are made comparable for every tool: dropout is off (p = 0; Inductor draws other random numbers than
eager, so gradients could not be compared) and activations are not in-place (`checkpoint_sequential` and SAC fail
on the zoo's `ReLU(inplace=True)`: a checkpointed segment's input, or a tensor SAC cached, is modified in place).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import gc
import itertools
import json
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

import checkmate
from checkmate import zoo
from checkmate.execute.memory import measure_peak, step_baseline, storage_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_report import Row, render

log = logging.getLogger("peers")

Factory = Callable[[], tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]]


@dataclass(frozen=True)
class Workload:
    """A model of the comparison: how to build it, its checkpoint blocks, and its layers as one chain if it is one."""

    name: str
    factory: Factory
    blocks: Callable[[nn.Module], list[nn.Module]]
    chain: Callable[[nn.Module], nn.Sequential] | None = None


def _children(model: nn.Module, name: str) -> list[nn.Module]:
    return list(model.get_submodule(name).children())


def _vgg_chain(model: nn.Module) -> nn.Sequential:
    return nn.Sequential(*_children(model, "features"), *_children(model, "classifier"))


def _unet_blocks(model: nn.Module) -> list[nn.Module]:
    return [*_children(model, "down"), model.get_submodule("bottleneck"), *_children(model, "up")]


def _resnet_blocks(model: nn.Module) -> list[nn.Module]:
    return [model.get_submodule("stem"), *_children(model, "stages")]


def _gpt_blocks(model: nn.Module) -> list[nn.Module]:
    return _children(model, "blocks")


def workloads(size: str) -> list[Workload]:
    """The four models at `size`: "quick" (a step of ~20-40 ms on one CPU thread), "full" (~50-500 ms on one CPU
    thread) or "gpu" (sizes for one large GPU)."""
    sizes: dict[str, tuple[Factory, Factory, Factory, Factory]] = {
        "quick": (
            lambda: zoo.vgg(16, image_size=32, width=16),
            lambda: zoo.resnet(16, image_size=32, width=16, blocks=(1, 1, 1)),
            lambda: zoo.unet(4, image_size=(32, 48), width=1 / 16),
            lambda: zoo.gpt(8, length=128, dim=64, heads=4, layers=2, vocab=128, dropout=0.0),
        ),
        "full": (
            lambda: zoo.vgg(32, image_size=32, width=16),
            lambda: zoo.resnet(32, image_size=32, width=16, blocks=(2, 2, 2)),
            lambda: zoo.unet(4, image_size=(64, 96), width=1 / 8),
            lambda: zoo.gpt(8, length=128, dim=128, heads=4, layers=4, vocab=512, dropout=0.0),
        ),
        "gpu": (
            lambda: zoo.vgg(256, image_size=64, width=64),
            lambda: zoo.resnet(256, image_size=64, width=64, blocks=(2, 2, 2, 2)),
            lambda: zoo.unet(16, image_size=(256, 384), width=1 / 2),
            lambda: zoo.gpt(16, length=1024, dim=768, heads=12, layers=6, vocab=8192, dropout=0.0),
        ),
    }
    vgg, resnet, unet, gpt = sizes[size]
    return [
        Workload("VGG (chain)", vgg, lambda model: [model], _vgg_chain),
        Workload("ResNet", resnet, _resnet_blocks),
        Workload("U-Net", unet, _unet_blocks),
        Workload("GPT", gpt, _gpt_blocks),
    ]


class Meter:
    """One meter for every tool: the step's peak bytes, counting what is alive at its start (`baseline`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.name = (
            "torch.cuda.max_memory_allocated"
            if device.type == "cuda"
            else "CPU allocator events (torch.profiler, profile_memory=True)"
        )

    def measure(self, run: Callable[[], None], baseline: Sequence[torch.Tensor]) -> int:
        gc.collect()
        if self.device.type == "cuda":
            with measure_peak(self.device, baseline) as meter:
                run()
            return meter.peak_bytes
        return storage_bytes(baseline) + allocator_peak(run)


def allocator_peak(run: Callable[[], None]) -> int:
    """Peak bytes allocated through c10's CPU allocator while `run` runs, above what was allocated at its start.

    Every CPU tensor allocation, whether made by an eager op, inside a kernel, or by Inductor-generated code
    (`empty_strided_cpu`), goes through the allocator, which reports it to the profiler when memory profiling is
    on; each event carries the allocator's running total. Frees of blocks allocated before profiling started are
    not reported, so a step that frees memory it did not allocate would read high, never low.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events: list[tuple[int, int, int]] = []

    def walk(event: Any) -> None:
        fields = event.extra_fields
        if isinstance(fields, torch._C._profiler._ExtraFields_Allocation) and fields.device.type == "cpu":
            events.append((event.start_time_ns, fields.alloc_size, fields.total_allocated))
        for child in event.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    if not events:
        return 0
    events.sort()
    start = events[0][2] - events[0][1]
    return max(total for _, _, total in events) - start


@dataclass
class Candidate:
    """One configuration of one tool, ready to run: `run()` does forward + backward into `model`'s `.grad`."""

    tool: str
    config: str
    model: nn.Module
    run: Callable[[], None]
    knob: float | None = None
    predicted_peak: int | None = None
    setup_s: float | None = None
    solve_s: float | None = None
    budget: int | None = None
    own_meter_peak: int | None = None
    note: str = ""
    grad_error: float | None = None
    grads_bitwise: bool = False
    measured_peak: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    """What every tool function gets: the prepared model (not to be changed), its loss, batch and options."""

    workload: Workload
    model: nn.Module
    loss_fn: Callable[..., torch.Tensor]
    batch: tuple[torch.Tensor, ...]
    device: torch.device
    args: argparse.Namespace


def prepare_model(workload: Workload, device: torch.device) -> tuple[nn.Module, Callable[..., Any], tuple[Any, ...]]:
    """Build the workload with dropout off and no in-place activations, in training mode, on `device`."""
    model, loss_fn, batch = workload.factory()
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if hasattr(module, "inplace"):
            setattr(module, "inplace", False)  # noqa: B010 - not every module declares it
    model.train().to(device)
    return model, loss_fn, tuple(tensor.to(device) for tensor in batch)


def _plain_step(model: nn.Module, setting: Setting) -> Callable[[], None]:
    def run() -> None:
        setting.loss_fn(model, *setting.batch).backward()

    return run


def eager_candidates(setting: Setting) -> list[Candidate]:
    """Eager PyTorch: no recomputation. Its own-meter peak is our TorchDispatchMode meter (CPU), for agreement."""
    model = copy.deepcopy(setting.model)
    candidate = Candidate("eager", "no recomputation", model, _plain_step(model, setting), knob=1.0)
    if setting.device.type == "cpu":
        baseline = step_baseline(model, setting.batch)
        with measure_peak(setting.device, baseline) as meter:
            candidate.run()
        model.zero_grad(set_to_none=True)
        candidate.own_meter_peak = meter.peak_bytes
    return [candidate]


def checkpoint_candidates(setting: Setting) -> list[Candidate]:
    """`checkpoint_sequential` over segment counts on a chain, else `checkpoint` on every k-th block."""
    workload, args = setting.workload, setting.args
    candidates = []
    if workload.chain is not None:
        length = len(workload.chain(setting.model))
        for segments in sorted({s for s in args.segments if s <= length}):
            model = copy.deepcopy(setting.model)
            chain = workload.chain(model)
            model.forward = functools.partial(checkpoint_sequential, chain, segments, use_reentrant=False)
            candidates.append(
                Candidate("checkpoint", f"checkpoint_sequential, {segments} segments", model,
                          _plain_step(model, setting), knob=segments)
            )  # fmt: skip
        return candidates
    count = len(workload.blocks(setting.model))
    seen: set[tuple[int, ...]] = set()
    for stride in args.strides:
        chosen = tuple(range(0, count, stride))
        if chosen in seen:
            continue
        seen.add(chosen)
        model = copy.deepcopy(setting.model)
        blocks = workload.blocks(model)
        for index in chosen:
            blocks[index].forward = functools.partial(checkpoint, blocks[index].forward, use_reentrant=False)
        label = "every block" if stride == 1 else f"every {_ordinal(stride)} block"
        candidates.append(
            Candidate("checkpoint", f"checkpoint {label} ({len(chosen)}/{count})", model,
                      _plain_step(model, setting), knob=stride)
        )  # fmt: skip
    return candidates


def _ordinal(number: int) -> str:
    return {2: "2nd", 3: "3rd"}.get(number, f"{number}th")


def _ops(*names: str) -> set[Any]:
    """The aten overloads named, skipping those this build lacks (attention kernels differ by device)."""
    found = set()
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(torch.ops.aten, packet, None)
        if op is not None and hasattr(op, overload or "default"):
            found.add(getattr(op, overload or "default"))
    return found


ATTENTION_OPS = _ops(
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
MATMUL_OPS = _ops("mm", "addmm", "bmm", "convolution")


def save_heavy_policy() -> Any:
    """Save matmuls, convolutions and attention; recompute everything else (pointwise ops, norms, pooling)."""

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in MATMUL_OPS or op in ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def titan_policy() -> Any:
    """TorchTitan's op-level SAC: save attention and every other matmul (here convolutions count as matmuls)."""
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        if op in MATMUL_OPS:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            if counts[key] % 2 == 1:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


SAC_POLICIES: dict[str, Callable[[], Any]] = {
    "save matmul/conv/attention": save_heavy_policy,
    "TorchTitan: every other matmul/conv": titan_policy,
}


def sac_candidates(setting: Setting) -> list[Candidate]:
    """Selective activation checkpointing with each policy over every checkpoint block (the whole model on a chain)."""
    candidates = []
    for index, (name, context_fn) in enumerate(SAC_POLICIES.items()):
        model = copy.deepcopy(setting.model)
        blocks = setting.workload.blocks(model)
        for block in blocks:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False, context_fn=context_fn)
        region = "the whole model" if setting.workload.chain is not None else f"each of {len(blocks)} blocks"
        candidates.append(
            Candidate("SAC", f"{name} ({region})", model, _plain_step(model, setting), knob=index)
        )  # fmt: skip
    return candidates


class SavedBytesRecorder:
    """Wraps the min-cut partitioner to record the bytes of activations each partition keeps for the backward.

    This is the quantity `activation_memory_budget` controls (the knapsack's memory), the nearest thing the tool
    has to a memory prediction. Saved parameters and inputs are not counted (they are alive anyway).
    """

    def __init__(self) -> None:
        self.saved_bytes: list[int] = []

    def make(self) -> Any:
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch._inductor.custom_graph_pass import CustomPartitionerFn

        recorder = self

        class Recording(CustomPartitionerFn):
            def __call__(self, gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any) -> Any:
                forward, backward = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
                recorder.saved_bytes.append(_saved_activation_bytes(forward, kwargs["num_fwd_outputs"]))
                return forward, backward

            def uuid(self) -> Any:
                return None

        return Recording()


def _saved_activation_bytes(forward: torch.fx.GraphModule, forward_outputs: int) -> int:
    placeholders = {node for node in forward.graph.nodes if node.op == "placeholder"}
    output = next(node for node in forward.graph.nodes if node.op == "output")
    total = 0
    for node in output.args[0][forward_outputs:]:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if node in placeholders or not isinstance(value, torch.Tensor):
            continue
        total += value.untyped_storage().nbytes() if value.is_contiguous() else value.numel() * value.element_size()
    return int(total)


_STEP_NUMBERS = itertools.count()


def compile_candidates(setting: Setting) -> list[Candidate]:
    """`torch.compile` (Inductor) of the loss, with `activation_memory_budget` over its range; caches off.

    Each budget gets its own code object for the step, so that Dynamo never reuses a graph compiled under another
    budget; `fullgraph=True` keeps the whole step in that one frame and `dynamic=False` keeps shapes static. The
    first call (compile, forward, backward) runs under the budget and is timed as compile time.
    """
    import torch._dynamo
    import torch._functorch.config
    import torch._inductor.config

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    candidates = []
    for budget in setting.args.compile_budgets:
        model = copy.deepcopy(setting.model)
        namespace: dict[str, Any] = {"loss_fn": setting.loss_fn, "model": model}
        source = "def step(*batch):\n    return loss_fn(model, *batch)\n"
        # A file name of its own: Dynamo keys automatic dynamic shapes on (file, line, name), and a shared key would
        # make it recompile the next model with symbolic shapes.
        filename = f"<peers step: {setting.workload.name}, budget {budget}, {next(_STEP_NUMBERS)}>"
        exec(compile(source, filename, "exec"), namespace)
        step: Callable[..., torch.Tensor] = namespace["step"]
        compiled = torch.compile(step, fullgraph=True, dynamic=False, backend=setting.args.compile_backend)
        recorder = SavedBytesRecorder()
        inductor_options: dict[str, Any] = {"fx_graph_cache": False}
        if setting.args.compile_backend == "inductor":
            inductor_options["custom_partitioner_fn"] = recorder.make()

        def run(compiled: Callable[..., torch.Tensor] = compiled) -> None:
            compiled(*setting.batch).backward()

        started = time.perf_counter()
        try:
            with (
                torch._functorch.config.patch(activation_memory_budget=budget, enable_autograd_cache=False),
                torch._inductor.config.patch(inductor_options),
            ):
                run()
        except Exception as error:  # a failed compile is a result to report
            log.warning("torch.compile at budget %s failed: %s", budget, error)
            failed = Candidate("torch.compile", f"activation_memory_budget={budget}", model, run, knob=budget)
            failed.note = f"failed: {type(error).__name__}: {str(error)[:200]}"
            candidates.append(failed)
            continue
        candidate = Candidate("torch.compile", f"activation_memory_budget={budget}", model, run, knob=budget)
        candidate.setup_s = time.perf_counter() - started
        candidate.extra["saved_activation_bytes"] = sum(recorder.saved_bytes) if recorder.saved_bytes else None
        candidate.extra["warm"] = True
        candidates.append(candidate)
    return candidates


def ours_candidates(
    setting: Setting, levels: dict[int, list[str]], meter: Meter, reference: list[torch.Tensor]
) -> list[Candidate]:
    """`checkmate.compile` with `optimal` and `approx` at each level (a peer's measured peak), fitted to the meter."""
    return [
        fit_ours(setting, level, method, (meter, reference), peers)
        for level, peers in sorted(levels.items(), reverse=True)
        for method in setting.args.methods
    ]


def fit_ours(
    setting: Setting, level: int, method: str, checks: tuple[Meter, list[torch.Tensor]], peers: list[str]
) -> Candidate:
    """Ours at `level`: plan with the level as the budget, run it once (gradients checked) and measure it on the one
    meter. While the meter reads above the level (memory the plan does not model, such as scratch space inside
    convolution kernels), plan again with the budget set that much below the plan's own peak, at most
    `--fit-iterations` times. The last plan that was measured is kept; the row's setup time adds up every attempt."""
    meter, reference = checks
    budget, history, setup = level, [], 0.0
    kept: Candidate | None = None
    for _ in range(setting.args.fit_iterations + 1):
        candidate = plan_ours(setting, budget, method, level)
        setup += candidate.setup_s or 0.0
        if not candidate.note:
            first_call(candidate, setting, reference)
        if candidate.note:
            if kept is None:
                kept = candidate
            else:
                kept.extra["fit_note"] = f"lowering the budget to {_mib(budget)} MiB: {candidate.note}"
            break
        candidate.measured_peak = measure_once(candidate, setting, meter)
        history.append((budget, candidate.measured_peak))
        kept = candidate
        if candidate.measured_peak <= level:
            break
        # what the meter reads beyond the plan's own peak is memory the plan does not see: ask for that much less
        planned = min(budget, candidate.predicted_peak or budget)
        budget = planned - (candidate.measured_peak - level)
    assert kept is not None
    kept.setup_s = setup
    kept.extra.update(matched=peers, fit=history)
    if len(history) > 1:
        kept.extra["fit_note"] = kept.extra.get("fit_note") or f"budget lowered to {_mib(kept.budget)} MiB to fit"
    return kept


def _mib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**20:.2f}"


def plan_ours(setting: Setting, budget: int, method: str, level: int) -> Candidate:
    """`checkmate.compile` at `budget` bytes (profiled op costs, plans cached on disk); not yet called."""
    args = setting.args
    model = copy.deepcopy(setting.model)
    config = f"{method} at {_mib(level)} MiB"
    started = time.perf_counter()
    try:
        step = checkmate.compile(
            model, setting.loss_fn, setting.batch, budget=int(budget), method=method,
            cost_model=args.cost_model, time_limit=args.time_limit, measure_memory="first",
        )  # fmt: skip
    except checkmate.CheckmateError as error:
        failed = Candidate(f"ours ({method})", config, model, lambda: None, knob=level, budget=int(budget))
        failed.note = _describe_failure(error)
        failed.setup_s = time.perf_counter() - started
        return failed

    def run() -> None:
        step(*setting.batch)

    candidate = Candidate(f"ours ({method})", config, model, run, knob=level, budget=int(budget))
    candidate.setup_s, candidate.solve_s = time.perf_counter() - started, step.plan.solve_time
    candidate.predicted_peak = step.plan.peak_memory
    candidate.extra.update(status=step.plan.status, step=step)
    return candidate


def _describe_failure(error: Exception) -> str:
    if isinstance(error, checkmate.InfeasibleBudget):
        minimum = "unknown" if error.minimum is None else f"{error.minimum / 2**20:.2f} MiB"
        return f"infeasible (smallest budget {minimum})"
    return f"failed: {type(error).__name__}: {str(error)[:200]}"


def reference_gradients(setting: Setting) -> list[torch.Tensor]:
    model = copy.deepcopy(setting.model)
    setting.loss_fn(model, *setting.batch).backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def check_gradients(candidate: Candidate, reference: list[torch.Tensor]) -> None:
    """Max over parameters of max|g - g_eager| / max|g_eager|, after one call from `.grad = None`."""
    worst, bitwise = 0.0, True
    for parameter, expected in zip(candidate.model.parameters(), reference, strict=True):
        got = parameter.grad
        if got is None:
            worst, bitwise = float("inf"), False
            continue
        bitwise = bitwise and torch.equal(got, expected)
        scale = expected.abs().max().clamp_min(1e-12)
        worst = max(worst, ((got - expected).abs().max() / scale).item())
    candidate.grad_error, candidate.grads_bitwise = worst, bitwise


def first_call(candidate: Candidate, setting: Setting, reference: list[torch.Tensor]) -> None:
    """Run once from `.grad = None` (compile steps were already called once) and compare gradients with eager's."""
    if candidate.note:
        return
    if not candidate.extra.get("warm"):
        candidate.model.zero_grad(set_to_none=True)
        try:
            candidate.run()
        except Exception as error:  # a tool failing on a model is a result
            log.warning("%s %s failed: %s", candidate.tool, candidate.config, error)
            candidate.note = f"failed: {type(error).__name__}: {str(error)[:200]}"
            return
    check_gradients(candidate, reference)
    step = candidate.extra.get("step")
    if step is not None:
        candidate.own_meter_peak = step.report().measured_peak


def measure_memory(candidates: list[Candidate], setting: Setting, meter: Meter) -> None:
    """Each runnable candidate's peak on the one meter (those not measured yet)."""
    for candidate in candidates:
        if not candidate.note and candidate.measured_peak is None:
            candidate.measured_peak = measure_once(candidate, setting, meter)


def measure_once(candidate: Candidate, setting: Setting, meter: Meter) -> int:
    """The peak of one call on the one meter, after a warm-up call, starting from `.grad = None`."""
    candidate.model.zero_grad(set_to_none=True)
    candidate.run()
    candidate.model.zero_grad(set_to_none=True)
    peak = meter.measure(candidate.run, step_baseline(candidate.model, setting.batch))
    candidate.model.zero_grad(set_to_none=True)
    return peak


def interleaved_times(candidates: list[Candidate], setting: Setting, repeats: int) -> dict[int, list[float]]:
    """Seconds of each runnable candidate's step: `repeats` rounds, each calling every candidate once in a shuffled
    order (so that drift on a shared machine hits all alike), after one warm-up round; `.grad` reset untimed."""
    runnable = [index for index, candidate in enumerate(candidates) if not candidate.note]
    times: dict[int, list[float]] = {index: [] for index in runnable}
    shuffler = random.Random(0)
    for round_index in range(repeats + 1):
        order = list(runnable)
        shuffler.shuffle(order)
        for index in order:
            candidate = candidates[index]
            candidate.model.zero_grad(set_to_none=True)
            _synchronize(setting.device)
            started = time.perf_counter()
            candidate.run()
            _synchronize(setting.device)
            if round_index > 0:
                times[index].append(time.perf_counter() - started)
    return times


def compiled_graphs() -> int:
    """How many graphs Dynamo has compiled in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def distinct_levels(rows: list[Row], merge: float) -> dict[int, list[str]]:
    """The peers' measured peaks, each within `merge` (relative) of a smaller one folded into it (the smaller is
    kept: ours then gets the tighter budget), mapped to the peer configurations it stands for."""
    peers = sorted((row.measured_peak, f"{row.tool}: {row.config}") for row in rows if row.measured_peak)
    levels: dict[int, list[str]] = {}
    current: int | None = None
    for peak, label in peers:
        if current is None or peak > current * (1 + merge):
            current = peak
            levels[current] = []
        levels[current].append(label)
    return levels


def to_row(candidate: Candidate, workload: Workload, seconds: list[float] | None) -> Row:
    return Row(
        model=workload.name,
        tool=candidate.tool,
        config=candidate.config,
        knob=candidate.knob,
        budget=candidate.budget,
        predicted_peak=candidate.predicted_peak,
        measured_peak=candidate.measured_peak,
        own_meter_peak=candidate.own_meter_peak,
        step_ms=statistics.median(seconds) * 1e3 if seconds else None,
        step_ms_min=min(seconds) * 1e3 if seconds else None,
        setup_s=candidate.setup_s,
        solve_s=candidate.solve_s,
        grads_equal=None if candidate.grad_error is None else candidate.grad_error <= GRADIENT_TOLERANCE,
        grads_bitwise=candidate.grads_bitwise,
        grad_error=candidate.grad_error,
        saved_activation_bytes=candidate.extra.get("saved_activation_bytes"),
        matched=candidate.extra.get("matched"),
        status=candidate.extra.get("status"),
        note="; ".join(filter(None, [candidate.note, candidate.extra.get("fit_note")])),
    )


GRADIENT_TOLERANCE = 1e-4  # relative to the largest eager gradient of each parameter


def benchmark_workload(workload: Workload, args: argparse.Namespace, meter: Meter) -> list[Row]:
    """Every tool on one model: peers first, then ours at each peer's measured peak; then all timed together."""
    model, loss_fn, batch = prepare_model(workload, meter.device)
    setting = Setting(workload, model, loss_fn, batch, meter.device, args)
    reference = reference_gradients(setting)
    peers: list[Candidate] = []
    for tool in args.tools:
        log.info("%s: building %s", workload.name, tool)
        peers += PEER_TOOLS[tool](setting)
    for candidate in peers:
        first_call(candidate, setting, reference)
    measure_memory(peers, setting, meter)
    ours: list[Candidate] = []
    if args.methods:
        log.info("%s: planning ours at each peer's peak", workload.name)
        peer_rows = [to_row(candidate, workload, None) for candidate in peers]
        ours = ours_candidates(setting, distinct_levels(peer_rows, args.merge), meter, reference)
    everyone = peers + ours
    log.info("%s: timing %d configurations, %d rounds", workload.name, len(everyone), args.repeats)
    graphs = compiled_graphs()
    times = interleaved_times(everyone, setting, args.repeats)
    if compiled_graphs() != graphs:  # a recompile would run under the default budget, not the one asked for
        log.warning("%s: torch.compile recompiled while timing; its rows are not trustworthy", workload.name)
        for candidate in everyone:
            if candidate.tool == "torch.compile":
                candidate.note = candidate.note or "recompiled while timing"
    rows = [to_row(candidate, workload, times.get(i)) for i, candidate in enumerate(everyone)]
    for row in rows:
        log.info("%s", row.short())
    return rows


PEER_TOOLS: dict[str, Callable[[Setting], list[Candidate]]] = {
    "eager": eager_candidates,
    "checkpoint": checkpoint_candidates,
    "sac": sac_candidates,
    "compile": compile_candidates,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small models, 4 compile budgets, 10 s solves")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--models", nargs="*", help="names (or prefixes) of the models to run; default all")
    parser.add_argument("--tools", nargs="*", default=list(PEER_TOOLS), choices=list(PEER_TOOLS))
    parser.add_argument("--methods", nargs="*", default=["optimal", "approx"], help="our methods; none to skip")
    parser.add_argument("--repeats", type=int, default=11, help="timed rounds (median)")
    parser.add_argument("--time-limit", type=float, help="seconds per solve of ours (default 45, quick 10)")
    parser.add_argument("--cost-model", default="profile", choices=("profile", "flops", "unit"))
    parser.add_argument("--compile-budgets", type=float, nargs="*", help="activation_memory_budget values")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (inductor or "
                        "aot_eager_decomp_partition: the same min-cut/knapsack planner, eager kernels)")  # fmt: skip
    parser.add_argument("--segments", type=int, nargs="*", help="checkpoint_sequential segment counts")
    parser.add_argument("--strides", type=int, nargs="*", default=[1, 2, 4], help="checkpoint every k-th block")
    parser.add_argument("--fit-iterations", type=int, default=2, help="replans of ours when the meter reads over")
    parser.add_argument("--merge", type=float, default=0.02, help="peer peaks this close share one budget of ours")
    parser.add_argument("--verbose", action="store_true", help="show checkmate's planning log")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    parser.add_argument("--cache-dir", help="CHECKMATE_CACHE_DIR for profiles and plans (default ~/.cache/checkmate)")
    parser.add_argument("--inductor-cache", help="TORCHINDUCTOR_CACHE_DIR (default: a new temporary directory)")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--plot", help="write the Pareto plot (PNG) here")
    parser.add_argument(
        "--from-json", nargs="+", help="render tables and plot from saved rows (several files: later models win)"
    )
    args = parser.parse_args(argv)
    if args.time_limit is None:
        args.time_limit = 10.0 if args.quick else 45.0
    if args.compile_budgets is None:
        args.compile_budgets = [1.0, 0.5, 0.25, 0.0] if args.quick else [1.0, 0.8, 0.6, 0.4, 0.2, 0.1, 0.0]
    if args.segments is None:
        args.segments = [2, 4, 8] if args.quick else [2, 3, 4, 6, 8, 12]
    return args


def environment(args: argparse.Namespace, meter: Meter) -> dict[str, Any]:
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "torch": torch.__version__,
        "device": str(meter.device),
        "meter": meter.name,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "gradient_tolerance": GRADIENT_TOLERANCE,
        "options": {key: value for key, value in vars(args).items() if key not in {"out", "plot", "from_json"}},
    }


def write_rows(path: str, info: dict[str, Any], rows: list[Row]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    plain = [{item.name: getattr(row, item.name) for item in dataclasses.fields(row)} for row in rows]
    Path(path).write_text(json.dumps({"environment": info, "rows": plain}, indent=1, default=_plain))


def read_rows(paths: Sequence[str]) -> tuple[list[Row], dict[str, Any]]:
    """Rows of saved runs; a model measured in a later file replaces that model's rows from earlier files."""
    rows: list[Row] = []
    commands = []
    info: dict[str, Any] = {}
    for path in paths:
        saved = json.loads(Path(path).read_text())
        new = [Row(**row) for row in saved["rows"]]
        models = {row.model for row in new}
        rows = [row for row in rows if row.model not in models] + new
        info = saved["environment"]
        commands.append(info.get("command", ""))
    info = {**info, "command": "` + `".join(commands)}
    return rows, info


def _plain(value: Any) -> Any:
    """JSON for what json does not know: numbers from numpy or torch as numbers, anything else as text."""
    log.warning("a row holds a %s (%r); written as %s", type(value).__name__, value, "a number or text")
    try:
        return float(value) if not isinstance(value, int | float) else value
    except (TypeError, ValueError):
        return str(value)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    if not args.verbose:
        logging.getLogger("checkmate").setLevel(logging.WARNING)
    if args.from_json:
        saved_rows, saved_info = read_rows(args.from_json)
        print(render(saved_rows, saved_info, plot=args.plot))
        return
    if args.cache_dir:
        os.environ["CHECKMATE_CACHE_DIR"] = args.cache_dir
    # Inductor keeps compiled kernels on disk whatever fx_graph_cache says: a fresh directory makes compile times honest
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.inductor_cache or tempfile.mkdtemp(prefix="peers-inductor-")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    meter = Meter(device)
    size = "quick" if args.quick else ("gpu" if device.type == "cuda" else "full")
    chosen = [w for w in workloads(size) if not args.models or any(w.name.startswith(m) for m in args.models)]
    info = environment(args, meter)
    rows: list[Row] = []
    for workload in chosen:
        rows += benchmark_workload(workload, args, meter)
        if args.out:  # after every model, so that a long run that stops keeps what it measured
            write_rows(args.out, info, rows)
    info["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if args.out:
        write_rows(args.out, info, rows)
    print(render(rows, info, plot=args.plot))


if __name__ == "__main__":
    main()
