"""Attention of a forward of fresh sequences over its own rows: each sequence causal over itself, nothing read
from the cache (MLA's expanded prefill, pcg_core/attention/mla_op.py).

Every step is device work on the forward's static metadata (sequence ids, positions), with shapes set by the
token count alone, so a graph can record it. The packed rows of one sequence are contiguous and padding rows come
last (engine/inputs.py), so the sequences' boundaries are where the sequence id changes.
- One sequence (AttentionMetadata.fresh_path "one"): plain causal attention over every row — exact for the real
  rows, which start at row 0 and see no padding — through a dense kernel (cuDNN's first on CUDA: on Hopper it takes
  MLA's 192/128 head widths at a third of FlashAttention-2's varlen time; MLA's whole fresh prefill of 2048 tokens
  1.04× transformers' expanded form on the H100, 2026-12-07f, where the packed path takes 1.93×).
- CUDA, half precision: FlashAttention-2 through torch's varlen_attn, cu_seqlens counted on the device (padding
  rows form one more sequence, whose output is zeroed after). FlashAttention-2 wants one head width for keys and
  values, so the values are padded with zeros to the keys' width and the output cut back. Or (FRESH_KERNEL)
  torch's memory-efficient kernel over the same bounds, which takes the values at their own width.
- Anywhere else (the CPU, float32): SDPA with the block-diagonal causal mask.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from pcg_core.attention.metadata import AttentionMetadata

# The smallest forward that takes a fresh-sequence path (AttentionMetadata.fresh_path); None turns the paths off.
# Below it MLA stays absorbed and varlen gathers (a handful of rows); buckets below it get one graph variant only.
# 512: the smallest measured size where MLA's expanded prefill beats the absorbed one. On the H100, 2026-12-07
# (benchmarks/results/2026-12-07e-h100-cells-fresh/, one layer at DeepSeek-V3's widths): absorbed / pcg fresh
# 0.31 / 0.36 ms at 128 tokens, 0.64 / 0.46 at 512, 5.94 / 1.55 at 2048 (transformers' expanded form 0.82); every
# graph variant of tests/pcg_core/attention/test_fresh_paths.py replayed bitwise equal to eager, the kernel within
# its bound of the float32 masked SDPA.
FRESH_PATH_MIN_TOKENS: int | None = 512
# The most sequences a forward on the fresh path holds (more: the cache-reading path). FlashAttention's varlen grid
# is (query blocks of the longest sequence) × (sequences) × heads, and a graph fixes both counts: the bounds hold
# this many sequences and the padding, whatever the batch. Bounds of one per token (T sequences, most empty) made
# T² blocks: pcg's fresh MLA prefill of 2048 tokens took 12.5 ms on the H100, 15× the expanded form.
FRESH_PATH_MAX_SEQS = 32

# The CUDA kernel of the fresh path: "flash" (FlashAttention-2, values padded to the keys' width) or "efficient"
# (torch's memory-efficient varlen kernel, values as they are). Both launch a block per (query block of the longest
# sequence × sequence slot × head): with FRESH_PATH_MAX_SEQS slots, most of them empty. benchmarks/mla_prefill.py
# times each at DeepSeek-V3's widths (192/128) beside transformers' expanded form: on the H100 efficient is faster to
# 512 tokens, flash from 2048 (1.55 against 1.84 ms), where the prefill's time goes. cuDNN's ragged attention (what
# varlen_attn's cuDNN backend calls) is not here: recorded in a CUDA graph it invalidates the capture, and eagerly it
# took 48-71 ms a call (2026-12-07e).
FreshKernel = Literal["flash", "efficient"]
FRESH_KERNEL: FreshKernel = "flash"

_flash_attn: Callable[..., Any] | None
try:
    from torch.nn.attention.varlen import varlen_attn

    _flash_attn = varlen_attn
    # causal: torch 2.11 says is_causal, 2.13 a window reaching no key after the query
    _CAUSAL = {"window_size": (-1, 0)} if "window_size" in inspect.signature(varlen_attn).parameters else {"is_causal": True}
except ImportError:  # a torch without it: the SDPA path
    _flash_attn, _CAUSAL = None, {}


def fresh_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata,
                    scale: float, kernel: FreshKernel | None = None) -> torch.Tensor:
    """q, k [T, H, Dqk], v [T, H, Dv] → [T, H, Dv]; padding rows hold anything (the caller zeroes them).
    kernel: the CUDA kernel of the packed path, FRESH_KERNEL unless given (a benchmark's choice)."""
    if md.fresh_path == "one":
        return _one(q, k, v, scale)
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        chosen = kernel or FRESH_KERNEL
        if chosen == "efficient":
            return _efficient(q, k, v, md, scale)
        if _flash_attn is not None:
            return _flash(q, k, v, md, scale)
    return _sdpa(q, k, v, md, scale)


def sequence_bounds(seq_ids: torch.Tensor, max_seqs: int = FRESH_PATH_MAX_SEQS,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """cu_seqlens [max_seqs + 2] int32 of the runs of equal ids in seq_ids [T] (the sequences, then the padding);
    runs past the last are empty (cu repeats), so the length is fixed whatever the batch. The forward holds at most
    max_seqs sequences (Engine.fresh_path sees to it): rows of a run past max_seqs + 1 would be counted in the last.
    out: a static buffer to write (the engine's, once per forward: AttentionMetadata.fresh_bounds)."""
    t = seq_ids.shape[0]
    starts = torch.ones(t, dtype=torch.int32, device=seq_ids.device)
    starts[1:] = (seq_ids[1:] != seq_ids[:-1]).to(torch.int32)
    run = torch.cumsum(starts, 0).clamp_(max=max_seqs + 1)  # 1-based run index of each row (int64: cumsum widens)
    counts = torch.zeros(max_seqs + 2, dtype=torch.int32, device=seq_ids.device)
    counts.index_add_(0, run, starts.new_ones(t))
    if out is None:
        return torch.cumsum(counts, 0, dtype=torch.int32)
    return torch.cumsum(counts, 0, dtype=torch.int32, out=out)


def _bounds(md: AttentionMetadata) -> torch.Tensor:
    """The forward's cu_seqlens: built once with the upload (the engine's), else here."""
    return md.fresh_bounds if md.fresh_bounds is not None else sequence_bounds(md.seq_ids)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata, scale: float) -> torch.Tensor:
    assert _flash_attn is not None  # fresh_attention's condition
    t, dv = q.shape[0], v.shape[-1]
    if dv < q.shape[-1]:
        v = F.pad(v, (0, q.shape[-1] - dv))
    cu = _bounds(md)
    out = _flash_attn(q, k, v, cu, cu, t, t, scale=scale, **_CAUSAL)  # no aux asked: one tensor
    return cast(torch.Tensor, out)[..., :dv]


def _efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata, scale: float) -> torch.Tensor:
    t = q.shape[0]
    cu = _bounds(md)
    # [1, T, H, D] with the sequences' bounds; mask type 1: causal from each sequence's first row (queries = keys)
    out = torch.ops.aten._efficient_attention_forward(q[None], k[None], v[None], None, cu, cu, t, t, 0.0, 1, False,
                                                      scale=scale)[0]
    return cast(torch.Tensor, out)[0]


# The dense kernels of the one-sequence path, in the order tried: cuDNN's (Hopper), then the others SDPA has
_ONE_KERNELS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence from row 0, the padding after it: causal attention over all T rows (a padding row attends to the
    sequence and to the padding before it, and is zeroed by the caller; a real row sees neither)."""
    with sdpa_kernel(_ONE_KERNELS, set_priority=True):
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           is_causal=True, scale=scale)
    return o[0].transpose(0, 1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata, scale: float) -> torch.Tensor:
    seq, pos = md.seq_ids, md.positions
    mask = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])  # padding rows: among themselves
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask[None, None], scale=scale)
    return o[0].transpose(0, 1)
