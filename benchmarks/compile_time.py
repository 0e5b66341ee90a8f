"""Compile time of `checkmate.compile(..., executor="inductor")` against `torch.compile`'s first call (issue 35, 5).

    .venv/bin/python benchmarks/compile_time.py --out          # rows to benchmarks/results/compile_time.json
    .venv/bin/python benchmarks/compile_time.py --models gpt --repeats 2
    .venv/bin/python benchmarks/compile_time.py --from-json
    .venv/bin/python benchmarks/compile_time.py --full --budget 0.85 --out benchmarks/results/compile_time_full.json

`--full` measures the six models of `benchmarks/peers.py` at their full sizes instead of the small GPT and ResNet
(at 0.85: the full-size VGG has no plan below 0.82 of its peak).

Per model and compiler, each measure runs in a fresh process. The first run has a fresh `CHECKMATE_CACHE_DIR` and
a fresh `TORCHINDUCTOR_CACHE_DIR` (nothing cached: no node measures, plans or fused-run measures, no Inductor
graphs or kernels); the second run keeps both directories from the first (what a user meets the next time the same
script starts). Ours is `checkmate.compile(model, loss_fn, batch, budget=0.6, executor="inductor")` then the first
step call, broken down by the step report's planning times (`checkmate.stage_times`): capture, node compilation,
node measuring, solving, the fused runs of the chosen schedule, and the rest. torch.compile's is `torch.compile(model)`
then its first forward and backward (its whole compile happens there). Each compiler has its own cache directories,
so neither warms the other's Inductor cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import checkmate
from checkmate.stage_times import Stage
from checkmate.zoo import gpt, resnet
from checkmate.zoo.common import Factory
from peers_tools import prepare_model, workloads
from rows import Row, Stored, add_row_arguments, measure_or_load

MODELS = {
    "gpt": ("gpt(8, length=128, dim=128, heads=4, layers=4, vocab=512)", lambda: gpt(8, 128, 128, 4, 4, 512, 0.0)),
    "resnet": ("resnet(32, image_size=32, width=16, blocks=(2, 2, 2))", lambda: resnet(32, 32, 16, (2, 2, 2))),
}
FULL_SIZE = "full size, as benchmarks/peers.py builds it"
COMPILERS = ("checkmate", "torch.compile")
RUNS = ("first", "second")
STAGE_COLUMNS = {stage: stage.name.lower() + "_s" for stage in Stage}


def measure(models: list[str], budget: float, repeats: int) -> Iterator[Row]:
    for model in models:
        for repeat in range(repeats):
            with tempfile.TemporaryDirectory() as scratch:
                for run in RUNS:
                    for compiler in COMPILERS:
                        caches = Path(scratch) / compiler
                        yield {"run": run, "repeat": repeat, **_in_process(model, compiler, budget, caches)}


def _in_process(model: str, compiler: str, budget: float, caches: Path) -> Row:
    """One measure in a fresh process with the cache directories under `caches` (made if missing)."""
    environment = dict(os.environ)
    environment["CHECKMATE_CACHE_DIR"] = str(caches / "checkmate")
    environment["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "inductor")
    command = [sys.executable, __file__, "--child", model, compiler, str(budget)]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{finished.stderr[-4000:]}")
    row: Row = json.loads(finished.stdout.strip().splitlines()[-1])
    return row


def child(model_name: str, compiler: str, budget: float) -> Row:
    """Measure one compile in this process (the parent gave it its cache directories)."""
    description, factory = _model(model_name)
    model, loss_fn, batch = factory()
    row: Row = {"model": model_name, "description": description, "compiler": compiler}
    if compiler == "torch.compile":
        return row | _torch_compile((model, loss_fn, batch))
    started = time.perf_counter()
    step = checkmate.compile(model, loss_fn, batch, budget=budget, executor="inductor")
    compiled = time.perf_counter() - started
    step(*batch)
    first_step = time.perf_counter() - started - compiled
    report = step.report()
    times = report.planning_times
    assert times is not None
    row |= {column: times.of(stage) for stage, column in STAGE_COLUMNS.items()}
    return row | {
        "budget": budget,
        "captures": times.captures,
        "planning_s": times.total,
        "other_s": compiled - sum(times.of(stage) for stage in Stage),
        "compile_s": compiled,
        "first_step_s": first_step,
        "total_s": compiled + first_step,
        "nodes": report.nodes,
        "planned_peak": report.planned_peak,
        "measured_peak": report.measured_peak,
        "torch_threads": torch.get_num_threads(),
    }


def _model(name: str) -> tuple[str, Factory]:
    """The small model of that name, or the full-size workload of `benchmarks/peers.py` of that name."""
    if name in MODELS:
        return MODELS[name]
    workload = next(workload for workload in workloads("full") if workload.name == name)
    return FULL_SIZE, lambda: prepare_model(workload, torch.device("cpu"))


def _torch_compile(factory: tuple[torch.nn.Module, Any, tuple[Any, ...]]) -> Row:
    model, loss_fn, batch = factory
    started = time.perf_counter()
    compiled = torch.compile(model)
    loss_fn(compiled, *batch).backward()
    return {"total_s": time.perf_counter() - started, "torch_threads": torch.get_num_threads()}


def render(stored: Stored) -> str:
    stages = [stage.value for stage in Stage]
    width = max([7, *(len(row["model"]) for row in stored.rows)])
    header = f"{'model':{width}} {'run':6} {'compiler':13} {'total':>6} {'x torch':>7}  " + " ".join(
        f"{name:>12}" for name in [*stages, "other", "1st step"]
    )
    lines = [header]
    peers = {
        (row["model"], row["run"], row["repeat"]): row["total_s"]
        for row in stored.rows
        if row["compiler"] == "torch.compile"
    }
    for row in stored.rows:
        peer = peers.get((row["model"], row["run"], row["repeat"]))
        ratio = f"{row['total_s'] / peer:6.2f}x" if peer and row["compiler"] == "checkmate" else ""
        cells = ""
        if row["compiler"] == "checkmate":
            figures = [row[column] for column in STAGE_COLUMNS.values()] + [row["other_s"], row["first_step_s"]]
            cells = " ".join(f"{figure:11.1f}s" for figure in figures) + f"  ({row['captures']} captures)"
        lines.append(
            f"{row['model']:{width}} {row['run']:6} {row['compiler']:13} {row['total_s']:5.1f}s {ratio:>7}  {cells}"
        )
    environment = stored.environment
    lines.append(
        f"(rows of: {environment.get('command', '')}; started {environment.get('started', '?')}, "
        f"load average {environment.get('load_average')})"
    )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], float(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,resnet", help=f"comma-separated of {', '.join(MODELS)}")
    parser.add_argument("--full", action="store_true", help="the six full-size models of benchmarks/peers.py")
    parser.add_argument("--budget", type=float, default=0.6, help="fraction of the no-remat peak (default 0.6)")
    parser.add_argument("--repeats", type=int, default=1, help="first and second runs per model (default 1)")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    models = [workload.name for workload in workloads("full")] if arguments.full else arguments.models.split(",")
    measure_or_load(arguments, "compile_time", lambda: measure(models, arguments.budget, arguments.repeats), render)


if __name__ == "__main__":
    main()
