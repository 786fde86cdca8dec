"""Quantized MoE experts sharded for tensor and expert parallelism, as their float weights are (shard.py).

Quantized experts hold every projection in the canonical [E, N out, K in] layout (pcg_core/quant/layers/experts.py):
8-bit codes [E, N, K] with a scale per expert (`_scale`: [E] per tensor, [E, N, 1] per channel, [E, N/128, K/128]
per block) and, for a static scheme, one input scale for all experts; int4 codes packed along K [E, N, K/8] with
`_scales` and `_zeros` [E, N, K/G] and act-order's `_perm`; FP4 codes packed two a byte along K [E, N, K/2] with
block scales [E, N, K/B] and row globals [E, N]. Every buffer is sliced with the weights it belongs to:
- by intermediate size (tpN): gate_up's rows of this rank's intermediate slice (gate and up alike: from each half, or
  whole interleaved pairs), down's input (K); a split that would cut a 128×128 block, an int4 group or an FP4 block,
  or act-order's permutation across the shards, is refused with the reason;
- by expert index (tpN-epN, epN): every buffer along its first dimension, whole experts per rank.
A per-tensor or per-channel scale of down's output rows, and a static input scale, are the same on every rank.

The down projection of a scheme with dynamic per-token activation scales then rounds its input over the rank's K
slice, as vLLM's and SGLang's row-parallel MoE layers do; the unsharded comparison model rounds alike
(`emulate_expert_row_shards`).
"""

from __future__ import annotations

import torch

from pcg_core.distributed.group import ParallelGroup, rank_block
from pcg_core.errors import UnsupportedModel
from pcg_core.quant.layers.expert_layout import held_scheme
from pcg_core.quant.layers.experts import PROJECTIONS
from pcg_core.quant.schemes.fp4 import Fp4Scheme
from pcg_core.quant.schemes.int4 import Int4Scheme
from pcg_core.quant.schemes.w8a8 import BLOCK, Scheme

_INT4_SUFFIXES = ("", "_scales", "_zeros")


def _buffers(m: torch.nn.Module, name: str) -> list[str]:
    """Projection `name`'s per-expert buffers (its scalar input scale is no expert's)."""
    scheme = held_scheme(m)
    if isinstance(scheme, Int4Scheme):
        suffixes: tuple[str, ...] = _INT4_SUFFIXES + ("_perm",)
    elif isinstance(scheme, Fp4Scheme):
        suffixes = ("", "_scale", "_global")  # packed codes [E, N, K/2], block scales [E, N, K/B], row globals [E, N]
    else:
        suffixes = ("", "_scale")
    return [name + s for s in suffixes if getattr(m, name + s, None) is not None]


def gate_up_rows(t: torch.Tensor, dim: int, rank: int, size: int, interleaved: bool) -> torch.Tensor:
    """This rank's gate_up rows along `dim` (2I of them): of two halves (gate, then up) the rank's slice of each, or,
    where gate and up rows alternate (gpt-oss: transformers' `is_concatenated=False`), one contiguous block of whole
    (gate, up) pairs."""
    if interleaved:
        return rank_block(t, dim, rank, size)
    gate, up = t.chunk(2, dim=dim)
    return torch.cat([rank_block(gate, dim, rank, size), rank_block(up, dim, rank, size)], dim)


def shard_expert_biases(m: torch.nn.Module, g: ParallelGroup, interleaved: bool) -> None:
    """Biased experts (gpt-oss) under TP: gate_up's bias [E, 2I] with its rows; down's [E, H] added by rank 0 only,
    so the ranks' partial sums add up to one bias."""
    bias = getattr(m, "gate_up_proj_bias", None)
    if isinstance(bias, torch.Tensor):
        setattr(m, "gate_up_proj_bias", torch.nn.Parameter(gate_up_rows(bias.data, 1, g.rank, g.size, interleaved),
                                                           requires_grad=False))
    bias = getattr(m, "down_proj_bias", None)
    if isinstance(bias, torch.Tensor) and g.rank != 0:
        setattr(m, "down_proj_bias", torch.nn.Parameter(torch.zeros_like(bias.data), requires_grad=False))


def _refuse(kind: str, where: str, why: str) -> UnsupportedModel:
    return UnsupportedModel(f"{kind}: {where}: {why}")


def shard_quantized_experts_by_index(m: torch.nn.Module, g: ParallelGroup) -> None:
    """Expert parallelism: this rank keeps experts [rank·E/size, (rank+1)·E/size) whole, codes and scales alike
    (the caller sets num_experts and ep_start)."""
    for name in PROJECTIONS:
        if isinstance(getattr(m, name, None), torch.Tensor):
            for b in _buffers(m, name):
                m._buffers[b] = rank_block(getattr(m, b), 0, g.rank, g.size)


def shard_quantized_experts(m: torch.nn.Module, g: ParallelGroup, where: str, inter: int, interleaved: bool) -> None:
    """Tensor parallelism: every expert keeps this rank's slice of its intermediate size `inter` — gate_up [E, 2I, H]
    by output rows (gate_up_rows), down [E, H, I] by input columns."""
    scheme, kind = held_scheme(m), f"tp{g.size}"
    part = inter // g.size
    if isinstance(scheme, Fp4Scheme):
        if part % scheme.block:
            raise _refuse(kind, where, f"{scheme.name}'s blocks of {scheme.block}: a shard of {part} intermediate "
                                       "columns would cut one")
    elif isinstance(scheme, Int4Scheme):
        group = getattr(m, "down_proj_group")
        if getattr(m, "down_proj_perm", None) is not None:
            raise _refuse(kind, where, "act-order (GPTQ desc_act) permutes the down projection's K across the shards' "
                                       "boundary; a checkpoint without act-order shards")
        if part % group or part % 8:
            raise _refuse(kind, where, f"int4 groups of {group}: a shard of {part} intermediate columns would cut one")
    elif scheme.weights == "block" and (part % BLOCK or inter % BLOCK):
        raise _refuse(kind, where, f"{scheme.name}'s {BLOCK}×{BLOCK} blocks: a shard of {part} of {inter} intermediate "
                                   f"rows would cut one (both must be multiples of {BLOCK})")
    whole_rows = not isinstance(scheme, Scheme) or scheme.weights != "tensor"  # scales that run along N
    for b in _buffers(m, "gate_up_proj"):  # [E, 2I, ...]: this rank's gate and up rows (or row blocks)
        if b.endswith("_perm") or (b.endswith("_scale") and not whole_rows):  # over K, or one per expert: whole
            continue
        m._buffers[b] = gate_up_rows(getattr(m, b), 1, g.rank, g.size, interleaved)
    k_scales = not isinstance(scheme, Scheme) or scheme.weights == "block"  # scales that run along K
    for b in _buffers(m, "down_proj"):  # [E, H, I...]: its input columns (packed codes, groups, blocks)
        if (b.endswith("_scale") and not k_scales) or b.endswith("_global"):  # per tensor or per output row: whole
            continue
        m._buffers[b] = rank_block(getattr(m, b), 2, g.rank, g.size)


def emulate_expert_row_shards(m: torch.nn.Module, parts: int) -> None:
    """Make unsharded quantized experts round the down projection's input per K slice, as `parts` ranks holding
    the slices do, each rank's partial sum in the model's dtype before they are added
    (pcg_core.quant.layers.experts.quantized_experts_forward reads `row_shards`). The weights stay whole: none of
    the sharding above is reused, so a wrong slice there still shows."""
    setattr(m, "row_shards", parts)
