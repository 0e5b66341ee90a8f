"""Real architectures from Hugging Face `transformers` against eager PyTorch: GPT-2 with its output layer tied to the
token embedding, BERT (masked LM, tied decoder, a padded 2-D attention mask), ViT, T5 (one embedding shared by
encoder, decoder and head), ResNet (BatchNorm statistics updated) and Llama (rotary embeddings, grouped-query
attention, SiLU).

Each model is built from a tiny config with random weights (nothing is downloaded), compiled with the "optimal"
method at the no-remat peak and at a tight budget, and trained three steps beside a deep copy run eagerly: the loss,
every `.grad` and every buffer must equal eager's bit for bit (Llama's to float32 rounding, see ROUNDING_ONLY), and
the peak the CPU allocator holds must stay within the plan's (profiled, so kernel scratch is planned). Dropout stays
on where the config has it: the executor replays the random ops, so both runs draw the same masks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
import torch
import transformers
from eager_oracle import assert_same_state, compare_steps, train_three_steps
from torch import nn

import checkmate
from checkmate.strategies.warm_start import lowest_peak_baseline
from checkmate.torch_capture.tracing_context import tracing_ahead_of_time

Built = tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]
TIME_LIMIT = 3
VOCAB, LENGTH = 64, 16


@pytest.fixture(scope="module", autouse=True)
def plan_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Plans and profiles cached in a fresh folder, so no run reads another run's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        yield


def _tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(2, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _padded_mask() -> torch.Tensor:
    """A 2-D attention mask whose second sequence ends in four padding tokens."""
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, -4:] = 0
    return mask


def _causal_lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss


def _masked_causal_lm_loss(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, attention_mask=mask, labels=tokens).loss


def _gpt2(*, tied: bool = True) -> Built:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2, tie_word_embeddings=tied
    )
    return transformers.GPT2LMHeadModel(config), _causal_lm_loss, (_tokens(2, LENGTH),)


def _bert() -> Built:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    tokens = _tokens(2, LENGTH)
    labels = torch.full_like(tokens, -100)
    labels[:, [3, 7]] = tokens[:, [3, 7]]

    def loss_fn(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, attention_mask=mask, labels=labels).loss

    return transformers.BertForMaskedLM(config), loss_fn, (tokens, _padded_mask(), labels)


def _image_classification_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return model(pixel_values=images, labels=labels).loss


def _images(size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, size, size, generator=generator), torch.randint(0, classes, (2,), generator=generator)


def _vit() -> Built:
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=5,
    )
    return transformers.ViTForImageClassification(config), _image_classification_loss, _images(16, 5)


def _t5() -> Built:
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=1,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )

    def loss_fn(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, labels=labels).loss

    return transformers.T5ForConditionalGeneration(config), loss_fn, (_tokens(2, 12), _tokens(2, 8, seed=2))


def _resnet() -> Built:
    config = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5
    )
    return transformers.ResNetForImageClassification(config), _image_classification_loss, _images(32, 5)


def _llama() -> Built:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(config), _causal_lm_loss, (_tokens(2, LENGTH),)


MODELS: dict[str, Callable[[], Built]] = {
    "gpt2": _gpt2,
    "bert": _bert,
    "vit": _vit,
    "t5": _t5,
    "resnet": _resnet,
    "llama": _llama,
}
# Tight budgets, as fractions of the no-remat peak: each is a little above the lowest peak of a baseline plan
# (`warm_start.lowest_peak_baseline` with profiled scratch, 2026-12-04: gpt2 0.686, bert 0.708, vit 0.761, t5 0.757,
# llama 0.696, resnet 0.755; the 5 KB generator state each dropout retains counts in these small models), so a plan
# exists whatever the solver reaches in TIME_LIMIT. vit's was 0.747 when these were chosen; at 0.76 the test then
# passed only when the MILP found a plan within 3 s, and failed under load: the test now checks the premise. The HF
# ResNet keeps 0.92, where its plans recompute little and the test stays short.
TIGHT = {"gpt2": 0.7, "bert": 0.72, "vit": 0.77, "t5": 0.76, "resnet": 0.92, "llama": 0.73}
# AOTAutograd decomposes SiLU's backward into sigmoid arithmetic, where eager calls the fused silu_backward kernel:
# Llama's gradients agree with eager's to float32 rounding (2e-8 at most here), not bit for bit.
ROUNDING_ONLY = {"llama"}


def _build(name: str) -> Built:
    torch.manual_seed(0)
    model, loss_fn, batch = MODELS[name]()
    model.train()
    return model, loss_fn, batch


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "budget"), [(name, budget) for name in MODELS for budget in (1.0, TIGHT[name])], ids=str
)
def test_matches_eager_and_stays_within_plan(name: str, budget: float) -> None:
    model, loss_fn, batch = _build(name)
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=budget, cost_model="profile", measure_memory="never", time_limit=TIME_LIMIT
    )
    if budget < 1.0:
        assert step.plan.R.sum() > step.graph.size, "a tight budget must make the plan recompute"
        baseline = lowest_peak_baseline(step.graph)
        assert baseline is not None and baseline.peak_memory <= step.plan.budget, (
            f"TIGHT[{name!r}] is below every baseline (lowest: {baseline and baseline.peak_memory} B): the test would "
            "depend on the solver finding a plan in time"
        )
    train_three_steps(step, reference, batch, f"{name} at {budget:.0%}", exact=name not in ROUNDING_ONLY)


@pytest.mark.slow
def test_a_tied_output_layer_is_one_tensor_with_one_gradient_counted_once() -> None:
    """GPT-2's output layer is its token embedding: lifted once (capture once failed on the second name), its
    gradient summed over both uses into the one `.grad`, and held once in the plan's fixed memory."""
    torch.manual_seed(0)
    model, loss_fn, batch = _gpt2(tied=True)
    untied, _, _ = _gpt2(tied=False)
    assert model.lm_head.weight is model.transformer.wte.weight
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="profile", measure_memory="never"
    )
    names = step.captured.parameter_names
    assert names.count("transformer.wte.weight") == 1 and "lm_head.weight" not in names
    untied_graph = checkmate.capture(untied, loss_fn, batch, cost_model="unit").graph
    matrix_bytes = model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    assert untied_graph.fixed_memory - step.graph.fixed_memory == 2 * matrix_bytes, "weight and gradient, once each"
    compare_steps(step, reference, batch, seed=0, context="tied GPT-2")
    assert model.lm_head.weight is model.transformer.wte.weight, "the step must not untie the model"
    assert model.lm_head.weight.grad is model.transformer.wte.weight.grad


@pytest.mark.slow
def test_gpt2_with_a_2d_attention_mask_plans_one_graph_for_every_mask() -> None:
    """A 2-D mask is traced as a tensor, not read: transformers skips building the 4-D mask only when the mask has
    no padding, a check on values that would bake this batch's answer into the graph. Planned on a mask without
    padding, the step must also be exact on a padded one."""
    torch.manual_seed(0)
    model, _, (tokens,) = _gpt2()
    reference = copy.deepcopy(model)
    unpadded = torch.ones_like(_padded_mask())
    step = checkmate.compile(
        model,
        _masked_causal_lm_loss,
        (tokens, unpadded),
        budget=0.8,
        cost_model="profile",
        measure_memory="never",
        time_limit=TIME_LIMIT,
    )
    compare_steps(step, reference, (tokens, unpadded), seed=0, context="GPT-2, mask without padding")
    compare_steps(step, reference, (tokens, _padded_mask()), seed=0, context="GPT-2, padded mask")
    losses = []
    for mask in (unpadded, _padded_mask()):
        torch.manual_seed(0)
        losses.append(step(tokens, mask))
    assert not torch.equal(*losses), "the padding must change the loss, or this test shows nothing"


def test_tracing_ahead_of_time_sets_the_compiler_flags_and_restores_them() -> None:
    assert not torch.compiler.is_compiling() and not torch.compiler.is_exporting()
    with tracing_ahead_of_time():
        assert torch.compiler.is_compiling() and torch.compiler.is_exporting()
    with pytest.raises(RuntimeError, match="inside"), tracing_ahead_of_time():
        raise RuntimeError("inside")
    assert not torch.compiler.is_compiling() and not torch.compiler.is_exporting()


def test_the_oracle_names_a_gradient_that_differs() -> None:
    """The oracle itself can fail: a gradient changed after the step is reported with the parameter's name."""
    model, loss_fn, batch = _build("vit")
    reference = copy.deepcopy(model)
    for instance in (model, reference):
        torch.manual_seed(0)
        loss_fn(instance, *batch).backward()
    assert_same_state(model, reference, "identical eager steps")
    model.classifier.weight.grad.add_(1e-6)
    with pytest.raises(AssertionError, match=r"classifier\.weight\.grad differs"):
        assert_same_state(model, reference, "one gradient nudged")
