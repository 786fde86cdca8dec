"""Shard a built model in place for tensor parallelism: every rank slices the same full weights.

Why shard the built model rather than load through transformers' `DistributedConfig`: synthetic weights are drawn
by `from_config` under a seed, which transformers' TP path does not take (it shards at checkpoint read), and a
TP=2 run is only comparable with TP=1 when both hold exactly the same full weights; slicing them is exact by
construction. The plan strings are transformers' (plan.py), so the layout is the one its loader would produce;
the result is plain local tensors (no DTensor can reach a traced graph) and pcg's `pcg::all_reduce_`.
A real checkpoint is read whole on every rank and sliced the same way (memory: the full model per rank while
loading; sharded reads are later work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pcg_core.distributed.dispatch import dispatch_experts
from pcg_core.distributed.group import ParallelGroup, rank_block
from pcg_core.distributed.layers import TP_GROUP, RowParallelLinear, ep_experts_class, tp_experts_class
from pcg_core.distributed.linear import is_gated_deltanet, shard_gated_deltanet
from pcg_core.distributed.quant import is_quantized_linear, shard_quantized
from pcg_core.distributed.quant_experts import (gate_up_rows, shard_expert_biases, shard_quantized_experts,
                                               shard_quantized_experts_by_index)
from pcg_core.distributed.plan import COLWISE, EXPERT_STYLES, ROWWISE, decoder_plan, style_for, tp_unsupported_reason, unknown_styles
from pcg_core.errors import UnsupportedModel
from pcg_core.quant.layers.expert_layout import expert_count
from pcg_core.quant.layers.linear import scheme_of
from pcg_core.quant.schemes.fp4 import Fp4Scheme
from pcg_core.quant.schemes.int4 import Int4Scheme

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ATTRIBUTE = "pcg_tensor_parallel"  # on the sharded model: its TensorParallel record


@dataclass(frozen=True)
class TensorParallel:
    """What sharding did: the group, the per-rank head counts the KV cache is sized by, and how many collectives
    one forward makes (2 per dense layer: attention out and MLP out)."""

    group: ParallelGroup
    kv_heads: int
    heads: int
    all_reduces: int


def _shard(t: torch.Tensor, dim: int, rank: int, size: int, where: str) -> torch.Tensor:
    n = t.shape[dim]
    if n % size:
        raise UnsupportedModel(f"tp{size}: {where} has {n} rows along dim {dim}, which {size} ranks do not divide")
    return rank_block(t, dim, rank, size)


def _param(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)


def _colwise(m: torch.nn.Linear, g: ParallelGroup, where: str) -> None:
    m.weight = _param(_shard(m.weight.data, 0, g.rank, g.size, where))
    if m.bias is not None:
        m.bias = _param(_shard(m.bias.data, 0, g.rank, g.size, where))
    m.out_features = m.weight.shape[0]


def _rowwise(m: torch.nn.Linear, g: ParallelGroup, where: str) -> None:
    m.weight = _param(_shard(m.weight.data, 1, g.rank, g.size, where))
    m.in_features = m.weight.shape[1]
    m.__class__ = RowParallelLinear
    setattr(m, TP_GROUP, g.name)


def _experts(m: torch.nn.Module, g: ParallelGroup, where: str) -> None:
    """Every expert keeps its whole hidden size and this rank's slice of its intermediate size: gate_up's rows of it
    (gate and up alike, halves or interleaved pairs: quant_experts.gate_up_rows), down's input columns; biases with
    their rows, down's added once; the output is summed over ranks. Float experts in their own layout (gpt-oss's
    transposed [E, K, N] too), quantized ones' codes and scales in the canonical [E, N, K] (quant_experts.py)."""
    if not getattr(m, "has_gate", True):
        raise UnsupportedModel(f"tp{g.size}: {where} ({type(m).__name__}) is gateless; only gated experts are sharded "
                               "so far")
    scheme = scheme_of(m)
    interleaved = not getattr(m, "is_concatenated", True)
    n_dim, k_dim = (2, 1) if scheme is None and getattr(m, "is_transposed", False) else (1, 2)
    gate_up, down = getattr(m, "gate_up_proj").data, getattr(m, "down_proj").data
    # codes packed along K: int4 8 per int32, FP4 2 per byte
    inter = down.shape[k_dim] * (8 if isinstance(scheme, Int4Scheme) else 2 if isinstance(scheme, Fp4Scheme) else 1)
    if gate_up.shape[n_dim] != 2 * inter:
        raise UnsupportedModel(f"tp{g.size}: {where}: gate_up_proj {tuple(gate_up.shape)} does not hold 2·{inter} "
                               f"rows along dim {n_dim}")
    if inter % g.size:
        raise UnsupportedModel(f"tp{g.size}: {where}: {inter} intermediate rows, which {g.size} ranks do not divide")
    if scheme is not None:
        shard_quantized_experts(m, g, where, inter, interleaved)
    else:
        setattr(m, "gate_up_proj", _param(gate_up_rows(gate_up, n_dim, g.rank, g.size, interleaved)))
        setattr(m, "down_proj", _param(_shard(down, k_dim, g.rank, g.size, where)))
    shard_expert_biases(m, g, interleaved)
    for attr in ("intermediate_dim", "intermediate_size"):
        if isinstance(getattr(m, attr, None), int):
            setattr(m, attr, inter // g.size)
    m.__class__ = tp_experts_class(type(m))
    setattr(m, TP_GROUP, g.name)


def _experts_by_index(m: torch.nn.Module, g: ParallelGroup, where: str, dispatch: bool = False) -> None:
    """Expert parallelism: this rank keeps experts [rank·E/size, (rank+1)·E/size) whole; every rank's tokens reach
    them all-reduce style (the block sees every token: ep = tp, or the all-gather form) or by all-to-all dispatch."""
    experts = expert_count(m)
    if experts % g.size:
        raise UnsupportedModel(f"ep{g.size}: {where} has {experts} experts, which {g.size} ranks do not divide")
    if scheme_of(m) is not None:
        shard_quantized_experts_by_index(m, g)
    floats = ("gate_up_proj_bias", "up_proj_bias", "down_proj_bias")  # biases stay float parameters when quantized
    for name in floats if scheme_of(m) is not None else ("gate_up_proj", "up_proj", "down_proj", *floats):
        if isinstance(getattr(m, name, None), torch.Tensor):
            setattr(m, name, _param(_shard(getattr(m, name).data, 0, g.rank, g.size, where)))
    local = experts // g.size
    setattr(m, "num_experts", local)
    setattr(m, "ep_start", g.rank * local)
    if dispatch:
        dispatch_experts(m, g.name)
        return
    m.__class__ = ep_experts_class(type(m))
    setattr(m, TP_GROUP, g.name)


def _is_experts(m: torch.nn.Module) -> bool:
    w = getattr(m, "down_proj", None)
    return isinstance(w, torch.Tensor) and w.dim() == 3 and hasattr(m, "num_experts")


def shard_model(model: PreTrainedModel, group: ParallelGroup, expert_parallel: bool = False,
                expert_group: ParallelGroup | None = None) -> TensorParallel:
    """Shard `model` (built whole, the same weights on every rank) for `group` in place; returns the record, also
    set on the model as `pcg_tensor_parallel`. A model the plan does not cover raises UnsupportedModel with why.
    `expert_parallel` (tpN-epN): fused experts split by expert index, whole experts per rank, instead of every
    expert by its intermediate size, over `expert_group` where given (tp2-ep4: TP2 attention in two data-parallel
    groups, the experts over all four ranks), else over `group`; a model without experts is refused."""
    if tensor_parallel_of(model) is not None:
        raise ValueError(f"{type(model).__name__} is already sharded (pcg_tensor_parallel is set); shard a model once")
    config = model.config
    if why := tp_unsupported_reason(config, group.size):
        raise UnsupportedModel(why)
    plan = decoder_plan(config)
    if bad := unknown_styles(plan):
        raise UnsupportedModel(f"tp{group.size}: transformers' plan has styles pcg does not apply yet: {'; '.join(bad)}")
    decoder = model.get_decoder()
    if expert_parallel and not any(_is_experts(m) for m in decoder.modules()):
        raise UnsupportedModel(f"ep{(expert_group or group).size}: {type(model).__name__} has no routed experts to "
                               "spread (expert parallelism is for MoE models)")
    text = config.get_text_config()
    kv_total = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    # More ranks than KV heads: each KV head is kept whole by tp / kv ranks (those whose query heads read it), as
    # vLLM and SGLang replicate them; k_proj and v_proj are sliced by the KV heads' own grouping.
    kv_group = group if kv_total >= group.size else \
        ParallelGroup(group.rank // (group.size // kv_total), kv_total, group.name, group.backend)
    reduces = 0
    for name, m in list(decoder.named_modules()):
        if _is_experts(m):
            if expert_parallel:
                _experts_by_index(m, expert_group or group, name)
            else:
                _experts(m, group, name)
            reduces += 1
            continue
        style = style_for(plan, name)
        if style is None or style in EXPERT_STYLES:
            continue
        g = kv_group if style in COLWISE and name.endswith(("k_proj", "v_proj")) else group
        if style in COLWISE + ROWWISE and is_quantized_linear(m):
            shard_quantized(m, style in ROWWISE, g, name)
            reduces += style in ROWWISE
            continue
        if style in COLWISE + ROWWISE and type(m) is not torch.nn.Linear:
            raise UnsupportedModel(f"tp{group.size}: {name} is a {type(m).__name__}, not a plain or quantized Linear; "
                                   "custom layers are not sharded yet")
        if style in COLWISE:
            _colwise(m, g, name)
        elif style in ROWWISE:
            _rowwise(m, group, name)
            reduces += 1
    heads, kv = text.num_attention_heads // group.size, kv_total // kv_group.size
    _local_heads(decoder, text.num_attention_heads, heads, kv, group)
    record = TensorParallel(group=group, kv_heads=kv, heads=heads, all_reduces=reduces)
    setattr(model, ATTRIBUTE, record)
    return record


def _local_heads(decoder: torch.nn.Module, total: int, heads: int, kv: int, group: ParallelGroup) -> None:
    """What modules read their head counts and per-head parameters from, this rank's: the attention modules'
    attributes (their reshapes infer the rest: -1), gpt-oss's sinks, Qwen3-Next's Gated DeltaNet layers."""
    for m in decoder.modules():
        if is_gated_deltanet(m):  # conv channels, decay and heads by key-head group
            shard_gated_deltanet(m, group)
        if not hasattr(m, "o_proj"):
            continue
        for attr, local in (("num_heads", heads), ("num_attention_heads", heads), ("num_key_value_heads", kv),
                            ("num_kv", kv),  # Grok-2's own attention names its KV heads num_kv
                            ("num_key_value_groups", heads // kv)):  # transformers' repeat_kv (a twin's eager)
            if isinstance(getattr(m, attr, None), int):
                setattr(m, attr, local)
        sinks = getattr(m, "sinks", None)  # gpt-oss: one sink logit per head, this rank's heads'
        if isinstance(sinks, torch.Tensor) and sinks.shape == (total,):
            setattr(m, "sinks", _param(_shard(sinks.data, 0, group.rank, group.size, "sinks")))


def shard_experts_by_index(model: PreTrainedModel, group: ParallelGroup, dispatch: bool = False) -> int:
    """Expert parallelism over `group` beside data-parallel attention (epN alone): every fused experts block keeps
    this rank's range of whole experts, and either sums its partial output over the ranks (the block sees every
    rank's rows: pcg_core.distributed.data_parallel, gathering) or, with `dispatch`, receives the tokens routed to
    it by all-to-all (pcg_core.distributed.dispatch); attention and dense layers stay whole. Returns how many blocks
    were split; a model without routed experts raises UnsupportedModel."""
    blocks = [(n, m) for n, m in model.get_decoder().named_modules() if _is_experts(m)]
    if not blocks:
        raise UnsupportedModel(f"ep{group.size}: {type(model).__name__} has no routed experts to spread (expert "
                               "parallelism is for MoE models)")
    for name, m in blocks:
        _experts_by_index(m, group, name, dispatch)
    return len(blocks)


def tensor_parallel_of(model: torch.nn.Module) -> TensorParallel | None:
    return getattr(model, ATTRIBUTE, None)
