"""Step time and per-rank peak of `checkmate.compile` on an FSDP2 (`fully_shard`) model against eager FSDP2 with the
tools users have today, at matched per-rank memory: 2 ranks, gloo, CPU (issue 21).

    .venv/bin/python benchmarks/sharded.py --quick                # 2 layers, width 64, 64 tokens: a dry run
    .venv/bin/python benchmarks/sharded.py --out                  # rows to benchmarks/results/sharded.json
    .venv/bin/python benchmarks/sharded.py --from-json            # the table again from them
    .venv/bin/python benchmarks/sharded.py --model prenorm --fractions 0.6 0.5 \
        --out benchmarks/results/sharded_prenorm.json             # our own pre-norm transformer, 6 blocks

The model is Hugging Face's `GPT2LMHeadModel` from a `GPT2Config` (random weights, dropout 0, tied output layer), or
with `--model prenorm` our own pre-norm transformer (`checkmate.zoo.gpt`, 6 blocks of width 128), with
`fully_shard` on each block and on the root; each rank feeds it its own tokens. Each rank
runs one torch thread, and every configuration is a fresh FSDP2 copy of the same model:

* eager FSDP2, `loss_fn(model, *batch).backward()`;
* per-block `checkpoint` (use_reentrant=False) as torchtitan lays it out: `checkpoint_wrapper` on a block, then
  `fully_shard` on the wrapper; on every block and on every 2nd block (`--strides`);
* SAC on every block (`checkpoint_wrapper` with a `create_selective_checkpoint_contexts` context) with the two
  policies of `benchmarks/peers_tools.py`: save matmuls and attention, and TorchTitan's every other matmul;
* ours, `checkmate.compile(method="optimal", gradient_memory="when_made")` (every configuration is metered from
  `.grad = None`) with each peer's measured per-rank peak as the budget in bytes (peaks within `--merge-within`
  share the smaller one), planned again with a lower budget, at most `--fit-iterations` times, while the meter reads
  over that peak; ours at each of `--fractions` of eager FSDP2's peak, likewise; and ours at budget 1.0
  (`checkpoint_all`, no recomputation), with each unit's all-gather prefetched (the default) and not
  (`checkmate.options.ShardedOptions`).

One meter for all, on each rank: the bytes the rank holds at the start (its parameter shards, buffers and tokens;
`.grad` is None) plus the CPU allocator's peak over a step above that (`allocator_peak`: profiler allocation events,
which see FSDP2's gathered parameters, unsharded gradients and collective buffers alike), after a warm-up step; the
table gives the max over `--meter-calls` steps (a step's peak varies by about a unit's gathered parameters with when
gloo's thread frees its buffers) and over ranks. Ours' planned peak is `step.report().planned_peak`, which counts the
gathered parameters, unsharded gradients and collective buffers (`checkmate.sharded.memory`); memory it missed would
show as measured above planned, and the column measured/planned says by how much. Ours' predicted time is
`step.report().planned_time`: the plan's compute and the gathers' and reduce-scatters' time that compute does not
hide, as the search priced them (rank 0's profile), beside the measured step time of the slower rank. Every
configuration's gradient shards (`.grad.to_local()`, from `.grad = None`) are compared with eager FSDP2's on its
first call (max abs difference over ranks; "bitwise" when 0). Step times are medians over `--repeats` rounds, each
calling every configuration once in a shuffled order (the same on every rank, since steps are collective; `.grad`
reset untimed), the slower rank's median.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import logging
import math
import random
import statistics
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import checkmate
import timing
from checkmate import zoo
from checkmate.execute.memory import storage_bytes
from checkmate.fetched import fetches
from checkmate.files import write_file
from checkmate.options import CostModel, ShardedOptions, choices
from checkmate.torch_capture.allocator import allocator_peak
from checkmate.training.compiled import CompiledStep
from peers_tools import SAC_POLICIES
from rows import Row, Stored, add_row_arguments, measure_or_load

WORLD_SIZE = 2
MODEL = "GPT-2 (transformers)"
SIZES = {  # layers, width, tokens per sequence, sequences per rank, vocabulary
    "quick": {"layers": 2, "width": 64, "length": 64, "batch": 4, "vocab": 512},
    "full": {"layers": 4, "width": 128, "length": 128, "batch": 4, "vocab": 1024},
}

log = logging.getLogger("sharded")


@dataclass(eq=False)
class Config:
    """One configuration, ready to run: `run()` does forward + backward into `model`'s sharded `.grad`s."""

    tool: str
    name: str
    model: nn.Module
    run: Callable[[], Any]
    peak: int | None = None
    grad_diff: float | None = None
    step: Any = None
    note: str = ""
    fit: list[tuple[int, int]] = field(default_factory=list)


def gpt2(size: dict[str, int]) -> Setup:
    """`GPT2LMHeadModel` with random weights (the same on every rank) and dropout off; this rank's tokens."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=size["vocab"], n_positions=size["length"], n_embd=size["width"], n_layer=size["layers"],
        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    tokens = torch.randint(0, size["vocab"], (size["batch"], size["length"]), generator=generator)

    def causal_lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, labels=tokens).loss

    return transformers.GPT2LMHeadModel(config).train(), causal_lm_loss, (tokens,)


def prenorm_gpt(size: dict[str, int]) -> Setup:
    """Our own pre-norm transformer (`checkmate.zoo.gpt`: LayerNorm before attention and the GELU MLP, tied output
    projection) at `size`, dropout off; this rank's tokens."""
    model, loss_fn, _ = zoo.gpt(
        size["batch"], length=size["length"], dim=size["width"], heads=4, layers=size["layers"],
        vocab=size["vocab"], dropout=0.0,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    tokens = torch.randint(0, size["vocab"], (size["batch"], size["length"] + 1), generator=generator)
    return model.train(), loss_fn, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


Setup = tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]  # the unsharded model, loss, batch
Wrap = Callable[[int, nn.Module], nn.Module]
MODELS: dict[str, tuple[str, Callable[[dict[str, int]], Setup], dict[str, dict[str, int]]]] = {
    "gpt2": (MODEL, gpt2, SIZES),
    "prenorm": (
        "pre-norm GPT (ours, 6 blocks)",
        prenorm_gpt,
        {
            "quick": {"layers": 6, "width": 64, "length": 64, "batch": 4, "vocab": 512},
            "full": {"layers": 6, "width": 128, "length": 128, "batch": 4, "vocab": 1024},
        },
    ),
}


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """The model's blocks, the units `fully_shard` wraps one by one: GPT-2's `transformer.h`, our GPT's `blocks`."""
    path = "transformer.h" if hasattr(model, "transformer") else "blocks"
    return cast(nn.ModuleList, model.get_submodule(path))


def sharded(base: nn.Module, wrap: Wrap | None = None) -> nn.Module:
    """A copy of `base` with each block (wrapped by `wrap(index, block)` first, if given) and the root sharded."""
    model = copy.deepcopy(base)
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    blocks = blocks_of(model)
    for index in range(len(blocks)):
        if wrap is not None:
            blocks[index] = wrap(index, blocks[index])
        fully_shard(blocks[index], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _checkpointed(stride: int, index: int, block: nn.Module, **options: Any) -> nn.Module:
    return checkpoint_wrapper(block, **options) if index % stride == 0 else block


def peer_configs(
    base: nn.Module, loss_fn: Callable[..., torch.Tensor], batch: tuple[Any, ...], strides: list[int]
) -> list[Config]:
    def make(tool: str, name: str, wrap: Wrap | None = None) -> Config:
        model = sharded(base, wrap)
        return Config(tool, name, model, lambda: loss_fn(model, *batch).backward())

    count = len(blocks_of(base))
    configs = [make("eager FSDP2", "eager FSDP2")]
    for stride in strides:
        label = {1: "every block", 2: "every 2nd block"}.get(stride, f"every {stride}th block")
        chosen = len(range(0, count, stride))
        wrap = functools.partial(_checkpointed, stride)
        configs.append(make("checkpoint", f"checkpoint {label} ({chosen}/{count})", wrap))
    for policy, context_fn in SAC_POLICIES.items():
        wrap = functools.partial(_checkpointed, 1, context_fn=context_fn)
        configs.append(make("SAC", f"SAC {policy} (each of {count} blocks)", wrap))
    return configs


def _max_over_ranks(value: float) -> float:
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_gradients(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else _local(p.grad).detach().clone() for p in model.parameters()]


def gradient_difference(config: Config, reference: list[torch.Tensor | None]) -> float:
    """Max abs difference of `config`'s gradient shards from `reference` after one call from `.grad = None`, over
    ranks (inf where one side has a gradient and the other none)."""
    config.model.zero_grad(set_to_none=True)
    config.run()
    worst = 0.0
    for got, want in zip(local_gradients(config.model), reference, strict=True):
        if got is None or want is None:
            worst = worst if got is want else math.inf
        else:
            worst = max(worst, (got - want).abs().max().item())
    config.model.zero_grad(set_to_none=True)
    return _max_over_ranks(worst)


def per_rank_peak(config: Config, batch: tuple[Any, ...], calls: int) -> int:
    """The one meter: bytes held at the start (parameter shards, buffers, batch) plus the allocator's peak over a
    step, from `.grad = None` after a warm-up step; the max over `calls` steps and over ranks (a step's peak varies by
    a gathered unit or so with when gloo's thread frees its buffers)."""
    config.model.zero_grad(set_to_none=True)
    config.run()
    peaks = []
    for _ in range(calls):
        config.model.zero_grad(set_to_none=True)
        gc.collect()
        held = [_local(p) for p in config.model.parameters()] + [*config.model.buffers(), *batch]
        peaks.append(storage_bytes(held) + allocator_peak(config.run))
    config.model.zero_grad(set_to_none=True)
    return int(_max_over_ranks(max(peaks)))


def check_and_meter(configs: list[Config], batch: tuple[Any, ...], calls: int) -> list[torch.Tensor | None]:
    """Each configuration's gradient difference from the first's (eager FSDP2's) and its per-rank peak; returns the
    first's gradient shards, the reference."""
    first = configs[0]
    first.model.zero_grad(set_to_none=True)
    first.run()
    reference = local_gradients(first.model)
    for config in configs:
        config.grad_diff = gradient_difference(config, reference)
        config.peak = per_rank_peak(config, batch, calls)
        log.info(
            "%s, %s: per-rank peak %s MiB, gradients max abs diff %g",
            config.tool, config.name, _mib(config.peak), config.grad_diff,
        )  # fmt: skip
    return reference


def levels(peers: list[Config], merge: float) -> dict[int, list[Config]]:
    """The peers' peaks, each within `merge` (relative) of a smaller one folded into the smaller."""
    folded: dict[int, list[Config]] = {}
    current: int | None = None
    for config in sorted(peers, key=lambda config: config.peak or 0):
        assert config.peak is not None
        if current is None or config.peak > current * (1 + merge):
            current = config.peak
            folded[current] = []
        folded[current].append(config)
    return folded


def _describe_failure(error: checkmate.CheckmateError) -> str:
    if isinstance(error, checkmate.InfeasibleBudget):
        smallest = "unknown" if error.minimum is None else f"{_mib(error.minimum)} MiB"
        return f"no plan (smallest budget {smallest})"
    return f"failed: {type(error).__name__}: {str(error)[:200]}"


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / 2**20:.2f}"


def compile_ours(
    setup: Setup, budget: float, args: argparse.Namespace, options: ShardedOptions | None = None
) -> Config:
    """`checkmate.compile` of a fresh FSDP2 copy at `budget` (bytes, or 1.0: no recomputation), placing its units'
    calls as `options` say; not yet called."""
    base, loss_fn, batch = setup
    model = sharded(base)
    method, solve_options = ("checkpoint_all", {}) if budget == 1.0 else ("optimal", {"time_limit": args.time_limit})
    name = "ours, budget 1.0 (no recomputation)" if budget == 1.0 else f"ours at {_mib(budget)} MiB"
    try:
        step = checkmate.compile(
            model, loss_fn, batch, budget=budget, method=method, cost_model=args.cost_model, cache=False,
            measure_memory="never", sharded=options, gradient_memory="when_made", **solve_options,
        )  # fmt: skip
    except checkmate.CheckmateError as error:
        return Config("ours", name, model, lambda: None, note=_describe_failure(error))
    return Config("ours", name, model, lambda: step(*batch), step=step)


def fit_ours(setup: Setup, level: int, reference: list[torch.Tensor | None], args: argparse.Namespace) -> Config:
    """Ours at `level`: plan with the level as the budget, check and meter it; while the meter reads over the level
    (memory the plan does not count), plan again with the budget that much below the plan's own peak, at most
    `--fit-iterations` times. The last plan measured is kept."""
    budget, kept = level, None
    for _ in range(args.fit_iterations + 1):
        config = compile_ours(setup, budget, args)
        if config.note:
            if kept is None:
                kept = config
            else:
                kept.note = f"lowering the budget to {_mib(budget)} MiB: {config.note}"
            break
        config.fit = [] if kept is None else kept.fit
        config.grad_diff = gradient_difference(config, reference)
        config.peak = per_rank_peak(config, setup[2], args.meter_calls)
        config.fit.append((budget, config.peak))
        kept = config
        log.info("%s: measured %s MiB for a level of %s MiB", config.name, _mib(config.peak), _mib(level))
        if config.peak <= level:
            break
        budget = min(budget, config.step.report().planned_peak) - (config.peak - level)
    assert kept is not None
    return kept


def interleaved_medians(configs: list[Config], repeats: int) -> list[float | None]:
    """Seconds per step of each runnable configuration: the slower rank's median over `repeats` shuffled rounds after
    one warm-up round."""
    runnable = [index for index, config in enumerate(configs) if not config.note]

    def reset(position: int) -> None:
        configs[runnable[position]].model.zero_grad(set_to_none=True)
        dist.barrier()

    shuffler = random.Random(0)  # the same order on every rank
    times = timing.interleaved_times([configs[i].run for i in runnable], repeats, shuffler=shuffler, before_each=reset)
    medians = {
        index: _max_over_ranks(statistics.median(seconds)) for index, seconds in zip(runnable, times, strict=True)
    }
    return [medians.get(index) for index in range(len(configs))]


def _gathers(step: CompiledStep) -> int | None:
    """How many all-gathers ours' step makes: the plan's decision (`checkmate.fetched`)."""
    presence = step.compiled.schedule.presence
    return int(fetches(presence).sum()) if presence.size else None


def _ours_fields(config: Config, seconds: float | None) -> Row:
    report = None if config.step is None else config.step.report()
    return {
        "ours_budget": None if report is None else report.budget,
        "ours_planned": None if report is None else report.planned_peak,
        "ours_gathers": None if config.step is None else _gathers(config.step),
        "ours_peak": config.peak,
        "ours_ms": None if seconds is None else seconds * 1e3,
        "ours_predicted_ms": None if report is None or report.planned_time is None else report.planned_time * 1e3,
        "ours_grad_diff": config.grad_diff,
        "ours_fit": config.fit,
        "ours_note": config.note,
    }


def _worker(rank: int, directory: str, args: argparse.Namespace) -> None:
    """One rank: every configuration built, checked, metered and timed; rank 0 writes the rows."""
    torch.set_num_threads(1)
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, format=f"%(asctime)s rank {rank} %(name)s %(message)s", datefmt="%H:%M:%S")
    if not args.verbose:
        logging.getLogger("checkmate").setLevel(logging.WARNING)
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=WORLD_SIZE)
    name, setup, sizes = MODELS[args.model]
    base, loss_fn, batch = setup(sizes["quick" if args.quick else "full"])
    peers = peer_configs(base, loss_fn, batch, args.strides)
    reference = check_and_meter(peers, batch, args.meter_calls)
    folded = levels(peers, args.merge_within)
    level_of = {id(config): level_bytes for level_bytes, configs in folded.items() for config in configs}
    matched: dict[int, Config] = {}
    for level_bytes, configs in sorted(folded.items(), reverse=True):
        log.info("ours at %s MiB (%s)", _mib(level_bytes), ", ".join(config.name for config in configs))
        ours = fit_ours((base, loss_fn, batch), level_bytes, reference, args)
        matched |= {id(config): ours for config in configs}
    eager_peak = peers[0].peak
    assert eager_peak is not None
    fractions = []
    for fraction in args.fractions:
        ours = fit_ours((base, loss_fn, batch), int(fraction * eager_peak), reference, args)
        ours.name = f"ours at {fraction:.0%} of eager FSDP2's peak"
        level_of[id(ours)] = int(fraction * eager_peak)
        fractions.append(ours)
    full = compile_ours((base, loss_fn, batch), 1.0, args)
    # the same plan with each all-gather where it is waited for: what prefetching buys
    serial = compile_ours((base, loss_fn, batch), 1.0, args, ShardedOptions(prefetch_gathers=False))
    serial.name = "ours, budget 1.0, all-gathers not prefetched"
    for config in (full, serial):
        if not config.note:
            config.grad_diff = gradient_difference(config, reference)
            config.peak = per_rank_peak(config, batch, args.meter_calls)
    ours_configs = list({id(config): config for config in [*matched.values(), *fractions, full, serial]}.values())
    everyone = peers + ours_configs
    log.info("timing %d configurations, %d rounds", len(everyone), args.repeats)
    medians = dict(zip(map(id, everyone), interleaved_medians(everyone, args.repeats), strict=True))
    rows = []
    for config in [*peers, *fractions, full, serial]:
        ours = matched.get(id(config), config)
        seconds = medians[id(config)]
        rows.append({
            "model": name, "tool": config.tool, "config": config.name, "peak": config.peak,
            "step_ms": None if seconds is None else seconds * 1e3, "grad_diff": config.grad_diff,
            "level": level_of.get(id(config)),
            **_ours_fields(ours, medians[id(ours)]),
        })  # fmt: skip
    hand_rows(directory, rows if rank == 0 else [])


def ranks_rows(worker: Callable[..., None], *args: Any) -> Iterator[Row]:
    """Run `worker(rank, directory, *args)` on `WORLD_SIZE` spawned ranks and yield the rows each handed to
    `hand_rows`, rank by rank."""
    with tempfile.TemporaryDirectory() as directory:
        mp.spawn(worker, args=(directory, *args), nprocs=WORLD_SIZE, join=True)
        for rank in range(WORLD_SIZE):
            yield from json.loads(Path(directory, f"rows_{rank}.json").read_text())


def hand_rows(directory: str, rows: list[Row]) -> None:
    """This rank's rows for `ranks_rows`; then the process group ends, once every rank has handed its own."""
    write_file(Path(directory, f"rows_{dist.get_rank()}.json"), json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def measure(args: argparse.Namespace) -> Iterator[Row]:
    return ranks_rows(_worker, args)


def _grads(difference: float | None) -> str:
    if difference is None:
        return "—"
    return "bitwise" if difference == 0 else f"max abs diff {difference:.1e}"


def _fits(row: Row) -> bool:
    return row["ours_peak"] is not None and row["ours_ms"] is not None and row["ours_peak"] <= row["level"]


def _line(row: Row, eager_ms: float | None) -> str:
    versus = row["step_ms"] if row["tool"] != "ours" else eager_ms
    ratio = "—" if row["ours_ms"] is None or versus is None else f"{row['ours_ms'] / versus:.3f}"
    if row["tool"] == "ours":
        ratio += " (vs eager FSDP2)"
    elif row["ours_peak"] is not None and not _fits(row):
        ratio += " (ours over)"
    planned, measured = row["ours_planned"], row["ours_peak"]
    share = "—" if planned is None or measured is None else f"{measured / planned:.3f}"
    step_ms = "—" if row["step_ms"] is None else f"{row['step_ms']:.1f}"
    ours_ms = "—" if row["ours_ms"] is None else f"{row['ours_ms']:.1f}"
    predicted = row.get("ours_predicted_ms")
    predicted_ms = "—" if predicted is None else f"{predicted:.1f}"
    note = f" {row['ours_note']}" if row["ours_note"] else ""
    gathers = "—" if row.get("ours_gathers") is None else str(row["ours_gathers"])
    return (
        f"| {row['config']} | {_mib(row['peak'])} | {step_ms} | {_mib(row['ours_budget'])} | "
        f"{_mib(planned)} | {_mib(measured)} | {share} | {gathers} | {predicted_ms} | {ours_ms} | {ratio}{note} | "
        f"{_grads(row['grad_diff'])}; ours {_grads(row['ours_grad_diff'])} |"
    )


def _summary(rows: list[Row]) -> list[str]:
    lines = []
    for tool in dict.fromkeys(row["tool"] for row in rows if row["tool"] != "ours"):
        mine = [row for row in rows if row["tool"] == tool]
        ratios = [row["ours_ms"] / row["step_ms"] for row in mine if _fits(row)]
        mean = f"{math.exp(statistics.fmean(map(math.log, ratios))):.3f}" if ratios else "—"
        over = sum(1 for row in mine if row["ours_peak"] is not None and not _fits(row))
        missing = sum(1 for row in mine if row["ours_peak"] is None)
        lines.append(
            f"- {tool}: ours/peer {mean} (geometric mean over {len(ratios)} of {len(mine)} configurations where ours "
            f"fits); ours reads over the peer's peak at {over}, has no plan at {missing}"
        )
    return lines


def render(stored: Stored) -> str:
    tables = []
    for model in dict.fromkeys(row["model"] for row in stored.rows):
        rows = [row for row in stored.rows if row["model"] == model]
        eager_ms = next((row["step_ms"] for row in rows if row["tool"] == "eager FSDP2"), None)
        tables.append(
            f"### {model}, 2 ranks (gloo, CPU)\n\n"
            "| configuration | per-rank peak MiB | step ms | ours' budget MiB | ours' planned peak MiB "
            "| ours' measured peak MiB | measured/planned | ours' gathers | ours predicted ms | ours ms | ours/peer "
            "| grads = eager FSDP2 |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
            + "\n".join(_line(row, eager_ms) for row in rows)
            + "\n\n"
            + "\n".join(_summary(rows))
        )
    return "\n\n".join(tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="gpt2", help="the model (see the module doc)")
    parser.add_argument("--quick", action="store_true", help="2 layers, width 64, 64 tokens; 5 repeats, 5 s solves")
    parser.add_argument("--strides", type=int, nargs="+", default=[1, 2], help="checkpoint every k-th block")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per optimal solve")
    parser.add_argument("--cost-model", default="profile", choices=choices(CostModel))
    parser.add_argument(
        "--fractions", type=float, nargs="*", default=[0.5], help="ours also at these fractions of eager FSDP2's peak"
    )
    parser.add_argument("--fit-iterations", type=int, default=2, help="replans of ours when the meter reads over")
    parser.add_argument(
        "--merge-within", type=float, default=0.02, help="peer peaks this close share one budget of ours"
    )
    parser.add_argument("--meter-calls", type=int, default=3, help="metered steps per configuration (max)")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (median)")
    parser.add_argument("--verbose", action="store_true", help="show checkmate's planning log")
    add_row_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.time_limit = 5, 5.0
    measure_or_load(args, "sharded", lambda: measure(args), render)


if __name__ == "__main__":
    main()
