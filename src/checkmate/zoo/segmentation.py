"""Segmentation networks with long skip connections: U-Net, FCN-8s and SegNet.

Each predicts a class per pixel and trains with a per-pixel cross-entropy (`segmentation_loss`). They default to the
paper's 416x608 resolution (Figure 6; `image_size` is (height, width) and must be divisible by 32, or 16 for U-Net)
and take a width multiplier `width` that scales every layer's channels, so a tiny variant
(`unet(batch_size=2, image_size=(32, 48), width=1 / 16)`) keeps the structure at a fraction of the cost.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from checkmate.zoo.common import Factory, scaled, segmentation_batch, segmentation_loss

PAPER_RESOLUTION = (416, 608)
# SegNet's encoder is VGG16's 13 convolutions: the output channels of each of its 5 levels.
SEGNET_ENCODER: tuple[tuple[int, ...], ...] = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def _conv_bn_relu(channels_in: int, channels_out: int) -> list[nn.Module]:
    return [
        nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    ]


def _double_conv(channels_in: int, channels_out: int) -> nn.Sequential:
    return nn.Sequential(*_conv_bn_relu(channels_in, channels_out), *_conv_bn_relu(channels_out, channels_out))


class UNet(nn.Module):
    """The classic U-Net (Ronneberger et al., 2015, with same-padding and BatchNorm).

    Two 3x3 conv + BatchNorm + ReLU at each of `levels` widths (64, 128, 256, 512 at width 1) with a 2x2 max-pool
    between them, a bottleneck twice as wide, then back up: a 2x2 transposed convolution, concatenation with the
    encoder's output at that resolution (the long skip connections), two conv layers; a 1x1 conv head.
    """

    def __init__(self, classes: int, width: float, levels: int = 4) -> None:
        super().__init__()
        widths = [scaled(64 * 2**level, width) for level in range(levels + 1)]
        self.down = nn.ModuleList()
        channels = 3
        for out in widths[:-1]:
            self.down.append(_double_conv(channels, out))
            channels = out
        self.bottleneck = _double_conv(channels, widths[-1])
        self.upsample = nn.ModuleList()
        self.up = nn.ModuleList()
        for below, out in reversed(list(zip(widths[1:], widths[:-1], strict=True))):
            self.upsample.append(nn.ConvTranspose2d(below, out, 2, stride=2))
            self.up.append(_double_conv(2 * out, out))
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        skips = []
        hidden = images
        for block in self.down:
            hidden = block(hidden)
            skips.append(hidden)
            hidden = functional.max_pool2d(hidden, 2)
        hidden = self.bottleneck(hidden)
        for upsample, block, skip in zip(self.upsample, self.up, reversed(skips), strict=True):
            hidden = block(torch.cat([skip, upsample(hidden)], dim=1))
        return self.head(hidden)


def unet(
    batch_size: int = 32, image_size: tuple[int, int] = PAPER_RESOLUTION, classes: int = 2, width: float = 1.0
) -> Factory:
    """U-Net (31M parameters at width 1) at the paper's 416x608 and batch 32 (its Figure 5), two classes.

    The paper's U-Net is keras_segmentation's `vgg_unet` (a VGG16 encoder and a shorter decoder); this is the
    original architecture, with the same long skip connections from each encoder level to the decoder.
    """
    torch.manual_seed(0)
    model = UNet(classes, width)
    return model, segmentation_loss, segmentation_batch(batch_size, *image_size, classes)


class FCN8(nn.Module):
    """FCN-8s (Long et al., 2015): VGG16's convolutions, its fully connected layers as convolutions (fc6 7x7, fc7
    1x1, with dropout), class scores at 1/32 resolution upsampled 2x by a transposed convolution and added to scores
    of pool4, again 2x and added to scores of pool3 (the long skips), then upsampled 8x to the input's size.
    Padded so that every shape lines up (the original pads by 100 and crops).
    """

    def __init__(self, classes: int, width: float) -> None:
        super().__init__()
        self.to_pool3 = _vgg_levels(3, (64, 128, 256), (2, 2, 3), width)
        self.to_pool4 = _vgg_levels(scaled(256, width), (512,), (3,), width)
        self.to_pool5 = _vgg_levels(scaled(512, width), (512,), (3,), width)
        hidden = scaled(4096, width)
        self.fully_connected = nn.Sequential(
            nn.Conv2d(scaled(512, width), hidden, 7, padding=3),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Conv2d(hidden, hidden, 1),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Conv2d(hidden, classes, 1),
        )
        self.score_pool4 = nn.Conv2d(scaled(512, width), classes, 1)
        self.score_pool3 = nn.Conv2d(scaled(256, width), classes, 1)
        self.upscore2 = nn.ConvTranspose2d(classes, classes, 4, stride=2, padding=1, bias=False)
        self.upscore_pool4 = nn.ConvTranspose2d(classes, classes, 4, stride=2, padding=1, bias=False)
        self.upscore8 = nn.ConvTranspose2d(classes, classes, 16, stride=8, padding=4, bias=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pool3 = self.to_pool3(images)
        pool4 = self.to_pool4(pool3)
        scores = self.fully_connected(self.to_pool5(pool4))
        scores = self.upscore2(scores) + self.score_pool4(pool4)
        scores = self.upscore_pool4(scores) + self.score_pool3(pool3)
        return self.upscore8(scores)


def _vgg_levels(channels: int, widths: tuple[int, ...], depths: tuple[int, ...], width: float) -> nn.Sequential:
    """VGG levels: `depth` 3x3 conv + ReLU of each width, each level ending in a 2x2 max-pool."""
    layers: list[nn.Module] = []
    for level_width, depth in zip(widths, depths, strict=True):
        for _ in range(depth):
            layers += [nn.Conv2d(channels, scaled(level_width, width), 3, padding=1), nn.ReLU(inplace=True)]
            channels = scaled(level_width, width)
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


def fcn8(
    batch_size: int = 32, image_size: tuple[int, int] = PAPER_RESOLUTION, classes: int = 21, width: float = 1.0
) -> Factory:
    """FCN-8s with a VGG16 backbone (134M parameters at width 1) at the paper's 416x608, 21 classes (PASCAL VOC)."""
    torch.manual_seed(0)
    model = FCN8(classes, width)
    return model, segmentation_loss, segmentation_batch(batch_size, *image_size, classes)


class SegNet(nn.Module):
    """SegNet (Badrinarayanan et al., 2017): VGG16's 13 convolutions with BatchNorm as the encoder, each of its 5
    levels ending in a 2x2 max-pool that keeps its argmax indices; the decoder mirrors it, each level starting with a
    max-unpool at the encoder's indices (the long skips carry the indices, not the features); a 3x3 conv head."""

    def __init__(self, classes: int, width: float) -> None:
        super().__init__()
        self.encoder = nn.ModuleList()
        channels = 3
        for level in SEGNET_ENCODER:
            layers: list[nn.Module] = []
            for out in level:
                layers += _conv_bn_relu(channels, scaled(out, width))
                channels = scaled(out, width)
            self.encoder.append(nn.Sequential(*layers))
        self.decoder = nn.ModuleList()
        for index, level in reversed(list(enumerate(SEGNET_ENCODER))):
            outputs = [*level[:-1], SEGNET_ENCODER[index - 1][-1]] if index > 0 else list(level[:-1])
            layers = []
            for out in outputs:
                layers += _conv_bn_relu(channels, scaled(out, width))
                channels = scaled(out, width)
            self.decoder.append(nn.Sequential(*layers))
        self.head = nn.Conv2d(channels, classes, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        hidden = images
        indices = []
        for level in self.encoder:
            hidden, index = functional.max_pool2d(level(hidden), 2, return_indices=True)
            indices.append(index)
        for level, index in zip(self.decoder, reversed(indices), strict=True):
            hidden = level(functional.max_unpool2d(hidden, index, (2, 2)))
        return self.head(hidden)


def segnet(
    batch_size: int = 32, image_size: tuple[int, int] = PAPER_RESOLUTION, classes: int = 21, width: float = 1.0
) -> Factory:
    """SegNet (29M parameters at width 1) at the paper's 416x608, 21 classes."""
    torch.manual_seed(0)
    model = SegNet(classes, width)
    return model, segmentation_loss, segmentation_batch(batch_size, *image_size, classes)
