"""Capture benchmark: graph sizes, capture time, and agreement of the captured graph with eager PyTorch.

For a VGG-style CNN, a ResNet-18-style network and a small GPT it reports
* fx call nodes of the joint graph, planning nodes, and planning nodes after `max_nodes` merging;
* capture time with the "profile" cost model, first with an empty profile cache, then cached;
* the simulated peak of `checkpoint_all` against the peak of live tensor storages measured while
  eager PyTorch runs `loss_fn(model, *batch).backward()` (checkmate.testing.eager_step), both totals
  including parameters, buffers and the batch, and the eager one with gradients charged either as
  they appear ("eager") or for the whole step like the graph's fixed memory ("eager, grads fixed"), or
  in a second step that accumulates into the first one's `.grad`s ("eager, accumulating": the graph's
  convention exactly, each new gradient a temporary beside its `.grad`);
* the sum of the profiled op costs against the median eager step time, both with one thread.

* profile stability: two captures with separate empty caches, the sums of their node costs and the
  time-weighted mean relative difference of the per-node costs.

Then it captures full-size VGG16 at batch 256, 224x224, in a subprocess, and reports time and RSS.

    .venv/bin/python benchmarks/capture_models.py [--out]
    .venv/bin/python benchmarks/capture_models.py --from-json   # the tables again from benchmarks/results/
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from checkmate import solve, zoo
from checkmate.byte_sizes import format_bytes
from checkmate.testing.eager_step import measure_eager_step
from checkmate.torch_capture import capture
from rows import Row, Stored, add_row_arguments, measure_or_load

MODELS: dict[str, Callable[[], Any]] = {
    "VGG (8 conv, w16, b32, 32x32)": lambda: zoo.vgg(batch_size=32, image_size=32, width=16),
    "ResNet-18-style (w16, b16, 32x32)": lambda: zoo.resnet(batch_size=16, image_size=32, width=16),
    "GPT (4 layers, d128, T64, b8)": lambda: zoo.gpt(batch_size=8, length=64, dim=128, heads=4, layers=4, vocab=256),
}

VGG16_SCRIPT = """
import resource, time
from checkmate import solve, zoo
from checkmate.torch_capture import capture
model, loss_fn, batch = zoo.vgg16(batch_size=256, image_size=224)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started = time.perf_counter()
captured = capture(model, loss_fn, batch, cost_model="flops")
elapsed = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
calls = sum(node.op == "call_function" for node in captured.module.graph.nodes)
peak = solve(captured.graph, None).peak_memory
print(elapsed, before, after, calls, captured.graph.size, peak)
"""


def measure_model(name: str, factory: Callable[[], Any], max_nodes: int) -> Row:
    model, loss_fn, batch = factory()
    torch.set_num_threads(1)
    eager_before = measure_eager_step(model, loss_fn, batch, repeats=11)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["CHECKMATE_CACHE_DIR"] = cache
        started = time.perf_counter()
        captured = capture(model, loss_fn, batch, cost_model="profile")
        first = time.perf_counter() - started
        started = time.perf_counter()
        capture(model, loss_fn, batch, cost_model="profile")
        cached = time.perf_counter() - started
        merged = capture(model, loss_fn, batch, cost_model="profile", max_nodes=max_nodes)
    eager_after = measure_eager_step(model, loss_fn, batch, repeats=11)
    step = min(eager_before.step_seconds, eager_after.step_seconds)
    return {
        "kind": "model",
        "name": name,
        "fx": sum(node.op == "call_function" for node in captured.module.graph.nodes),
        "nodes": captured.graph.size,
        "merged": merged.graph.size,
        "first": first,
        "cached": cached,
        "simulated": solve(captured.graph, None).peak_memory,
        "simulated_merged": solve(merged.graph, None).peak_memory,
        "eager": eager_before.peak_bytes,
        "eager_fixed": eager_before.peak_gradients_fixed,
        "eager_accumulating": eager_before.peak_accumulating,
        "profiled": sum(node.cost for node in captured.graph.nodes),
        "step": step,
        "steps": (eager_before.step_seconds, eager_after.step_seconds),
        "fastest": min(eager_before.fastest_step_seconds, eager_after.fastest_step_seconds),
        "max_nodes": max_nodes,
    }


def profile_stability(factory: Callable[[], Any]) -> tuple[float, float, float]:
    """Two fresh profiles of the same model: (sum 1, sum 2, time-weighted mean relative difference per node)."""
    model, loss_fn, batch = factory()
    runs = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["CHECKMATE_CACHE_DIR"] = cache
            runs.append([node.cost for node in capture(model, loss_fn, batch, cost_model="profile").graph.nodes])
    first, second = runs
    weights = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
    difference = sum(abs(a - b) for a, b in zip(first, second, strict=True)) / sum(weights)
    return sum(first), sum(second), difference


def model_table(rows: list[Row], max_nodes: int) -> str:
    lines = [
        f"| model | fx ops | nodes | nodes (max_nodes={max_nodes}) | capture, empty cache / cached | "
        "simulated peak | eager peak | eager peak, grads fixed | eager peak, accumulating | "
        "sim / eager (accumulating) | "
        "simulated peak, merged | sum of profiled costs | eager step, median (1 thread) | eager step, fastest | "
        "profile / eager median |",
        "|---" * 15 + "|",
    ]
    for row in rows:
        lines.append(
            f"| {row['name']} | {row['fx']} | {row['nodes']} | {row['merged']} | "
            f"{row['first']:.1f} s / {row['cached']:.1f} s | {format_bytes(row['simulated'])} | "
            f"{format_bytes(row['eager'])} | {format_bytes(row['eager_fixed'])} | "
            f"{format_bytes(row['eager_accumulating'])} | {row['simulated'] / row['eager_accumulating']:.3f} | "
            f"{format_bytes(row['simulated_merged'])} | "
            f"{row['profiled'] * 1e3:.1f} ms | {row['step'] * 1e3:.1f} ms "
            f"(runs: {row['steps'][0] * 1e3:.1f}, {row['steps'][1] * 1e3:.1f}) | {row['fastest'] * 1e3:.1f} ms | "
            f"{row['profiled'] / row['step']:.2f} |"
        )
    return "\n".join(lines)


def vgg16_row() -> Row:
    result = subprocess.run([sys.executable, "-c", VGG16_SCRIPT], capture_output=True, text=True, check=True)
    elapsed, before, after, calls, nodes, peak = (float(value) for value in result.stdout.split()[-6:])
    return {
        "kind": "vgg16",
        "seconds": elapsed,
        "rss_before": int(before),
        "rss_after": int(after),
        "fx": int(calls),
        "nodes": int(nodes),
        "simulated": int(peak),
    }


def measure(max_nodes: int, skip_vgg16: bool) -> Iterator[Row]:
    for name, factory in MODELS.items():
        yield measure_model(name, factory, max_nodes)
    for name, factory in MODELS.items():
        first, second, difference = profile_stability(factory)
        yield {"kind": "stability", "name": name, "first": first, "second": second, "difference": difference}
    if not skip_vgg16:
        yield vgg16_row()
    yield {"kind": "process", "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def render(stored: Stored) -> str:
    kinds: dict[str, list[Row]] = {}
    for row in stored.rows:
        kinds.setdefault(row["kind"], []).append(row)
    models = kinds.get("model", [])
    load = stored.environment.get("load_average")
    parts = [f"load average before: {load[0]:.2f}"] if load else []
    parts.append(model_table(models, models[0]["max_nodes"] if models else 0))
    stability = ["| model | profile 1 | profile 2 | time-weighted mean per-node difference |", "|---|---|---|---|"]
    for row in kinds.get("stability", []):
        stability.append(
            f"| {row['name']} | {row['first'] * 1e3:.1f} ms | {row['second'] * 1e3:.1f} ms | {row['difference']:.1%} |"
        )
    parts.append("\n".join(stability))
    for row in kinds.get("vgg16", []):
        parts.append(
            f"VGG16, batch 256, 224x224, cost model flops: {row['fx']} fx ops, {row['nodes']} nodes, capture "
            f"{row['seconds']:.1f} s, peak RSS {format_bytes(row['rss_before'])} after building the model and batch, "
            f"{format_bytes(row['rss_after'])} after capture; simulated checkpoint_all peak "
            f"{format_bytes(row['simulated'])}"
        )
    for row in kinds.get("process", []):
        parts.append(f"(this process: peak RSS {format_bytes(row['rss'])})")
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-nodes", type=int, default=40)
    parser.add_argument("--skip-vgg16", action="store_true")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    measure_or_load(arguments, "capture_models", lambda: measure(arguments.max_nodes, arguments.skip_vgg16), render)


if __name__ == "__main__":
    main()
