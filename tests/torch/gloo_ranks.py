"""The process group of a test's spawned CPU ranks (gloo), set up and torn down the same way by every distributed test.

Teardown matters as much as set-up. A gloo worker thread destroys each finished collective's work after the waiting
rank has moved on, and that destructor lets go of the collective's tensors, which takes the GIL. If the interpreter
is finalizing by then, the thread is ended mid-destructor and the process aborts ("terminate called without an
active exception", pytorch/pytorch#190489). `destroy_process_group` does not join those threads while a
DistributedDataParallel still refers to the group (DDP keeps it alive past `del` and `gc.collect()`), so a rank whose
last collective carried a tensor (a failed compile's `on_every_rank` flag, for example) could abort at exit. A
barrier after the checks makes the last collective one without tensors, on both ranks.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

WORLD_SIZE = 2


@contextmanager
def gloo_ranks(rank: int, init_file: str, *, timeout: datetime.timedelta) -> Iterator[None]:
    """This rank in a 2-rank gloo group for the body, on one thread; a rank stuck in a collective dumps its Python
    stacks 10 s before the group's `timeout`, and one that crashes in native code shows where."""
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE, timeout=timeout
    )
    torch.set_num_threads(1)
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(timeout.total_seconds() - 10)
    try:
        yield
        dist.barrier()  # the last collective holds no tensor (module doc), and no rank leaves while another talks
    finally:
        faulthandler.cancel_dump_traceback_later()
        dist.destroy_process_group()
        gc.collect()  # the groups no module holds go now, not in interpreter teardown
