"""`torch.compile(model, backend=checkmate.backend(...))` on the Hugging Face models of `test_transformers.py` (the
same tiny configs, random weights, dropout on), in a plain loop with an optimizer, and README's example as written.

Oracle: the same loop in eager PyTorch on a deep copy under the same seeds: the loss and every `.grad` of every step,
and the parameters after each update, to float32 rounding (AOTAutograd decomposes some backward kernels, such as
SiLU's and GELU's, into arithmetic that rounds otherwise than eager's fused kernels).
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from eager_oracle import assert_same_state
from test_transformers import MODELS, _build
from torch import nn

import checkmate

TIME_LIMIT = 5
README = Path(__file__).parents[2] / "docs" / "fused-kernels.md"

pytestmark = pytest.mark.usefixtures("module_cache_directory", "fresh_dynamo")


def _assert_same_parameters(model: nn.Module, reference: nn.Module, context: str) -> None:
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        torch.testing.assert_close(got, want, msg=f"{context}: parameter {name} differs")


def _output_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor a model's output holds, in order: a ModelOutput's fields and, through its attributes, a cache's
    keys and values (`past_key_values`, returned while `use_cache` is left at its default)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        items = list(vars(value).values())
    else:
        return []
    return [tensor for item in items for tensor in _output_tensors(item)]


class _Recording:
    """The model, keeping what each call returns."""

    def __init__(self, model: Callable[..., Any]) -> None:
        self.model = model
        self.outputs: list[Any] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.outputs.append(self.model(*args, **kwargs))
        return self.outputs[-1]


def _assert_same_outputs(got: Any, want: Any, context: str) -> None:
    """The same fields, and each tensor (logits, cache keys and values, encoder states) equal to float32 rounding."""
    assert list(got.keys()) == list(want.keys()), f"{context}: the output's fields differ"
    got_tensors, want_tensors = _output_tensors(got), _output_tensors(want)
    assert len(got_tensors) == len(want_tensors), f"{context}: {len(got_tensors)} tensors, eager {len(want_tensors)}"
    for position, (one, other) in enumerate(zip(got_tensors, want_tensors, strict=True)):
        torch.testing.assert_close(one, other, msg=f"{context}: output tensor {position} differs")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_a_training_loop_through_the_backend_matches_eager(name: str) -> None:
    """Three steps with SGD and momentum: loss and gradients of each step, parameters after each update, and every
    tensor of the model's output (several: the logits, and the cache of GPT-2, T5 and Llama, whose `use_cache` is
    left at its default)."""
    model, loss_fn, batch = _build(name)
    reference = copy.deepcopy(model)
    planner = checkmate.backend(budget=1.0, cost_model="flops", time_limit=TIME_LIMIT)
    compiled = _Recording(torch.compile(model, backend=planner))
    eager = _Recording(reference)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, reference)]
    for step in range(3):
        context = f"{name} through checkmate.backend, step {step + 1}"
        torch.manual_seed(step)
        loss = loss_fn(compiled, *batch)
        loss.backward()
        torch.manual_seed(step)
        expected = loss_fn(eager, *batch)
        expected.backward()
        torch.testing.assert_close(loss, expected, msg=f"{context}: loss {loss.item()} != {expected.item()}")
        _assert_same_outputs(compiled.outputs[-1], eager.outputs[-1], context)
        assert_same_state(model, reference, context, exact=False)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
        _assert_same_parameters(model, reference, f"{context}, after the update")
    assert planner.regions, "the training regions are planned"
    assert all(region.plan.peak_memory <= region.budget for region in planner.regions)


def _readme_backend_example() -> str:
    text = README.read_text()
    section = text[text.index("## Your own loop: `torch.compile(model, backend=checkmate.backend(...))`") :]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "README's backend section has no Python example"
    return found.group(1)


def _readme_namespace(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """What README's backend example expects to exist: GPT-2, a loader of three batches, its loss and an optimizer."""
    tokens = batch[0]
    return {
        "torch": torch,
        "checkmate": checkmate,
        "model": model,
        "loader": [(tokens, tokens)] * 3,
        "criterion": lambda output, labels: nn.functional.cross_entropy(
            output.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()
        ),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
    }


@pytest.mark.slow
def test_readme_backend_example_runs_as_written_and_matches_eager(caplog: pytest.LogCaptureFixture) -> None:
    """README's budget, 60 %, is below what GPT-2's regions can reach: each is planned at the smallest budget known
    to fit, with a warning that says so, and training goes on with eager's values."""
    model, _, batch = _build("gpt2")
    reference = copy.deepcopy(model)
    namespace = _readme_namespace(model, batch)
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="checkmate.inductor.backend"):
        exec(compile(_readme_backend_example(), str(README), "exec"), namespace)
    assert isinstance(namespace["model"], torch._dynamo.eval_frame.OptimizedModule)
    assert any("cannot reach 60%" in record.getMessage() for record in caplog.records)

    eager = _readme_namespace(reference, batch)
    torch.manual_seed(0)
    for x, y in eager["loader"]:
        loss = eager["criterion"](reference(x), y)
        loss.backward()
        eager["optimizer"].step()
        eager["optimizer"].zero_grad()
    torch.testing.assert_close(namespace["loss"], loss)
    _assert_same_parameters(model, reference, "README's example on GPT-2 after three steps")
