"""GPU check: measured CUDA memory against the plan's peak, and step times against eager, on three models.

    .venv/bin/python benchmarks/gpu_check.py                  # on a CUDA machine, a few minutes
    .venv/bin/python benchmarks/gpu_check.py --device cpu --quick   # dry run of the same code path on CPU
    .venv/bin/python benchmarks/gpu_check.py --out            # rows to benchmarks/results/gpu_check.json
    .venv/bin/python benchmarks/gpu_check.py --from-json      # the table again from them (no GPU needed)

For a ResNet (BatchNorm, skip connections), a GPT (attention, dropout) and Hugging Face's GPT-2, each compiled
at 100 % and 50 % of its no-recomputation peak with `optimal` and profiled costs (when no plan is found at 50 % in the
time limit, 70 % and then 90 % are tried and the misses are listed: on an H200, cuDNN's workspace puts the
ResNet's smallest budget at 84 %), it prints one markdown row with:
the plan's peak; the measured peak as the plan counts it (`torch.cuda.max_memory_allocated` over the
step, minus what was allocated before it, plus parameters, gradients, buffers and batch); the raw
`max_memory_allocated` of the step (also counting optimizer state and allocator rounding); eager's
raw peak; the planned compute overhead and the median step times of compiled and eager. It also
checks that the compiled gradients equal eager's (max absolute difference; CUDA kernels need not be
bitwise deterministic). Without CUDA it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import checkmate
from checkmate import zoo
from checkmate.byte_sizes import format_bytes
from checkmate.options import CostModel, choices
from rows import Row, Stored, add_row_arguments, measure_or_load


def hugging_face_gpt2(batch_size: int, length: int, width: int, layers: int, vocab: int) -> Any:
    """`transformers.GPT2LMHeadModel` from a config with random weights (dropout 0.1, tied output layer)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=length, n_embd=width, n_layer=layers, n_head=4, tie_word_embeddings=True
    )
    tokens = torch.randint(0, vocab, (batch_size, length), generator=torch.Generator().manual_seed(1))

    def causal_lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, labels=tokens).loss

    return transformers.GPT2LMHeadModel(config), causal_lm_loss, (tokens,)


MODELS: dict[str, Callable[[], Any]] = {
    "ResNet": lambda: zoo.resnet(batch_size=64, image_size=32, width=32, blocks=(1, 1, 1)),
    "GPT": lambda: zoo.gpt(batch_size=16, length=128, dim=256, heads=4, layers=2, vocab=1024),
    "GPT-2 (transformers)": lambda: hugging_face_gpt2(batch_size=16, length=256, width=256, layers=4, vocab=4096),
}
QUICK_MODELS: dict[str, Callable[[], Any]] = {
    "ResNet": lambda: zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1)),
    "GPT": lambda: zoo.gpt(batch_size=4, length=32, dim=32, heads=2, layers=2, vocab=64),
    "GPT-2 (transformers)": lambda: hugging_face_gpt2(batch_size=2, length=32, width=32, layers=2, vocab=128),
}


def synchronized_median(function: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median seconds of `function` after two warm-up calls, synchronizing the device around each call."""
    for _ in range(2):
        function()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def raw_peak(function: Callable[[], Any], device: torch.device) -> int | None:
    """`torch.cuda.max_memory_allocated` increase over one call (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    function()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def gradient_difference(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    pairs = zip(model.parameters(), reference.parameters(), strict=True)
    return max(((a.grad - b.grad).abs().max().item() for a, b in pairs if a.grad is not None), default=0.0)


def check_model(name: str, factory: Callable[[], Any], device: torch.device, args: argparse.Namespace) -> Iterator[Row]:
    model, loss_fn, batch = factory()
    model = model.to(device).train()
    batch = tuple(tensor.to(device) for tensor in batch)
    reference = copy.deepcopy(model)

    def eager_step() -> None:
        loss_fn(reference, *batch).backward()

    eager_raw = raw_peak(eager_step, device)
    for budget in (1.0, 0.5, 0.7, 0.9):
        method = "checkpoint_all" if budget == 1.0 else "optimal"
        options = {"time_limit": args.time_limit} if method == "optimal" else {}
        started = time.perf_counter()
        try:
            step = checkmate.compile(
                model, loss_fn, batch, budget=budget, method=method, cost_model=args.cost_model, **options
            )
        except checkmate.InfeasibleBudget as error:
            yield {"model": name, "budget": budget, "error": str(error)}
            continue
        planning = time.perf_counter() - started
        for module in (model, reference):
            module.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        step(*batch)
        torch.manual_seed(0)
        eager_step()
        difference = gradient_difference(model, reference)
        compiled_raw = raw_peak(functools.partial(step, *batch), device)
        compiled_time = synchronized_median(functools.partial(step, *batch), device, args.repeats)
        eager_time = synchronized_median(eager_step, device, args.repeats)
        report = step.report()
        yield {
            "model": name,
            "budget": budget,
            "method": report.method,
            "status": report.status,
            "nodes": report.nodes,
            "planning_seconds": planning,
            "planned_peak": report.planned_peak,
            "measured_peak": report.measured_peak,
            "compiled_raw_peak": compiled_raw,
            "eager_raw_peak": eager_raw,
            "planned_overhead": report.planned_extra_compute,
            "compiled_ms": compiled_time * 1e3,
            "eager_ms": eager_time * 1e3,
            "gradient_difference": difference,
        }
        if budget < 1.0:
            return


HEADER = (
    "| model | budget | plan | planned peak | measured peak (plan's terms) | raw max_memory_allocated "
    "| eager raw peak | planned overhead | step ms compiled / eager | max grad diff |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def line(row: Row) -> str:
    """One markdown row of the table."""
    if "error" in row:
        return f"| {row['model']} | {row['budget']:.0%} | no plan: {row['error']} |" + " |" * 7

    def show(size: int | None) -> str:
        return "n/a" if size is None else format_bytes(size)

    compiled, eager = row["compiled_ms"], row["eager_ms"]
    return (
        f"| {row['model']} | {row['budget']:.0%} | {row['method']} ({row['status']}), {row['nodes']} nodes, "
        f"{row['planning_seconds']:.0f} s | {show(row['planned_peak'])} | {show(row['measured_peak'])} | "
        f"{show(row['compiled_raw_peak'])} | {show(row['eager_raw_peak'])} | {row['planned_overhead']:+.1%} | "
        f"{compiled:.2f} / {eager:.2f} ({compiled / eager - 1:+.1%}) | {row['gradient_difference']:.2g} |"
    )


def measure(device: torch.device, args: argparse.Namespace) -> Iterator[Row]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}", file=sys.stderr)
    yield {"device": name, "torch": torch.__version__}
    models = QUICK_MODELS if args.quick else MODELS
    for model_name, factory in models.items():
        for row in check_model(model_name, factory, device, args):
            print(line(row), file=sys.stderr, flush=True)
            yield row


def render(stored: Stored) -> str:
    device, *rows = stored.rows
    return f"device: {device['device']}, torch {device['torch']}\n{HEADER}\n" + "\n".join(line(row) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="small models (for a dry run)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per optimal solve")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cost-model", default="profile", choices=choices(CostModel))
    add_row_arguments(parser)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.from_json is None and device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to measure (run it on a machine with a GPU)")
        sys.exit(0)
    measure_or_load(args, "gpu_check", lambda: measure(device, args), render)


if __name__ == "__main__":
    main()
