"""What every zoo factory shares: the factory's return type, the losses and the seeded batches.

A factory returns `(model, loss_fn, batch)` where `loss_fn(model, *batch)` is the scalar training loss, which is
what `checkmate.capture` and `checkmate capture PACKAGE.MODULE:FACTORY` expect. Weights are seeded with
`torch.manual_seed(0)` and batches with their own generator (seed 1), so a factory called twice gives the same step.

Called under a `FakeTensorMode` (as `checkmate.max_batch` calls them), factories allocate nothing: the weights and
the batch are fake tensors that carry only shapes, so a full-size model at a large batch size costs no memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional

Factory = tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]
"""What a factory returns: the model, `loss_fn(model, *batch) -> scalar loss`, and the batch."""

BATCH_SEED = 1


def classification_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's logits against one label per example."""
    return functional.cross_entropy(model(images), labels)


def segmentation_loss(model: nn.Module, images: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per-pixel cross-entropy: logits (N, classes, H, W) against a class index per pixel (N, H, W)."""
    return functional.cross_entropy(model(images), masks)


def language_model_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position."""
    logits = model(tokens)
    return functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def image_batch(
    batch_size: int, channels: int, height: int, width: int, classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded images (N, C, H, W) and one class label per image (N,)."""
    generator = torch.Generator().manual_seed(BATCH_SEED)
    images = torch.randn(batch_size, channels, height, width, generator=generator)
    labels = torch.randint(0, classes, (batch_size,), generator=generator)
    return images, labels


def segmentation_batch(batch_size: int, height: int, width: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded RGB images (N, 3, H, W) and a class index per pixel (N, H, W)."""
    generator = torch.Generator().manual_seed(BATCH_SEED)
    images = torch.randn(batch_size, 3, height, width, generator=generator)
    masks = torch.randint(0, classes, (batch_size, height, width), generator=generator)
    return images, masks


def scaled(channels: int, width: float) -> int:
    """`channels` times the width multiplier `width`, at least 1."""
    return max(1, round(channels * width))
