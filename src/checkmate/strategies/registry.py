"""The table of strategies. Every strategy takes (graph, budget, **options) and returns a Plan."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from checkmate.errors import InvalidArgument
from checkmate.graph import Graph
from checkmate.plan import Plan

StrategyFunction = Callable[..., Plan]
OptionCheck = Callable[[Mapping[str, Any]], None]


def _accept(options: Mapping[str, Any]) -> None:
    """The option check of a strategy whose option values need none beyond their names."""


@dataclass(frozen=True)
class Strategy:
    """A registered method: its name, a one-line description, and the function that plans.

    The function is called as function(graph, budget, **options) with budget in bytes (fixed memory
    included) or None for no limit. It returns a Plan within the budget, or raises InfeasibleBudget. `check(options)`
    raises InvalidArgument for an option value the function would refuse, before any work. A strategy that
    `needs_host_link` plans moves to host memory, so only graphs with a `host_link`.
    """

    name: str
    description: str
    function: StrategyFunction
    check: OptionCheck = _accept
    needs_host_link: bool = False

    def applies_to(self, graph: Graph) -> bool:
        """Whether the strategy plans `graph` (what it needs, the graph has)."""
        return graph.host_link is not None or not self.needs_host_link


_STRATEGIES: dict[str, Strategy] = {}


def register(
    name: str, description: str, check: OptionCheck = _accept, *, needs_host_link: bool = False
) -> Callable[[StrategyFunction], StrategyFunction]:
    """Decorator that adds a strategy function to the table under `name`, with the check of its option values and
    whether it needs a graph with a host link."""

    def add(function: StrategyFunction) -> StrategyFunction:
        if name in _STRATEGIES:
            raise ValueError(f"strategy {name!r} is registered twice")
        _STRATEGIES[name] = Strategy(name, description, function, check, needs_host_link)
        return function

    return add


def strategies() -> tuple[Strategy, ...]:
    """All registered strategies, in registration order."""
    return tuple(_STRATEGIES.values())


def strategies_for(graph: Graph) -> tuple[Strategy, ...]:
    """The registered strategies that plan `graph`, in registration order."""
    return tuple(strategy for strategy in _STRATEGIES.values() if strategy.applies_to(graph))


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


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """InvalidArgument for an unknown method, an option it does not take (naming those it does), or an option value
    it would refuse: what `call_strategy` checks, for callers that check before any other work."""
    known = option_names(name)
    unknown = sorted(set(options) - set(known)) if known is not None else []
    if unknown:
        takes = ", ".join(known) if known else "none"
        raise InvalidArgument(f"method {name!r} takes no option {unknown[0]!r}; the options it takes: {takes}")
    get_strategy(name).check(options)


def call_strategy(name: str, graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    """Run a registered strategy, its options checked first (`check_options`)."""
    check_options(name, options)
    return get_strategy(name).function(graph, budget, **options)
