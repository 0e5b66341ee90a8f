"""Measure each compiled node on real tensors: its run time, and what the allocator holds while it runs.

The nodes run in graph order from the model's parameters, buffers and an example batch (each value freed after its
last reader, as in a step without recomputation), `WARMUP` untimed passes and then `REPEATS` timed ones, at the
step's thread count (Inductor's C++ kernels are compiled for it). A node's time is its median call. One more pass
reads the allocator around each call: the peak above what was held when the call started (on CPU from the
profiler's allocation events, `checkmate.torch_capture.allocator`; on CUDA `max_memory_allocated`), and the bytes
of each storage the call returns, so the plan counts Inductor's own buffers as the node's workspace and the
returned buffers as its memory, as they are.

Measurements are cached on disk by node key (`checkmate.inductor.kernels`) and device, in
`$CHECKMATE_CACHE_DIR/profiles/inductor-<device>.json`: a second compile of the same model measures nothing.
The random generator's state is restored afterwards.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from checkmate.captured import Captured
from checkmate.execute.memory import measure_peak, synchronize
from checkmate.execute.program import fetch_attribute
from checkmate.inductor.kernels import NodeKernel
from checkmate.json_cache import finite_number, merge_entries, read_entries
from checkmate.stage_times import Stage, timed
from checkmate.torch_capture.profile import cache_directory, device_key

log = logging.getLogger(__name__)

WARMUP = 1
REPEATS = 5


@dataclass(frozen=True)
class KernelMeasure:
    """One node's function, measured.

    Attributes:
        seconds: median time of a call.
        peak_bytes: the most the allocator held during a call above what it held when the call started.
        output_storages: for each returned value, the index of its storage in `storage_bytes`, or -1 when it is not
            a tensor (a returned view of an input counts its input's storage: more than it holds, never less).
        storage_bytes: bytes of each storage the call returned.
    """

    seconds: float
    peak_bytes: int
    output_storages: tuple[int, ...]
    storage_bytes: tuple[int, ...]


def measure_kernels(
    captured: Captured, kernels: Sequence[NodeKernel], inputs: Sequence[Any], device: torch.device
) -> tuple[KernelMeasure, ...]:
    """Measure every node's function (once per key), from the cache where possible."""
    path = cache_directory() / f"inductor-{device_key(device, torch.get_num_threads())}.json"
    cached = _load(path)
    missing = {kernel.key for kernel in kernels} - cached.keys()
    if missing:
        started = time.perf_counter()
        with (
            timed(Stage.NODE_MEASURE),
            torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []),
        ):
            fresh = _measure(captured, kernels, inputs, device, missing)
        log.info("Inductor: measured %d node functions in %.1f s", len(fresh), time.perf_counter() - started)
        _store(path, fresh)
        cached |= fresh
    return tuple(cached[kernel.key] for kernel in kernels)


def _measure(
    captured: Captured,
    kernels: Sequence[NodeKernel],
    inputs: Sequence[Any],
    device: torch.device,
    missing: set[str],
) -> dict[str, KernelMeasure]:
    wanted = [kernel for kernel in kernels if kernel.key in missing]
    first = {kernel.key: kernel.index for kernel in reversed(wanted)}
    times: dict[int, list[float]] = {index: [] for index in first.values()}
    for repeat in range(WARMUP + REPEATS):
        for index, call in _calls(captured, kernels, inputs):
            if index in times:
                synchronize(device)
                started = time.perf_counter()
                call()
                synchronize(device)
                if repeat >= WARMUP:
                    times[index].append(time.perf_counter() - started)
            else:
                call()
    memory: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
    for index, call in _calls(captured, kernels, inputs):
        if index in times:
            memory[index] = _memory(call, device)
        else:
            call()
    return {key: KernelMeasure(statistics.median(times[index]), *memory[index]) for key, index in first.items()}


def _calls(captured: Captured, kernels: Sequence[NodeKernel], inputs: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    """Each node's call in graph order, as a thunk that stores its outputs; values die after their last reader."""
    placeholders = [node.name for node in captured.module.graph.nodes if node.op == "placeholder"]
    constants = {
        node.name: fetch_attribute(captured.module, str(node.target))
        for node in captured.module.graph.nodes
        if node.op == "get_attr"
    }
    values: dict[str, Any] = dict(zip(placeholders, inputs, strict=True)) | constants
    last_reader: dict[str, int] = {}
    for kernel in kernels:
        for name in kernel.inputs:
            last_reader[name] = kernel.index
    keep = frozenset(placeholders) | constants.keys()

    for kernel in kernels:
        arguments = [values[name] for name in kernel.inputs]
        returned: list[Any] = []

        def call(kernel: NodeKernel = kernel, arguments: list[Any] = arguments, returned: list[Any] = returned) -> Any:
            with torch.no_grad():
                returned.append(kernel.function(*arguments))
            return returned[-1]

        yield kernel.index, call
        del arguments
        values.update(zip(kernel.outputs, returned[-1], strict=True))
        for name in kernel.inputs:
            if last_reader[name] == kernel.index and name not in keep:
                del values[name]
        for name in kernel.outputs:
            if name not in last_reader and name in values:
                del values[name]


def _memory(call: Any, device: torch.device) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The call's allocator peak (the executor's meter, `measure_peak`, with nothing held as baseline), and the
    storages of what it returned (-1 for a value that is not a tensor)."""
    with measure_peak(device, (), allocator=True) as meter:
        returned = call()
    storages: dict[int, int] = {}
    sizes: list[int] = []
    positions = []
    for value in returned:
        if not isinstance(value, torch.Tensor):
            positions.append(-1)
            continue
        pointer = value.untyped_storage().data_ptr()
        if pointer not in storages:
            storages[pointer] = len(sizes)
            sizes.append(value.untyped_storage().nbytes())
        positions.append(storages[pointer])
    return meter.peak_bytes, tuple(positions), tuple(sizes)


def _load(path: Path) -> dict[str, KernelMeasure]:
    """The cached measures; a missing file reads as empty, a damaged one is removed (`json_cache.read_entries`)."""
    return {key: _measure_of(entry) for key, entry in read_entries(path, _well_formed).items()}


def _measure_of(entry: Any) -> KernelMeasure:
    return KernelMeasure(
        float(entry["seconds"]),
        int(entry["peak_bytes"]),
        tuple(int(value) for value in entry["output_storages"]),
        tuple(int(value) for value in entry["storage_bytes"]),
    )


def _well_formed(entry: Any) -> bool:
    """Whether a cache entry holds a measure: finite, non-negative seconds and bytes."""
    if not isinstance(entry, dict):
        return False
    numbers = [entry.get("seconds"), entry.get("peak_bytes")]
    for name in ("output_storages", "storage_bytes"):
        values = entry.get(name)
        if not isinstance(values, list):
            return False
        numbers.extend(values)
    return all(finite_number(value) for value in numbers)


def _store(path: Path, fresh: dict[str, KernelMeasure]) -> None:
    """Merge `fresh` into the cache file atomically, keeping entries another process wrote."""
    merge_entries(path, {key: dataclasses.asdict(measure) for key, measure in fresh.items()}, _well_formed)
