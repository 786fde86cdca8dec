"""Gated DeltaNet layers (Qwen3-Next's linear attention) sharded by head for tensor parallelism.

transformers' plan gathers these layers' outputs (`colwise_gather_output`): every rank would then run every head's
conv and recurrence. Sharded by key-head group instead, as SGLang and vLLM do, each rank keeps its heads' whole
state and no collective runs until out_proj (rowwise, like o_proj). The projections group their rows by key head
(in_proj_qkvz: per key head [q, k, v, z]; in_proj_ba: per key head [b, a]), so plan.py's `colwise` slices them right;
what a plain plan cannot say is sliced here: the depthwise conv's channels ([q | k | v] blocks, each this rank's
heads'), A_log and dt_bias (per value head), and the head counts the module's reshapes read.
"""

from __future__ import annotations

import torch

from pcg_core.distributed.group import ParallelGroup, rank_block

GDN_ATTRIBUTES = ("in_proj_qkvz", "in_proj_ba", "conv1d", "A_log", "dt_bias", "num_k_heads", "num_v_heads")


def is_gated_deltanet(module: torch.nn.Module) -> bool:
    return all(hasattr(module, n) for n in GDN_ATTRIBUTES)


def shard_gated_deltanet(m: torch.nn.Module, g: ParallelGroup) -> None:
    """The parts of a Gated DeltaNet module that its plan's colwise/rowwise projections leave whole, this rank's."""
    kh, vh = int(getattr(m, "num_k_heads")), int(getattr(m, "num_v_heads"))
    kd, vd = int(getattr(m, "head_k_dim")) * kh, int(getattr(m, "head_v_dim")) * vh
    conv = getattr(m, "conv1d")
    assert isinstance(conv, torch.nn.Conv1d)  # depthwise, [q | k | v] channels
    q, k, v = conv.weight.data.split([kd, kd, vd])
    conv.weight = torch.nn.Parameter(torch.cat([rank_block(x, 0, g.rank, g.size) for x in (q, k, v)]), requires_grad=False)
    if conv.bias is not None:
        bq, bk, bv = conv.bias.data.split([kd, kd, vd])
        conv.bias = torch.nn.Parameter(torch.cat([rank_block(x, 0, g.rank, g.size) for x in (bq, bk, bv)]), requires_grad=False)
    conv.in_channels = conv.out_channels = conv.groups = conv.weight.shape[0]
    for name in ("A_log", "dt_bias"):
        setattr(m, name, torch.nn.Parameter(rank_block(getattr(m, name).data, 0, g.rank, g.size), requires_grad=False))
    for attr, value in (("num_k_heads", kh // g.size), ("num_v_heads", vh // g.size), ("key_dim", kd // g.size),
                        ("value_dim", vd // g.size), ("conv_dim", (2 * kd + vd) // g.size)):
        if hasattr(m, attr):
            setattr(m, attr, value)
