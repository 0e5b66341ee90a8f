"""The table of strategies. Every strategy takes (graph, budget, **options) and returns a Plan."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkmate.errors import InvalidArgument
from checkmate.graph import Graph
from checkmate.plan import Plan

StrategyFunction = Callable[..., Plan]


@dataclass(frozen=True)
class Strategy:
    """A registered method: its name, a one-line description, and the function that plans.

    The function is called as function(graph, budget, **options) with budget in bytes (fixed memory
    included) or None for no limit. It returns a Plan within the budget, or raises InfeasibleBudget.
    """

    name: str
    description: str
    function: StrategyFunction


_STRATEGIES: dict[str, Strategy] = {}


def register(name: str, description: str) -> Callable[[StrategyFunction], StrategyFunction]:
    """Decorator that adds a strategy function to the table under `name`."""

    def add(function: StrategyFunction) -> StrategyFunction:
        if name in _STRATEGIES:
            raise ValueError(f"strategy {name!r} is registered twice")
        _STRATEGIES[name] = Strategy(name, description, function)
        return function

    return add


def strategies() -> tuple[Strategy, ...]:
    """All registered strategies, in registration order."""
    return tuple(_STRATEGIES.values())


def get_strategy(name: str) -> Strategy:
    """Look a strategy up by name; raises ValueError listing the known names."""
    try:
        return _STRATEGIES[name]
    except KeyError:
        known = ", ".join(_STRATEGIES)
        raise InvalidArgument(f"unknown method {name!r}; choose one of: {known}") from None


def option_names(name: str) -> tuple[str, ...] | None:
    """The options a strategy takes after (graph, budget), or None when it takes any keyword."""
    parameters = list(inspect.signature(get_strategy(name).function).parameters.values())[2:]
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    return tuple(parameter.name for parameter in parameters)


def call_strategy(name: str, graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    """Run a registered strategy; an option it does not take is a ValueError that lists the ones it does."""
    known = option_names(name)
    unknown = sorted(set(options) - set(known)) if known is not None else []
    if unknown:
        takes = ", ".join(known) if known else "none"
        raise InvalidArgument(f"method {name!r} takes no option {unknown[0]!r}; the options it takes: {takes}")
    return get_strategy(name).function(graph, budget, **options)
