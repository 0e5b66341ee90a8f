"""A step on CUDA: its peak on the caching allocator within the plan's, and dropout replayed from CUDA's generator.

Each test also runs on CPU, the control that shows the check holds, and can fail, where it can be run. The CUDA
cases carry the `gpu` marker and are skipped where no CUDA device is present (tests/conftest.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from eager_oracle import assert_same_state, measured_call, recompute_everything
from torch import nn

import checkmate

pytestmark = pytest.mark.usefixtures("module_cache_directory")

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]
# Activations of 1 MiB, above the parameters (no schedule fits below 0.84 of the peak on CPU), and every tensor but
# the scalars a multiple of the 512 bytes CUDA's caching allocator rounds each block up to.
BATCH, WIDTH, CLASSES = 1024, 256, 128


class Net(nn.Module):
    """Two Linear+ReLU layers, each followed by dropout when `dropout` is above 0, then a linear classifier."""

    def __init__(self, width: int, classes: int, dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(2):
            layers += [nn.Linear(width, width), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
        self.layers = nn.Sequential(*layers, nn.Linear(width, classes))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)


def cross_entropy(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(inputs), labels)


def _net(
    device: str, *, batch_size: int, width: int, classes: int, dropout: float
) -> tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = Net(width, classes, dropout).to(device).train()
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(batch_size, width, generator=generator)
    labels = torch.randint(0, classes, (batch_size,), generator=generator)
    return model, cross_entropy, (inputs.to(device), labels.to(device))


def _generator_state(device: str) -> torch.Tensor:
    return torch.cuda.get_rng_state() if device == "cuda" else torch.get_rng_state()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("budget", "method"), [(1.0, "checkpoint_all"), (0.9, "optimal")])
def test_the_allocator_holds_no_more_than_the_plan(device: str, budget: float, method: str) -> None:
    """Profiled on the device (each op's scratch read from its allocator), a step's peak on that allocator is at most
    the plan's: on CUDA `torch.cuda.max_memory_allocated` over the step, on CPU the profiler's allocation events
    (`eager_oracle.measured_call`). The first call warms up: cuBLAS allocates its workspace on its first matmul and
    keeps it."""
    model, loss_fn, batch = _net(device, batch_size=BATCH, width=WIDTH, classes=CLASSES, dropout=0.0)
    options = {"time_limit": 20} if method == "optimal" else {}
    step = checkmate.compile(
        model, loss_fn, batch, budget=budget, method=method, cost_model="profile", measure_memory="never", **options
    )
    assert step.captured.device.startswith(device)
    if budget < 1.0:
        assert step.plan.R.sum() > step.graph.size, "the budget must make the plan recompute"
    step(*batch)
    _, measured = measured_call(step, batch)
    assert measured <= step.plan.peak_memory, f"{device}: measured {measured}, planned {step.plan.peak_memory}"


@pytest.mark.parametrize("device", DEVICES)
def test_moves_to_host_memory_stay_within_the_plan_and_exact(device: str) -> None:
    """A plan that moves values to host memory (offload_all, with a link given so that no measuring is needed): on
    CUDA its copies run on side streams into pinned memory, which `max_memory_allocated` does not count; the step's
    peak is at most the plan's and its gradients equal eager's (a copy is exact)."""
    model, loss_fn, batch = _net(device, batch_size=BATCH, width=WIDTH, classes=CLASSES, dropout=0.0)
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="offload_all", cost_model="profile", measure_memory="never",
        host_link=checkmate.LinkSpeeds(20e9, 20e9),
    )  # fmt: skip
    assert step.plan.moves.any
    step(*batch)
    for parameter in model.parameters():
        parameter.grad = None
    loss, measured = measured_call(step, batch)
    assert measured <= step.plan.peak_memory, f"{device}: measured {measured}, planned {step.plan.peak_memory}"
    expected = loss_fn(reference, *batch)
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    assert_same_state(model, reference, f"{device} with moves", exact=device == "cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_recomputed_dropout_draws_eager_s_masks(device: str) -> None:
    """A plan that recomputes every node, dropout included: each replay draws the first run's mask from the saved
    generator state, so loss and gradients are eager's under the same seed, and the generator ends where eager's
    does."""
    model, loss_fn, batch = _net(device, batch_size=32, width=64, classes=8, dropout=0.5)
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="flops", measure_memory="never"
    )
    recompute_everything(step)
    random_nodes = sorted(step.captured.random_nodes)
    assert random_nodes and (step.plan.R[:, random_nodes].sum(axis=0) > 1).all(), "every dropout is recomputed"
    for seed in (3, 4):
        torch.manual_seed(seed)
        loss = step(*batch)
        after_step = _generator_state(device)
        torch.manual_seed(seed)
        expected = loss_fn(reference, *batch)
        expected.backward()
        assert torch.equal(_generator_state(device), after_step), "the replays moved the generator otherwise than eager"
        torch.testing.assert_close(loss, expected.detach())
        assert_same_state(model, reference, f"{device}, seed {seed}", exact=device == "cpu")
