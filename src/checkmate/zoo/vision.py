"""Image classifiers: VGG (small, 16, 19), MobileNet v1, ResNet (small with basic blocks, and ResNet-50).

The full-size factories (`vgg16`, `vgg19`, `mobilenet`, `resnet50`) default to the paper's 224x224 ImageNet setting
(1000 classes) and take a width multiplier `width` that scales every layer's channels, so that a tiny variant
(`vgg19(batch_size=2, image_size=32, width=1 / 16)`) keeps the same structure at a fraction of the cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional

from checkmate.zoo.common import Factory, classification_loss, image_batch, scaled

VGG16_LAYERS: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)  # fmt: skip
VGG19_LAYERS: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M",
)  # fmt: skip
# MobileNet v1 (Howard et al., 2017, Table 1): (output channels, stride) of the 13 depthwise-separable blocks.
MOBILENET_BLOCKS: tuple[tuple[int, int], ...] = (
    (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1),
)  # fmt: skip
RESNET50_BLOCKS = (3, 4, 6, 3)


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


def vgg(batch_size: int = 8, image_size: int = 32, width: int = 16, classes: int = 10) -> Factory:
    """A small VGG-style CNN: 8 convolutions of `width` to 8x`width` channels, 4 max-pools, 2 linear layers."""
    torch.manual_seed(0)
    layers: list[int | str] = [width, "M", 2 * width, "M", 4 * width, 4 * width, "M", 8 * width, 8 * width, "M"]
    layers += [8 * width, 8 * width]
    model = VGG(layers, image_size, classes, hidden=16 * width)
    return model, classification_loss, image_batch(batch_size, 3, image_size, image_size, classes)


def _vgg(layers: Sequence[int | str], batch_size: int, image_size: int, classes: int, width: float) -> Factory:
    torch.manual_seed(0)
    widened = [layer if layer == "M" else scaled(int(layer), width) for layer in layers]
    model = VGG(widened, image_size, classes, hidden=scaled(4096, width))
    return model, classification_loss, image_batch(batch_size, 3, image_size, image_size, classes)


def vgg16(batch_size: int = 256, image_size: int = 224, classes: int = 1000, width: float = 1.0) -> Factory:
    """VGG16 (Simonyan and Zisserman, 2015; 138M parameters at full width): 13 convolutions, 3 linear layers.

    `image_size` must be a multiple of 32. Full size, capture it with fake tensors; do not run it on a small machine.
    """
    return _vgg(VGG16_LAYERS, batch_size, image_size, classes, width)


def vgg19(batch_size: int = 256, image_size: int = 224, classes: int = 1000, width: float = 1.0) -> Factory:
    """VGG19 (144M parameters at full width): 16 convolutions, 3 linear layers; `image_size` a multiple of 32."""
    return _vgg(VGG19_LAYERS, batch_size, image_size, classes, width)


def _conv_bn_relu6(channels_in: int, channels_out: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU6(inplace=True),
    )


class MobileNet(nn.Module):
    """MobileNet v1: a strided 3x3 convolution, 13 depthwise-separable blocks (a depthwise 3x3 and a pointwise 1x1
    convolution, each with BatchNorm and ReLU6), global average pooling, dropout and a linear classifier."""

    def __init__(self, width: float, classes: int) -> None:
        super().__init__()
        channels = scaled(32, width)
        layers: list[nn.Module] = [_conv_bn_relu6(3, channels, 3, 2)]
        for channels_out, stride in MOBILENET_BLOCKS:
            channels_out = scaled(channels_out, width)
            layers.append(_conv_bn_relu6(channels, channels, 3, stride, groups=channels))
            layers.append(_conv_bn_relu6(channels, channels_out, 1, 1))
            channels = channels_out
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(1e-3)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pooled = self.features(images).mean(dim=(2, 3))
        return self.classifier(self.dropout(pooled))


def mobilenet(batch_size: int = 512, image_size: int = 224, classes: int = 1000, width: float = 1.0) -> Factory:
    """MobileNet v1 (Howard et al., 2017; 4.2M parameters at width 1), the paper's MobileNet; `width` is its alpha."""
    torch.manual_seed(0)
    model = MobileNet(width, classes)
    return model, classification_loss, image_batch(batch_size, 3, image_size, image_size, classes)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv + BatchNorm, with an identity or 1x1 projection skip."""

    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut = _shortcut(channels_in, channels_out, stride)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = functional.relu(self.bn1(self.conv1(inputs)))
        hidden = self.bn2(self.conv2(hidden))
        return functional.relu(hidden + self.shortcut(inputs))


class Bottleneck(nn.Module):
    """ResNet bottleneck block: 1x1 (reduce), 3x3 (strided) and 1x1 (expand 4x) conv + BatchNorm, with a skip."""

    expansion = 4

    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        channels_out = self.expansion * channels
        self.conv1 = nn.Conv2d(channels_in, channels, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, channels_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels_out)
        self.shortcut = _shortcut(channels_in, channels_out, stride)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = functional.relu(self.bn1(self.conv1(inputs)))
        hidden = functional.relu(self.bn2(self.conv2(hidden)))
        hidden = self.bn3(self.conv3(hidden))
        return functional.relu(hidden + self.shortcut(inputs))


def _shortcut(channels_in: int, channels_out: int, stride: int) -> nn.Module:
    """The identity, or a strided 1x1 conv + BatchNorm where the block changes the shape."""
    if stride == 1 and channels_in == channels_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride, bias=False), nn.BatchNorm2d(channels_out))


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
    batch_size: int = 8,
    image_size: int = 32,
    width: int = 16,
    blocks: Sequence[int] = (2, 2, 2, 2),
    classes: int = 10,
) -> Factory:
    """A small ResNet-18-style network (BasicBlocks [2, 2, 2, 2] by default) with BatchNorm and skip connections."""
    torch.manual_seed(0)
    model = ResNet(blocks, width, classes)
    return model, classification_loss, image_batch(batch_size, 3, image_size, image_size, classes)


class BottleneckResNet(nn.Module):
    """ResNet-50 and its kin: a 7x7 stride-2 conv + BatchNorm + ReLU and a 3x3 stride-2 max-pool, four stages of
    Bottleneck blocks (the 3x3 conv of a stage's first block strides, as in torchvision), global average pooling and
    a linear classifier."""

    def __init__(self, blocks: Sequence[int], width: float, classes: int) -> None:
        super().__init__()
        channels = scaled(64, width)
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 7, 2, 3, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        stages: list[nn.Module] = []
        for stage, count in enumerate(blocks):
            inner = scaled(64 * 2**stage, width)
            for index in range(count):
                stages.append(Bottleneck(channels, inner, 2 if index == 0 and stage > 0 else 1))
                channels = Bottleneck.expansion * inner
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.stages(self.stem(images))
        return self.head(features.mean(dim=(2, 3)))


def resnet50(batch_size: int = 256, image_size: int = 224, classes: int = 1000, width: float = 1.0) -> Factory:
    """ResNet-50 (He et al., 2016; 25.6M parameters at full width): Bottleneck blocks [3, 4, 6, 3] with BatchNorm."""
    torch.manual_seed(0)
    model = BottleneckResNet(RESNET50_BLOCKS, width, classes)
    return model, classification_loss, image_batch(batch_size, 3, image_size, image_size, classes)
