"""A compiled step keeps eager's semantics when what its trace depended on changes after compile: the training flag,
module attributes the forward reads, autocast, grad mode (`checkmate.training.guards`)."""

from __future__ import annotations

import array
import copy
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from eager_oracle import assert_equal, assert_same_state, assert_within_plan, measured_call
from torch import nn
from torch.utils import _pytree as pytree

import checkmate
import checkmate.training.compiled
import checkmate.training.distribution
from checkmate import CaptureError, ExecutionError

pytestmark = pytest.mark.usefixtures("module_cache_directory")


class Scaled(nn.Module):
    """Divides by `temperature`, a plain attribute the forward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.temperature


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 4), Scaled())


def mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(32, 8, generator=generator), torch.randn(32, 4, generator=generator)


QUIET = {"measure_memory": "never"}


def compiled(model: nn.Module, loss_fn: Any = mse, example: tuple[Any, ...] | None = None) -> Any:
    """No recomputation; the budget is bytes fixed at compile, so it must hold the step in every state the tests
    switch to (a fraction would be of the compiled state's peak)."""
    return checkmate.compile(
        model, loss_fn, example or batch(), budget="1MiB", cost_model="flops", method="checkpoint_all", **QUIET
    )


def compare_steps(step: Any, reference: nn.Module, batch: tuple[Any, ...], *, seed: int, context: str) -> Any:
    """One compiled and one eager step under the same seed: equal loss, `.grad`s and buffers. (The memory check of
    `eager_oracle.compare_steps` is left out: a BatchNorm in eval() measures above its plan on CPU, another issue.)"""
    torch.manual_seed(seed)
    got = step(*batch)
    torch.manual_seed(seed)
    want = step.loss_fn(reference, *batch)
    want.backward()
    assert_equal(got, want.detach(), f"{context}: loss {got.item()} != {want.item()}")
    assert_same_state(step.model, reference, context)
    return got


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the plans made after compile (each call of `plan_step` by a compiled step)."""
    made: list[int] = []
    plan_step = checkmate.training.distribution.plan_step

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return plan_step(*args, **kwargs)

    monkeypatch.setattr(checkmate.training.distribution, "plan_step", counted)
    yield made


@pytest.mark.parametrize("first", ["eval", "train"])
def test_switching_train_and_eval_after_compile_follows_eager(first: str, plans: list[int]) -> None:
    model = tiny_model()
    getattr(model, first)()
    step = compiled(model)
    reference = copy.deepcopy(model)
    compare_steps(step, reference, batch(), seed=3, context=f"compiled in {first}")
    for module in (model, reference):
        module.train(first == "eval")
    compare_steps(step, reference, batch(), seed=4, context=f"compiled in {first}, then switched")
    assert len(plans) == 1


def test_an_attribute_changed_after_compile_follows_eager(caplog: pytest.LogCaptureFixture) -> None:
    model = tiny_model()
    step = compiled(model)
    reference = copy.deepcopy(model)
    for module in (model, reference):
        module[5].temperature = 3.0
    with caplog.at_level(logging.INFO, logger="checkmate.training.compiled"):
        compare_steps(step, reference, batch(), seed=3, context="temperature changed")
    assert "`temperature` of module '5' changed from 1.0 to 3.0" in caplog.text


def test_a_state_seen_before_reuses_its_plan(plans: list[int], caplog: pytest.LogCaptureFixture) -> None:
    model = tiny_model()
    step = compiled(model)
    reference = copy.deepcopy(model)
    with caplog.at_level(logging.INFO, logger="checkmate.training.compiled"):
        for seed, mode in enumerate(["eval", "train", "eval", "train"]):
            for module in (model, reference):
                getattr(module, mode)()
            compare_steps(step, reference, batch(), seed=seed, context=f"call {seed} in {mode}")
    assert len(plans) == 1, "train -> eval -> train must reuse the first plan"
    assert "model.eval() since the plan: capturing and planning again" in caplog.text


def test_autocast_toggled_after_compile_follows_eager(plans: list[int]) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    step = compiled(model)
    reference = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compare_steps(step, reference, batch(), seed=3, context="under autocast")
    compare_steps(step, reference, batch(), seed=4, context="autocast off again")
    assert len(plans) == 1


def test_a_step_under_no_grad_raises_as_eager_backward_would() -> None:
    step = compiled(tiny_model())
    with torch.no_grad(), pytest.raises(ExecutionError, match="gradients disabled"):
        step(*batch())
    with torch.inference_mode(), pytest.raises(ExecutionError, match="gradients disabled"):
        step(*batch())


def plain_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 4))


def test_batch_tensors_that_require_grad_get_eager_gradients() -> None:
    model = plain_model()
    x, y = batch()
    x.requires_grad_(True)
    step = compiled(model, example=(x, y))
    reference = copy.deepcopy(model)
    x_reference = x.detach().clone().requires_grad_(True)
    for seed in (3, 4):  # the second call accumulates into the `.grad` the first left, as eager does
        torch.manual_seed(seed)
        step(x, y)
        torch.manual_seed(seed)
        mse(reference, x_reference, y).backward()
        assert x.grad is not None, "the batch tensor's gradient was dropped"
        assert_equal(x.grad, x_reference.grad, f"call {seed}: x.grad differs")
        assert_same_state(model, reference, f"call {seed}")
        assert y.grad is None


def test_a_batch_tensor_made_by_autograd_passes_its_gradient_back() -> None:
    model = plain_model()
    scale = torch.ones(8, requires_grad=True)
    scale_reference = scale.detach().clone().requires_grad_(True)
    x, y = batch()
    step = compiled(model, example=(x * scale, y))
    reference = copy.deepcopy(model)
    torch.manual_seed(3)
    step(x * scale, y)
    torch.manual_seed(3)
    mse(reference, x * scale_reference, y).backward()
    assert scale.grad is not None
    assert_equal(scale.grad, scale_reference.grad, "the gradient through the batch tensor differs")


def with_logits(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(x)
    return torch.nn.functional.mse_loss(logits, y), logits


def as_list(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[Any]:
    loss, logits = with_logits(model, x, y)
    return [loss, {"logits": logits, "mean": logits.mean(), "name": "run"}]


def as_dict(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    loss, logits = with_logits(model, x, y)
    return {"logits": logits, "loss": loss, "nothing": None}


def as_model_output(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    from transformers.modeling_outputs import SequenceClassifierOutput

    loss, logits = with_logits(model, x, y)
    return SequenceClassifierOutput(loss=loss, logits=logits)


@pytest.mark.parametrize("loss_fn", [with_logits, as_list, as_dict, as_model_output], ids=lambda f: f.__name__)
def test_loss_fn_may_return_the_loss_among_other_values(loss_fn: Any) -> None:
    if loss_fn is as_model_output:
        pytest.importorskip("transformers.modeling_outputs")  # imported before the trace, as a model's own import does
    model = plain_model()
    step = compiled(model, loss_fn)
    reference = copy.deepcopy(model)
    for seed in (3, 4):
        torch.manual_seed(seed)
        got, measured = measured_call(step, batch())
        torch.manual_seed(seed)
        want = loss_fn(reference, *batch())
        loss = want[0] if isinstance(want, list | tuple) else want["loss"]
        loss.backward()
        assert type(got) is type(want)
        got_leaves, got_spec = pytree.tree_flatten(got)
        want_leaves, want_spec = pytree.tree_flatten(want)
        assert got_spec == want_spec
        for got_leaf, want_leaf in zip(got_leaves, want_leaves, strict=True):
            if isinstance(want_leaf, torch.Tensor):
                assert not got_leaf.requires_grad, "the step's outputs are detached"
                assert_equal(got_leaf, want_leaf.detach(), f"{loss_fn.__name__}: an output differs")
            else:
                assert got_leaf == want_leaf
        assert_same_state(model, reference, loss_fn.__name__)
        assert_within_plan(step, measured, accumulating=seed == 4)


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        (lambda model, x, y: None, "it returned None"),
        (lambda model, x, y: model(x), r"its loss has shape \(32, 4\)"),
        (lambda model, x, y: (None, model(x).mean()), "whose loss entry is None"),
        (lambda model, x, y: {"logits": model(x)}, r"its loss has shape \(32, 4\)"),
        (lambda model, x, y: (model(x).mean(), object()), "loss_fn returned a object at"),
    ],
    ids=["None", "non-scalar", "tuple-without-loss-first", "dict-without-loss", "object-beside-the-loss"],
)
def test_a_loss_fn_without_a_loss_is_refused_at_compile(returns: Any, message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        compiled(plain_model(), returns)


def test_a_criterion_loss_fn_holds_is_guarded_too() -> None:
    criterion = nn.HuberLoss(delta=1.0)

    def huber(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return criterion(model(x), y)

    model = plain_model()
    step = compiled(model, huber)
    reference = copy.deepcopy(model)
    compare_steps(step, reference, batch(), seed=3, context="delta 1.0")
    criterion.delta = 0.05
    compare_steps(step, reference, batch(), seed=4, context="delta 0.05")


class Settings:
    """A plain config object, as a training script holds one."""

    def __init__(self) -> None:
        self.temperature = 1.0


class ScaledBy(nn.Module):
    """Divides by the `temperature` of a config object it holds and adds its `offset` where it has one, as Hugging
    Face code reads `self.config` and `getattr(config, "is_causal", True)`."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.settings.temperature + getattr(self.settings, "offset", 0.0)


def test_a_config_object_changed_in_place_after_compile_follows_eager(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    settings = Settings()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), ScaledBy(settings), ScaledBy(settings))
    step = compiled(model)
    reference = copy.deepcopy(model)
    compare_steps(step, reference, batch(), seed=3, context="temperature 1.0")
    for module in (model, reference):
        module[3].settings.temperature = 3.0
    with caplog.at_level(logging.INFO, logger="checkmate.training.compiled"):
        compare_steps(step, reference, batch(), seed=4, context="temperature changed in place")
    assert "`temperature` of `settings` of module '3' changed from 1.0 to 3.0" in caplog.text
    for module in (model, reference):
        module[3].settings.offset = 1.0  # an attribute the trace looked for and did not find
    compare_steps(step, reference, batch(), seed=5, context="an attribute added")


def test_a_hugging_face_config_changed_in_place_after_compile_follows_eager(plans: list[int]) -> None:
    """Llama's decoder runs `self.layers[: self.config.num_hidden_layers]` on every call."""
    pytest.importorskip("transformers")
    from test_transformers import _build

    model, causal_lm_loss, (tokens,) = _build("llama")
    step = checkmate.compile(
        model, causal_lm_loss, (tokens,), budget="4MiB", cost_model="flops", method="checkpoint_all", **QUIET
    )
    reference = copy.deepcopy(model)
    for seed in (3, 4):
        if seed == 4:
            for module in (model, reference):
                module.config.num_hidden_layers = 1
        torch.manual_seed(seed)
        got = step(tokens)
        torch.manual_seed(seed)
        want = causal_lm_loss(reference, tokens)
        want.backward()
        torch.testing.assert_close(got, want.detach(), msg=f"call {seed}: the loss differs")
        assert_same_state(model, reference, f"call {seed}", exact=False)
    assert len(plans) == 1


class ScaledByArray(nn.Module):
    """Multiplies by a value kept in an `array.array`, an object whose state Python code cannot see."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = array.array("d", [2.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale[0]


def test_an_object_whose_state_cannot_be_read_is_named_at_compile(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), ScaledByArray())
    with caplog.at_level(logging.WARNING, logger="checkmate.training.guards"):
        compiled(model)
    assert "`scale` of module '1', a array, keeps its state where checkmate cannot read it" in caplog.text
