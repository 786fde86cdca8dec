"""`pcg::attention`, the attention split op, and its hook into transformers' AttentionInterface.

The op writes into `out`, a buffer the caller allocates *before* the call: under piecewise capture that
allocation belongs to the preceding captured piece, so the next piece reads the address it saw at capture.
The op's other inputs are tensors and constants (the score modifiers: sliding window, soft-cap, sinks); the
batch's metadata comes from the forward context.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from pcg_core.attention.metadata import LayerParams
from pcg_core.forward_context import get_forward_context
from pcg_core.split_ops import register_split_op, run_split_op

ATTN_IMPLEMENTATION = "pcg"


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer: int, scale: float,
               sliding_window: int, softcap: float, sinks: torch.Tensor | None, temperature_len: int = 0) -> None:
    ctx = get_forward_context()
    if ctx.observer is not None:
        ctx.observer(layer, q)
    params = LayerParams(layer, scale, sliding_window, softcap, sinks, latent=ctx.attn_backend.cache.latent,
                         temperature_len=temperature_len)
    call_backend(q, k, v, out, params)


def check_layer(params: LayerParams, gqa: bool) -> None:
    """Refuse, once per layer, a score modifier the forward's attention backend would get wrong."""
    backend = get_forward_context().attn_backend
    if params.layer not in backend.checked_layers:
        backend.check_call(params, gqa=gqa)
        backend.checked_layers.add(params.layer)


def call_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, params: LayerParams) -> None:
    """One call of the forward's attention backend (the cache write and the attention), the layer checked first and
    the judge's probe, if any, after it."""
    ctx = get_forward_context()
    check_layer(params, gqa=q.shape[1] != k.shape[1])
    ctx.attn_backend.forward(q, k, v, out, params, ctx.attn_metadata)
    if ctx.attention_probe is not None:
        ctx.attention_probe(ctx.attn_backend, q, k, v, out, params, ctx.attn_metadata)


@torch.library.custom_op("pcg::attention", mutates_args=("out",))
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer: int, scale: float,
              sliding_window: int, softcap: float, sinks: torch.Tensor | None, temperature_len: int = 0) -> None:
    run_split_op(_attention, q, k, v, out, layer, scale, sliding_window, softcap, sinks, temperature_len)


@attention.register_fake
def _attention_fake(q, k, v, out, layer, scale, sliding_window, softcap, sinks, temperature_len=0) -> None:
    return None


register_split_op(torch.ops.pcg.attention)


def pcg_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                          softcap=None, s_aux=None, temperature_len=None, **kwargs):
    """transformers attention function: [1, H, T, D] in, [1, T, H, D] out, packed batch of one row. `softcap`
    (Gemma 2) and `s_aux` (gpt-oss's sinks) are the names transformers' modules pass them by; `temperature_len`
    is Grok's (pcg_core/model/grok.py)."""
    if query.shape[0] != 1:
        raise ValueError(f"pcg runs packed batches of one row; got batch size {query.shape[0]}")
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    out = torch.empty_like(q)  # allocated here, in the piece before the split op
    scale = float(scaling) if scaling is not None else q.shape[-1] ** -0.5
    torch.ops.pcg.attention(q, k, v, out, int(module.layer_idx), scale, int(sliding_window or 0), float(softcap or 0.0), s_aux,
                            max(0, int(temperature_len or 0)))
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, pcg_attention_forward)
