"""`varlen` attention backend: torch's `varlen_attn` (FlashAttention-2 inside aten) over KV gathered per sequence.

No compile step. torch 2.11's varlen_attn takes contiguous per-sequence K/V only (no block table), so each layer
gathers every sequence's KV, in position order, from its pages into one packed tensor; the gather index and the
cu_seqlens are built on the host from the batch (which the engine already has there) and copied into static
buffers before the forward. Inside a `full` graph the shapes must be fixed, so the gather covers the whole cache
(the index past the batch's keys points at the pad slot) and every bucket uses cu_seqlens of bucket + 1 entries
(the unused sequences are empty); between graphs (eager, piecewise, breakable) the gather is exact. Either way
the kernel sees the same cu_seqlens and max lengths, so graph and eager agree bit for bit. A forward of fresh
sequences (AttentionMetadata.fresh_path: nothing cached before it) gathers nothing: its keys are its own rows,
cu_seqlens the same for keys as for queries (graphs that record the op keep a variant for it), and they bound
FRESH_PATH_MAX_SEQS sequences rather than one per token: FlashAttention launches a block per (query block of the
longest sequence × sequence × head), and a bucket's worth of empty sequences made that T²/128 blocks — one 2048-token
prefill of Qwen3-0.6B's shape took 35.9 ms on the H100 against sdpa's 21.7 (2026-12-08).

Causal is bottom-right aligned per sequence: a sequence's query rows are its last positions, as the engine
packs them (prefill, chunked prefill and decode alike). Sinks via the LSE correction; no soft-cap (FA2 in aten
has none). CUDA only.
"""

from __future__ import annotations

import functools
import inspect
import types

import torch

from pcg_core.attention.backend import AttentionBackend, register_attention_backend, write_kv, zero_padding
from pcg_core.attention.fresh import FRESH_PATH_MAX_SEQS
from pcg_core.attention.reference import apply_sinks

_varlen: types.ModuleType | None  # None: a torch without it
try:
    from torch.nn.attention import varlen as _varlen

    from torch.nn.attention.varlen import varlen_attn

    _PARAMS = set(inspect.signature(varlen_attn).parameters)
except ImportError:  # a torch without it: the backend stays registered and says why it cannot run
    _varlen, _PARAMS = None, set()


@register_attention_backend
class VarlenBackend(AttentionBackend):
    name = "varlen"
    capturable = True
    kv_caches = ("auto", "fp8_e4m3")  # reads through KVCache.read
    dtypes = ("float16", "bfloat16")
    why_not_dtype = "torch's varlen_attn runs FlashAttention-2 kernels, which have none for float32; sdpa or flex do"
    page_size = 16
    fresh_path = True  # a fresh forward attends over its own K and V: no gather
    devices = ("cuda",) if _varlen is not None else ()
    why_not_device = {"cpu": "torch's varlen_attn runs FlashAttention-2 kernels, which exist for CUDA only"}
    if _varlen is None:
        why_not_device = {"cpu": "this torch has no torch.nn.attention.varlen", "cuda": "this torch has no torch.nn.attention.varlen"}

    @classmethod
    def features(cls) -> dict[str, str | None]:
        return {
            "causal": None,
            "gqa": None,  # enable_gqa where torch has it, else KV heads expanded after the gather
            "sliding_window": None if "window_size" in _PARAMS else "this torch's varlen_attn has no window_size",
            "softcap": "FlashAttention-2 in aten has no soft-cap",
            "sinks": None if "return_aux" in _PARAMS else "this torch's varlen_attn cannot return the LSE sinks need",
            "mla": "FlashAttention-2 takes heads of at most 256 dims; absorbed MLA's are 576 (latent + rope)",
            "length_temperature": "FlashAttention-2 in aten has no score modifier",
        }

    def __init__(self, cache, max_tokens):
        super().__init__(cache, max_tokens)
        # The static buffers graphs read; a batch above the largest bucket (eager) gets its own for its forward.
        self._static = self._alloc(self.max_tokens)
        self.cu_q, self.cu_k, self.gather = self._static
        # A fresh forward's cu_seqlens (queries and keys alike): its sequences, then empty ones, a fixed length
        self.cu_fresh = torch.zeros(FRESH_PATH_MAX_SEQS + 1, dtype=torch.int32, device=self.device)
        self.total_k = 0
        if "return_aux" in _PARAMS and self.device.type == "cuda":
            lse_heads_first(self.device)

    def _alloc(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = self.device
        return (torch.zeros(tokens + 1, dtype=torch.int32, device=d), torch.zeros(tokens + 1, dtype=torch.int32, device=d),
                torch.full((self.cache.num_slots,), self.cache.pad_slot, dtype=torch.int64, device=d))

    def begin_forward(self, md) -> None:
        n, c = md.num_tokens, self.cache
        self.cu_q, self.cu_k, self.gather = self._static if n <= self.max_tokens else self._alloc(n)
        seqs, counts = torch.unique_consecutive(md.host_seq_ids, return_counts=True)
        ends = counts.cumsum(0)
        if md.fresh_path:  # keys are the forward's own rows: its sequences (at most FRESH_PATH_MAX_SEQS: Engine.fresh_path),
            cu = torch.full((FRESH_PATH_MAX_SEQS + 1,), int(ends[-1]) if len(ends) else 0, dtype=torch.int32)  # then empty
            cu[0], cu[1 : len(ends) + 1] = 0, ends
            self.cu_fresh.copy_(cu, non_blocking=False)
            self.total_k = 0
            return
        context = md.host_positions[ends - 1] + 1 if len(ends) else ends
        cu = torch.zeros(2, n + 1, dtype=torch.int32)
        cu[0, 1 : len(ends) + 1] = ends
        cu[1, 1 : len(ends) + 1] = context.cumsum(0)
        cu[:, len(ends) + 1 :] = cu[:, len(ends) : len(ends) + 1]  # empty sequences up to the bucket's count
        self.cu_q[: n + 1].copy_(cu[0], non_blocking=False)
        self.cu_k[: n + 1].copy_(cu[1], non_blocking=False)
        self.total_k = int(context.sum()) if len(ends) else 0
        if self.total_k:  # each sequence's slots in position order, from its pages
            ps = c.page_size
            self.gather[: self.total_k].copy_(torch.cat([
                (torch.tensor(c.block_tables[s], dtype=torch.int64)[:, None] * ps + torch.arange(ps)).flatten()[:k]
                for s, k in zip(seqs.tolist(), context.tolist())]))
        self.gather[self.total_k :].fill_(c.pad_slot)

    def forward(self, q, k, v, out, params, md) -> None:
        c, n = self.cache, md.num_tokens
        write_kv(c, params.layer, k, v, md.slot_mapping)
        cu_q, cu_k = self.cu_q[: n + 1], self.cu_k[: n + 1]
        if md.fresh_path:  # every key is a row of this forward: read as the cache holds it (an FP8 cache's rounding)
            keys, values = c.read(params.layer, md.slot_mapping) if c.quantized else (k, v)
            max_k, cu_q, cu_k = n, self.cu_fresh, self.cu_fresh
        else:
            whole = torch.cuda.is_current_stream_capturing() or self.total_k == 0  # static shapes (or a dummy batch)
            idx = self.gather if whole else self.gather[: self.total_k]
            keys, values = c.read(params.layer, idx)  # gathered first, then (FP8 cache) dequantized
            max_k = c.num_slots
        kw: dict = {"scale": params.scale}
        w = params.sliding_window
        if "window_size" in _PARAMS:
            kw["window_size"] = (w - 1 if w > 0 else -1, 0)
        else:
            kw["is_causal"] = True
        if q.shape[1] != keys.shape[1]:
            if "enable_gqa" in _PARAMS:
                kw["enable_gqa"] = True
            else:
                rep = q.shape[1] // keys.shape[1]
                keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        assert _varlen is not None  # devices is () without it: the backend is refused before a forward
        if params.sinks is not None:
            kw["return_aux"] = _varlen.AuxRequest(lse=True)
        res = _varlen.varlen_attn(q, keys, values, cu_q, cu_k, n, max_k, **kw)
        if params.sinks is not None:
            attn, lse = res
            if lse_heads_first(self.device):  # asked in __init__, never first during a capture
                lse = lse.transpose(0, 1)
            attn = apply_sinks(attn, lse, params.sinks)
        else:
            attn = res
        zero_padding(out, attn, md.valid)


@functools.cache
def lse_heads_first(device: torch.device) -> bool:
    """Whether varlen_attn returns the LSE as [H, T] (FlashAttention's own layout) rather than the [T, H] torch's
    docstring names. Asked once, of a call whose T ≠ H: a batch's own shapes cannot tell when its token count
    equals its head count (gpt-oss's 64 heads at a 64-token bucket, where guessing from shapes applied every
    row's sink correction with another row's LSE)."""
    q = torch.zeros(3, 2, 64, device=device, dtype=torch.bfloat16)
    cu = torch.tensor([0, 3], dtype=torch.int32, device=device)
    assert _varlen is not None  # asked by the backend only, which runs where this torch has varlen
    _, lse = _varlen.varlen_attn(q, q, q, cu, cu, 3, 3, return_aux=_varlen.AuxRequest(lse=True))
    return tuple(lse.shape) == (2, 3)
