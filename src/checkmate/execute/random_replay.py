"""Random replay: a random node that a schedule computes again draws what its first computation drew.

The generators' state is saved before the node's first computation (`saved_state`) and set again for each
recomputation inside `torch.random.fork_rng` (`replaying`): the recomputed values (dropout's mask) equal the first
ones, and the global stream goes on as if the node had run once, as in eager PyTorch. The eager executor's generated
step (`checkmate.execute.codegen`) replays the CPU generator and those of the CUDA devices its inputs are on;
`checkmate.inductor.backend`'s graphs (`checkmate.inductor.split`) replay the CPU generator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

# The CPU generator's state, then one per CUDA device, in the order of the devices asked for.
RandomState = tuple[torch.Tensor, list[torch.Tensor]]


def saved_state(cuda_devices: Sequence[int]) -> RandomState:
    """The state of the CPU generator and of the generators of `cuda_devices` now."""
    return torch.get_rng_state(), [torch.cuda.get_rng_state(device) for device in cuda_devices]


@contextlib.contextmanager
def replaying(state: RandomState, cuda_devices: Sequence[int]) -> Iterator[None]:
    """Run the block with the generators as `saved_state(cuda_devices)` found them, then give them back the state
    they had before the block."""
    with torch.random.fork_rng(devices=list(cuda_devices)):
        cpu_state, cuda_states = state
        torch.set_rng_state(cpu_state)
        for device, cuda_state in zip(cuda_devices, cuda_states, strict=True):
            torch.cuda.set_rng_state(cuda_state, device)
        yield
