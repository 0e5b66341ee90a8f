"""Generated node functions: arguments, constants, releases, taken values and failures."""

from __future__ import annotations

import math
import operator

import pytest

from checkmate.execute.codegen import Operation, OperationFailed, Reference, node_function


def _join(items: list[float], *, scale: float, extra: tuple[float, ...] = ()) -> list[float]:
    return [scale * item for item in items] + list(extra)


OPERATIONS = (
    Operation("total", operator.add, operator.add, (Reference("a"), Reference("b")), {}, ()),
    Operation(
        "joined",
        _join,
        _join,
        ([Reference("total"), math.inf, -0.0],),
        {"scale": 2.0, "extra": (Reference("a"), float("nan"))},
        ("total",),
    ),
)


def test_runs_in_order_releases_and_hands_over_taken_values() -> None:
    run = node_function("node 0", OPERATIONS, taken={"total"})
    env = {"a": 1.5, "b": 2.0}
    taken: list[tuple[str, float]] = []
    run(env, lambda name: taken.append((name, env[name])))
    assert taken == [("total", 3.5)]
    assert "total" not in env, "released after its last use"
    assert env["joined"][:4] == [7.0, math.inf, -0.0, 1.5] and math.isnan(env["joined"][4])


def test_a_recomputation_takes_nothing() -> None:
    env = {"a": 1.0, "b": 1.0}
    node_function("node 0", OPERATIONS, taken={"total"})(env, None)
    assert env["joined"][0] == 4.0


def test_failure_names_the_operation() -> None:
    run = node_function("node 0", OPERATIONS, taken=())
    with pytest.raises(OperationFailed) as caught:
        run({"a": 1.0, "b": "text"}, None)
    assert caught.value.position == 0 and isinstance(caught.value.error, TypeError)
