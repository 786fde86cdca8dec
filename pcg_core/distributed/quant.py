"""Quantized linears sharded for tensor parallelism, as a serving engine shards a quantized checkpoint.

The model is quantized whole first (a checkpoint's codes and scales; a synthetic model's, its static input scales
calibrated on the whole model), then each layer is sliced as transformers' plan slices its float weight: codes
with the rows or columns they belong to, and each scale with the weights it scales — per-channel scales with
their rows, 128×128 FP8 block scales with their blocks, int4 group scales and zeros with their K groups; a
per-tensor scale (and a static input scale, and FP4's global) is the same on every rank; FP4 codes, packed two a byte
along K, go with their block scales. A split that would cut a block or a group,
or act-order's permutation across the shards' boundary, is refused with the reason, never sliced approximately.

A row-parallel shard's dynamic activation scales are its own input slice's (per token over its K shard), as in
vLLM's and SGLang's row-parallel layers: the same weights, other activation rounding than at TP=1.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from pcg_core.distributed.group import ParallelGroup, rank_block
from pcg_core.distributed.layers import TP_GROUP, tp_row_class
from pcg_core.distributed.plan import ROWWISE, decoder_plan, style_for
from pcg_core.errors import UnsupportedModel
from pcg_core.distributed.quant_experts import emulate_expert_row_shards
from pcg_core.quant.layers.expert_layout import in_out
from pcg_core.quant.layers.experts import is_experts
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.layers.int4_linear import Int4Linear, W4A8Linear
from pcg_core.quant.layers.linear import QuantLinear, scheme_of
from pcg_core.quant.schemes.int4 import Int4Scheme
from pcg_core.quant.kernels.w4a8_gemm import quantize_act
from pcg_core.quant.schemes.w8a8 import BLOCK, expand_activation_scale, quantize_activation

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def is_quantized_linear(m: torch.nn.Module) -> TypeGuard[QuantLinear | Int4Linear | Fp4Linear]:
    return isinstance(m, (QuantLinear, Int4Linear, Fp4Linear))


def _slice(t: torch.Tensor | None, dim: int, rank: int, parts: int) -> torch.Tensor | None:
    return None if t is None else rank_block(t, dim, rank, parts)


def _set(m: torch.nn.Module, name: str, t: torch.Tensor | None) -> None:
    m._buffers[name] = t


def _refuse(g: ParallelGroup, where: str, why: str) -> UnsupportedModel:
    return UnsupportedModel(f"tp{g.size}: {where}: {why}")


def shard_quantized(m: QuantLinear | Int4Linear | Fp4Linear, rowwise: bool, g: ParallelGroup, where: str) -> None:
    """Slice quantized linear `m` in place for this rank: output rows (colwise) or input columns (rowwise, then
    its class becomes the row-parallel one: the partial output summed over ranks, the bias added once)."""
    n, k = m.out_features, m.in_features
    along = k if rowwise else n
    if along % g.size:
        raise _refuse(g, where, f"{along} {'input' if rowwise else 'output'} features, which {g.size} ranks do not divide")
    part = along // g.size
    if isinstance(m, QuantLinear):
        _quant_linear(m, rowwise, g, where, part)
    elif isinstance(m, Fp4Linear):
        _fp4_linear(m, rowwise, g, where, part)
    else:
        _int4_linear(m, rowwise, g, where, part)
    if rowwise:
        m.in_features = part
        bias = m._buffers.get("bias")
        _set(m, "bias", None)
        m.__class__ = tp_row_class(type(m))
        m.register_buffer("tp_bias", bias)
        setattr(m, TP_GROUP, g.name)
    else:
        _set(m, "bias", _slice(m._buffers.get("bias"), 0, g.rank, g.size))
        m.out_features = part


def _quant_linear(m: QuantLinear, rowwise: bool, g: ParallelGroup, where: str, part: int) -> None:
    block = m.scheme.weights == "block"
    if (block or m.scheme.acts == "group") and part % BLOCK:
        raise _refuse(g, where, f"{m.scheme.name}'s {BLOCK}×{BLOCK} blocks: a shard of {part} "
                                f"{'columns' if rowwise else 'rows'} would cut one (it must be a multiple of {BLOCK})")
    dim = 1 if rowwise else 0
    _set(m, "weight", _slice(m.weight, dim, g.rank, g.size))
    scale: torch.Tensor | None = m.weight_scale
    if block:
        scale = _slice(scale, dim, g.rank, g.size)
    elif m.scheme.weights == "channel" and not rowwise:
        scale = _slice(scale, 0, g.rank, g.size)
    _set(m, "weight_scale", scale)  # per tensor, or per output channel of a row-parallel shard: the same on every rank


def _fp4_linear(m: Fp4Linear, rowwise: bool, g: ParallelGroup, where: str, part: int) -> None:
    """Codes packed two a byte along K and block scales (N, K/B) with their rows or K blocks; the global scale (one
    per layer) is the same on every rank. Weight-only: the activations are the same at any TP."""
    if rowwise and part % m.block:
        raise _refuse(g, where, f"{m.quant_scheme.name}'s blocks of {m.block}: a shard of {part} input features "
                                "would cut one")
    dim = 1 if rowwise else 0
    for name in ("weight_packed", "weight_scale"):
        _set(m, name, _slice(m._buffers[name], dim, g.rank, g.size))


def _int4_linear(m: Int4Linear, rowwise: bool, g: ParallelGroup, where: str, part: int) -> None:
    if not rowwise:
        for name in ("qweight", "scales", "zeros"):
            _set(m, name, _slice(m._buffers[name], 0, g.rank, g.size))
        return
    if m.perm is not None:
        raise _refuse(g, where, "act-order (GPTQ desc_act) permutes K across the shards' boundary, so a row-parallel "
                                "shard's groups would be cut; a checkpoint without act-order shards")
    if part % m.group or part % 8:
        raise _refuse(g, where, f"int4 groups of {m.group}: a shard of {part} input features would cut one")
    for name in ("qweight", "scales", "zeros"):  # K/8 packed columns, K/G group columns: a whole number per rank
        _set(m, name, _slice(m._buffers[name], 1, g.rank, g.size))


def scheme_for_shards(scheme: Any, model: torch.nn.Module, parts: int) -> Any:
    """An int4 scheme whose groups a row-parallel shard holds whole, for quantizing a synthetic model that will be
    sharded `parts` ways: the scheme's group where every linear's K/parts takes it (real widths: K/2 = 2048 and
    more), else the tiny-width fallback group_for picks for K/parts (16–64). Other schemes as they are."""
    if parts == 1 or not isinstance(scheme, Int4Scheme):
        return scheme
    ks = {m.in_features // parts for m in model.modules() if type(m) is torch.nn.Linear and m.in_features % parts == 0}
    ks |= {k // parts for m in model.modules() if is_experts(m) and (k := in_out(m, "down_proj")[1]) % parts == 0}
    group = min((scheme.group_for(k) for k in ks), default=scheme.group)
    return scheme if group == scheme.group else dataclasses.replace(scheme, group=group)


def activation_rounding_differs(scheme: Any) -> bool:
    """Whether a row-parallel shard rounds its activations otherwise than TP=1 does: dynamic per-token scales
    computed over the shard's K (8-bit per-token schemes, W4A8). Per-tensor static scales and FP8's 128-groups
    (whole in every shard) round alike, so their TP=2 output equals TP=1's up to the summation order."""
    return getattr(scheme, "acts", None) == "token" or getattr(scheme, "activations", None) in ("int8", "fp8")


def emulate_row_shards(model: PreTrainedModel, parts: int, experts: bool = True) -> int:
    """Make an unsharded quantized model round its activations as `parts` row-parallel shards do, in place: each
    row-parallel linear of a scheme whose activation scales span K (activation_rounding_differs) quantizes each K
    slice of its input on its own and sums the slices' outputs in the model's dtype, as the ranks' all-reduce does.
    The weights are the unsharded layer's, dequantized whole and then sliced by column: none of the sharding's own
    slicing (shard_quantized) is reused, so a wrong scale slice there still shows. `experts`: quantized experts
    split by intermediate size too (their down projection's K; False where whole experts go to each rank). Returns
    how many layers."""
    plan, count = decoder_plan(model.config), 0
    for name, m in model.get_decoder().named_modules():
        if experts and is_experts(m) and (scheme := scheme_of(m)) is not None and activation_rounding_differs(scheme):
            emulate_expert_row_shards(m, parts)
            count += 1
            continue
        scheme = scheme_of(m)
        if is_quantized_linear(m) and style_for(plan, name) in ROWWISE and scheme is not None \
                and activation_rounding_differs(scheme):
            if m.in_features % parts:
                raise UnsupportedModel(f"tp{parts}: {name}: {m.in_features} input features, which {parts} ranks do not divide")
            setattr(m, "forward", types.MethodType(functools.partial(_split_k_forward, parts=parts), m))
            count += 1
    return count


def _act_dequantized(m: QuantLinear | W4A8Linear, x: torch.Tensor) -> torch.Tensor:
    """x as layer m's activation quantizer leaves it (quantized and dequantized, float32)."""
    if isinstance(m, QuantLinear):
        xq, sx = quantize_activation(x, m.scheme, m.input_scale)
        return xq.float() * expand_activation_scale(sx, x.shape[-1])
    xq, sx = quantize_act(x, m.act)  # W4A8Linear
    return xq.float() * sx


def _split_k_forward(self: QuantLinear | W4A8Linear, x: torch.Tensor, parts: int) -> torch.Tensor:
    lead, k = x.shape[:-1], self.in_features
    x2, w, step = x.reshape(-1, k), self.dequantized_weight().float(), k // parts
    out: torch.Tensor | None = None
    for r in range(parts):
        xs = x2[:, r * step:(r + 1) * step]
        part = (_act_dequantized(self, xs) @ w[:, r * step:(r + 1) * step].t()).to(x.dtype)
        out = part if out is None else out + part
    assert out is not None  # parts ≥ 1
    bias = self._buffers.get("bias")
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.reshape(*lead, self.out_features)
