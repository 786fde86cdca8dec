"""`pcg::all_reduce_`, the collective split op: an in-place sum over a named process group.

One opaque op, so a traced graph can never hold an all_reduce whose wait lands in another piece (which crashes
under CUDA graphs, pytorch#192000). Registered as a split op that piecewise never records in a graph of its own:
piecewise and breakable run it eagerly between their graphs (milestone 1 of the TP design); `full` records
whatever its forward calls in its one graph, NCCL included (NCCL ≥ 2.9 captures collectives uniform over ranks).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pcg_core.distributed.group import get_group
from pcg_core.split_ops import register_split_op, run_split_op


def _all_reduce(x: torch.Tensor, group: str) -> None:
    dist.all_reduce(x, group=get_group(group))


@torch.library.custom_op("pcg::all_reduce_", mutates_args=("x",))
def all_reduce_(x: torch.Tensor, group: str) -> None:
    """x ← the sum of x over every rank of `group` (a name from pcg_core.distributed.group)."""
    run_split_op(_all_reduce, x, group)


@all_reduce_.register_fake
def _all_reduce_fake(x, group) -> None:
    return None


register_split_op(torch.ops.pcg.all_reduce_, capturable=False)
