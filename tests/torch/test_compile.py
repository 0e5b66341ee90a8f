"""checkmate.compile against eager PyTorch: same loss, gradients and buffers, and the memory it promises.

The oracle is plain `loss_fn(model, *batch).backward()` on a deep copy of the model, under the same seed;
peaks are read from the CPU allocator while each step runs (`eager_oracle.measured_call`), against plans whose
nodes count the kernel scratch the profiling pass measured (cost_model="profile").
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from eager_oracle import compare_steps, recompute_everything, train_three_steps

import checkmate
import checkmate.solving
import checkmate.training.compiled
import checkmate.training.planning
from checkmate import CheckmateError, ExecutionError, zoo
from checkmate.byte_sizes import resolve_budget
from checkmate.execute import eager_peak
from checkmate.stage_times import Stage

TIME_LIMIT = 20
MODELS: dict[str, Callable[[], Any]] = {
    "resnet": lambda: zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1)),
    "gpt": lambda: zoo.gpt(batch_size=8, length=32, dim=32, heads=2, layers=2, vocab=64),
}
# Near the smallest feasible budgets: `checkmate.minimum_budget` (30 s) brackets them in [0.54, 0.61] of the
# no-remat peak for this ResNet and [0.40, 0.43] for this GPT (profiled graphs, scratch counted).
BUDGETS = [("resnet", 1.0), ("resnet", 0.7), ("resnet", 0.62), ("gpt", 1.0), ("gpt", 0.5)]


@pytest.fixture(scope="module", autouse=True)
def plan_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One plan cache for the module, so a budget solved once is not solved again by the next test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        yield


@pytest.mark.parametrize(("name", "budget"), BUDGETS)
def test_matches_eager_and_stays_within_plan(name: str, budget: float) -> None:
    model, loss_fn, batch = MODELS[name]()
    model.train()
    reference = copy.deepcopy(model)
    method, options = "optimal", {"time_limit": TIME_LIMIT}
    if budget == 1.0:
        method, options = "checkpoint_all", {}
    step = checkmate.compile(
        model, loss_fn, batch, budget=budget, method=method, cost_model="profile", measure_memory="never", **options
    )
    if budget < 1.0:
        assert step.plan.R.sum() > step.graph.size, "a tight budget must make the plan recompute"
    train_three_steps(step, reference, batch, f"{name} at {budget:.0%} with {method}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_recomputing_everything_is_still_exact(name: str) -> None:
    """The plan that holds nothing across stages: every value is recomputed for each use, random ops and
    BatchNorm included, and the numbers are still eager's."""
    model, loss_fn, batch = MODELS[name]()
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="profile", measure_memory="never"
    )
    recompute_everything(step)
    size = step.graph.size
    assert step.plan.R.sum() > 3 * size
    train_three_steps(step, reference, batch, f"{name}, recomputing everything")


def test_half_budget_is_clearly_below_eager() -> None:
    model, loss_fn, batch = MODELS["gpt"]()
    method, options = "optimal", {"time_limit": TIME_LIMIT}
    step = checkmate.compile(model, loss_fn, batch, budget=0.5, method=method, cost_model="flops", **options)
    step(*batch)
    measured = step.report().measured_peak
    model.zero_grad(set_to_none=True)
    eager = eager_peak(copy.deepcopy(model), loss_fn, batch)
    assert measured is not None and measured < 0.85 * eager, f"measured {measured} vs eager {eager}"


def test_new_shape_is_replanned_or_refused() -> None:
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit", measure_memory="never"
    )  # "unit": replanning inside the metered call runs no profiler
    first_graph, first_plan = step.graph, step.plan
    smaller = tuple(tensor[:4] for tensor in batch)
    reference = copy.deepcopy(model)
    compare_steps(step, reference, smaller, seed=0, context="replanned batch of 4")
    assert step.graph is not first_graph
    assert step.captured.batch_shapes[0][0] == (4, 32)
    compare_steps(step, reference, batch, seed=1, context="back to the batch of 8")
    assert step.graph is first_graph and step.plan is first_plan, "the earlier shape's plan is kept, not redone"
    strict = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit", replan=False
    )
    with pytest.raises(ExecutionError, match=r"planned for batch float32\[8, 32\]"):
        strict(*smaller)


def test_plans_come_from_the_disk_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    solved: list[str] = []
    real_solve = checkmate.training.planning.solve

    def counting_solve(graph: Any, budget: Any, *, method: str, **options: Any) -> Any:
        solved.append(method)
        return real_solve(graph, budget, method=method, **options)

    monkeypatch.setattr(checkmate.training.planning, "solve", counting_solve)
    monkeypatch.setattr(checkmate.solving, "solve", counting_solve)
    first = checkmate.compile(model, loss_fn, batch, budget=1.0, method="chen_greedy_linear", cost_model="unit")
    second = checkmate.compile(model, loss_fn, batch, budget=1.0, method="chen_greedy_linear", cost_model="unit")
    assert solved.count("chen_greedy_linear") == 1
    assert (first.plan.R == second.plan.R).all() and (first.plan.S == second.plan.S).all()
    checkmate.compile(model, loss_fn, batch, budget=1.0, method="chen_greedy_linear", cost_model="unit", cache=False)
    assert solved.count("chen_greedy_linear") == 2


def test_save_and_load_plan(tmp_path: Any) -> None:
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    step = checkmate.compile(model, loss_fn, batch, budget=1.0, method="chen_greedy_linear", cost_model="unit")
    path = tmp_path / "plan.json"
    step.save_plan(path)
    other = checkmate.compile(model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    loaded = other.load_plan(path)
    assert (loaded.R == step.plan.R).all() and loaded.peak_memory == step.plan.peak_memory
    assert other.plan is loaded
    wider, wider_loss, wider_batch = zoo.mlp(batch_size=8, width=16)
    mismatched = checkmate.compile(
        wider, wider_loss, wider_batch, budget=1.0, method="checkpoint_all", cost_model="unit"
    )
    with pytest.raises(CheckmateError, match="another graph"):
        mismatched.load_plan(path)


def test_report_before_and_after_a_call() -> None:
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    step = checkmate.compile(model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    assert step.report().measured_peak is None
    assert "not yet measured" in str(step.report())
    step(*batch)
    step(*batch)
    report = step.report()
    assert report.measured_peak is not None and report.measured_time is not None
    text = str(report)
    for label in ("no-remat peak", "budget", "planned peak", "measured peak", "planned extra compute", "step time"):
        assert label in text


def test_report_gives_the_predicted_time_beside_the_measured() -> None:
    """With profiled costs the plan's cost is seconds: the report puts it beside the measured step time; with other
    cost models there is no prediction in seconds to give."""
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    step = checkmate.compile(model, loss_fn, batch, budget=1.0, method="checkpoint_all", measure_memory="never")
    step(*batch)
    report = step.report()
    assert report.planned_time == step.plan.cost > 0
    assert report.predicted_time == pytest.approx(step.plan.cost), "eager runs each planned computation as it is"
    assert report.measured_time is not None
    assert f"predicted {report.predicted_time * 1e3:.1f} ms, measured {report.measured_time * 1e3:.1f} ms" in str(
        report
    )
    unit = checkmate.compile(model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    assert unit.report().predicted_time is None and "predicted" not in str(unit.report())


def test_report_says_where_the_planning_time_went() -> None:
    """The report gives the seconds of each planning stage that ran: the eager executor captures (and profiles)
    and solves, once per capture it plans."""
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    step = checkmate.compile(model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    times = step.report().planning_times
    assert times is not None and times.captures == 1
    assert {stage for stage, _ in times.seconds} == {Stage.CAPTURE, Stage.SOLVE}
    assert times.total >= times.of(Stage.CAPTURE) + times.of(Stage.SOLVE) > 0
    assert f"planning time      {times}" in str(step.report())


def test_budget_forms() -> None:
    assert resolve_budget(0.5, 1000) == 500
    assert resolve_budget(1.0, 1000) == 1000
    assert resolve_budget("1KiB", 1000) == 1024
    assert resolve_budget(4096, 1000) == 4096
    for bad in (1.5, 0.0, True):
        with pytest.raises(ValueError):
            resolve_budget(bad, 1000)


def test_a_measured_peak_above_the_plan_is_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The budget is checked at run time: a step that held more than its plan said logs a warning with both peaks."""
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit", measure_memory="every"
    )
    step(*batch)
    assert not [record for record in caplog.records if record.levelname == "WARNING"]
    real_measure = checkmate.training.compiled.measure_peak

    @contextlib.contextmanager
    def overshooting(device: Any, baseline: Any, *, allocator: bool) -> Iterator[Any]:
        with real_measure(device, baseline, allocator=allocator) as meter:
            yield meter
        meter.peak_bytes = step.plan.peak_memory + 4096

    monkeypatch.setattr(checkmate.training.compiled, "measure_peak", overshooting)
    step(*batch)
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and "above the plan's" in warnings[0] and "by 4.00 KiB" in warnings[0], warnings


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"backend": "inductor"}, "unknown MILP backend 'inductor'"),
        ({"time_limt": 5}, "takes no option 'time_limt'"),
        ({"method": "chen_greedy", "backend": "highs"}, "takes no option 'backend'"),
        ({"method": "fastest"}, "unknown method 'fastest'"),
    ],
    ids=["unknown solver", "misspelt option", "option of another method", "unknown method"],
)
def test_options_are_refused_before_any_work(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], named: str
) -> None:
    """A wrong method or option is an InvalidArgument at once, not after capture and profiling, and not accepted
    silently when the solver it names is never reached."""

    def no_capture(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("captured before the options were checked")

    monkeypatch.setattr(checkmate.training.planning, "capture", no_capture)
    model, loss_fn, batch = zoo.mlp(batch_size=2)
    with pytest.raises(checkmate.InvalidArgument, match=named):
        checkmate.compile(model, loss_fn, batch, budget=1.0, **options)


def test_sharded_options_need_a_sharded_model() -> None:
    """`sharded=` only means something for a model sharded with FSDP2: elsewhere it is refused, not ignored."""
    model = torch.nn.Linear(4, 2)
    with pytest.raises(checkmate.InvalidArgument, match="sharded= places the units of a model sharded"):
        checkmate.compile(
            model, lambda m, x: m(x).sum(), (torch.randn(3, 4),), budget=1.0, sharded=checkmate.ShardedOptions()
        )
