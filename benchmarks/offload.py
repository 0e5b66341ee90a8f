"""Keep, recompute or move to host memory, on LLM-scale graphs with H100-like figures: predicted step time of the joint
plan against recomputation only, offload only and offloading every activation, at budgets from the peak without
recomputation down.

Graphs are captured on fake tensors (no memory: `transformers` models from configs, bf16, random weights never
made) with the flops cost model, one node per op (3,939 nodes for the 8B; the search goes through a coarse graph,
`checkmate.strategies.large_graph`), and kept in `benchmarks/graphs/offload/`:

* `llama3_8b`: Llama-3-8B's shape (32 layers, hidden 4096, MLP 14336, 32 heads, 8 KV heads, vocab 128256), one
  sequence of 2048 tokens;
* `llama32_1b`: Llama-3.2-1B's shape (16 layers, hidden 2048, MLP 8192, 32 heads, 8 KV heads, tied embeddings), 4
  sequences of 2048 tokens;
* `vit_large`: ViT-L/16 (24 layers, hidden 1024, MLP 4096, 16 heads), 64 images of 224 x 224.

The figures (`H100`): 600 TFLOP/s of bf16 matrix products sustained (about 60 % of an H100 SXM's dense peak), PCIe
Gen5 x16 at 55 GB/s each way with 10 us per copy, copies fully beside compute (`overlap` 1: the copy engines do not
slow the kernels), host memory unlimited. Every plan is priced by the same simulator (`checkmate.moved` for moves).

Methods per budget (a fraction of checkpoint_all's peak, fixed memory included):
* `recompute`: `optimal` on the graph without the link (today's plans);
* `joint`: `optimal` on the graph with the link: keep, recompute or move, one search;
* `offload_only`: no recomputation, values moved cheapest per byte first until the budget holds;
* `offload_all`: no recomputation, every long hold moved (budget-free: a row only where its peak fits).

The peers' plans, on the same graph, each at its own peak (a budget of its own, where `recompute` and `joint` are
planned too). Each checkpoints every transformer block as `torch.utils.checkpoint` does: the block's kept nodes held,
the others held while the forward reads them and computed again, all at once, in the first backward stage that reads
the block, then held until their last use; the blocks are found as the residual stream (the longest chain of adds,
two per block):
* `per_block`: full checkpointing (torchtitan's `mode="full"`): only the block inputs kept;
* `sac`: torchtitan's per-op selective checkpointing: the block inputs, and the outputs of attention and of every
  other matrix product kept (`_save_list`, `mm` recomputed every second time).
The graphs are captured again each run (a few minutes for the largest): the peers need the fx graph.

    .venv/bin/python benchmarks/offload.py --models llama3_8b --time-limit 180 --fractions 0.9 0.8 0.75 --out
    .venv/bin/python benchmarks/offload.py --models vit_large llama32_1b --time-limit 120 --fractions 0.9 0.8 \
        --out --merge
    .venv/bin/python benchmarks/offload.py --from-json --markdown   # BENCHMARKS.md's table from the rows
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import checkmate
from checkmate import LinkSpeeds
from checkmate.files import write_file
from checkmate.strategies.common import plan_from_s
from rows import Row, Stored, add_row_arguments, markdown_table, measure_or_load

GRAPHS = Path(__file__).parent / "graphs" / "offload"  # apart from the graph set of `large_graphs.py`
FLOPS_PER_SECOND = 6e14
H100 = LinkSpeeds(to_host=55e9, to_device=55e9, latency=10e-6, overlap=1.0)
FRACTIONS = (1.0, 0.9, 0.8, 0.75, 0.7)
GIB = 2**30


def _language_model(config: Any, batch: int, length: int) -> tuple[Any, Any, tuple[Any, ...]]:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config)
    tokens = torch.randint(0, config.vocab_size, (batch, length))

    def loss_fn(module: Any, inputs: Any) -> Any:
        return module(input_ids=inputs, labels=inputs).loss

    return model, loss_fn, (tokens,)


def llama3_8b() -> tuple[Any, Any, tuple[Any, ...]]:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, max_position_embeddings=2048,
                         use_cache=False)  # fmt: skip
    return _language_model(config, 1, 2048)


def llama32_1b() -> tuple[Any, Any, tuple[Any, ...]]:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, max_position_embeddings=2048,
                         tie_word_embeddings=True, use_cache=False)  # fmt: skip
    return _language_model(config, 4, 2048)


def vit_large() -> tuple[Any, Any, tuple[Any, ...]]:
    import torch
    from transformers import ViTConfig, ViTForImageClassification
    from transformers.initialization import no_init_weights

    config = ViTConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                       image_size=224, patch_size=16, num_labels=1000)  # fmt: skip
    with no_init_weights():
        model = ViTForImageClassification(config)
    images, labels = torch.randn(64, 3, 224, 224), torch.randint(0, 1000, (64,))

    def loss_fn(module: Any, pixels: Any, targets: Any) -> Any:
        return module(pixel_values=pixels, labels=targets).loss

    return model, loss_fn, (images, labels)


MODELS: dict[str, Callable[[], tuple[Any, Any, tuple[Any, ...]]]] = {
    "llama3_8b": llama3_8b,
    "llama32_1b": llama32_1b,
    "vit_large": vit_large,
}


LAYERS = {"llama3_8b": 32, "llama32_1b": 16, "vit_large": 24}


def captured_model(name: str) -> checkmate.Captured:
    """The model's step captured on fake tensors in bf16, one node per op; its graph is also written to
    `benchmarks/graphs/offload/`."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with FakeTensorMode():
            model, loss_fn, batch = MODELS[name]()
    finally:
        torch.set_default_dtype(default)
    captured = checkmate.capture(model, loss_fn, batch, cost_model="flops")
    write_file(GRAPHS / f"{name}.json.gz", gzip.compress(captured.graph.to_json().encode("utf-8"), mtime=0))
    return captured


def peer_plans(captured: checkmate.Captured, layers: int) -> dict[str, checkmate.Plan]:
    """The peers' plans on the captured graph (module doc)."""
    import torch

    graph, node_of = captured.graph, captured.node_of
    calls = [node for node in captured.module.graph.nodes if node.op == "call_function"]
    forward = [node for node in calls if not graph.is_backward[node_of[node.name]]]
    chain = _residual_chain(forward)[-2 * layers :]
    order = {node: position for position, node in enumerate(captured.module.graph.nodes)}
    residual = [argument for argument in chain[0].args if isinstance(argument, torch.fx.Node)]
    first = min(residual, key=order.__getitem__)  # the stream before the first block: made before its branch
    boundaries = [node_of[first.name], *(node_of[node.name] for node in chain[1::2])]
    saved: set[int] = set()
    products = 0
    for node in forward:
        if node.target == torch.ops.aten.mm.default:
            products += 1
            if products % 2 == 1:
                saved.add(node_of[node.name])
        elif "scaled_dot_product" in str(node.target):
            saved |= {node_of[node.name], *(node_of[user.name] for user in node.users)}
    return {
        "per_block": _blocks_recomputed(graph, boundaries, set(boundaries), "per_block"),
        "sac": _blocks_recomputed(graph, boundaries, set(boundaries) | saved, "sac"),
    }


def _blocks_recomputed(graph: checkmate.Graph, boundaries: list[int], held: set[int], method: str) -> checkmate.Plan:
    """Each block (the forward nodes from one boundary to the next) checkpointed: its `held` nodes kept, the others
    kept while the forward reads them and computed again, all at once, in the first backward stage that reads any
    node of the block (as `torch.utils.checkpoint` reruns a block's forward), then kept until their last use; what
    the rerun reads from outside the block or from its kept nodes is kept until the rerun (the checkpoint's saved
    inputs). Nodes outside the blocks are kept."""
    T = graph.size
    is_backward = graph.is_backward
    users = graph.users
    first_backward = [min((user for user in users[node] if is_backward[user]), default=T) for node in range(T)]
    block_of = np.full(T, -1)
    for number, (start, stop) in enumerate(itertools.pairwise(boundaries)):
        block_of[start + 1 : stop + 1] = number  # a block's input is the one before it; its output is its last node
    rerun = {
        number: min(first_backward[node] for node in np.flatnonzero(block_of == number))
        for number in range(len(boundaries) - 1)
    }
    S = np.zeros((T, T), dtype=bool)
    for node in range(T):
        if not users[node]:
            continue
        last = users[node][-1]
        if is_backward[node] or node in held or block_of[node] < 0:
            S[node + 1 : last + 1, node] = True
            continue
        forward_users = [user for user in users[node] if not is_backward[user]]
        if forward_users:
            S[node + 1 : forward_users[-1] + 1, node] = True
        stage = rerun[int(block_of[node])]
        if stage < last:
            S[stage + 1 : last + 1, node] = True
        for source in graph.predecessors[node]:  # the block's inputs from elsewhere, saved for its rerun
            if block_of[source] != block_of[node] or source in held:
                S[source + 1 : stage + 1, source] = True
    return plan_from_s(graph, S, method=method)


def _residual_chain(forward: list[Any]) -> list[Any]:
    """The longest chain of tensor adds in which each reads the one before: the residual stream."""
    import torch

    adds = [node for node in forward if node.target == torch.ops.aten.add.Tensor]
    longest: dict[Any, list[Any]] = {}
    for node in adds:
        before = [longest[argument] for argument in node.args if argument in longest]
        longest[node] = [*max(before, key=len, default=[]), node]
    return max(longest.values(), key=len)


def _row(name: str, budget: str, fraction: float, method: str, plan_or_error: Any, seconds: float) -> Row:
    row: Row = {
        "row": f"{name} | {budget} | {method}",
        "name": name,
        "budget": budget,
        "fraction": fraction,
        "method": method,
        "seconds": round(seconds, 2),
    }
    if isinstance(plan_or_error, Exception):
        return {**row, "status": type(plan_or_error).__name__}
    plan: checkmate.Plan = plan_or_error
    return {
        **row,
        "status": plan.status,
        "step_seconds": plan.cost / FLOPS_PER_SECOND,
        "peak_gib": plan.peak_memory / GIB,
        "gap": plan.gap,
        "lower_bound_seconds": None if plan.lower_bound is None else plan.lower_bound / FLOPS_PER_SECOND,
        "recomputed": int(plan.R.sum()) - plan.R.shape[0],
        "moved": int(plan.moves.copy_out.sum()),
        "host_gib": plan.host_peak / GIB,
    }


def _solve(graph: checkmate.Graph, budget: int, method: str, time_limit: float) -> tuple[Any, float]:
    options = {"time_limit": time_limit, "progress": False} if method == "optimal" else {}
    started = time.perf_counter()
    try:
        return checkmate.solve(graph, budget, method=method, **options), time.perf_counter() - started
    except checkmate.InfeasibleBudget as error:
        return error, time.perf_counter() - started


def measure(arguments: argparse.Namespace) -> Iterator[Row]:
    for name in arguments.models:
        op_level = captured_model(name)
        graph = op_level.graph
        linked = dataclasses.replace(graph, host_link=H100.priced(FLOPS_PER_SECOND, None))
        kept = checkmate.solve(graph, None, method="checkpoint_all")
        fixed: dict[str, checkmate.Plan] = {
            "checkpoint_all": kept,
            "offload_all": checkmate.solve(linked, None, method="offload_all"),
        }
        fixed |= peer_plans(op_level, LAYERS[name])
        print(f"{name}: {graph.size} nodes, fixed {graph.fixed_memory / GIB:.2f} GiB", file=sys.stderr)
        budgets = [(f"{fraction:.0%}", int(fraction * kept.peak_memory)) for fraction in arguments.fractions]
        budgets += [(f"{label}'s peak", fixed[label].peak_memory) for label in PEERS]
        for label, budget in budgets:
            fraction = budget / kept.peak_memory
            for method, plan in fixed.items():
                yield _row(name, label, fraction, method, plan if plan.peak_memory <= budget else _over(budget), 0.0)
            for method, on, solver in (
                ("recompute", graph, "optimal"),
                ("offload_only", linked, "offload_only"),
                ("joint", linked, "optimal"),
            ):
                found, seconds = _solve(on, budget, solver, arguments.time_limit)
                row = _row(name, label, fraction, method, found, seconds)
                print(f"  {label} ({fraction:.0%}) {method}: {_cell(row)}", file=sys.stderr)
                yield row


def _over(budget: int) -> checkmate.InfeasibleBudget:
    return checkmate.InfeasibleBudget("its peak is over the budget", budget=budget, minimum=None)


def _cell(row: Row) -> str:
    if "step_seconds" not in row:
        return "–"
    text = f"{row['step_seconds'] * 1e3:.1f} ms"
    if row["moved"]:
        text += f", {row['moved']} moved ({row['host_gib']:.1f} GiB)"
    return text


PEERS = ("per_block", "sac")
METHODS = ("checkpoint_all", *PEERS, "recompute", "offload_only", "offload_all", "joint")


def render(stored: Stored) -> str:
    by_key = {(row["name"], row["budget"], row["method"]): row for row in stored.rows}
    lines = []
    for name, budget in dict.fromkeys((row["name"], row["budget"]) for row in stored.rows):
        rows = [by_key.get((name, budget, method), {}) for method in METHODS]
        fraction = next(row["fraction"] for row in rows if row)
        joint = by_key.get((name, budget, "joint"), {})
        others = [row["step_seconds"] for row in rows[:-1] if "step_seconds" in row]
        best = f"{joint['step_seconds'] / min(others):.3f}" if others and "step_seconds" in joint else "–"
        gap = "–" if joint.get("gap") is None else f"{joint['gap']:.1%}"
        lines.append([name, f"{budget} ({fraction:.0%})", *map(_cell, rows), best, gap, str(joint.get("seconds", "–"))])
    header = ["model", "budget", *METHODS, "joint / best other", "joint gap", "joint s"]
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS))
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds for each optimal solve")
    parser.add_argument("--markdown", action="store_true", help="accepted for symmetry: the table is markdown")
    add_row_arguments(parser, merge_key="row")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    measure_or_load(arguments, "offload", lambda: measure(arguments), render)


if __name__ == "__main__":
    main()
