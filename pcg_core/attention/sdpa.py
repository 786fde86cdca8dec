"""`sdpa` attention backend: torch's scaled_dot_product_attention over the whole KV cache with a mask.

Why over the whole cache: the key set then has a static size (the cache capacity), so the op has the same
shapes for every batch of a bucket and can be captured whole (`full` backend). The mask (same sequence and
key position ≤ query position, optionally inside a sliding window) makes it causal, ragged and GQA-correct.
Padding rows write KV only into the cache's pad slot (never attended) and get an output of exactly zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pcg_core.attention.backend import AttentionBackend, register_attention_backend


@register_attention_backend
class SdpaBackend(AttentionBackend):
    name = "sdpa"
    capturable = True

    def forward(self, q, k, v, out, layer, scale, sliding_window, md, cache) -> None:
        k_cache, v_cache = cache.k[layer], cache.v[layer]  # [Hkv, S+1, D]
        k_cache.index_copy_(1, md.slot_mapping, k.transpose(0, 1).to(k_cache.dtype))
        v_cache.index_copy_(1, md.slot_mapping, v.transpose(0, 1).to(v_cache.dtype))
        num_slots = cache.num_slots
        keys, values = k_cache[:, :num_slots], v_cache[:, :num_slots]
        n_heads, n_kv = q.shape[1], keys.shape[0]
        if n_heads != n_kv:  # GQA: expand KV heads to query heads
            rep = n_heads // n_kv
            keys = keys.repeat_interleave(rep, dim=0)
            values = values.repeat_interleave(rep, dim=0)
        mask = md.mask
        if sliding_window > 0:
            in_window = (md.positions[:, None] - cache.slot_pos[None, :num_slots]) < sliding_window
            mask = mask & in_window
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask[None, None], scale=scale
        )[0].transpose(0, 1)  # [T, H, D]
        # Rows with no visible key (padding) come out NaN from softmax; force exact zeros.
        out.copy_(torch.where(md.valid[:, None, None], attn, torch.zeros((), dtype=attn.dtype, device=attn.device)))
