"""Benchmark graph set: large op-level training graphs for the solver benchmark, as gzip-compressed JSON.

Each model below is built from its config with random weights (no downloads), captured with
`checkmate.capture(model, loss_fn, batch, cost_model="flops")` on fake tensors, and its planning graph
written with `Graph.to_json()` to `<graphs>/<name>.json.gz` (default `benchmarks/graphs/`). Load one with
`checkmate.Graph.from_json(gzip.open(path, "rt").read())`.

* `resnet50`: Hugging Face `ResNetForImageClassification(ResNetConfig())` with 1000 labels (ResNet-50),
  batch 32, 128x128 images, cross-entropy over 1000 classes.
* `gpt2`: GPT-2 small, `GPT2LMHeadModel(GPT2Config(tie_word_embeddings=False, use_cache=False))` (12 layers,
  d 768, dropout 0.1 as in the config), batch 4 x 256 tokens, next-token cross-entropy. The output layer is
  untied from the token embedding: with it tied, the trace names a parameter `lm_head.weight` that
  `model.named_parameters()` does not have (the "profile" cost model fails with KeyError 'lm_head.weight', and
  the "flops" graph counts the shared weight and its gradient twice in the fixed memory).
  The causal mask is passed as a prepared 4-D boolean `attention_mask` (part of the batch): without it,
  transformers' mask code tests `(packed_sequence_mask[:, -1] == 0).all()` on a value, which capture rejects
  as data-dependent control flow (aten._local_scalar_dense); a 2-D mask fails the same way (`padding_mask.all()`).
* `vit`: `ViTForImageClassification(ViTConfig())` with 1000 labels (ViT-Base/16, 224x224), batch 8,
  cross-entropy over 1000 classes.
* `bert`: BERT-base `BertForSequenceClassification(BertConfig())` (2 labels, dropout 0.1 as in the config),
  batch 8 x 128 tokens. `BertForMaskedLM` fails in capture: its `cls.predictions.bias` gets no gradient, and
  AOTAutograd asserts "Found a parameter that did not receive a gradient".
* `unet`: `checkmate.zoo.unet(batch_size=4)`, the classic U-Net (4 down levels of two 3x3 conv + BatchNorm +
  ReLU, base width 64, 2x2 max-pool, 2x2 transposed-conv up path with skip concatenation, 1x1 head) at 416x608 as
  in the Checkmate paper, per-pixel cross-entropy over 2 classes.
* `vgg16`: `checkmate.zoo.vgg16(batch_size=64, image_size=224)`.
* `zoo_gpt`: `checkmate.zoo.gpt` at a GPT-2-small-like size (12 layers, d 768, 12 heads, 256 tokens,
  vocab 50257, batch 4).
* `llama`: a Llama-style decoder with grouped-query attention at GPT-2-small size,
  `LlamaForCausalLM(LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
  num_attention_heads=12, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=512, use_cache=False,
  tie_word_embeddings=False))` (RMSNorm, rotary positions, SwiGLU, no dropout), batch 4 x 256 tokens, next-token
  cross-entropy. The causal mask is passed as a prepared 4-D boolean `attention_mask` as for `gpt2`, though Llama
  also captures without one (its mask code then builds the mask inside the graph: 1414 planning nodes, not 1395).
* `t5`: a t5-small-like encoder-decoder, `T5ForConditionalGeneration(T5Config(d_model=512, d_ff=2048,
  num_layers=5, num_decoder_layers=5, num_heads=8, vocab_size=32128, use_cache=False))` (relative position
  bias, dropout 0.1 as in the config), batch 8, 128 source tokens and 128 target tokens; the decoder reads the
  target tokens shifted by one (`decoder_input_ids`, passed explicitly) and the loss is the cross-entropy of the
  logits against the next target token. It has 5 encoder and 5 decoder layers, not t5-small's 6 and 6, to stay
  under 1,500 planning nodes (6 and 6 give 1687). transformers 5 always ties T5's output layer and both token
  embeddings to `shared.weight` (`T5Config` forces `tie_word_embeddings=True`; passing False only turns off the
  decoder output scaling), so the graph keeps the tie; capture counts the shared weight and its gradient once
  (fixed memory = 2 x the distinct parameter bytes + the batch + the loss).
* `swin`: Swin-T, `SwinForImageClassification(SwinConfig())` (windowed attention, depths 2-2-6-2, stochastic
  depth 0.1 as in the config) with 1000 labels, batch 8, 224x224, cross-entropy over 1000 classes.

It prints one row per graph: planning nodes, forward nodes, edges, the `checkpoint_all` peak, the fixed
memory and the capture time. A model that fails to capture is reported with its error and skipped.

    .venv/bin/python benchmarks/graph_set.py                 # all graphs
    .venv/bin/python benchmarks/graph_set.py --only gpt2,vit --graphs /tmp/graphs
    .venv/bin/python benchmarks/graph_set.py --graphs /tmp/graphs --out   # rows to benchmarks/results/graph_set.json
    .venv/bin/python benchmarks/graph_set.py --only llama,t5 --out --merge   # those rows beside the stored others
    .venv/bin/python benchmarks/graph_set.py --from-json     # the table again from them
"""

from __future__ import annotations

import argparse
import gzip
import logging
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional

import checkmate
from checkmate import zoo
from checkmate.files import write_file
from rows import Row as StoredRow
from rows import Stored, add_row_arguments, measure_or_load

Factory = tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]

DEFAULT_GRAPHS = Path(__file__).resolve().parent / "graphs"


def _images(batch: int, height: int, width: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(batch, 3, height, width, generator=generator)
    labels = torch.randint(0, classes, (batch,), generator=generator)
    return images, labels


def _tokens(batch: int, length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, both (batch, length)."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, length + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def logits_loss(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a Hugging Face model's `.logits` (images or tokens in, class or token labels out)."""
    logits = model(inputs).logits
    return functional.cross_entropy(logits.flatten(0, -2), labels.flatten())


def _image_classifier(model_class: Callable[[Any], nn.Module], config: Any, batch: int, size: int) -> Factory:
    """A Hugging Face image classifier over 1000 labels with random weights, on `batch` random size x size images."""
    torch.manual_seed(0)
    config.num_labels = 1000
    return model_class(config).train(), logits_loss, _images(batch, size, size, 1000)


def _causal_language_model(model_class: Callable[[Any], nn.Module], config: Any) -> Factory:
    """A Hugging Face causal LM with random weights on batch 4 x 256 tokens, with a prepared 4-D causal mask."""
    torch.manual_seed(0)
    model = model_class(config).train()
    batch, length = 4, 256
    tokens, targets = _tokens(batch, length, config.vocab_size)
    mask = torch.ones(length, length, dtype=torch.bool).tril().expand(batch, 1, length, length).contiguous()
    return model, causal_language_model_loss, (tokens, mask, targets)


def resnet50() -> Factory:
    from transformers import ResNetConfig, ResNetForImageClassification

    return _image_classifier(ResNetForImageClassification, ResNetConfig(), 32, 128)


def causal_language_model_loss(
    model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Next-token cross-entropy of a Hugging Face causal LM given a prepared 4-D attention mask."""
    logits = model(tokens, attention_mask=mask).logits
    return functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def gpt2() -> Factory:
    from transformers import GPT2Config, GPT2LMHeadModel

    return _causal_language_model(GPT2LMHeadModel, GPT2Config(use_cache=False, tie_word_embeddings=False))


def vit() -> Factory:
    from transformers import ViTConfig, ViTForImageClassification

    return _image_classifier(ViTForImageClassification, ViTConfig(), 8, 224)


def bert() -> Factory:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig()
    config.num_labels = 2
    model = BertForSequenceClassification(config).train()
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (8, 128), generator=generator)
    labels = torch.randint(0, 2, (8,), generator=generator)
    return model, logits_loss, (tokens, labels)


def unet() -> Factory:
    return zoo.unet(batch_size=4)


def vgg16() -> Factory:
    return zoo.vgg16(batch_size=64, image_size=224)


def zoo_gpt() -> Factory:
    return zoo.gpt(batch_size=4, length=256, dim=768, heads=12, layers=12, vocab=50257)


def llama() -> Factory:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
        vocab_size=32000, max_position_embeddings=512, use_cache=False, tie_word_embeddings=False,
    )  # fmt: skip
    return _causal_language_model(LlamaForCausalLM, config)


def sequence_to_sequence_loss(
    model: nn.Module, source: torch.Tensor, decoder_inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy of a Hugging Face encoder-decoder's logits against the next target tokens (teacher forcing)."""
    logits = model(input_ids=source, decoder_input_ids=decoder_inputs).logits
    return functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def t5() -> Factory:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        d_model=512, d_ff=2048, num_layers=5, num_decoder_layers=5, num_heads=8, vocab_size=32128, use_cache=False
    )
    model = T5ForConditionalGeneration(config).train()
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(0, config.vocab_size, (8, 128), generator=generator)
    target = torch.randint(0, config.vocab_size, (8, 129), generator=generator)
    return model, sequence_to_sequence_loss, (source, target[:, :-1].contiguous(), target[:, 1:].contiguous())


def swin() -> Factory:
    from transformers import SwinConfig, SwinForImageClassification

    return _image_classifier(SwinForImageClassification, SwinConfig(), 8, 224)


MODELS: dict[str, Callable[[], Factory]] = {
    "resnet50": resnet50,
    "gpt2": gpt2,
    "vit": vit,
    "bert": bert,
    "unet": unet,
    "vgg16": vgg16,
    "zoo_gpt": zoo_gpt,
    "llama": llama,
    "t5": t5,
    "swin": swin,
}


@dataclass(frozen=True)
class Row:
    name: str
    nodes: int
    forward: int
    edges: int
    peak: int
    fixed: int
    seconds: float
    file_bytes: int


def capture_one(name: str, out: Path) -> Row:
    """Build, capture and write one graph; check that the file reads back as the same graph."""
    model, loss_fn, batch = MODELS[name]()
    started = time.perf_counter()
    graph = checkmate.capture(model, loss_fn, batch, cost_model="flops").graph
    seconds = time.perf_counter() - started
    path = out / f"{name}.json.gz"
    write_file(path, gzip.compress(graph.to_json().encode("utf-8")))
    with gzip.open(path, "rt", encoding="utf-8") as file:
        if checkmate.Graph.from_json(file.read()) != graph:
            raise RuntimeError(f"{path} does not read back as the graph written")
    return Row(
        name=name,
        nodes=graph.size,
        forward=int((~graph.is_backward).sum()),
        edges=len(graph.edges),
        peak=checkmate.solve(graph, None).peak_memory,
        fixed=graph.fixed_memory,
        seconds=seconds,
        file_bytes=path.stat().st_size,
    )


def measure(names: list[str], folder: Path) -> Iterator[StoredRow]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        try:
            yield asdict(capture_one(name, folder))
        except Exception as error:
            traceback.print_exc()
            yield {"name": name, "error": f"{type(error).__name__}: {error}"}
        print(f"done: {name}", file=sys.stderr, flush=True)


def render(stored: Stored) -> str:
    lines = [
        "| graph | nodes | forward nodes | edges | checkpoint_all peak | fixed memory | capture | file |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    failures = []
    for row in stored.rows:
        if "error" in row:
            failures.append(f"\nFAILED {row['name']}: {row['error']}")
            continue
        lines.append(
            f"| {row['name']} | {row['nodes']} | {row['forward']} | {row['edges']} | "
            f"{checkmate.format_bytes(row['peak'])} | {checkmate.format_bytes(row['fixed'])} | "
            f"{row['seconds']:.1f} s | {checkmate.format_bytes(row['file_bytes'])} |"
        )
    return "\n".join(lines + failures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated names among {', '.join(MODELS)}")
    parser.add_argument(
        "--graphs", type=Path, default=DEFAULT_GRAPHS, help="folder to write the graphs to (default benchmarks/graphs)"
    )
    add_row_arguments(parser, merge_key="name")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    names = list(MODELS) if arguments.only is None else [name.strip() for name in arguments.only.split(",")]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}; choose among {', '.join(MODELS)}")
    measure_or_load(arguments, "graph_set", lambda: measure(names, arguments.graphs), render)


if __name__ == "__main__":
    main()
