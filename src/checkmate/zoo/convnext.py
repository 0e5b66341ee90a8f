"""A ConvNeXt-like classifier (Liu et al., 2022): a model made mostly of ops Inductor fuses.

Each block is a 7x7 depthwise convolution, LayerNorm over channels, a pointwise MLP (Linear, GELU, Linear) on
channels-last activations, a learned per-channel layer scale and a residual sum: apart from the convolution and the
two matrix products, every op is pointwise or a reduction over channels, where `torch.compile` recomputes rather
than saves. Stages are joined by LayerNorm and a 2x2 stride-2 convolution, as in the paper.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional

from checkmate.zoo.common import Factory, classification_loss, image_batch

LAYER_SCALE_INIT = 1e-6


class ChannelsLastNorm(nn.LayerNorm):
    """LayerNorm over the channels of an (N, C, H, W) tensor."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return super().forward(images.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7 convolution, LayerNorm, Linear to 4x channels, GELU, Linear back, layer scale, residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels)
        self.expand = nn.Linear(channels, 4 * channels)
        self.project = nn.Linear(4 * channels, channels)
        self.scale = nn.Parameter(torch.full((channels,), LAYER_SCALE_INIT))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        hidden = self.depthwise(images).permute(0, 2, 3, 1)
        hidden = self.project(functional.gelu(self.expand(self.norm(hidden))))
        return images + (self.scale * hidden).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """A 4x4 stride-4 stem, stages of ConvNeXt blocks joined by downsampling, global pooling and a linear head."""

    def __init__(self, widths: Sequence[int], depths: Sequence[int], classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 4, stride=4), ChannelsLastNorm(widths[0])]
        for stage, (width, depth) in enumerate(zip(widths, depths, strict=True)):
            if stage > 0:
                layers += [ChannelsLastNorm(widths[stage - 1]), nn.Conv2d(widths[stage - 1], width, 2, stride=2)]
            layers += [ConvNeXtBlock(width) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(widths[-1])
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(images).mean(dim=(2, 3))))


def convnext(
    batch_size: int = 8,
    image_size: int = 64,
    widths: Sequence[int] = (32, 64),
    depths: Sequence[int] = (2, 2),
    classes: int = 10,
) -> Factory:
    """A small ConvNeXt-like classifier: `depths[k]` blocks of `widths[k]` channels in stage k."""
    torch.manual_seed(0)
    model = ConvNeXt(widths, depths, classes)
    return model, classification_loss, image_batch(batch_size, 3, image_size, image_size, classes)
