"""Data-parallel attention (dpN): each rank attends over its own sequences with its own KV, and the MoE layers run over
every rank's tokens, as SGLang's DP attention runs a MoE (the experts see the whole batch, so their GEMMs stay wide).

The engine is handed the whole batch and keeps the sequences this rank owns (sequence i on rank i mod N), as a DP
front end would hand each rank its requests. Before a forward the ranks agree on the largest local token count
(an all-reduce of one integer, on the host, before any graph), and all pad to the bucket of that count: the
collectives inside the forward then pair up row for row, and every rank replays the same graph. A MoE block gathers
every rank's rows (`pcg::all_gather_into_`, a split op), runs on all of them, and keeps its own; dense layers run on
the local rows alone. The forward's output is gathered the same way, so every rank returns the whole batch's hidden
states (and so picks the same next tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pcg_core.distributed.group import ParallelGroup, get_group
from pcg_core.errors import UnsupportedModel
from pcg_core.split_ops import register_split_op, run_split_op

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ATTRIBUTE = "pcg_data_parallel"  # on the model: its DataParallel record
_GROUP = "pcg_dp_group"


def _all_gather_into(out: torch.Tensor, x: torch.Tensor, group: str) -> None:
    dist.all_gather_into_tensor(out, x.contiguous(), group=get_group(group))


@torch.library.custom_op("pcg::all_gather_into_", mutates_args=("out",))
def all_gather_into_(out: torch.Tensor, x: torch.Tensor, group: str) -> None:
    """out ← every rank's x of `group` stacked along dim 0 in rank order (out has size × x's rows)."""
    run_split_op(_all_gather_into, out, x, group)


@all_gather_into_.register_fake
def _all_gather_into_fake(out, x, group) -> None:
    return None


register_split_op(torch.ops.pcg.all_gather_into_, capturable=False)


@dataclass(frozen=True)
class DataParallel:
    """What data-parallel attention set up: the group, and how many MoE blocks gather over it."""

    group: ParallelGroup
    gathers: int

    def owner(self, seq_id: int) -> int:
        return seq_id % self.group.size

    def split(self, seq_ids: list[int]) -> list[list[int]]:
        """A batch's row indices (by its rows' sequence ids) on each rank, in batch order."""
        rows: list[list[int]] = [[] for _ in range(self.group.size)]
        for i, s in enumerate(seq_ids):
            rows[self.owner(s)].append(i)
        return rows

    def agreed_rows(self, local: int, device: torch.device) -> int:
        """The largest local token count over the ranks (every rank pads to it, or to its bucket)."""
        g = get_group(self.group.name)
        t = torch.tensor([local], dtype=torch.int64, device=device if dist.get_backend(g) == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        return int(t.item())

    def gather(self, hidden: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
        """Every rank's padded hidden states [T, H] into the whole batch's rows, batch order."""
        size, t = self.group.size, hidden.shape[0]
        out = torch.empty(size * t, *hidden.shape[1:], dtype=hidden.dtype, device=hidden.device)
        _all_gather_into(out, hidden, self.group.name)
        order = torch.empty(sum(map(len, rows)), dtype=torch.int64)
        for r, idx in enumerate(rows):
            order[idx] = torch.arange(len(idx)) + r * t
        return out.index_select(0, order.to(hidden.device))


_GATHER_CLASSES: dict[type, type] = {}


def _gathering_class(cls: type[torch.nn.Module]) -> type:
    """A subclass of MoE-block class `cls` that runs on every rank's rows and returns this rank's."""
    if cls not in _GATHER_CLASSES:
        def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
            shape = hidden_states.shape
            x = hidden_states.reshape(-1, shape[-1])
            size, rank = self.pcg_dp_size, self.pcg_dp_rank
            everyone = torch.empty(size * x.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
            torch.ops.pcg.all_gather_into_(everyone, x, getattr(self, _GROUP))
            out = cls.forward(self, everyone.reshape(*shape[:-2], size * shape[-2], shape[-1]), *args, **kwargs)
            first = out[0] if isinstance(out, tuple) else out
            mine = first.reshape(size, -1, shape[-1])[rank].reshape(shape)
            return (mine, *out[1:]) if isinstance(out, tuple) else mine

        _GATHER_CLASSES[cls] = type(f"DataParallel{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})
    return _GATHER_CLASSES[cls]


def _moe_blocks(decoder: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules that hold a fused experts block (transformers' MoE blocks: the router and experts, and a shared
    expert where the model has one)."""
    found = []
    for m in decoder.modules():
        experts = getattr(m, "experts", None)
        w = getattr(experts, "down_proj", None)
        if isinstance(w, torch.Tensor) and w.dim() == 3:
            found.append(m)
    return found


def data_parallel_model(model: PreTrainedModel, group: ParallelGroup, gather_moe: bool = True) -> DataParallel:
    """Set `model` up for data-parallel attention over `group` in place (the same weights on every rank); returns the
    record, also set on the model as `pcg_data_parallel`. `gather_moe` False: the MoE blocks run on this rank's rows
    alone (their experts dispatch by all-to-all: pcg_core.distributed.dispatch). Models whose per-sequence state
    lives outside the KV cache (linear attention) or whose inputs carry images are refused for now."""
    if getattr(model, ATTRIBUTE, None) is not None:
        raise ValueError(f"{type(model).__name__} is already set up for data parallelism; do it once")
    config = model.config
    text = config.get_text_config()
    if config is not text:
        raise UnsupportedModel(f"dp{group.size}: a model with a vision tower is not run data-parallel yet")
    if "linear_attention" in (getattr(text, "layer_types", None) or ()):
        raise UnsupportedModel(f"dp{group.size}: linear-attention layers' per-sequence state is not split by rank yet")
    blocks = _moe_blocks(model.get_decoder()) if gather_moe else []
    for b in blocks:
        setattr(b, "pcg_dp_size", group.size)
        setattr(b, "pcg_dp_rank", group.rank)
        setattr(b, _GROUP, group.name)
        b.__class__ = _gathering_class(type(b))
    record = DataParallel(group=group, gathers=len(blocks))
    setattr(model, ATTRIBUTE, record)
    return record


def data_parallel_of(model: torch.nn.Module) -> DataParallel | None:
    return getattr(model, ATTRIBUTE, None)
