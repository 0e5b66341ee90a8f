"""Which module attributes a traced step read: the Python values a trace may have baked into its graph.

A trace records tensor operations only. A forward that reads `self.training`, `self.p` or `self.temperature` runs
with the value it finds at trace time, and the graph keeps that value as a constant (or the branch it chose). To
know what a compiled step depends on beyond tensor shapes, the trace records every attribute read on a module
(`recording_reads`), as torch.compile's guards record what the traced bytecode read.

The recording replaces `nn.Module.__getattribute__` for the duration of the block: every attribute lookup on any
module (instance attributes, parameters and submodules through `__getattr__`, attributes that do not exist) is
noted as (module, name). Dunder names are not noted. Recording nests and is restored on exit, also when the block
raises.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from torch import nn

# An attribute a step read: the module's qualified name in the model ("" for the model itself), or the module
# itself when it is not part of the model (a criterion that loss_fn holds), and the attribute's name.
AttributeRead = tuple[str | nn.Module, str]
Reads = dict[tuple[int, str], nn.Module]

# What nn.Module keeps in each instance for its own bookkeeping (parameters, buffers, submodules, hooks): not values
# a forward computes with. `training` is one, and is guarded for every module (`checkmate.training.guards`).
_MODULE_INTERNALS = frozenset(vars(nn.Module()))

_lock = threading.Lock()
_active: list[Reads] = []


def _recording_getattribute(self: nn.Module, name: str) -> Any:
    if not name.startswith("__"):
        for reads in _active:
            reads[(id(self), name)] = self
    return object.__getattribute__(self, name)


@contextlib.contextmanager
def recording_reads() -> Iterator[Reads]:
    """Within the block, note each attribute read on a module; yields {(id(module), name): module}, filled as the
    block runs (the modules are held, so their ids stay theirs)."""
    reads: Reads = {}
    with _lock:
        if not _active:
            nn.Module.__getattribute__ = _recording_getattribute  # type: ignore[method-assign,assignment]
        _active.append(reads)
    try:
        yield reads
    finally:
        with _lock:
            del _active[next(index for index, active in enumerate(_active) if active is reads)]
            if not _active:
                del nn.Module.__getattribute__


def attribute_reads(reads: Reads, model: nn.Module, internal: frozenset[int]) -> tuple[AttributeRead, ...]:
    """The recorded reads that may be Python values: each of `model`'s modules by qualified name, other modules as
    themselves; reads of parameters, buffers, submodules and nn.Module's bookkeeping, and of modules whose id is in
    `internal` (the tracer's own), left out. In the order they were first read."""
    names: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), name)
    found: list[AttributeRead] = []
    for (identity, name), module in reads.items():
        if identity in internal or name in _MODULE_INTERNALS or _is_state(module, name):
            continue
        found.append((names.get(identity, module), name))
    return tuple(dict.fromkeys(found))


def _is_state(module: nn.Module, name: str) -> bool:
    """Whether `name` is one of the module's parameters, buffers or submodules."""
    own = vars(module)
    return name in own["_parameters"] or name in own["_buffers"] or name in own["_modules"]
