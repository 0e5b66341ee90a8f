"""Small model factories for tests, benchmarks, demos and the CLI.

Each factory returns `(model, loss_fn, batch)` where `loss_fn(model, *batch)` is the scalar training
loss, which is what `checkmate.capture` and `checkmate capture PACKAGE.MODULE:FACTORY` expect.
Weights and batches are seeded, so a factory called twice gives the same step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional

log = logging.getLogger(__name__)

Factory = tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]

VGG16_LAYERS: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)  # fmt: skip


def classification_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's logits."""
    return functional.cross_entropy(model(images), labels)


def _image_batch(batch: int, channels: int, size: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, channels, size, size, generator=generator)
    labels = torch.randint(0, classes, (batch,), generator=generator)
    return images, labels


def mlp(batch: int = 8, width: int = 32, depth: int = 3, classes: int = 10) -> Factory:
    """A multilayer perceptron of `depth` Linear+ReLU layers."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, classes))
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(batch, width, generator=generator)
    labels = torch.randint(0, classes, (batch,), generator=generator)
    return model, classification_loss, (inputs, labels)


class VGG(nn.Module):
    """VGG: 3x3 conv + ReLU stacks separated by max-pooling, then a fully connected classifier."""

    def __init__(self, layers: Sequence[int | str], image_size: int, classes: int, hidden: int) -> None:
        super().__init__()
        modules: list[nn.Module] = []
        channels = 3
        size = image_size
        for layer in layers:
            if layer == "M":
                modules.append(nn.MaxPool2d(2))
                size //= 2
            else:
                modules += [nn.Conv2d(channels, int(layer), 3, padding=1), nn.ReLU(inplace=True)]
                channels = int(layer)
        self.features = nn.Sequential(*modules)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * size * size, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(hidden, classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


def vgg(batch: int = 8, image_size: int = 32, width: int = 16, classes: int = 10) -> Factory:
    """A VGG-style CNN: 8 convolutions of width `width` to 8x`width`, 4 max-pools, 2 linear layers."""
    torch.manual_seed(0)
    layers: list[int | str] = [width, "M", 2 * width, "M", 4 * width, 4 * width, "M", 8 * width, 8 * width, "M"]
    layers += [8 * width, 8 * width]
    model = VGG(layers, image_size, classes, hidden=16 * width)
    return model, classification_loss, _image_batch(batch, 3, image_size, classes, seed=1)


def vgg16(batch: int = 256, image_size: int = 224, classes: int = 1000) -> Factory:
    """Full-size VGG16 (138M parameters); capture it with fake tensors, do not run it on a small machine."""
    torch.manual_seed(0)
    model = VGG(VGG16_LAYERS, image_size, classes, hidden=4096)
    return model, classification_loss, _image_batch(batch, 3, image_size, classes, seed=1)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv + BatchNorm, with an identity or 1x1 projection skip."""

    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False), nn.BatchNorm2d(channels_out)
            )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = functional.relu(self.bn1(self.conv1(inputs)))
        hidden = self.bn2(self.conv2(hidden))
        return functional.relu(hidden + self.shortcut(inputs))


class ResNet(nn.Module):
    """A small ResNet: stem, four stages of BasicBlocks, global average pooling, linear classifier."""

    def __init__(self, blocks: Sequence[int], width: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        stages: list[nn.Module] = []
        channels = width
        for stage, count in enumerate(blocks):
            channels_out = width * 2**stage
            for index in range(count):
                stages.append(BasicBlock(channels, channels_out, 2 if index == 0 and stage > 0 else 1))
                channels = channels_out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.stages(self.stem(images))
        return self.head(features.mean(dim=(2, 3)))


def resnet(
    batch: int = 8, image_size: int = 32, width: int = 16, blocks: Sequence[int] = (2, 2, 2, 2), classes: int = 10
) -> Factory:
    """A ResNet-18-style network (BasicBlocks [2, 2, 2, 2] by default) with BatchNorm and skip connections."""
    torch.manual_seed(0)
    model = ResNet(blocks, width, classes)
    return model, classification_loss, _image_batch(batch, 3, image_size, classes, seed=1)


class Attention(nn.Module):
    """Causal multi-head self-attention through `scaled_dot_product_attention`."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, dim = hidden.shape
        query, key, value = self.qkv(hidden).split(dim, dim=2)
        shape = (batch, length, self.heads, dim // self.heads)
        query, key, value = (tensor.view(shape).transpose(1, 2) for tensor in (query, key, value))
        attended = functional.scaled_dot_product_attention(
            query, key, value, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out(attended.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    """Pre-norm transformer block: attention and a GELU MLP, each with a residual connection and dropout."""

    def __init__(self, dim: int, heads: int, dropout: float, attention_dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = Attention(dim, heads, attention_dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attention(self.norm1(hidden))
        return hidden + self.mlp(self.norm2(hidden))


class GPT(nn.Module):
    """A small GPT: token and position embeddings, dropout, transformer blocks, tied output projection."""

    def __init__(
        self, vocab: int, length: int, dim: int, heads: int, layers: int, dropout: float, attention_dropout: float
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(length, dim)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(dim, heads, dropout, attention_dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.dropout(self.tokens(tokens) + self.positions(positions))
        return self.norm(self.blocks(hidden)) @ self.tokens.weight.t()


def language_model_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position."""
    logits = model(tokens)
    return functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def gpt(
    batch: int = 4,
    length: int = 32,
    dim: int = 64,
    heads: int = 4,
    layers: int = 2,
    vocab: int = 128,
    dropout: float = 0.1,
    attention_dropout: float = 0.0,
) -> Factory:
    """A GPT-style transformer with embeddings, dropout and causal `scaled_dot_product_attention`.

    Attention dropout is off by default: with it, eager PyTorch on CPU takes the unfused math path
    of `scaled_dot_product_attention`, which materializes the causal mask, unlike the traced graph.
    """
    torch.manual_seed(0)
    model = GPT(vocab, length, dim, heads, layers, dropout, attention_dropout)
    for embedding in (model.tokens, model.positions):
        nn.init.normal_(embedding.weight, std=0.02)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, length + 1), generator=generator)
    return model, language_model_loss, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
