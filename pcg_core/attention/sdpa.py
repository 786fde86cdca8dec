"""`sdpa` attention backend, the reference: torch's scaled_dot_product_attention over the whole KV cache with a mask.

Why over the whole cache: the key set then has a static size (the cache capacity), so the op has the same
shapes for every batch of a bucket and can be captured whole (`full` backend). The mask (a slot of the query's
sequence's block table, key position ≤ query position, optionally inside a sliding window) makes it causal, ragged and paged alike;
it is built once per forward into a static buffer the backend owns. Soft-cap and sinks, which the
fused kernels lack, take the plain-math path (so does Grok's length temperature). Absorbed MLA is one KV head of the latent cache, keys 576 wide and
values 512 (their first columns): SDPA takes the two widths as they are.
Padding rows write KV only into the cache's pad slot (never attended) and get an output of exactly zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pcg_core.attention.backend import AttentionBackend, register_attention_backend, write_kv, zero_padding
from pcg_core.attention.reference import attention_math, length_temperature


@register_attention_backend
class SdpaBackend(AttentionBackend):
    name = "sdpa"
    capturable = True
    kv_caches = ("auto", "fp8_e4m3")  # reads through KVCache.read
    page_size = 16
    prep_capturable = True  # the mask: two device ops into a static buffer

    def __init__(self, cache, max_tokens):
        super().__init__(cache, max_tokens)
        self._mask = torch.zeros(self.max_tokens, cache.num_slots, dtype=torch.bool, device=self.device)
        self.mask = self._mask[:0]

    def begin_forward(self, md) -> None:
        """mask[t, s]: slot s is in a page of t's sequence's block table and holds a position ≤ t's position."""
        c, n = self.cache, md.num_tokens
        buf = self._mask if n <= self.max_tokens else torch.empty(n, c.num_slots, dtype=torch.bool, device=self.device)
        self.mask = buf[:n]
        rows = c.seq_pages.index_select(0, c.reader_rows(md.seq_ids))  # [n, pages]
        self.mask.view(n, c.num_pages, c.page_size).copy_(rows[:, :, None].expand(n, c.num_pages, c.page_size))
        self.mask.logical_and_(c.slot_pos[None, : c.num_slots] <= md.positions[:, None])

    def rebind(self, md) -> None:
        self.mask = self._mask[: md.num_tokens]

    def forward(self, q, k, v, out, params, md) -> None:
        c = self.cache
        write_kv(c, params.layer, k, v, md.slot_mapping)
        keys, values = c.read(params.layer)  # [S, Hkv, D]; an FP8 cache's dequantized to q's dtype
        mask = self.mask
        if params.sliding_window > 0:
            mask = mask & ((md.positions[:, None] - c.slot_pos[None, : c.num_slots]) < params.sliding_window)
        if params.softcap or params.sinks is not None or params.temperature_len:
            temp = length_temperature(md.positions, params.temperature_len) if params.temperature_len else None
            attn = _math_by_rows(q, keys, values, mask, params.scale, params.softcap, params.sinks, temp)
        else:
            attn = _sdpa_gqa(q, keys, values, mask, params.scale)
        zero_padding(out, attn, md.valid)


# The plain-math path holds float32 scores for every (head, query, cache slot) a few times over: gpt-oss at a 4096-token
# bucket (64 heads, ~4k slots) took a 41 GiB graph pool for it on the H200 (issue 38). Query rows go through it in
# chunks of about this many bytes of scores, so the pool holds one chunk's.
MATH_CHUNK_BYTES = 256 << 20


def _math_by_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
                  softcap: float, sinks: torch.Tensor | None, temp: torch.Tensor | None) -> torch.Tensor:
    """attention_math over chunks of query rows (each row's attention is its own; the chunks are a function of the
    shapes alone, so a graph and its eager reference at one padding chunk alike)."""
    t = q.shape[0]
    rows = max(1, MATH_CHUNK_BYTES // (4 * q.shape[1] * keys.shape[0]))
    if rows >= t:
        return attention_math(q, keys, values, mask, scale, softcap, sinks, temp)
    return torch.cat([attention_math(q[i : i + rows], keys, values, mask[i : i + rows], scale, softcap, sinks,
                                     None if temp is None else temp[i : i + rows]) for i in range(0, t, rows)])


def _sdpa_gqa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA with KV heads expanded to the query heads. The reference keeps the formulation it was verified with on
    the H200 (KV copied per query head, one mask for all heads), not the faster fold of query heads into rows:
    a reference must be the last place a kernel's corner case hides (see the 2026-12-01 attention results)."""
    t, h, d = q.shape
    k, v = keys.transpose(0, 1), values.transpose(0, 1)  # [Hkv, S, D]
    if h != k.shape[0]:
        k, v = k.repeat_interleave(h // k.shape[0], dim=0), v.repeat_interleave(h // k.shape[0], dim=0)
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask[None, None], scale=scale)
    return o[0].transpose(0, 1)  # [T, H, D]
