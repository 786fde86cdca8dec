"""`pcg::mla_attention`, the split op of multi-head latent attention (DeepSeek-V3, Kimi-K2): absorbed over the
latent cache, or expanded for a forward of fresh sequences.

Absorbed (decode, extend, chunked prefill): queries taken into the latent space (W_UKᵀ q_nope per head), one KV
head of cached latent rows through the engine's attention backend, W_UV after it. It reads 576 values per cached
token, which is what decode wants; at prefill it does attention at 576/512 dims for 128 heads, 6.7× the expanded
form's time at 2048 tokens on the H200 (benchmarks/results/2026-12-02c-…/mla_prefill.txt).
Expanded (AttentionMetadata.fresh_path: nothing cached before this forward, wide enough): each token's latent row
multiplied out to per-head keys (nope + the shared rope part) and values, ordinary causal attention of every
sequence over its own rows — what transformers' module computes, and what SGLang and vLLM run for prefill. The
latent rows still go to the cache first, and the expansion reads them back as the cache holds them (an FP8 cache's
rounding included), so both forms attend over the same numbers.

The two absorption GEMMs live here, not in the pieces around, so that the choice is the op's alone: piecewise and
full keep a graph of the op per variant (forward_context.graph_key), breakable's hole chooses per forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pcg_core.attention.backend import write_kv, zero_padding
from pcg_core.attention.fresh import FreshKernel, fresh_attention
from pcg_core.attention.metadata import AttentionMetadata, LayerParams
from pcg_core.attention.op import call_backend, check_layer
from pcg_core.forward_context import get_forward_context
from pcg_core.split_ops import register_split_op, run_split_op

def _mla_attention(q_nope: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor, w_kv: torch.Tensor,
                   out: torch.Tensor, layer: int, scale: float) -> None:
    ctx = get_forward_context()
    if ctx.observer is not None:
        ctx.observer(layer, q_nope)
    nope, rank = q_nope.shape[-1], w_kv.shape[-1]
    w_uk, w_uv = w_kv[:, :nope], w_kv[:, nope:]  # [H, nope, rank], [H, v, rank]
    params = LayerParams(layer, scale, latent=True)
    if not ctx.attn_metadata.fresh_path:
        query = torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_rot], dim=-1)  # [T, H, rank + rope]
        attn = query.new_empty(query.shape[0], query.shape[1], rank)
        call_backend(query, latent, latent[..., :rank], attn, params)
        out.copy_(torch.einsum("thr,hvr->thv", attn, w_uv))
        return
    check_layer(params, gqa=q_nope.shape[1] != 1)  # the absorbed form's refusals: a backend without MLA runs neither
    md, cache = ctx.attn_metadata, ctx.attn_backend.cache
    write_kv(cache, layer, latent, latent[..., :rank], md.slot_mapping)
    rows = cache.read(layer, md.slot_mapping)[0][:, 0] if cache.quantized else latent[:, 0]  # [T, rank + rope]
    zero_padding(out, expanded_attention(q_nope, q_rot, rows, w_kv, md, scale), md.valid)


def expanded_attention(q_nope: torch.Tensor, q_rot: torch.Tensor, rows: torch.Tensor, w_kv: torch.Tensor,
                       md: AttentionMetadata, scale: float, kernel: FreshKernel | None = None) -> torch.Tensor:
    """The expanded form over the forward's own latent rows [T, rank + rope]: per-head keys [W_UK c, k_rot] and
    values W_UV c, each sequence causal over itself → [T, H, v] (padding rows: anything). kernel: fresh_attention's."""
    nope, rank, heads = q_nope.shape[-1], w_kv.shape[-1], q_nope.shape[1]
    c, k_rot = rows[:, :rank], rows[:, rank:]
    # one GEMM over kv_b_proj's whole weight, as the module itself runs it (per-head einsums over the key and value
    # halves would copy each half of the weight first: neither is a [H·n, rank] view)
    kv = F.linear(c, w_kv.reshape(-1, rank)).view(rows.shape[0], heads, -1)  # [T, H, nope + v]
    keys = torch.cat([kv[..., :nope], k_rot[:, None, :].expand(-1, heads, -1)], dim=-1)
    values = kv[..., nope:]
    return fresh_attention(torch.cat([q_nope, q_rot], dim=-1), keys, values, md, scale, kernel)


@torch.library.custom_op("pcg::mla_attention", mutates_args=("out",))
def mla_attention(q_nope: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor, w_kv: torch.Tensor,
                  out: torch.Tensor, layer: int, scale: float) -> None:
    """q_nope [T, H, nope], q_rot [T, H, rope] (rotated), latent [T, 1, rank + rope] (the normed compressed KV and
    the rotated shared key: the row the cache keeps), w_kv [H, nope + v, rank] (kv_b_proj's weight per head, dense)
    → out [T, H, v], padding rows exactly zero."""
    run_split_op(_mla_attention, q_nope, q_rot, latent, w_kv, out, layer, scale)


@mla_attention.register_fake
def _mla_attention_fake(q_nope, q_rot, latent, w_kv, out, layer, scale) -> None:
    return None


register_split_op(torch.ops.pcg.mla_attention)
