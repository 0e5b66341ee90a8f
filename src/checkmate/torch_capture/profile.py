"""The "profile" cost model: time every op of the joint graph on the model's device.

How it is measured: the whole joint graph is run `WARMUP + REPEATS` times, op by op in execution
order, on real tensors (parameters, buffers and the example batch; intermediate values are
allocated one op at a time and freed after their last use, as in a training step, so caches are as
warm or cold as they are in the step). Every op that allocates memory is timed in every run, and its
cost is the median of its `REPEATS` timed runs after `WARMUP` untimed ones, in seconds. On CPU the
timer is `time.perf_counter` and PyTorch runs with one intra-op thread: on a loaded machine two
threads gave timings that varied 10-100x between runs, one thread kept per-op medians within a few
percent. On CUDA each op is bracketed by CUDA events and synchronized. Views, `getitem` and other
ops that allocate nothing cost 0. The random generator state is restored afterwards, so profiling
does not change the user's random stream.

Timings are cached on disk, per device and op signature (op, argument shapes, strides, dtypes and
non-tensor arguments), in `$CHECKMATE_CACHE_DIR/profiles/` (default `~/.cache/checkmate/profiles/`),
so a second capture of the same model, or of a model with the same layers, is fast.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from checkmate.torch_capture.grouping import find_owners
from checkmate.torch_capture.strides import conform_layout, traced_stride

log = logging.getLogger(__name__)

WARMUP = 2
REPEATS = 11


def cache_directory() -> Path:
    """Where profiles are cached: `$CHECKMATE_CACHE_DIR/profiles`, else `~/.cache/checkmate/profiles`."""
    root = os.environ.get("CHECKMATE_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "checkmate"
    return base / "profiles"


def device_key(device: torch.device) -> str:
    """A file-name-safe identity of the device the timings belong to."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{device.type}-{platform.machine()}-{_cpu_model()}-1thread"
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
    module: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], device: torch.device
) -> dict[str, float]:
    """Seconds per call node of `module` run on `inputs` (cached timings are reused)."""
    cache_file = cache_directory() / f"{device_key(device)}.json"
    cache = _load(cache_file)
    allocating = find_owners(module.graph).allocating
    with _one_thread(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        signatures = {node.name: op_signature(node, args, kwargs) for node, args, kwargs in _run(module, inputs, None)}
        missing = {name for name in allocating if signatures[name] not in cache}
        fresh: dict[str, float] = {}
        if missing:
            timer = _cuda_timer if device.type == "cuda" else _cpu_timer
            timings: dict[str, list[float]] = {name: [] for name in missing}
            for repeat in range(WARMUP + REPEATS):
                passes = _run(module, inputs, timer)
                for node, seconds in ((node, result) for node, result, _ in passes if node.name in missing):
                    if repeat >= WARMUP:
                        timings[node.name].append(seconds)
            fresh = {signatures[name]: statistics.median(values) for name, values in timings.items()}
            _store(cache_file, fresh)
    costs = {name: (cache | fresh)[signature] if name in allocating else 0.0 for name, signature in signatures.items()}
    log.info("profiled %d ops: %d timed, the rest from %s", len(costs), len(missing), cache_file)
    return costs


def _run(module: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], timer: Any) -> Any:
    """Run the graph op by op on real tensors, freeing each value after its last use.

    Yields `(node, args, kwargs)` for each call node when `timer` is None; otherwise runs each op
    through `timer(node, args, kwargs)`, which returns seconds, and yields `(node, seconds, None)`.
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
            if timer is None:
                yield node, args, kwargs
                env[node] = node.target(*args, **kwargs)
            else:
                env[node], seconds = timer(node.target, args, kwargs)
                yield node, seconds, None
            stride = traced_stride(node)
            if stride is not None:
                env[node] = conform_layout(env[node], stride)
        for argument in node.all_input_nodes:
            if last_use[argument] == index:
                del env[argument]


def _cpu_timer(target: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = target(*args, **kwargs)
    return result, time.perf_counter() - started


def _cuda_timer(target: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Any, float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = target(*args, **kwargs)
    end.record()
    torch.cuda.synchronize()
    return result, start.elapsed_time(end) / 1000.0


@contextmanager
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _load(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(key): float(value) for key, value in data.items()} if isinstance(data, dict) else {}


def _store(path: Path, fresh: dict[str, float]) -> None:
    """Merge `fresh` into the cache file, atomically (rename), keeping entries another process wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = _load(path) | fresh
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
        json.dump(merged, handle)
    Path(handle.name).replace(path)
