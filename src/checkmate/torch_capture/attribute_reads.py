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
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

# An attribute a step read: the module's qualified name in the model ("" for the model itself), or the module
# itself when it is not part of the model (a criterion that loss_fn names), and the attribute's name.
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


def attribute_reads(reads: Reads, model: nn.Module, loss_fn: Callable[..., Any]) -> tuple[AttributeRead, ...]:
    """The recorded reads that may be Python values, in the order first read: of `model`'s modules by qualified
    name, of the modules `loss_fn` names (`loss_fn_values`) and their submodules as themselves. Reads of parameters,
    buffers, submodules and nn.Module's bookkeeping are left out, and so are reads of other modules: the tracer's own,
    and modules made during the step (they are made anew by each call)."""
    owners: dict[int, str | nn.Module] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        owners.setdefault(id(module), name)
    for _, read in loss_fn_values(loss_fn):
        value = read()
        if isinstance(value, nn.Module):
            for module in value.modules():
                owners.setdefault(id(module), module)
    found: list[AttributeRead] = []
    for (identity, name), module in reads.items():
        if identity in owners and name not in _MODULE_INTERNALS and not _is_state(module, name):
            found.append((owners[identity], name))
    return tuple(dict.fromkeys(found))


def loss_fn_values(loss_fn: Callable[..., Any], depth: int = 3) -> list[tuple[str, Callable[[], Any]]]:
    """The values `loss_fn`'s code names outside itself, each as (what it is, a function that reads it now): its
    closure cells, its default arguments, and the module globals its code names; through functions in its closure
    (a wrapper's inner function), `depth` levels deep."""
    function = inspect.unwrap(loss_fn)
    code = getattr(function, "__code__", None)
    if code is None or depth == 0:
        return []
    values: list[tuple[str, Callable[[], Any]]] = []
    for name, cell in zip(code.co_freevars, function.__closure__ or (), strict=False):
        read = functools.partial(_cell_contents, cell)
        values.append((f"loss_fn's closure variable `{name}`", read))
        if inspect.isfunction(read()):
            values += loss_fn_values(read(), depth - 1)
    for name in ("__defaults__", "__kwdefaults__"):
        if getattr(function, name):
            values.append((f"loss_fn's {name}", functools.partial(getattr, function, name)))
    namespace = function.__globals__
    values += [
        (f"loss_fn's global `{name}`", functools.partial(namespace.get, name, MISSING))
        for name in code.co_names
        if name in namespace
    ]
    return values


class _Missing:
    """A value looked for and not found (an attribute, a global, an empty closure cell)."""

    def __repr__(self) -> str:
        return "missing"


MISSING = _Missing()


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return MISSING


def _is_state(module: nn.Module, name: str) -> bool:
    """Whether `name` is one of the module's parameters, buffers or submodules."""
    own = vars(module)
    return name in own["_parameters"] or name in own["_buffers"] or name in own["_modules"]
