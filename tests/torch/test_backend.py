"""`torch.compile(model, backend=checkmate.backend(...))` in a user's own training loop, against eager PyTorch.

Oracles: the same loop in eager PyTorch on a deep copy (loss, every `.grad`, BatchNorm buffers, to float32 rounding),
and the CPU allocator's peak during forward, loss and backward, against the region's plan.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from eager_oracle import assert_same_state
from torch import nn

import checkmate
import checkmate.solving
from checkmate import InfeasibleBudget, InvalidArgument, zoo
from checkmate.execute.memory import storage_bytes
from checkmate.search_defaults import DEFAULT_GAP, DEFAULT_STALL_TIME, DEFAULT_TIME_LIMIT
from checkmate.torch_capture.allocator import allocator_peak

TIME_LIMIT = 15


pytestmark = pytest.mark.usefixtures("module_cache_directory", "fresh_dynamo")


def _resnet() -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    model, _, (images, labels) = zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1))
    return model, images, lambda logits: nn.functional.cross_entropy(logits, labels)


def _gpt() -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    model, _, (tokens, targets) = zoo.gpt(batch_size=4, length=16, dim=32, heads=2, layers=2, vocab=64)
    return model, tokens, lambda logits: nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


MODELS = {"resnet": _resnet, "gpt": _gpt}


def _train(model: nn.Module, inputs: torch.Tensor, criterion: Any, steps: int, seed: int) -> list[torch.Tensor]:
    """A plain loop: forward, loss, backward, SGD; the second-to-last step accumulates into the last's grads."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        torch.manual_seed(seed + step)
        loss = criterion(model(inputs))
        loss.backward()
        losses.append(loss.detach())
        if step < steps - 1:
            optimizer.step()
            optimizer.zero_grad()
    torch.manual_seed(seed + steps)
    criterion(model(inputs)).backward()  # one more, accumulating
    return losses


@pytest.mark.slow
@pytest.mark.parametrize(("name", "budget"), [(name, budget) for name in MODELS for budget in (1.0, 0.8)], ids=str)
def test_a_plain_training_loop_matches_eager(name: str, budget: float) -> None:
    torch.manual_seed(0)
    model, inputs, criterion = MODELS[name]()
    model.train()
    reference = copy.deepcopy(model)
    planner = checkmate.backend(budget=budget, cost_model="flops", time_limit=TIME_LIMIT)
    compiled = torch.compile(model, backend=planner)
    losses = _train(compiled, inputs, criterion, steps=3, seed=5)
    expected = _train(reference, inputs, criterion, steps=3, seed=5)
    for got, want in zip(losses, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert_same_state(model, reference, f"{name} at {budget:.0%} through checkmate.backend", exact=False)
    assert len(planner.regions) == 1, "the model compiles as one region"
    region = planner.regions[0]
    assert region.plan.peak_memory <= region.budget
    if budget < 1.0:
        assert region.plan.R.sum() > region.nodes, "the budget must make the plan recompute"


@pytest.mark.slow
def test_the_region_holds_its_plan_on_the_allocator() -> None:
    """Forward, loss and backward measured on the allocator: at most the region's planned peak plus what the loss
    outside the region holds (its logits-sized temporaries), and below what the region needs without recomputation."""
    torch.manual_seed(0)
    model, inputs, criterion = _gpt()
    model.train()
    planner = checkmate.backend(budget=0.8, cost_model="flops", time_limit=TIME_LIMIT)
    compiled = torch.compile(model, backend=planner)
    criterion(compiled(inputs)).backward()  # compiles and plans
    model.zero_grad(set_to_none=True)
    logits_bytes = 4 * inputs.numel() * 64
    measured = allocator_peak(lambda: criterion(compiled(inputs)).backward())
    measured += storage_bytes([*model.parameters(), *model.buffers(), inputs])
    region = planner.regions[0]
    assert measured <= region.plan.peak_memory + 3 * logits_bytes, (measured, region.plan.peak_memory)
    assert region.plan.peak_memory < region.no_remat_peak


@pytest.mark.slow
def test_a_graph_break_plans_each_region_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32))
            self.second = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hidden = self.first(x)
            torch._dynamo.graph_break()
            return self.second(hidden)

    torch.manual_seed(0)
    model = Broken()
    planner = checkmate.backend(budget=1.0, cost_model="flops", time_limit=TIME_LIMIT)
    with caplog.at_level("INFO", logger="checkmate.inductor.backend"):
        torch.compile(model, backend=planner)(torch.randn(8, 16)).sum().backward()
    assert [region.index for region in planner.regions] == [0, 1]
    assert any("graph break" in record.getMessage() for record in caplog.records)


class _Scaled(nn.Module):
    """A forward that makes tensors from Python values (as Hugging Face attention masks do): the joint graph reads them
    as constants (`_tensor_constant0`, ...), in the forward and, through the products' gradients, in the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x) * torch.tensor(0.5)) + torch.tensor([1.0, -1.0]).repeat(16)
        return self.head(x)


class _PrintingBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x)
        print(f"mean activation {float(hidden.mean()):.3f}")
        return nn.functional.gelu(hidden)


class _Printing(nn.Module):
    """Graph breaks made by user code: a value printed in the middle of each of two blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.first = _PrintingBlock()
        self.second = _PrintingBlock()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.second(self.first(x)))


@pytest.mark.parametrize("budget", [1.0, 0.8], ids=str)
def test_tensor_constants_of_the_forward_reach_both_graphs(budget: float) -> None:
    torch.manual_seed(0)
    model = _Scaled()
    reference = copy.deepcopy(model)
    inputs = torch.randn(64, 32)
    criterion = nn.MSELoss()
    target = torch.randn(64, 4)
    planner = checkmate.backend(budget=budget, cost_model="flops", time_limit=TIME_LIMIT)
    losses = _train(torch.compile(model, backend=planner), inputs, lambda out: criterion(out, target), 3, seed=1)
    expected = _train(reference, inputs, lambda out: criterion(out, target), 3, seed=1)
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected))
    assert_same_state(model, reference, f"tensor constants at {budget:.0%}", exact=False)
    assert len(planner.regions) == 1
    region = planner.regions[0]
    if budget < 1.0:
        assert region.plan.R.sum() > region.nodes, "the budget must make the plan recompute"


def test_graph_breaks_from_user_code_run_every_region(capsys: pytest.CaptureFixture[str]) -> None:
    """Each training region is planned; what Dynamo compiles without gradients (the code around the prints, an
    evaluation under `torch.no_grad()`) runs through Inductor, with eager's values."""
    torch.manual_seed(0)
    model = _Printing()
    reference = copy.deepcopy(model)
    inputs = torch.randn(8, 16)
    planner = checkmate.backend(budget=1.0, cost_model="flops", time_limit=TIME_LIMIT)
    compiled = torch.compile(model, backend=planner)
    losses = _train(compiled, inputs, lambda out: out.square().mean(), 3, seed=1)
    expected = _train(reference, inputs, lambda out: out.square().mean(), 3, seed=1)
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected))
    assert_same_state(model, reference, "graph breaks from print", exact=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(inputs), reference(inputs))
    assert len(planner.regions) >= 2, "the prints split the forward into several planned regions"
    forwards = 2 * (3 + 1 + 1)  # compiled and eager: three steps, the accumulating one, the evaluation
    assert capsys.readouterr().out.count("mean activation") == 2 * forwards, "each block prints on every call"


def _small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def test_a_fraction_a_region_cannot_reach_plans_it_as_low_as_it_goes(caplog: pytest.LogCaptureFixture) -> None:
    """A fraction is a share of each region's own peak, as low as the region goes (as `torch.compile`'s
    `activation_memory_budget`): below what it can reach, the region is planned at the smallest budget known to fit,
    with a warning, and trains as eager does."""
    model = _small()
    reference = copy.deepcopy(model)
    inputs = torch.randn(8, 16)
    planner = checkmate.backend(budget=0.3, cost_model="flops", time_limit=TIME_LIMIT)
    with caplog.at_level("WARNING", logger="checkmate.inductor.backend"):
        losses = _train(torch.compile(model, backend=planner), inputs, lambda out: out.square().mean(), 2, seed=1)
    expected = _train(reference, inputs, lambda out: out.square().mean(), 2, seed=1)
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected))
    assert_same_state(model, reference, "a fraction below the region's smallest budget", exact=False)
    (region,) = planner.regions
    assert region.budget > 0.3 * region.no_remat_peak
    assert region.plan.peak_memory <= region.budget
    assert any("cannot reach 30%" in record.getMessage() for record in caplog.records)


def test_a_fraction_falling_back_plans_within_the_regions_time_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The solve at the smallest budget known to fit gets what is left of the region's `time_limit`, not a second
    `time_limit` of its own: the first solve is made to take 1.5 s of a 3 s limit."""
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))  # no plan cached by another test of the module
    real_solve = checkmate.solving.solve
    limits: list[float] = []

    def slow_solve(graph: Any, budget: Any, *, method: str, **options: Any) -> Any:
        if method == "optimal":
            limits.append(options["time_limit"])
            if len(limits) == 1:
                time.sleep(1.5)
        return real_solve(graph, budget, method=method, **options)

    monkeypatch.setattr(checkmate.solving, "solve", slow_solve)
    planner = checkmate.backend(budget=0.3, cost_model="flops", time_limit=3)
    torch.compile(_small(), backend=planner)(torch.randn(8, 16)).sum().backward()
    (region,) = planner.regions
    assert region.budget > 0.3 * region.no_remat_peak, "the region falls back to the smallest budget known to fit"
    assert len(limits) == 2 and limits[0] == 3
    assert limits[1] <= 3 - 1.5, f"the second solve was given {limits[1]:.2f} s of the region's 3 s"


def test_the_search_defaults_are_compiles() -> None:
    """`checkmate.backend` searches as long and stops as near the bound as `checkmate.compile` does by default."""
    assert checkmate.backend(budget=0.5).solve_options == {
        "time_limit": DEFAULT_TIME_LIMIT,
        "mip_gap": DEFAULT_GAP,
        "stall_time": DEFAULT_STALL_TIME,
    }
    assert checkmate.backend(budget=0.5, method="approx").solve_options == {"time_limit": DEFAULT_TIME_LIMIT}
    assert checkmate.backend(budget=0.5, method="checkpoint_all").solve_options == {}
    asked = checkmate.backend(budget=0.5, time_limit=7, mip_gap=1e-4, stall_time=None).solve_options
    assert asked == {"time_limit": 7, "mip_gap": 1e-4, "stall_time": None}


def test_a_byte_budget_a_region_cannot_fit_is_an_error_naming_the_smallest() -> None:
    """Bytes are a limit: a region that cannot fit raises InfeasibleBudget (wrapped by Dynamo), never runs over."""
    compiled = torch.compile(_small(), backend=checkmate.backend(budget=1024, cost_model="flops", time_limit=2))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="smallest budget") as raised:
        compiled(torch.randn(8, 16))
    assert isinstance(raised.value.inner_exception, InfeasibleBudget)
    assert raised.value.inner_exception.minimum is not None and raised.value.inner_exception.minimum > 1024


def test_options_are_checked_before_any_compile() -> None:
    with pytest.raises(InvalidArgument, match="method"):
        checkmate.backend(budget=0.5, method="nonsense")
    with pytest.raises(InvalidArgument, match="cost_model"):
        checkmate.backend(budget=0.5, cost_model="unit")
    with pytest.raises(InvalidArgument):
        checkmate.backend(budget=1.5)


def test_solve_options_are_checked_before_any_compile() -> None:
    """As `checkmate.compile` checks them: a misspelt option or a negative limit is refused when the backend is made,
    not inside Dynamo's first compile."""
    with pytest.raises(InvalidArgument, match="time_limt"):
        checkmate.backend(budget=0.5, time_limt=30)
    with pytest.raises(InvalidArgument, match="time_limit"):
        checkmate.backend(budget=0.5, time_limit=-1)
