"""Side by side with the tools PyTorch users have today: at the memory I have, which tool trains fastest?

    # reduced run (small models, 15 interleaved rounds; about 35 min on the 2-core box with every executor)
    .venv/bin/python benchmarks/peers.py --quick --repeats 15 --cache-dir $(mktemp -d) \
        --out benchmarks/results/peers_quick.json --plot docs/peers_quick.png
    # full run (on a quiet machine; about 1.5 h on 2 CPU cores, most of it torch.compile and the solves)
    .venv/bin/python benchmarks/peers.py --cache-dir $(mktemp -d) \
        --out benchmarks/results/peers.json --plot docs/peers.png
    # the same comparison on a GPU (meter: torch.cuda.max_memory_allocated)
    .venv/bin/python benchmarks/peers.py --device cuda --cache-dir $(mktemp -d) \
        --out benchmarks/results/peers_cuda.json --plot docs/peers_cuda.png
    # tables and plot again from saved rows, without measuring
    .venv/bin/python benchmarks/peers.py --from-json benchmarks/results/peers.json --plot docs/peers.png

The peers (models, and one function per tool) are in `benchmarks/peers_tools.py`, the tables and the plot in
`benchmarks/peers_report.py`. `--cache-dir $(mktemp -d)` starts from empty plan and profile caches, so that planning
times are from scratch (a run that reuses a cache reports the cached plans' original solve times); Inductor always
gets a fresh cache directory.

For each model (a chain-like VGG, a ResNet, a U-Net, a GPT and a ConvNeXt-like model of many fusible ops from
`checkmate.zoo`, and Hugging Face's GPT-2 from a config) it runs one training step
(forward + backward, gradients into `.grad`) with:

* eager PyTorch, no recomputation;
* `torch.utils.checkpoint`: `checkpoint_sequential` over several segment counts on the chain-like model, `checkpoint`
  on every, every 2nd and every 4th block elsewhere;
* selective activation checkpointing (`create_selective_checkpoint_contexts`) on the same regions with two usual
  policies: save the compute-heavy ops (matmuls, convolutions, attention) and recompute the rest, and TorchTitan's
  op policy (save attention and every other matmul, here also every other convolution);
* `torch.compile` (Inductor, its caches off and a fresh `TORCHINDUCTOR_CACHE_DIR`, so compile times include building
  its kernels) at several `torch._functorch.config.activation_memory_budget` values;
* ours, `checkmate.compile` with `optimal` and `approx` (profiled op costs), with each peer's measured peak as budget,
  and `gradient_memory="when_made"` (every step here starts from `.grad = None`, so each gradient is counted from
  the op that makes it, as it is for the peers; `--gradient-memory whole_step` charges them for the whole step).

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
import gc
import json
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import checkmate
from checkmate.execute.memory import measure_peak, step_baseline, storage_bytes, synchronize
from checkmate.files import write_file
from checkmate.options import CostModel, GradientMemory, choices
from checkmate.search_defaults import TIMED_METHODS
from checkmate.torch_capture.allocator import allocator_peak

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing
from peers_report import Row, prediction_summary, ratio_summary, render
from peers_tools import PEER_TOOLS, Candidate, Setting, Workload, prepare_model, workloads

log = logging.getLogger("peers")


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


def ours_candidates(
    setting: Setting, levels: dict[int, list[str]], meter: Meter, reference: list[torch.Tensor]
) -> list[Candidate]:
    """`checkmate.compile` with `optimal` and `approx` at each level (a peer's measured peak), fitted to the meter."""
    return [
        fit_ours(setting, level, (method, executor), (meter, reference), peers)
        for level, peers in sorted(levels.items(), reverse=True)
        for executor in setting.args.executors
        for method in setting.args.methods
    ]


def fit_ours(
    setting: Setting, level: int, how: tuple[str, str], checks: tuple[Meter, list[torch.Tensor]], peers: list[str]
) -> Candidate:
    """Ours at `level`: plan with the level as the budget, run it once (gradients checked) and measure it on the one
    meter. While the meter reads above the level (memory the plan does not model, such as kernel scratch under a
    cost model that runs nothing), plan again with the budget set that much below the plan's own peak, at most
    `--fit-iterations` times. The last plan that was measured is kept; the row's setup time adds up every attempt."""
    meter, reference = checks
    budget, history, setup = level, [], 0.0
    kept: Candidate | None = None
    for _ in range(setting.args.fit_iterations + 1):
        candidate = plan_ours(setting, budget, how, level)
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


def plan_ours(setting: Setting, budget: int, how: tuple[str, str], level: int) -> Candidate:
    """`checkmate.compile` at `budget` bytes with (method, executor) (profiled op costs, plans cached on disk); not
    yet called. The tool is "ours (method)" on the eager executor, "ours+inductor (method)" on Inductor."""
    args = setting.args
    method, executor = how
    model = copy.deepcopy(setting.model)
    config = f"{method} at {_mib(level)} MiB"
    tool = f"ours ({method})" if executor == "eager" else f"ours+{executor} ({method})"
    if executor == "backend":
        return _plan_ours_backend(setting, budget, method, level, tool)
    channels_last = {"inductor-cl": True, "inductor-contiguous": False}.get(executor)  # else the default (auto)
    started = time.perf_counter()
    try:
        step = checkmate.compile(
            model, setting.loss_fn, setting.batch, budget=int(budget), method=method,
            cost_model=args.cost_model, time_limit=args.time_limit, measure_memory="first",
            gradient_memory=args.gradient_memory, executor=executor.split("-")[0], channels_last=channels_last,
        )  # fmt: skip
    except checkmate.CheckmateError as error:
        failed = Candidate(tool, config, model, lambda: None, knob=level, budget=int(budget))
        failed.note = _describe_failure(error)
        failed.setup_s = time.perf_counter() - started
        return failed

    def run() -> None:
        step(*setting.batch)

    candidate = Candidate(tool, config, model, run, knob=level, budget=int(budget))
    candidate.setup_s, candidate.solve_s = time.perf_counter() - started, step.plan.solve_time
    candidate.predicted_peak = step.plan.peak_memory
    predicted = step.report().predicted_time
    candidate.predicted_ms = None if predicted is None else predicted * 1e3
    candidate.extra.update(status=step.plan.status, step=step)
    return candidate


def _plan_ours_backend(setting: Setting, budget: int, method: str, level: int, tool: str) -> Candidate:
    """`torch.compile(step, backend=checkmate.backend(budget))` of the whole step (model and loss, as the
    torch.compile peer compiles it), called once here: that call compiles and plans, and is the setup time."""
    args = setting.args
    model = copy.deepcopy(setting.model)
    namespace: dict[str, Any] = {"loss_fn": setting.loss_fn, "model": model}
    filename = f"<peers checkmate.backend step: {setting.workload.name}, {budget}, {time.perf_counter_ns()}>"
    exec(compile("def step(*batch):\n    return loss_fn(model, *batch)\n", filename, "exec"), namespace)
    planner = checkmate.backend(int(budget), method=method, cost_model=args.cost_model, time_limit=args.time_limit)
    compiled = torch.compile(namespace["step"], fullgraph=True, dynamic=False, backend=planner)

    def run() -> None:
        compiled(*setting.batch).backward()

    config = f"{method} at {_mib(level)} MiB"
    started = time.perf_counter()
    try:
        run()
    except Exception as error:  # Dynamo wraps the backend's errors; ours is the cause
        inner = getattr(error, "inner_exception", None) or error.__cause__
        if not isinstance(inner, checkmate.CheckmateError):
            raise
        cause = inner
        failed = Candidate(tool, config, model, lambda: None, knob=level, budget=int(budget))
        failed.note = _describe_failure(cause)
        failed.setup_s = time.perf_counter() - started
        return failed
    candidate = Candidate(tool, config, model, run, knob=level, budget=int(budget))
    region = planner.regions[-1]
    candidate.setup_s, candidate.solve_s = time.perf_counter() - started, region.plan.solve_time
    candidate.predicted_peak = region.plan.peak_memory
    candidate.predicted_ms = region.plan.cost * 1e3 if args.cost_model == "profile" else None
    candidate.extra.update(status=region.plan.status, warm=True, regions=len(planner.regions))
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

    def reset(position: int) -> None:
        candidates[runnable[position]].model.zero_grad(set_to_none=True)
        synchronize(setting.device)

    def synchronized(candidate: Candidate) -> Callable[[], None]:
        def run() -> None:
            candidate.run()
            synchronize(setting.device)

        return run

    steps = [synchronized(candidates[index]) for index in runnable]
    times = timing.interleaved_times(steps, repeats, shuffler=random.Random(0), before_each=reset)
    return dict(zip(runnable, times, strict=True))


def compiled_graphs() -> int:
    """How many graphs Dynamo has compiled in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


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
        predicted_ms=candidate.predicted_ms,
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small models, 4 compile budgets, 10 s solves")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--models", nargs="*", help="names (or prefixes) of the models to run; default all")
    parser.add_argument("--tools", nargs="*", default=list(PEER_TOOLS), choices=list(PEER_TOOLS))
    parser.add_argument("--methods", nargs="*", default=list(TIMED_METHODS), help="our methods; none to skip")
    parser.add_argument(
        "--executors", nargs="*", default=["eager", "inductor", "inductor-cl", "backend"],
        choices=("eager", "inductor", "inductor-cl", "inductor-contiguous", "backend"),
        help="how ours runs: checkmate.compile on ATen ops (eager) or Inductor-compiled nodes (inductor, its default "
        "layout choice; inductor-cl with channels_last=True, inductor-contiguous with channels_last=False), or "
        "torch.compile with checkmate.backend (backend)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=11, help="timed rounds (median)")
    parser.add_argument("--time-limit", type=float, help="seconds per solve of ours (default 45, quick 10)")
    parser.add_argument("--cost-model", default="profile", choices=choices(CostModel))
    parser.add_argument("--compile-budgets", type=float, nargs="*", help="activation_memory_budget values")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (inductor or "
                        "aot_eager_decomp_partition: the same min-cut/knapsack planner, eager kernels)")  # fmt: skip
    parser.add_argument("--segments", type=int, nargs="*", help="checkpoint_sequential segment counts")
    parser.add_argument("--strides", type=int, nargs="*", default=[1, 2, 4], help="checkpoint every k-th block")
    parser.add_argument(
        "--gradient-memory", default="when_made", choices=choices(GradientMemory),
        help="how our plans count gradients: from the op that makes each (every step here starts from .grad = None, "
        "as the peers' do) or for the whole step",
    )  # fmt: skip
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
    parser.add_argument(
        "--summary", action="store_true", help="with --from-json: only the table of ours against each peer tool"
    )
    parser.add_argument(
        "--predictions", action="store_true", help="with --from-json: only how far measured step times are from ours' "
        "predicted ones",
    )  # fmt: skip
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
    write_file(path, json.dumps({"environment": info, "rows": plain}, indent=1, default=_plain))


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
        if args.summary:
            print(ratio_summary(saved_rows))
        elif args.predictions:
            print(prediction_summary(saved_rows))
        else:
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
