"""The multilayer perceptron: the smallest training step, for tests and examples."""

from __future__ import annotations

import torch
from torch import nn

from checkmate.zoo.common import BATCH_SEED, Factory, classification_loss


def mlp(batch_size: int = 8, width: int = 32, depth: int = 3, classes: int = 10) -> Factory:
    """A multilayer perceptron of `depth` Linear+ReLU layers of `width` features, then a linear classifier."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, classes))
    generator = torch.Generator().manual_seed(BATCH_SEED)
    inputs = torch.randn(batch_size, width, generator=generator)
    labels = torch.randint(0, classes, (batch_size,), generator=generator)
    return model, classification_loss, (inputs, labels)
