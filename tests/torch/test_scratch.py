"""Kernel scratch memory: what an ATen kernel allocates inside itself and frees before it returns.

The oracle is the CPU allocator itself, read from the profiler's allocation events (each carries the allocator's
running total): `allocator_peak` reads a whole step, `allocator_scratch` one op called on its own, outside the
graph. The profiling pass must find the same scratch for the op inside the graph, the planning node that runs it
must count it in its workspace, and a compiled step must not hold more than its plan's peak.
"""

from __future__ import annotations

import copy
import gc
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import checkmate
from checkmate.captured import Captured
from checkmate.execute.memory import step_baseline, storage_bytes
from checkmate.torch_capture import capture
from checkmate.torch_capture.allocator import allocator_peak
from checkmate.torch_capture.profile import _load, profile_per_op

# Conv -> BatchNorm -> ReLU -> Conv on 8 images of 32x32: CPU convolution_backward allocates 1 MiB of scratch with
# one thread (1.5 MiB with two) and BatchNorm's backward 0.5 MiB, next to activations of 0.5 MiB each.
BATCH, CHANNELS, SIDE = 8, 16, 32
SCRATCH_FLOOR = 2**20  # convolution_backward's scratch here at any thread count


def conv_net() -> tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, CHANNELS, 3, padding=1),
        nn.BatchNorm2d(CHANNELS),
        nn.ReLU(),
        nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1),
    ).train()
    return model, lambda model, images: model(images).square().mean(), (torch.randn(BATCH, 3, SIDE, SIDE),)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    yield


def allocator_scratch(run: Callable[[], Any]) -> int:
    """Bytes `run()` held at its peak above its start, less the storages of the tensors it returns."""
    result: list[Any] = []
    peak = allocator_peak(lambda: result.append(run()))
    outputs = [value for value in torch.utils._pytree.tree_leaves(result) if isinstance(value, torch.Tensor)]
    return max(0, peak - storage_bytes(outputs))


def test_allocator_meters_read_a_known_temporary() -> None:
    def run() -> torch.Tensor:
        temporary = torch.empty(1000, dtype=torch.float32)
        del temporary
        return torch.empty(10, dtype=torch.float64)

    assert allocator_peak(run) == 4000
    assert allocator_scratch(run) == 4000 - 80


def test_allocator_meter_counts_a_free_on_another_thread() -> None:
    """A block made on the metered thread and let go by another (as a gloo worker thread lets go of a finished
    collective's buffers) is no longer held: the next block of its size is the peak, not a second one beside it."""

    def run() -> None:
        held = [torch.empty(2**18)]  # 1 MiB
        letting_go = threading.Thread(target=held.clear)
        letting_go.start()
        letting_go.join()
        torch.empty(2**18)

    assert allocator_peak(run) == 2**20


def _profile_of(captured: Captured, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> Any:
    """The profile of the captured graph (from the cache `capture` filled)."""
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    inputs = [state[name] for name in (*captured.parameter_names, *captured.buffer_names)]
    return profile_per_op(captured.module, [*inputs, *batch], torch.device("cpu"))


def _real(value: Any) -> Any:
    """A random CPU tensor laid out as the fake tensor `value` the trace recorded."""
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).normal_()


def test_profiled_scratch_of_convolution_backward_matches_a_single_call() -> None:
    model, loss_fn, batch = conv_net()
    captured = capture(model, loss_fn, batch, cost_model="profile")
    profiled = _profile_of(captured, model, batch).scratch_bytes
    node = next(node for node in captured.module.graph.nodes if node.name == "convolution_backward")
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda argument: _real(argument.meta["val"]))
    node.target(*args, **kwargs)  # warm-up, as the profile pass runs after the timing passes
    direct = allocator_scratch(lambda: node.target(*args, **kwargs))
    assert direct >= SCRATCH_FLOOR, "this net's convolution backward should need 1 MiB of scratch or more"
    assert profiled["convolution_backward"] == pytest.approx(direct, rel=0.03)


def test_workspace_of_the_node_running_convolution_backward_covers_its_scratch() -> None:
    model, loss_fn, batch = conv_net()
    captured = capture(model, loss_fn, batch, cost_model="profile")
    scratch = _profile_of(captured, model, batch).scratch_bytes
    assert scratch["convolution_backward"] >= SCRATCH_FLOOR
    for fx_name in ("convolution_backward", "native_batch_norm_backward"):
        index = next(index for index, members in enumerate(captured.members) if fx_name in members)
        assert captured.graph.nodes[index].workspace >= scratch[fx_name], fx_name


def test_flops_model_runs_nothing_and_counts_no_scratch() -> None:
    model, loss_fn, batch = conv_net()
    by_flops = capture(model, loss_fn, batch, cost_model="flops")
    by_profile = capture(model, loss_fn, batch, cost_model="profile")
    index = next(index for index, members in enumerate(by_flops.members) if "convolution_backward" in members)
    assert by_flops.graph.nodes[index].workspace <= by_profile.graph.nodes[index].workspace - SCRATCH_FLOOR


def test_scratch_is_cached_apart_from_timings_and_old_entries_read_as_missing(tmp_path: Path) -> None:
    model, loss_fn, batch = conv_net()
    capture(model, loss_fn, batch, cost_model="profile")
    (scratch_file,) = (tmp_path / "profiles").glob("scratch-*.json")
    assert f"{torch.get_num_threads()}thread" in scratch_file.name
    assert max(_load(scratch_file).values()) >= SCRATCH_FLOOR
    scratch_file.write_text('{"an old signature": [1, 2], "another": "text", "flag": true}')
    assert _load(scratch_file) == {}
    again = capture(model, loss_fn, batch, cost_model="profile")
    assert max(_load(scratch_file).values()) >= SCRATCH_FLOOR, "missing entries are measured again"
    assert any(node.workspace >= SCRATCH_FLOOR for node in again.graph.nodes)


@pytest.mark.parametrize("budget", [1.0, 0.9])
def test_compiled_step_holds_no_more_than_its_plan(budget: float) -> None:
    model, loss_fn, batch = conv_net()
    eager = copy.deepcopy(model)
    step = checkmate.compile(model, loss_fn, batch, budget=budget, cost_model="profile", measure_memory="first")
    step(*batch)
    for parameter in model.parameters():
        parameter.grad = None
    gc.collect()
    measured = storage_bytes(step_baseline(model, batch)) + allocator_peak(lambda: step(*batch))
    assert measured <= step.plan.peak_memory * 1.01, (measured, step.plan.peak_memory)
    loss_fn(eager, *batch).backward()
    for ours, theirs in zip(model.parameters(), eager.parameters(), strict=True):
        assert ours.grad is not None and theirs.grad is not None
        torch.testing.assert_close(ours.grad, theirs.grad)
