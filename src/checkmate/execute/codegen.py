"""Generate one Python function per graph node from its operations, as torch.fx generates a GraphModule's forward.

The generated function runs the node's operations in order on an environment dict of live values:

    def run(env, take):
        at = 0
        try:
            at = 0
            env['mm'] = f0(env['view'], c0)
            del env['view']
            ...
        except Exception as error:
            raise OperationFailed(at, error) from error

Targets and constant arguments are bound by name (`f0`, `c0`) in the function's globals, never printed as
literals. `take(name)` is called right after each value that leaves the step is made, unless `take` is None
(a recomputation). Compared with a loop that fills argument lists, this saves a few microseconds per op,
which is most of what a Python executor adds to eager PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

NodeFunction = Callable[[dict[str, Any], Callable[[str], None] | None], None]


@dataclass(frozen=True)
class Reference:
    """An argument slot filled at run time with the fx value `name`."""

    name: str


@dataclass(frozen=True, slots=True)
class Operation:
    """One member fx node, ready to evaluate.

    Attributes:
        name: the fx node's name (its value's key in the environment).
        target: the fx node's target (an ATen overload or operator.getitem), for messages.
        function: what is called: the overload's underlying builtin (one Python frame less per op), else the target.
        args: positional arguments, with fx values replaced by Reference.
        kwargs: keyword arguments, likewise.
        release: names of member values that die right after this operation (last use within the node).
        stride: the strides the value had when traced, for values that a kernel may lay out otherwise at run time
            (None for views and non-tensors): see `node_function`'s `conform`.
    """

    name: str
    target: Callable[..., Any]
    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    release: tuple[str, ...]
    stride: tuple[int, ...] | None = None


class OperationFailed(Exception):
    """Raised by a generated node function: operation number `position` raised `error`."""

    def __init__(self, position: int, error: Exception) -> None:
        super().__init__(position, error)
        self.position = position
        self.error = error


def node_function(
    label: str,
    operations: tuple[Operation, ...],
    taken: Collection[str],
    conform: Callable[[Any, tuple[int, ...], str], Any] | None = None,
) -> NodeFunction:
    """Compile `operations` into `run(env, take)`; `taken` names the values to hand to `take` as they are made.

    A kernel may lay its output out otherwise than its fake (meta) version did when the step was traced (CPU
    batch norm returns a contiguous tensor for a transposed input, its meta function keeps the input's strides),
    and a traced `view` of it then fails. When `conform` is given, each value with a traced `stride` whose
    strides differ is replaced by `conform(value, stride, name)` right after it is made.
    """
    names = _Names()
    conform_name = names.bind(conform, "conform") if conform is not None else None
    lines = ["def run(env, take):", "    at = 0", "    try:"]
    for position, operation in enumerate(operations):
        function = names.bind(operation.function, "f")
        arguments = [names.render(value) for value in operation.args]
        arguments += [f"{key}={names.render(value)}" for key, value in operation.kwargs.items()]
        lines.append(f"        at = {position}")
        lines.append(f"        env[{operation.name!r}] = {function}({', '.join(arguments)})")
        if conform_name is not None and operation.stride is not None:
            stride = names.bind(operation.stride, "s")
            value, name = f"env[{operation.name!r}]", repr(operation.name)
            fixed = f"{conform_name}({value}, {stride}, {name})"
            lines.append(f"        if {value}.stride() != {stride}: {value} = {fixed}")
        if operation.name in taken:
            lines.append(f"        if take is not None: take({operation.name!r})")
        lines.extend(f"        del env[{name!r}]" for name in operation.release)
    lines += ["    except Exception as error:", "        raise OperationFailed(at, error) from error"]
    namespace = {"OperationFailed": OperationFailed, **names.bound}
    exec(compile("\n".join(lines), f"<checkmate {label}>", "exec"), namespace)
    run: NodeFunction = namespace["run"]
    return run


class _Names:
    """The globals of one generated function: targets (f0, f1, ...) and constant arguments (c0, c1, ...)."""

    def __init__(self) -> None:
        self.bound: dict[str, Any] = {}
        self.counts: dict[str, int] = {}

    def bind(self, value: Any, prefix: str) -> str:
        number = self.counts.get(prefix, 0)
        self.counts[prefix] = number + 1
        self.bound[f"{prefix}{number}"] = value
        return f"{prefix}{number}"

    def render(self, value: Any) -> str:
        """Source text for one argument: env lookups for references, containers spelled out, anything else bound."""
        if isinstance(value, Reference):
            return f"env[{value.name!r}]"
        if isinstance(value, tuple):
            return "(" + "".join(f"{self.render(item)}, " for item in value) + ")"
        if isinstance(value, list):
            return "[" + ", ".join(self.render(item) for item in value) + "]"
        if isinstance(value, dict) and all(isinstance(key, str) for key in value):
            return "{" + ", ".join(f"{key!r}: {self.render(item)}" for key, item in value.items()) + "}"
        return self.bind(value, "c")
