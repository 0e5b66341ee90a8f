"""Model factories for tests, benchmarks, demos, `checkmate capture` and `checkmate max-batch`.

    model, loss_fn, batch = checkmate.zoo.vgg19(batch_size=64)
    captured = checkmate.capture(model, loss_fn, batch, cost_model="flops")

Each factory takes `batch_size` first (then the resolution or sequence length and the model's size) and returns
`(model, loss_fn, batch)` with `loss_fn(model, *batch)` the scalar loss, seeded weights and a seeded batch
(`checkmate.zoo.common`). `FACTORIES` maps each name to its factory.

* the paper's models (Figure 6) at its resolutions by default: `vgg16`, `vgg19`, `mobilenet` (v1), `resnet50`
  (224x224, 1000 classes); `unet`, `fcn8`, `segnet` (416x608, per-pixel cross-entropy); and `gpt2` (GPT-2 small's
  size). Each takes a width multiplier (`width`, or `dim`/`layers` for `gpt2`) for a tiny variant of the same
  structure. At full size they hold hundreds of MiB of weights: call them under a `FakeTensorMode` to capture them
  without allocating (as `checkmate.max_batch` does).
* small models for tests and the demo: `mlp`, `vgg`, `resnet` (BasicBlocks), `gpt`, and `convnext` (ConvNeXt-like
  blocks: mostly ops Inductor fuses).
"""

from __future__ import annotations

from collections.abc import Callable

from checkmate.zoo.common import Factory, classification_loss, language_model_loss, segmentation_loss
from checkmate.zoo.convnext import convnext
from checkmate.zoo.language import gpt, gpt2
from checkmate.zoo.perceptron import mlp
from checkmate.zoo.segmentation import fcn8, segnet, unet
from checkmate.zoo.vision import mobilenet, resnet, resnet50, vgg, vgg16, vgg19

FACTORIES: dict[str, Callable[..., Factory]] = {
    "mlp": mlp,
    "vgg": vgg,
    "resnet": resnet,
    "gpt": gpt,
    "convnext": convnext,
    "vgg16": vgg16,
    "vgg19": vgg19,
    "mobilenet": mobilenet,
    "resnet50": resnet50,
    "unet": unet,
    "fcn8": fcn8,
    "segnet": segnet,
    "gpt2": gpt2,
}
"""Every factory by name; each takes `batch_size` as its first argument."""

__all__ = [
    "FACTORIES",
    "Factory",
    "classification_loss",
    "convnext",
    "fcn8",
    "gpt",
    "gpt2",
    "language_model_loss",
    "mlp",
    "mobilenet",
    "resnet",
    "resnet50",
    "segmentation_loss",
    "segnet",
    "unet",
    "vgg",
    "vgg16",
    "vgg19",
]
