"""The "profile" cost model: time every op of the joint graph on the model's device, and measure its scratch memory.

How it is measured: the whole joint graph is run op by op in execution order, on real tensors
(parameters, buffers and the example batch; intermediate values are allocated one op at a time and
freed after their last use, as in a training step, so caches are as warm or cold as they are in the
step): `ProfileRepeats.warmup` untimed runs, then timed runs until the step's total (the sum of the per-op medians)
moves by at most `settled` between two runs, at least `minimum` and at most `maximum` of them.
Every op that allocates memory is timed in every timed run, and its cost is the median of its runs,
in seconds. Each run is a whole training step, so on a large model profiling takes as long as tens of
steps; the plan needs costs relative to each other, which settle after a few runs: a plan made from a
few runs costs, priced by many, what the plan made from many costs, within run-to-run noise, in a
fraction of the capture time (`benchmarks/investigations/profile_repeats.py`). On CPU the
timer is `time.perf_counter` and PyTorch runs with one intra-op thread: on a loaded machine, timings
with more threads vary many times over between runs, where one thread keeps per-op medians steady.
On CUDA each op is bracketed by CUDA events and synchronized. Views, `getitem` and other
ops that allocate nothing cost 0. The random generator state is restored afterwards, so profiling
does not change the user's random stream.

Scratch memory: a kernel may allocate buffers inside itself and free them before it returns (a
convolution's backward, BatchNorm's backward); the fx graph does not show them. One more pass over
the graph, untimed and at PyTorch's current intra-op thread count (the step's: CPU kernels may
allocate per-thread buffers), measures each allocating op's scratch bytes: the most bytes the
allocator held during the op above what it held when the op returned (what it still holds then is
the op's output, which the planning graph counts already), 0 when it never held more. On CPU the
pass runs under `torch.profiler.profile(profile_memory=True)`, each op inside a `record_function`
span; every allocation and free event carries the allocator's running total, and an event belongs
to the op whose span contains its time (on any thread, so intra-op worker threads count). On CUDA
the op runs between `torch.cuda.reset_peak_memory_stats` and `max_memory_allocated`.

Both are cached on disk, per device and op signature (op, argument shapes, strides, dtypes and
non-tensor arguments), in `$CHECKMATE_CACHE_DIR/profiles/` (default `~/.cache/checkmate/profiles/`):
timings in `<device>.json`, scratch bytes in `scratch-<device at the thread count>.json`. A second
capture of the same model, or of a model with the same layers, is fast.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import logging
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.utils import _pytree as pytree

from checkmate.disk_cache import cache_root
from checkmate.json_cache import finite_number, merge_entries, read_entries
from checkmate.progress_lines import work_lines
from checkmate.torch_capture.allocator import allocation_events, event_tree, memory_profile, walk
from checkmate.torch_capture.grouping import find_owners
from checkmate.torch_capture.strides import conform_layout, traced_stride

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfileRepeats:
    """How many times the "profile" cost model runs the step (see the module docstring).

    Attributes:
        warmup: untimed runs first.
        minimum: the fewest timed runs.
        maximum: the most timed runs.
        settled: timing stops once the step's total moves by at most this fraction between two timed runs.
    """

    warmup: int = 1
    minimum: int = 3
    maximum: int = 11
    settled: float = 0.02


DEFAULT_REPEATS = ProfileRepeats()

_SPAN_PREFIX = "checkmate::"


@dataclass(frozen=True)
class OpProfile:
    """The price of each call node of the joint graph (fx name -> value; 0 for ops that allocate nothing).

    Attributes:
        costs: the op's cost: its median run time in seconds when profiled (the "flops" and "unit" cost
            models fill in their own units).
        scratch_bytes: bytes the op holds inside its kernel while it runs, above its output (see the module
            docstring); empty when the cost model runs nothing.
    """

    costs: dict[str, float]
    scratch_bytes: dict[str, int]


# One measurement pass: runs the graph's ops and returns the measured value of each of the named (missing) ops.
Measure = Callable[[set[str], "_Tally"], dict[str, float]]


@dataclass
class _Tally:
    """How far a measurement is, for its progress lines: `done` ops run, in passes of `ops` ops, at most `passes`."""

    what: str
    ops: int
    passes: int
    done: int = 0

    def line(self) -> str:
        run, op = divmod(self.done, max(self.ops, 1))
        return f"{self.what}: pass {min(run + 1, self.passes)} of at most {self.passes}, op {op:,} of {self.ops:,}"


def cache_directory() -> Path:
    """Where profiles are cached: `profiles/` in the cache folder (`checkmate.disk_cache.cache_root`)."""
    return cache_root() / "profiles"


def device_key(device: torch.device, threads: int = 1) -> str:
    """A file-name-safe identity of the device (and, on CPU, intra-op thread count) the measurements belong to."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{device.type}-{platform.machine()}-{_cpu_model()}-{threads}thread"
    return "".join(character if character.isalnum() else "_" for character in f"{name}-torch{torch.__version__}")


def _cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), so timings are not shared across CPU models."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def op_signature(node: torch.fx.Node, args: Any, kwargs: Any) -> str:
    """The op and a description of its arguments: shapes, strides and dtypes of tensors, values of the rest."""

    def describe(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return f"T{tuple(value.shape)}s{tuple(value.stride())}{value.dtype}"
        return repr(value)

    text = f"{node.target}|{pytree.tree_map(describe, (args, kwargs))}"
    return hashlib.sha1(text.encode()).hexdigest()


def profile_per_op(
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    device: torch.device,
    repeats: ProfileRepeats = DEFAULT_REPEATS,
) -> OpProfile:
    """Seconds and scratch bytes per call node of `module` run on `inputs` (cached measurements are reused), timed
    as `repeats` says."""
    allocating = find_owners(module.graph).allocating
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        signatures = {node.name: op_signature(node, args, kwargs) for node, args, kwargs in _run(module, inputs, None)}
        with _one_thread():
            seconds = _cached(
                cache_directory() / f"{device_key(device)}.json",
                signatures,
                allocating,
                lambda missing, tally: _time(module, inputs, device, missing, tally, repeats),
                _Tally(f"profiling op times on {device.type}", len(signatures), repeats.warmup + repeats.maximum),
            )
        scratch = _cached(
            cache_directory() / f"scratch-{device_key(device, torch.get_num_threads())}.json",
            signatures,
            allocating,
            lambda missing, tally: _scratch(module, inputs, device, missing, tally),
            _Tally(f"measuring scratch memory on {device.type}", len(signatures), 1),
        )
    return OpProfile(costs=seconds, scratch_bytes={name: int(value) for name, value in scratch.items()})


def _cached(
    path: Path, signatures: dict[str, str], allocating: frozenset[str], measure: Measure, tally: _Tally
) -> dict[str, float]:
    """The value of every call node: 0 for ops that allocate nothing, else from the cache file at `path`, measuring
    (and storing) the allocating ops whose signature it lacks, with progress lines (`tally`) meanwhile."""
    cache = _load(path)
    missing = {name for name in allocating if signatures[name] not in cache}
    fresh: dict[str, float] = {}
    if missing:
        first = f"{tally.what}: {len(missing):,} ops of {tally.ops:,} to measure; cached for the next compile"
        with work_lines(first, tally.line):
            fresh = {signatures[name]: value for name, value in measure(missing, tally).items()}
    if fresh:
        _store(path, fresh)
    log.info("profile %s: %d ops measured, the rest from the cache", path.name, len(missing))
    known = cache | fresh
    return {name: known[signature] if name in allocating else 0.0 for name, signature in signatures.items()}


def _time(
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    device: torch.device,
    missing: set[str],
    tally: _Tally,
    repeats: ProfileRepeats,
) -> dict[str, float]:
    """Median seconds of each op in `missing` over timed passes after `repeats.warmup` passes, until their total
    settles (see the module doc)."""
    timer = _cuda_timer if device.type == "cuda" else _cpu_timer
    for _ in range(repeats.warmup):
        for _ in _run(module, inputs, timer, tally):
            pass
    timings: dict[str, list[float]] = {name: [] for name in missing}
    total = None
    for repeat in range(1, repeats.maximum + 1):
        for node, seconds in _run(module, inputs, timer, tally):
            if node.name in missing:
                timings[node.name].append(seconds)
        medians = {name: statistics.median(values) for name, values in timings.items()}
        previous, total = total, sum(medians.values())
        log.debug("profile: timed run %d, the step's total %.6g s", repeat, total)
        settled = previous is not None and abs(total - previous) <= repeats.settled * total
        if repeat >= repeats.minimum and settled:
            log.info("profile: op times settled after %d timed runs", repeat)
            break
    return medians


def _run(
    module: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], measure: Any, tally: _Tally | None = None
) -> Iterator[Any]:
    """Run the graph op by op on real tensors, freeing each value after its last use.

    Yields `(node, args, kwargs)` for each call node when `measure` is None; otherwise runs each op
    through `measure(node, args, kwargs)`, which returns the op's result and a measurement, and yields
    `(node, measurement)`. Each op run is counted in `tally`.
    """
    nodes = list(module.graph.nodes)
    last_use = {argument: index for index, node in enumerate(nodes) for argument in node.all_input_nodes}
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(inputs)
    for index, node in enumerate(nodes):
        if node.op == "placeholder":
            env[node] = next(placeholders)
        elif node.op == "get_attr":
            env[node] = getattr(module, str(node.target))
        elif node.op == "call_function":
            args, kwargs = pytree.tree_map_only(torch.fx.Node, env.__getitem__, (node.args, node.kwargs))
            if measure is None:
                yield node, args, kwargs
                env[node] = _call(node, args, kwargs)
            else:
                env[node], measurement = measure(node, args, kwargs)
                yield node, measurement
            if tally is not None:
                tally.done += 1
            stride = traced_stride(node)
            if stride is not None:
                env[node] = conform_layout(env[node], stride)
        for argument in node.all_input_nodes:
            if last_use[argument] == index:
                del env[argument]


def _call(node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
    """Run a call node's op (a `call_function` node's target is callable)."""
    return cast(Callable[..., Any], node.target)(*args, **kwargs)


def _cpu_timer(node: torch.fx.Node, args: Any, kwargs: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = _call(node, args, kwargs)
    return result, time.perf_counter() - started


def _cuda_timer(node: torch.fx.Node, args: Any, kwargs: Any) -> tuple[Any, float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = _call(node, args, kwargs)
    end.record()
    torch.cuda.synchronize()
    return result, start.elapsed_time(end) / 1000.0


def _scratch(
    module: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], device: torch.device, missing: set[str], tally: _Tally
) -> dict[str, float]:
    """Scratch bytes of each op in `missing`, from one pass over the graph."""
    if device.type == "cuda":
        measure = functools.partial(_cuda_scratch, device)
        return {node.name: value for node, value in _run(module, inputs, measure, tally) if node.name in missing}
    return _cpu_scratch(module, inputs, missing, tally)


def _cuda_scratch(device: torch.device, node: torch.fx.Node, args: Any, kwargs: Any) -> tuple[Any, int]:
    """Run the op; its scratch is the allocator's peak during it above what it holds when the op returns."""
    torch.cuda.reset_peak_memory_stats(device)
    result = _call(node, args, kwargs)
    return result, max(0, torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device))


def _cpu_scratch(
    module: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], missing: set[str], tally: _Tally
) -> dict[str, float]:
    """Run the graph under the memory profiler, each op in its own span, and read each op's scratch from the
    allocation events inside its span: the highest running total minus the running total after its last event."""
    with memory_profile() as profiler:
        for _ in _run(module, inputs, _in_span, tally):
            pass
    roots = event_tree(profiler)
    events = allocation_events(roots)
    times = [time_ns for time_ns, _, _ in events]
    scratch: dict[str, float] = {}
    for name, (start, end) in _spans(roots).items():
        if name in missing:
            inside = events[bisect.bisect_left(times, start) : bisect.bisect_right(times, end)]
            totals = [total for _, _, total in inside]
            scratch[name] = max(totals) - totals[-1] if totals else 0
    return scratch


def _in_span(node: torch.fx.Node, args: Any, kwargs: Any) -> tuple[Any, None]:
    with torch.profiler.record_function(_SPAN_PREFIX + node.name):
        return _call(node, args, kwargs), None


def _spans(roots: Sequence[Any]) -> dict[str, tuple[int, int]]:
    """fx name -> (start, end) in ns of the op's `record_function` span."""
    return {
        event.name.removeprefix(_SPAN_PREFIX): (event.start_time_ns, event.end_time_ns)
        for event in walk(roots)
        if event.name.startswith(_SPAN_PREFIX)
    }


@contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _load(path: Path) -> dict[str, float]:
    """The cache file's entries (signature -> number); a missing file reads as empty, a damaged one (an entry that is
    not a finite, non-negative number) is logged, removed and measured again (`json_cache.read_entries`)."""
    return {key: float(value) for key, value in read_entries(path, finite_number).items()}


def _store(path: Path, fresh: dict[str, float]) -> None:
    """Merge `fresh` into the cache file, atomically (rename), keeping entries another process wrote."""
    merge_entries(path, dict(fresh), finite_number)
