"""Graph JSON and sizes are read strictly, and help(checkmate.compile) documents every option."""

from __future__ import annotations

import inspect
import json
import pydoc

import pytest

import checkmate
from checkmate.examples import linear_graph


def _json_with(change: dict[str, object], *, node: int | None = 1) -> str:
    data = json.loads(linear_graph(2).to_json())
    (data["nodes"][node] if node is not None else data).update(change)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("change", "node", "named"),
    [
        ({"backward": "no"}, 1, "backward"),
        ({"backward": 1}, 1, "backward"),
        ({"memroy": 4}, 1, "memroy"),
        ({"name": 7}, 1, "name"),
        ({"fixed_memry": 4}, None, "fixed_memry"),
    ],
)
def test_graph_json_refuses_unknown_keys_and_wrong_types(
    change: dict[str, object], node: int | None, named: str
) -> None:
    with pytest.raises(checkmate.InvalidGraph, match=named):
        checkmate.Graph.from_json(_json_with(change, node=node))


def test_sizes_past_64_bit_accounting_are_an_invalid_graph() -> None:
    with pytest.raises(checkmate.InvalidGraph, match="2\\^62"):
        checkmate.Graph((checkmate.Node("a", 1.0, 10**30, False, ()),))
    with pytest.raises(checkmate.InvalidGraph, match="2\\^62"):
        checkmate.Graph.from_json(_json_with({"fixed_memory": 10**30}, node=None))


def test_help_of_compile_documents_every_parameter() -> None:
    torch_compile = pytest.importorskip("checkmate.compile_step").compile
    text = pydoc.render_doc(checkmate.compile)
    for name in inspect.signature(torch_compile).parameters:
        assert f"{name}:" in text or f"**{name}:" in text, name
