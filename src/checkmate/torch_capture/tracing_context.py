"""Tell the traced code that it runs under an ahead-of-time tracer, as torch.export's tracer does.

Model code asks `torch.compiler.is_compiling()` and `torch.compiler.is_exporting()` whether a graph is being
recorded, and takes a path that reads no tensor value when it is. Hugging Face `transformers` is one such
library: given a 2-D `attention_mask`, its masking utilities check whether the mask is all ones to skip building
a 4-D mask, unless `is_tracing(mask)` says a tracer is running. That check recognizes torch.compile, torch.export,
torch.jit, fx proxies and bare FakeTensors, but not AOTAutograd's FunctionalTensor wrappers, so under
`aot_export_module` the value check runs on a fake tensor and fails as data-dependent control flow.

torch.export's non-strict tracer runs the same machinery (make_fx through AOTAutograd on fake tensors) inside
`torch._export.utils._compiling_state_context()`, which sets the two flags those functions return. checkmate's
trace has export's contract exactly, one graph recorded once and then run on other batches of the same shapes, so
it sets the same flags for the duration of the trace. Reading values at trace time would be wrong for it anyway:
a branch taken on the example batch (this mask has no padding) would be baked into the graph for every later one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# The flags behind torch.compiler.is_compiling() and is_exporting(); older torch releases have only the first.
_FLAGS = ("_is_compiling_flag", "_is_exporting_flag")


@contextlib.contextmanager
def tracing_ahead_of_time() -> Iterator[None]:
    """Within the block, `torch.compiler.is_compiling()` and `is_exporting()` return True, as under torch.export.

    The previous values are restored on exit, also when the block raises.
    """
    flags = [flag for flag in _FLAGS if hasattr(torch.compiler, flag)]
    saved = {flag: getattr(torch.compiler, flag) for flag in flags}
    try:
        for flag in flags:
            setattr(torch.compiler, flag, True)
        yield
    finally:
        for flag, value in saved.items():
            setattr(torch.compiler, flag, value)
