"""Real architectures from Hugging Face `transformers` under `checkmate.compile`: the table of issue 10, rerun.

Each row builds a model from a small config with random weights (nothing is downloaded), compiles its training
step with the "optimal" method at a fraction of the no-remat peak ("flops" cost model), then runs it beside a deep
copy trained eagerly under the same seed: step 1 from no `.grad`, step 2 accumulating into step 1's. It prints
planning nodes, the budget, the planned and the largest measured peak, the planned overhead (cost over the no-remat
cost), whether loss, every `.grad` and every buffer equal eager's, and the time to capture and plan.

The two bf16 rows run without dropout: on CPU eager dropout scales by 1/(1-p) in the activation's dtype, while the
traced `native_dropout` scales in float, so in bf16 the two differ by rounding (in float32 they agree).

    .venv/bin/python benchmarks/real_models.py                 # every row at 0.7 (ResNet at 0.87)
    .venv/bin/python benchmarks/real_models.py --rows gpt2,t5 --time-limit 60
    .venv/bin/python benchmarks/real_models.py --out          # rows to benchmarks/results/real_models.json
    .venv/bin/python benchmarks/real_models.py --from-json    # the table again from them
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import transformers
from torch import nn

import checkmate
from checkmate import CheckmateError
from checkmate.byte_sizes import format_bytes
from rows import Row as StoredRow
from rows import Stored, add_row_arguments, markdown_table, measure_or_load

Built = tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]
BATCH, LENGTH, VOCAB, WIDTH = 4, 32, 256, 64


@dataclass(frozen=True)
class Row:
    """One line of the table: what it shows, how to build the step, and its budget if not the default."""

    label: str
    build: Callable[[], Built]
    budget: float | None = None


def _tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(2, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _padded_mask() -> torch.Tensor:
    """A 2-D attention mask: the last sequence of the batch ends in eight padding tokens."""
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[-1, -8:] = 0
    return mask


def _causal_lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss


def _masked_lm_loss(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, attention_mask=mask, labels=labels).loss


def _autocast_causal_lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(input_ids=tokens, labels=tokens).loss


def _image_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return model(pixel_values=images, labels=labels).loss


def _images(size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 3, size, size, generator=generator), torch.randint(
        0, classes, (BATCH,), generator=generator
    )


def _gpt2_model(dropout: float = 0.1) -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=LENGTH,
        n_embd=WIDTH,
        n_layer=4,
        n_head=4,
        tie_word_embeddings=True,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return transformers.GPT2LMHeadModel(config)


def gpt2() -> Built:
    """GPT-2 whose output layer is its token embedding (one tensor under two names)."""
    return _gpt2_model(), _causal_lm_loss, (_tokens(BATCH, LENGTH),)


def gpt2_masked() -> Built:
    """GPT-2 given an ordinary 2-D attention mask with padding."""

    def loss_fn(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, attention_mask=mask, labels=tokens).loss

    return _gpt2_model(), loss_fn, (_tokens(BATCH, LENGTH), _padded_mask())


def t5() -> Built:
    """T5: one embedding shared by encoder, decoder and (tied) head; relative attention bias in the first layers."""
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=WIDTH, d_kv=16, d_ff=4 * WIDTH, num_layers=2, num_heads=4, decoder_start_token_id=0
    )

    def loss_fn(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, labels=labels).loss

    batch = (_tokens(BATCH, LENGTH), _tokens(BATCH, LENGTH // 2, seed=2))
    return transformers.T5ForConditionalGeneration(config), loss_fn, batch


def llama() -> Built:
    """Llama: RMSNorm, rotary embeddings, grouped-query attention, SiLU MLP."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=LENGTH,
    )
    return transformers.LlamaForCausalLM(config), _causal_lm_loss, (_tokens(BATCH, LENGTH),)


def vit() -> Built:
    """ViT classifying 32x32 images in 4x4 patches."""
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=4,
        hidden_size=WIDTH,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=4 * WIDTH,
        num_labels=10,
    )
    return transformers.ViTForImageClassification(config), _image_loss, _images(32, 10)


def bert() -> Built:
    """BERT masked LM (decoder tied to the word embedding) with a padded 2-D attention mask."""
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=4 * WIDTH,
        max_position_embeddings=LENGTH,
    )
    tokens = _tokens(BATCH, LENGTH)
    labels = torch.full_like(tokens, -100)
    labels[:, ::5] = tokens[:, ::5]
    return transformers.BertForMaskedLM(config), _masked_lm_loss, (tokens, _padded_mask(), labels)


def resnet() -> Built:
    """ResNet (basic blocks, four stages) on 64x64 images; BatchNorm statistics are updated by each step."""
    config = transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic", num_labels=10
    )
    return transformers.ResNetForImageClassification(config), _image_loss, _images(64, 10)


def autocast_bf16() -> Built:
    """GPT-2 in float32 with `torch.autocast("cpu", dtype=torch.bfloat16)` inside loss_fn."""
    return _gpt2_model(dropout=0.0), _autocast_causal_lm_loss, (_tokens(BATCH, LENGTH),)


def bf16_model() -> Built:
    """GPT-2 with every parameter and buffer in bf16."""
    return _gpt2_model(dropout=0.0).to(torch.bfloat16), _causal_lm_loss, (_tokens(BATCH, LENGTH),)


ROWS = {
    "gpt2": Row("`GPT2LMHeadModel`, output layer tied to the token embedding", gpt2),
    "gpt2-mask": Row("`GPT2LMHeadModel`, tied, padded 2-D `attention_mask`", gpt2_masked),
    "t5": Row("`T5ForConditionalGeneration`", t5),
    "llama": Row("`LlamaForCausalLM`", llama),
    "vit": Row("`ViTForImageClassification`", vit),
    "bert": Row("`BertForMaskedLM`, padded 2-D `attention_mask`", bert),
    # The stem (7x7 convolution, BatchNorm, max-pool at full resolution) keeps every schedule of this ResNet above
    # 0.83 of its no-remat peak (checkmate.minimum_budget).
    "resnet": Row("`ResNetForImageClassification`", resnet, budget=0.87),
    "autocast": Row("GPT-2, `torch.autocast` bf16 inside `loss_fn`", autocast_bf16),
    "bf16": Row("GPT-2, bf16 model", bf16_model),
}


def compare(model: nn.Module, reference: nn.Module, loss: torch.Tensor, expected: torch.Tensor) -> float | None:
    """The largest difference from eager relative to eager's largest value, over the loss, every `.grad` and every
    buffer (0.0: equal bit for bit), or None when a `.grad` is present on one side only."""
    pairs = [(loss, expected.detach())]
    reference_parameters = dict(reference.named_parameters(remove_duplicate=False))
    for name, parameter in model.named_parameters(remove_duplicate=False):
        want = reference_parameters[name].grad
        if (parameter.grad is None) != (want is None):
            return None
        if want is not None and parameter.grad is not None:
            pairs.append((parameter.grad, want))
    pairs += list(zip(model.buffers(), reference.buffers(), strict=True))
    worst = 0.0
    for got, want in pairs:
        if not torch.equal(got, want):
            scale = want.double().abs().max().item() or 1.0
            worst = max(worst, (got.double() - want.double()).abs().max().item() / scale)
    return worst


def run_row(row: Row, *, budget: float, time_limit: float) -> StoredRow:
    """Compile the row's step, run two steps beside eager, and return what the table shows."""
    torch.manual_seed(0)
    model, loss_fn, batch = row.build()
    model.train()
    reference = copy.deepcopy(model)
    started = time.perf_counter()
    step = checkmate.compile(
        model, loss_fn, batch, budget=budget, cost_model="flops", measure_memory="every", time_limit=time_limit
    )
    planning = time.perf_counter() - started
    measured, worst = 0, 0.0
    for seed in (11, 12):
        torch.manual_seed(seed)
        loss = step(*batch)
        torch.manual_seed(seed)
        expected = loss_fn(reference, *batch)
        expected.backward()
        difference = compare(model, reference, loss, expected)
        worst = float("inf") if difference is None else max(worst, difference)
        measured = max(measured, step.report().measured_peak or 0)
    report = step.report()
    return {
        "label": row.label,
        "nodes": report.nodes,
        "budget": budget,
        "no_remat_peak": report.no_remat_peak,
        "planned_peak": report.planned_peak,
        "measured_peak": measured,
        "planned_overhead": report.planned_extra_compute,
        "status": report.status,
        "difference": None if worst == float("inf") else worst,
        "seconds": planning,
    }


HEADER = [
    "model",
    "nodes",
    "budget",
    "planned peak",
    "measured peak (within plan)",
    "planned overhead",
    "loss, grads, buffers equal eager",
    "capture + plan s",
]


def cells(row: StoredRow) -> list[str]:
    """The table's cells for one stored row."""
    if "error" in row:
        return [row["label"], f"fails: {row['error']}", *[""] * (len(HEADER) - 2)]
    if row["difference"] is None:
        equal = "no: a `.grad` is set on one side only"
    elif row["difference"] == 0.0:
        equal = "yes, bit for bit"
    else:
        equal = f"to rounding: largest difference {row['difference']:.1e} of the value"
    within = "yes" if row["measured_peak"] <= row["planned_peak"] else "NO"
    return [
        row["label"],
        str(row["nodes"]),
        f"{row['budget']:.2f} of {format_bytes(row['no_remat_peak'])}",
        format_bytes(row["planned_peak"]),
        f"{format_bytes(row['measured_peak'])} ({within})",
        f"{row['planned_overhead']:+.1%} ({row['status']})",
        equal,
        f"{row['seconds']:.1f}",
    ]


def measure(names: list[str], budget: float, time_limit: float) -> Iterator[StoredRow]:
    for name in names:
        row = ROWS[name]
        try:
            yield run_row(row, budget=row.budget or budget, time_limit=time_limit)
        except CheckmateError as error:
            yield {"label": row.label, "error": f"{type(error).__name__}: {str(error)[:300]}"}


def render(stored: Stored) -> str:
    return markdown_table(HEADER, map(cells, stored.rows))


def main() -> None:
    """Print the markdown table for the rows asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from {', '.join(ROWS)}")
    parser.add_argument("--budget", type=float, default=0.7, help="fraction of the no-remat peak (default 0.7)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds for each solve (default 20)")
    add_row_arguments(parser)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    transformers.logging.set_verbosity_error()
    names = arguments.rows.split(",")
    measure_or_load(arguments, "real_models", lambda: measure(names, arguments.budget, arguments.time_limit), render)


if __name__ == "__main__":
    main()
