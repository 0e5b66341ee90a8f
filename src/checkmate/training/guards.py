"""What a compiled step's plan depends on beyond the batch, checked on every call as torch.compile checks its guards.

A plan runs a graph traced once. The trace ran the model's Python code with the values it found: each module's
`training` flag, the attributes its forward read (`self.p`, `self.temperature`, a config object), the values
`loss_fn` names (closure cells, defaults, module globals), the autocast state and the default dtype. The graph keeps
them as constants or as the branch they chose. `Guards` snapshots them into a `GuardState` on every call; a
`CompiledStep` keeps its plans by batch signature and guard state, so a changed value (`model.train()` after
compiling in `eval()`) makes it capture and plan again, and a state seen before reuses its plan.

What is guarded, and how:

* Every module's `training` flag.
* Each module attribute the trace read (`checkmate.torch_capture.attribute_reads`): None, bools, numbers, strings,
  dtypes, devices, enums and tuples, lists, dicts and sets of them by value; any other object (a config, a tensor
  that is not a parameter or buffer, a function) by identity: replacing it plans again. An attribute read but missing
  is guarded as missing. Methods and properties of the class are code, not values, and are not guarded.
* The state of each object so read that keeps its state in a `__dict__` (a Hugging Face `PretrainedConfig`, a
  dataclass, a `SimpleNamespace`, any plain Python object): which attributes it has, and each of them as above, and so
  on through the objects among them, each object once however many modules hold it. Changing `model.config.x` in
  place plans again, whether or not the trace read `x` (the trace's reads of such objects are not recorded). An
  object that keeps its state out of Python's sight (a C extension object, such as a NumPy array) is guarded by
  identity alone, and compiling says so in a warning that names it. Functions, classes, Python modules and tensors
  are guarded by identity alone.
* `loss_fn`'s closure cells, default arguments and the module globals it names, where they are such plain values.
* The autocast state of the model's device (enabled, dtype) and `torch.get_default_dtype()`.

Grad mode is checked, not guarded: a step called under `torch.no_grad()` or `torch.inference_mode()` raises (eager's
`loss.backward()` would fail there too).
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import types
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from checkmate.errors import ExecutionError
from checkmate.torch_capture.attribute_reads import MISSING, AttributeRead, loss_fn_values

log = logging.getLogger(__name__)

_PLAIN = frozenset(
    {type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout, torch.memory_format}
)


# nn.Module's class attributes (its methods, `_compiled_call_impl`, ...): what every module call reads.
_MODULE_CLASS = frozenset(vars(nn.Module))


class _Identity:
    """An object guarded by identity: equal only to a guard of the same object (which it holds alive)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)

    def __repr__(self) -> str:
        return f"the {type(self.value).__name__} object at {id(self.value):#x}"


def guarded_value(value: Any) -> Hashable:
    """`value` as a guard compares it: plain values and containers of them by value, anything else by identity."""
    kind = type(value)  # tested by type, not isinstance: isinstance may call a class's own `__getattribute__`
    if kind in _PLAIN or issubclass(kind, enum.Enum):
        return value
    if kind is tuple or kind is torch.Size:
        if _PLAIN.issuperset(map(type, value)):
            return value
        return (tuple, tuple(map(guarded_value, value)))
    if kind is list:
        return (list, tuple(map(guarded_value, value)))
    if issubclass(kind, dict):
        return (dict, tuple((key, guarded_value(item)) for key, item in value.items()))
    if kind is set or kind is frozenset:
        return (frozenset, frozenset(map(guarded_value, value)))
    return _Identity(value)


def _is_plain(value: Any) -> bool:
    """Whether `value` is guarded by value all through (no part of it by identity)."""
    kind = type(value)
    if kind in _PLAIN or issubclass(kind, enum.Enum):
        return True
    if kind in (tuple, list, set, frozenset, torch.Size):
        return all(map(_is_plain, value))
    if issubclass(kind, dict):
        return all(map(_is_plain, value.values()))
    return False


@dataclass(frozen=True)
class GuardState:
    """The values a plan's trace depended on beyond the batch, as of one call.

    Attributes:
        training: each module's `training` flag, in `modules()` order.
        attributes: each guarded value (`Guards.labels` names them), by value or identity.
        autocast: whether autocast is enabled on the model's device type, and its dtype.
        default_dtype: `torch.get_default_dtype()`.
    """

    training: tuple[bool, ...]
    attributes: tuple[Hashable, ...]
    autocast: tuple[bool, torch.dtype]
    default_dtype: torch.dtype


class _Computed:
    """A guarded value that is not an instance attribute, read as `source.get(name, default)` reads one."""

    __slots__ = ("read",)

    def __init__(self, read: Callable[[], Any]) -> None:
        self.read = read

    def get(self, _name: str, _default: Any) -> Any:
        return self.read()


@dataclass(frozen=True)
class _Read:
    """One guarded value: read as `source.get(name, MISSING)`, where `source` is the module's instance `__dict__`
    (the common case, and a dict lookup in C) or a `_Computed`; `label` names it in messages."""

    source: dict[str, Any] | _Computed
    name: str
    label: str


class Guards:
    """The guards of one compiled step: what to snapshot on each call (`state`), grown by each capture (`watch`).

    Args:
        model: the module whose step is captured (its modules' flags and attributes are read).
        loss_fn: the step's loss function (its closure cells, defaults and named globals are read).
        device_type: the model's device type, whose autocast state is guarded ("cpu", "cuda").
    """

    def __init__(self, model: nn.Module, loss_fn: Callable[..., Any], device_type: str) -> None:
        self._model = model
        self._named_modules = tuple(model.named_modules())
        self._modules = tuple(module for _, module in self._named_modules)
        self._device_type = device_type
        self._reads: list[_Read] = _loss_fn_reads(loss_fn)
        self._sources: list[tuple[dict[str, Any] | _Computed, str]] = [(read.source, read.name) for read in self._reads]
        self._watched: set[tuple[int, str]] = set()
        self._held: list[object] = []  # the objects whose state is guarded, kept alive so that their ids stay theirs

    @property
    def labels(self) -> tuple[str, ...]:
        """What each of `GuardState.attributes` is, such as "`temperature` of module 'scale'"."""
        return tuple(read.label for read in self._reads)

    def watch(self, reads: Iterable[AttributeRead]) -> bool:
        """Guard the attributes a capture read, as well; returns whether any was not guarded before."""
        added = False
        for owner, name in reads:
            module = self._model.get_submodule(owner) if isinstance(owner, str) else owner
            if (id(module), name) in self._watched:
                continue
            self._watched.add((id(module), name))
            read = _attribute_read(module, name, _module_label(owner, name))
            if read is not None:
                self._reads.append(read)
                added = True
        added |= self._watch_objects()
        if added:
            self._sources = [(read.source, read.name) for read in self._reads]
        return added

    def _watch_objects(self) -> bool:
        """Guard the state of each object a guarded value holds now: its attribute names and each attribute, through
        the objects among them (the loop reaches the reads it appends). Returns whether any read was added."""
        count = len(self._reads)
        index = 0
        while index < len(self._reads):
            read = self._reads[index]
            index += 1
            value = read.source.get(read.name, MISSING)
            if value is MISSING or type(value) in _CONTAINERS or _is_plain(value) or isinstance(value, _CODE):
                continue  # a container's objects are guarded by identity (`guarded_value`)
            state = _instance_state(value)
            if state is None:
                if (id(value), "") not in self._watched:
                    self._watched.add((id(value), ""))
                    log.warning(
                        "%s, a %s, keeps its state where checkmate cannot read it: it is guarded by identity alone, "
                        "so changing it in place after compile is not seen (replace it, or hold its values as plain "
                        "Python values or buffers)",
                        read.label,
                        type(value).__name__,
                    )
                continue
            if (id(value), "__dict__") not in self._watched:
                self._watched.add((id(value), "__dict__"))
                self._held.append(value)
                names = _Computed(functools.partial(tuple, state))
                self._reads.append(_Read(names, "", f"the attributes of {read.label}"))
            for name in tuple(state):
                if (id(value), name) not in self._watched:
                    self._watched.add((id(value), name))
                    self._reads.append(_Read(state, name, f"`{name}` of {read.label}"))
        return len(self._reads) > count

    def state(self) -> GuardState:
        """The guarded values now: a dict lookup per value, and `guarded_value` only where one is not plain."""
        values = [source.get(name, MISSING) for source, name in self._sources]
        if not _PLAIN.issuperset(map(type, values)):
            values = [guarded_value(value) for value in values]
        return GuardState(
            training=tuple([module.training for module in self._modules]),
            attributes=tuple(values),
            autocast=(
                torch.is_autocast_enabled(self._device_type),
                torch.get_autocast_dtype(self._device_type),
            ),
            default_dtype=torch.get_default_dtype(),
        )

    def extended(self, state: GuardState) -> GuardState:
        """`state` with the attributes guarded since it was taken added at their current values (a plan traced
        before they were guarded did not read them, so any value is right for it)."""
        extra = self._reads[len(state.attributes) :]
        return GuardState(
            training=state.training,
            attributes=(*state.attributes, *(guarded_value(read.source.get(read.name, MISSING)) for read in extra)),
            autocast=state.autocast,
            default_dtype=state.default_dtype,
        )

    def describe_change(self, before: GuardState, now: GuardState) -> str:
        """What differs between two states, for the log: "model.train() since the plan", "`p` of module 'drop'
        changed from 0.1 to 0.5", ..."""
        changes = []
        if before.training != now.training:
            changes.append(self._describe_training(before.training, now.training))
        for label, old, new in zip(self.labels, before.attributes, now.attributes, strict=False):
            if old != new:
                changes.append(f"{label} changed from {_shown(old)} to {_shown(new)}")
        if before.autocast != now.autocast:
            now_autocast, plan_autocast = _autocast(now.autocast), _autocast(before.autocast)
            changes.append(f"autocast on {self._device_type} is {now_autocast}, the plan's was {plan_autocast}")
        if before.default_dtype != now.default_dtype:
            changes.append(f"the default dtype is {now.default_dtype}, the plan's was {before.default_dtype}")
        return "; ".join(changes) or "the guarded values changed"

    def _describe_training(self, before: tuple[bool, ...], now: tuple[bool, ...]) -> str:
        if all(now):
            return "model.train() since the plan"
        if not any(now):
            return "model.eval() since the plan"
        named = zip(self._named_modules, before, now, strict=True)
        changed = [name or "the model" for (name, _), old, new in named if old != new]
        return f"the training flag of {len(changed)} modules changed (first: {changed[0]!r})"


def check_grad_mode() -> None:
    """Raise ExecutionError when gradients are off: a training step needs them, as eager's `loss.backward()` does."""
    if not torch.is_grad_enabled():
        raise ExecutionError(
            "the compiled step was called with gradients disabled (torch.no_grad() or torch.inference_mode()), where "
            "eager's loss.backward() would fail: call the step with gradients enabled, and for evaluation without a "
            "backward pass call the model itself"
        )


def _module_label(owner: str | nn.Module, name: str) -> str:
    where = f"module {owner!r}" if isinstance(owner, str) and owner else "the model"
    if not isinstance(owner, str):
        where = f"the {type(owner).__name__} loss_fn uses"
    return f"`{name}` of {where}"


def _attribute_read(module: nn.Module, name: str, label: str) -> _Read | None:
    """How to read a module attribute the trace read, or None when it is code (a method, a property) or nn.Module's
    own machinery."""
    if name in vars(module):
        return _Read(vars(module), name, label)
    if name in _MODULE_CLASS:
        return None  # nn.Module's own class attributes, such as `_compiled_call_impl`
    static = inspect.getattr_static(type(module), name, MISSING)
    if static is not MISSING and not _is_plain(static):
        return None  # a method, property or other descriptor of the class: code, run anew by each trace
    return _Read(_Computed(functools.partial(getattr, module, name, MISSING)), name, label)


def _loss_fn_reads(loss_fn: Callable[..., Any]) -> list[_Read]:
    """Reads of the plain values `loss_fn` names: closure cells, defaults and the module globals in its code."""
    return [
        _Read(_Computed(read), label, label) for label, read in loss_fn_values(loss_fn, depth=1) if _is_plain(read())
    ]


_CONTAINERS = frozenset({tuple, list, dict, set, frozenset, torch.Size})

# Values that are code or have identity alone: their `__dict__`, where they have one, is not state a trace reads.
_CODE = (
    nn.Module,
    torch.Tensor,
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
)


def _instance_state(value: object) -> dict[str, Any] | None:
    """The `__dict__` an object keeps its attributes in, or None when it has none."""
    try:
        state = vars(value)
    except TypeError:
        return None
    return state if type(state) is dict else None


def _shown(value: Hashable) -> str:
    if isinstance(value, tuple) and len(value) == 2 and value[0] in (tuple, list, dict, frozenset):
        return repr(value[1])
    return repr(value)


def _autocast(state: tuple[bool, torch.dtype]) -> str:
    enabled, dtype = state
    return f"on ({dtype})" if enabled else "off"
