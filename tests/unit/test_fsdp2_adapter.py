"""FSDP2's private API is reached from one module of `checkmate.sharded` only: `checkmate.sharded.fsdp2`.

Every other module of the package folder is scanned (with `ast`, nothing imported) for an import of a private
`torch.distributed` module (a dotted path with a segment that starts with `_`, as `torch.distributed._composable` or
`torch.distributed.fsdp._fully_shard._fsdp_common`) and for a read or write of an attribute that FSDP2's objects keep
private (`PRIVATE_ATTRIBUTES`), so that a torch release that changes them changes the adapter only.
"""

from __future__ import annotations

import ast
from pathlib import Path

SHARDED = Path(__file__).resolve().parents[2] / "src" / "checkmate" / "sharded"
ADAPTER = "fsdp2.py"

# Private attributes of FSDP2's objects (FSDPModule, FSDPState, FSDPParamGroup, FSDPParam, their contexts) and of
# the module hooks `fully_shard` registers, as named in torch 2.13
PRIVATE_ATTRIBUTES = frozenset(
    {
        "_get_fsdp_state",
        "_lazy_init",
        "_fsdp_param_groups",
        "_fsdp_param_group",
        "_state_ctx",
        "_comm_ctx",
        "_training_state",
        "_root_post_backward_final_callback",
        "_modules_to_run_forward",
        "_param_fqn",
        "_sharded_local_tensor",
        "_unsharded_param",
        "_sharded_param_data",
        "_orig_size",
        "_all_gather_output",
        "_forward_pre_hooks",
        "_forward_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
    }
)


def _private_path(dotted: str) -> bool:
    """Whether a dotted name is a private part of `torch.distributed` (a segment under it starts with `_`)."""
    parts = dotted.split(".")
    return parts[:2] == ["torch", "distributed"] and any(part.startswith("_") for part in parts[2:])


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def private_uses(source: str) -> list[str]:
    """Each private import of `torch.distributed` and each use of a private FSDP2 attribute in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {alias.name}" for alias in node.names if _private_path(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [
                f"from {node.module} import {alias.name}"
                for alias in node.names
                if _private_path(f"{node.module}.{alias.name}")
            ]
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if node.attr in PRIVATE_ATTRIBUTES or (dotted is not None and _private_path(dotted)):
                found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_the_scan_sees_private_uses() -> None:
    source = (
        "import torch.distributed._composable.contract\n"
        "from torch.distributed._composable.contract import STATE_KEY\n"
        "from torch.distributed.fsdp import _fully_shard\n"
        "from torch.distributed.fsdp import FSDPModule\n"
        "import torch.distributed as dist\n"
        "module._get_fsdp_state()._fsdp_param_groups\n"
        "torch.distributed._functional_collectives.all_gather_tensor\n"
        "self._gradients\n"
    )
    assert sorted(private_uses(source)) == sorted(
        [
            "import torch.distributed._composable.contract",
            "from torch.distributed._composable.contract import STATE_KEY",
            "from torch.distributed.fsdp import _fully_shard",
            "line 6: ._fsdp_param_groups",
            "line 6: ._get_fsdp_state",
            "line 7: ._functional_collectives",
            "line 7: .all_gather_tensor",
        ]
    )
    assert private_uses((SHARDED / ADAPTER).read_text()), "the adapter is where FSDP2's private API is used"


def test_only_the_adapter_uses_fsdp2_private_api() -> None:
    modules = sorted(path for path in SHARDED.glob("*.py") if path.name != ADAPTER)
    assert len(modules) > 5, "the sharded modules were found"
    found = {path.name: uses for path in modules if (uses := private_uses(path.read_text()))}
    assert found == {}, f"FSDP2's private API outside checkmate/sharded/{ADAPTER}: {found}"
