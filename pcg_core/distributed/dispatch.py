"""Expert parallelism by all-to-all dispatch (epN beside data-parallel attention, under piecewise and breakable).

Each rank routes its own tokens, sends each token once to every rank that holds one of its experts (with its top-k
ids and weights), runs its own experts on what it received, and sends the weighted partial sums back, where each
token's partials are added in rank order. Traffic and expert work follow the routes, not the batch times the ranks
(the all-gather form: data_parallel.py gathers every rank's rows into every MoE block, each rank runs its experts
on all of them and the partials are all-reduced).

The sizes exchanged depend on the routes, so the host must read them: `pcg::ep_all_to_all_` is a split op that is
never recorded in a graph (capturable=False), as serving engines run their prefill dispatch (DeepEP's normal mode)
outside graphs. A capture backend that records every op in one graph (full) keeps the all-gather form instead,
whose shapes are static (the counterpart of DeepEP's low-latency mode under decode graphs).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pcg_core.distributed.group import get_group
from pcg_core.split_ops import bind_module, bound_module, register_split_op, run_split_op

GROUP = "pcg_ep_group"  # the attribute naming the process group the experts are spread over


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """Rows of `x` (send[r] of them for rank r, in rank order) to their ranks; what every rank sent here, rank order."""
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


def _local_experts(m: torch.nn.Module, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """This rank's experts on received rows: routes to its own range keep their (local) index and weight, the
    others are zero-weighted and pointed at a local expert (the rank that holds them adds theirs)."""
    if x.shape[0] == 0:
        return x.new_zeros(x.shape)
    start, count = int(getattr(m, "ep_start")), int(getattr(m, "num_experts"))
    local = index - start
    mine = (local >= 0) & (local < count)
    base = getattr(type(m), "pcg_local_class")
    return base.forward(m, x, torch.where(mine, local, torch.zeros_like(local)), weights * mine)


def _dispatch(out: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
              key: str) -> None:
    if hidden.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("pcg::ep_all_to_all_ runs between graphs: its sizes follow the routes and are read on the "
                           "host (a backend that records every op in one graph takes the all-gather form instead)")
    m = bound_module(key)
    group = get_group(getattr(m, GROUP))
    size = dist.get_world_size(group)
    tokens = hidden.shape[0]
    wants = torch.zeros(tokens, size, dtype=torch.bool, device=hidden.device)
    wants.scatter_(1, torch.div(top_k_index, int(getattr(m, "num_experts")), rounding_mode="floor"), True)
    dest, token = wants.t().nonzero(as_tuple=True)  # rank-major: each rank's tokens in batch order
    send = wants.sum(0)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_n, recv_n = send.tolist(), recv.tolist()  # the host sync that keeps this op out of graphs
    x = _exchange(hidden.index_select(0, token), send_n, recv_n, group)
    index = _exchange(top_k_index.index_select(0, token), send_n, recv_n, group)
    weights = _exchange(top_k_weights.index_select(0, token), send_n, recv_n, group)
    back = _exchange(_local_experts(m, x, index, weights), recv_n, send_n, group)
    # each token's partials in rank order (an index_add would add them in whatever order atomics land on CUDA)
    partial = hidden.new_zeros(size, tokens, hidden.shape[-1])
    partial[dest, token] = back.to(partial.dtype)
    out.copy_(partial.sum(0))


@torch.library.custom_op("pcg::ep_all_to_all_", mutates_args=("out",))
def ep_all_to_all_(out: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                   key: str) -> None:
    """out ← the routed experts' weighted sum for each row of `hidden`, the experts spread over the ranks of the
    experts module bound under `key` (split_ops.bind_module)."""
    run_split_op(_dispatch, out, hidden, top_k_index, top_k_weights, key)


@ep_all_to_all_.register_fake
def _ep_all_to_all_fake(out, hidden, top_k_index, top_k_weights, key) -> None:
    return None


register_split_op(torch.ops.pcg.ep_all_to_all_, capturable=False)

_CLASSES: dict[type, type] = {}


def dispatching_experts_class(cls: type[torch.nn.Module]) -> type:
    """A subclass of experts class `cls` (already holding this rank's range of whole experts: `ep_start`,
    `num_experts`) whose forward is the all-to-all dispatch; `cls`'s own forward runs on the received rows."""
    if cls not in _CLASSES:
        def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                    *args, **kwargs) -> torch.Tensor:
            out = torch.empty_like(hidden_states)
            torch.ops.pcg.ep_all_to_all_(out, hidden_states, top_k_index, top_k_weights, self.pcg_split_key)
            return out

        _CLASSES[cls] = type(f"Dispatching{cls.__name__}", (cls,), {
            "forward": forward, "pcg_local_class": cls, "__module__": __name__})
    return _CLASSES[cls]


def dispatch_experts(m: torch.nn.Module, group_name: str) -> None:
    """Make experts module `m` (this rank's whole experts) dispatch its tokens by all-to-all over `group_name`."""
    setattr(m, GROUP, group_name)
    m.__class__ = dispatching_experts_class(type(m))
    bind_module(m, "ep_experts")
