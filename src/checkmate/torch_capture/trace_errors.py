"""Explain why a training step could not be traced: which construct, on which line of the model, and what to do.

Tracing runs the step on fake tensors, which have shapes and dtypes but no values, and records one graph that is
then run for every batch of those shapes. What fails is what needs a value at trace time: a Python branch or a
Python number taken from a tensor (`.item()`, `int(t)`, `if t.sum() > 0:`), an op whose output shape depends on
values (`nonzero`, boolean-mask indexing), a conversion to NumPy. The error torch raises is deep inside the
tracer; the line that asked is the innermost frame outside torch and checkmate's capture, which the message names.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator

import torch

_VALUE_READ = (
    "data-dependent control flow cannot be planned ahead: tracing has shapes but no values, and one planned graph "
    "serves every batch. `.item()`, `.tolist()`, `int(t)`, `bool(t)` and `if t.sum() > 0:` read values; keep the "
    "choice on the tensor side (torch.where, a mask, torch.cond), or compute the Python value outside loss_fn and "
    "bind it in"
)


def explain_trace_error(error: Exception) -> str:
    """Turn a tracing failure into a message naming the construct, the model line that used it, and the fix."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    text = f"{type(error).__name__}: {error}".strip()
    first_line = text.splitlines()[0][:300]
    where = _where(error)
    if isinstance(error, UnsupportedOperatorException):
        return (
            f"op {error.func}{where} has no fake-tensor (meta) implementation, so its output size is unknown: "
            "register one with torch.library.register_fake, or replace the op"
        )
    if isinstance(error, DynamicOutputShapeException):
        return (
            f"op {error.func}{where} has an output shape that depends on tensor values (nonzero, boolean-mask "
            "indexing, unique): a static plan needs static shapes; pad to a fixed size or use a masked formulation"
        )
    if isinstance(error, DataDependentOutputException):
        return f"the step reads a tensor's value{where} (op {error.func}): {_VALUE_READ}"
    if ".numpy()" in text:
        return (
            f"the step converts a tensor to NumPy{where}: tracing runs on fake tensors that hold no data. Keep the "
            "computation in torch ops, or do the NumPy work outside loss_fn"
        )
    if "no fake impl" in text.lower() or "fake implementation" in text.lower():
        return (
            f"{first_line}{where}: checkmate sizes every op on fake tensors, so each op needs a fake (meta) "
            "implementation: register one with torch.library.register_fake"
        )
    if "requires gradients, and received a mutation" in text:
        return (
            f"the step mutates a parameter in place{where} (for example under torch.no_grad()); checkmate plans a "
            "functional step: update parameters in the optimizer, outside loss_fn"
        )
    if "data-dependent" in text.lower() or "GuardOnDataDependent" in text:
        return f"the step branches on a tensor's value{where} ({first_line}): {_VALUE_READ}"
    return f"tracing the training step failed{where}: {first_line}. The model must be traceable by AOTAutograd"


def raised_in_checkmate(error: BaseException) -> bool:
    """Whether `error` was raised by checkmate's own code (a bug of ours, which keeps its type and traceback) rather
    than by the user's model or loss, or by torch's tracer (which capture explains as a CaptureError)."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(_PACKAGE_ROOT)


_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _where(error: BaseException) -> str:
    """` at file:line in function: source` for the innermost frame outside torch and this tracer, or ""."""
    library_roots = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in (torch.__file__ or "", __file__))
    for chained in _chain(error):
        frames = [
            frame
            for frame in traceback.extract_tb(chained.__traceback__)
            if not os.path.abspath(frame.filename).startswith(library_roots) and not frame.filename.startswith("<")
        ]
        if frames:
            frame = frames[-1]
            source = f": `{frame.line.strip()}`" if frame.line else ""
            return f" at {frame.filename}:{frame.lineno} in {frame.name}{source}"
    return ""


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error and its causes, innermost first: a re-raised error's own traceback starts where it was re-raised."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return reversed(chain)
