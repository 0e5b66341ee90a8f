"""The peers of `benchmarks/peers.py`: the models, and one function per tool that builds its configurations.

Each tool function takes a `Setting` (the prepared model, its loss and batch, the options) and returns `Candidate`s:
deep copies of the model made to run one training step the tool's way. `PEER_TOOLS` names them for `--tools`.
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from checkmate import zoo
from checkmate.execute.memory import measure_peak, step_baseline
from checkmate.zoo.convnext import ConvNeXtBlock

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


def _convnext_blocks(model: nn.Module) -> list[nn.Module]:
    return [module for module in _children(model, "features") if isinstance(module, ConvNeXtBlock)]


def _hf_gpt2_blocks(model: nn.Module) -> list[nn.Module]:
    return _children(model, "transformer.h")


def _hf_gpt2(batch_size: int, length: int, dim: int, heads: int, layers: int, vocab: int) -> Factory:
    """Hugging Face's `GPT2LMHeadModel` from a config (random weights, no download), dropout off."""

    def factory() -> tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        config = transformers.GPT2Config(
            vocab_size=vocab, n_positions=length, n_embd=dim, n_layer=layers, n_head=heads,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        tokens = torch.randint(0, vocab, (batch_size, length), generator=torch.Generator().manual_seed(1))
        model = transformers.GPT2LMHeadModel(config)
        model.loss_type = "ForCausalLM"  # else its loss warns through a logger, which torch.compile cannot trace
        return model, _hf_language_model_loss, (tokens,)

    return factory


def _hf_language_model_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss


def workloads(size: str) -> list[Workload]:
    """The six models at `size`: "quick" (a step of ~15-30 ms on one CPU thread), "full" (~50-150 ms on one CPU
    thread) or "gpu" (sizes for one large GPU). ConvNeXt is the model made mostly of ops Inductor fuses; HF GPT-2 is
    Hugging Face's `GPT2LMHeadModel` from a config."""
    sizes: dict[str, tuple[Factory, ...]] = {
        "quick": (
            lambda: zoo.vgg(16, image_size=32, width=16),
            lambda: zoo.resnet(16, image_size=32, width=16, blocks=(1, 1, 1)),
            lambda: zoo.unet(4, image_size=(32, 48), width=1 / 16),
            lambda: zoo.gpt(8, length=128, dim=64, heads=4, layers=2, vocab=128, dropout=0.0),
            lambda: zoo.convnext(8, image_size=64, widths=(32, 64), depths=(2, 2)),
            _hf_gpt2(8, length=128, dim=64, heads=4, layers=2, vocab=128),
        ),
        "full": (
            lambda: zoo.vgg(64, image_size=32, width=16),
            lambda: zoo.resnet(32, image_size=32, width=16, blocks=(2, 2, 2)),
            lambda: zoo.unet(8, image_size=(64, 96), width=1 / 8),
            lambda: zoo.gpt(8, length=128, dim=128, heads=4, layers=4, vocab=512, dropout=0.0),
            lambda: zoo.convnext(16, image_size=64, widths=(48, 96), depths=(3, 3)),
            _hf_gpt2(8, length=128, dim=128, heads=4, layers=4, vocab=512),
        ),
        "gpu": (
            lambda: zoo.vgg(256, image_size=64, width=64),
            lambda: zoo.resnet(256, image_size=64, width=64, blocks=(2, 2, 2, 2)),
            lambda: zoo.unet(16, image_size=(256, 384), width=1 / 2),
            lambda: zoo.gpt(16, length=1024, dim=768, heads=12, layers=6, vocab=8192, dropout=0.0),
            lambda: zoo.convnext(64, image_size=224, widths=(96, 192, 384), depths=(3, 3, 9)),
            _hf_gpt2(16, length=1024, dim=768, heads=12, layers=6, vocab=8192),
        ),
    }
    vgg, resnet, unet, gpt, convnext, hf_gpt2 = sizes[size]
    return [
        Workload("VGG (chain)", vgg, lambda model: [model], _vgg_chain),
        Workload("ResNet", resnet, _resnet_blocks),
        Workload("U-Net", unet, _unet_blocks),
        Workload("GPT", gpt, _gpt_blocks),
        Workload("ConvNeXt", convnext, _convnext_blocks),
        Workload("HF GPT-2", hf_gpt2, _hf_gpt2_blocks),
    ]


@dataclass
class Candidate:
    """One configuration of one tool, ready to run: `run()` does forward + backward into `model`'s `.grad`."""

    tool: str
    config: str
    model: nn.Module
    run: Callable[[], None]
    knob: float | None = None
    predicted_peak: int | None = None
    predicted_ms: float | None = None
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


PEER_TOOLS: dict[str, Callable[[Setting], list[Candidate]]] = {
    "eager": eager_candidates,
    "checkpoint": checkpoint_candidates,
    "sac": sac_candidates,
    "compile": compile_candidates,
}
