"""pcg's runtime form of tensor-parallel layers: plain local tensors and one `pcg::all_reduce_` where a partial sum
is completed. No DTensor and no replaced `forward` attribute: a module's class is swapped for a subclass that adds
the collective, so parameter names, state dicts and the reference twins' deep copies stay what they were."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import pcg_core.distributed.ops  # noqa: F401 - registers pcg::all_reduce_

TP_GROUP = "pcg_tp_group"  # the attribute naming the process group a swapped module reduces over


class RowParallelLinear(torch.nn.Linear):
    """A linear whose input features are this rank's shard: local matmul, the sum over ranks, then the bias (once,
    not once per rank)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        torch.ops.pcg.all_reduce_(out, getattr(self, TP_GROUP))
        return out if self.bias is None else out + self.bias


_EXPERT_CLASSES: dict[type, type] = {}


def tp_experts_class(cls: type[torch.nn.Module]) -> type:
    """A subclass of transformers' experts class `cls` whose output (this rank's slice of every expert's
    intermediate dimension, so a partial sum) is summed over ranks. One subclass per class, reused."""
    if cls not in _EXPERT_CLASSES:
        def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            out = cls.forward(self, hidden_states, *args, **kwargs)
            torch.ops.pcg.all_reduce_(out, getattr(self, TP_GROUP))
            return out

        _EXPERT_CLASSES[cls] = type(f"TensorParallel{cls.__name__}", (cls,), {"forward": forward,
                                                                             "__module__": __name__})
    return _EXPERT_CLASSES[cls]


_ROW_CLASSES: dict[type, type] = {}


def tp_row_class(cls: type[torch.nn.Module]) -> type:
    """A subclass of a quantized linear class `cls` holding this rank's input columns: `local_forward` (the class's
    own forward, on the local shard, without bias) then the sum over ranks, then `tp_bias` once. The float and
    reference twins (pcg_core/quant/twin.py) replace `local_forward` only, so their shards are summed alike."""
    if cls not in _ROW_CLASSES:
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.local_forward(x)
            torch.ops.pcg.all_reduce_(out, getattr(self, TP_GROUP))
            return out if self.tp_bias is None else out + self.tp_bias.to(out.dtype)

        def local_forward(self, x: torch.Tensor) -> torch.Tensor:
            return cls.forward(self, x)

        _ROW_CLASSES[cls] = type(f"RowParallel{cls.__name__}", (cls,), {
            "forward": forward, "local_forward": local_forward, "row_parallel": True, "__module__": __name__})
    return _ROW_CLASSES[cls]


_EP_CLASSES: dict[type, type] = {}


def ep_experts_class(cls: type[torch.nn.Module]) -> type:
    """A subclass of transformers' experts class `cls` holding a contiguous range of whole experts (`ep_start`, then
    `num_experts` of them; expert parallelism where ep = tp, all-reduce style). Every rank sees every token and the
    same routing: the routes to its own experts keep their index (made local) and weight, the others run nowhere
    here (their weight zeroed, their index pointed at a local expert), and the partial sums are added over ranks.
    Static shapes throughout, so the experts stay capturable (an all-to-all dispatch is data-dependent)."""
    if cls not in _EP_CLASSES:
        def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                    *args, **kwargs) -> torch.Tensor:
            local = top_k_index - self.ep_start
            mine = (local >= 0) & (local < self.num_experts)
            out = cls.forward(self, hidden_states, torch.where(mine, local, torch.zeros_like(local)),
                              top_k_weights * mine, *args, **kwargs)
            torch.ops.pcg.all_reduce_(out, getattr(self, TP_GROUP))
            return out

        _EP_CLASSES[cls] = type(f"ExpertParallel{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})
    return _EP_CLASSES[cls]
