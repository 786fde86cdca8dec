"""Is eager's padding exact? The float32 test that tells padding noise from a padding leak.

In half precision eager padded to a bucket and eager unpadded differ: a padded GEMM rounds differently, and on a
MoE model one such rounding can flip a router's choice of experts, which moves a logprob by a whole unit (gpt-oss
×2 on the H200: 0.97). The judge widens its bound on graph vs *unpadded* eager to that measured difference. A
padding *leak* — padding rows reaching real ones, in the model or the attention backend — would widen it just the
same and hide itself. Rounding and a leak part in float32: there the same forwards differ by ~1e-6 from rounding,
while a leak keeps its size. So the noisy cases run again on the model in float32, padded as the graph pads
and unpadded, and only a padding shown exact there counts as noise. The float32 model is the float twin
(pcg_core/quant/twin.py: it shares the model's weights, reading them in float32; a quantized model's weights
dequantized, no activation quantizer): quantizers turn a 1e-7 rounding change into a whole step, in float32 too,
while each of them is row-local, so padding cannot leak through them.

An attention backend with no float32 kernel (varlen: FlashAttention-2), or one that would compile its float32
kernels anew for the check (flex on CUDA), is swapped for sdpa in that run, which then proves the model's padding,
not the backend's. So the backend is probed on its own, in the cell's dtype on the
cell's model: eager padded as the graph pads, each attention call made again with other values in its padding
rows (real rows' values, sign-flipped and shifted: in range, so an FP8 KV cache holds them as it would real ones).
Real rows see the same inputs, kernel and metadata both times, so their outputs must be equal bit for bit; a
backend that lets a padding row's query, key or value (or the pad slot they write) reach a real row moves them.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from harness.cell.judge.lockstep import lockstep, lockstep_stats, nan_max
from harness.cell.prompts import Case
from harness.metrics import CellMetrics
from pcg_core.attention import get_attention_backend
from pcg_core.config import EngineConfig
from pcg_core.engine import Engine, PackedBatch
from pcg_core.quant.twin import float_twin

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Max per-row relative difference of hidden states, float32 eager padded vs unpadded, for padding to count as
# exact: GEMM summation orders differ by ~1e-7 relative per op; a leak of a padding row at 1e-4 of a real row's
# size is already far below anything half precision can show.
FP32_PADDING_RTOL = 1e-4
# Max per-row relative difference of real rows' attention outputs when only padding rows' inputs change: the same
# kernel on the same real inputs and metadata gives the same bits; anything above float32's last bit is a leak.
PROBE_RTOL = 1e-6


def float32_attention(attention: str, device: str) -> str:
    """The attention backend float32 runs on `device` use: the cell's where it computes float32 from kernels it
    already has, else sdpa, and the cell's backend's padding is then probed on its own (attention_padding_rel, in
    the cell's dtype, on the kernels its graph and eager built). varlen's FlashAttention has no float32 kernel;
    flex on CUDA compiles one per token count: a Mixtral-8x7B:2 nvfp4 flex cell, whose check compiled them, was
    killed at 240 s in its judge on the H100; on sdpa and probed it passed in 87 s, its checks 21 s (2026-12-07h)."""
    backend = get_attention_backend(attention)
    own = backend.dtype_reason("float32") is None and device.split(":")[0] not in backend.compiled_per_shape
    return attention if own else "sdpa"


class _PaddedEager:
    """An eager engine standing in for the graph engine in the lockstep: it pads each forward to the graph's bucket,
    so the lockstep's noise runs (unpadded, padded) happen in float32 with the graph's shapes."""

    def __init__(self, engine: Engine, bucket_for: Callable[[int], int | None], probe=None):
        self.engine, self.bucket_for, self.probe = engine, bucket_for, probe

    @property
    def cache(self):
        return self.engine.cache

    def pack_prompts(self, prompts: list[list[int]], new_tokens: int, images=None, prefix_cache=None):
        return self.engine.pack_prompts(prompts, new_tokens, images, prefix_cache)

    def remember(self, prefix_cache, sequences: list[list[int]]) -> None:
        self.engine.remember(prefix_cache, sequences)

    def forward(self, batch: PackedBatch, observer=None, decode: bool = False) -> torch.Tensor:
        return self.engine.forward(batch, eager=True, observer=observer, pad_to=self.bucket_for(len(batch)),
                                   probe=self.probe)


class PaddingProbe:
    """forward_context.AttentionProbe: after each attention call, the call again with its padding rows' q, k and v
    replaced; `worst` is the largest per-row relative difference of real rows' outputs seen, `calls` how many calls
    had padding rows. A third call with the original inputs puts back what the first wrote (the pad slot's KV)."""

    def __init__(self):
        self.worst, self.calls = 0.0, 0

    @torch.no_grad()
    def __call__(self, backend, q, k, v, out, params, md) -> None:
        valid = md.valid
        pad = ~valid
        if valid.numel() != q.shape[0] or not bool(pad.any()) or not bool(valid.any()):
            return
        swapped = [_other_values(t, valid) for t in (q, k, v)]
        moved = torch.empty_like(out)
        backend.forward(*swapped, moved, params, md)
        real = valid.nonzero().flatten()
        a, b = out.index_select(0, real).flatten(1).float(), moved.index_select(0, real).flatten(1).float()
        rel = float(((a - b).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-30)).max())
        self.worst = rel if rel != rel else max(self.worst, rel)  # NaN stays
        self.calls += 1
        backend.forward(q, k, v, torch.empty_like(out), params, md)


def _other_values(t: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`t` with its padding rows holding real rows' values (cycled, sign-flipped, plus their mean magnitude): in the
    range the layer produces, unlike anything the model would put there."""
    out = t.clone()
    real, pad = valid.nonzero().flatten(), (~valid).nonzero().flatten()
    src = real[torch.arange(pad.numel(), device=t.device) % real.numel()]
    rows = t.index_select(0, src)
    out[pad] = -rows + rows.abs().mean()
    return out


@torch.no_grad()
def float32_padding_rel(model: PreTrainedModel, config: EngineConfig, bucket_for: Callable[[int], int | None],
                        cases: list[Case]) -> float:
    """Worst per-row relative difference of any forward's hidden states in `cases`, eager padded to `bucket_for`'s
    buckets vs unpadded, on `model`'s float twin (float32, sharing its weights) with `config`'s attention backend
    (float32_attention's) and KV capacity (NaN if a row is NaN). The twin is freed before returning; the caller's
    model is not touched."""
    model32: PreTrainedModel | None
    model32 = float_twin(model)
    ref: Engine | None
    other: Engine | None
    try:
        # A 16-bit KV cache: an FP8 one's static per-tensor scales are row-local (padding cannot leak through them),
        # and its rounding steps would turn float32's 1e-7 into whole steps, as activation quantizers do.
        cfg = replace(config, dtype="float32", kv_cache="auto", attention=float32_attention(config.attention, config.device),
                      capture=replace(config.capture, backend="disabled"))
        ref, other = Engine(model32, cfg), Engine(model32, cfg)
        return nan_max(lockstep_stats(ref, _PaddedEager(other, bucket_for), case, noise=True).padding_rel for case in cases)
    finally:
        ref = other = model32 = None  # engines and twin hold reference cycles (capture backend, bound forwards)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@torch.no_grad()
def attention_padding_rel(model: PreTrainedModel, config: EngineConfig, bucket_for: Callable[[int], int | None],
                          cases: list[Case]) -> float:
    """The backend's own padding probe (PaddingProbe) over every forward of `cases`, eager padded to `bucket_for`'s
    buckets, on `model` itself with `config` (the cell's dtype, backend and KV cache): the worst real-row difference
    (0.0 when exact; NaN if one is NaN). Raises if no call had padding rows to change (nothing was probed)."""
    probe = PaddingProbe()
    cfg = replace(config, capture=replace(config.capture, backend="disabled"))
    ref: Engine | None
    padded: Engine | None
    try:
        ref, padded = Engine(model, cfg), Engine(model, cfg)
        for case in cases:
            for _ in lockstep(ref, _PaddedEager(padded, bucket_for, probe), case):
                pass
    finally:
        ref = padded = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if probe.calls == 0:
        raise RuntimeError("the padding probe found no attention call with padding rows in the cases it was given")
    return probe.worst


def padding_leak(m: CellMetrics) -> str:
    """Which padding check found the leak, in words for the reason."""
    if not (m.judge.padding_rel_fp32 is not None and m.judge.padding_rel_fp32 <= FP32_PADDING_RTOL):
        return (f"in float32, eager padded as the graph pads differs from unpadded by {m.judge.padding_rel_fp32:.3g} per row "
                f"> {FP32_PADDING_RTOL:g} (padding reaches real rows)")
    return (f"the attention backend's padding probe moved real rows by {m.judge.padding_probe_rel:.3g} per row > "
            f"{PROBE_RTOL:g} when only padding rows' inputs changed (padding reaches real rows)")


def probe_note(m: CellMetrics) -> str:
    """The padding probe's part of an excuse's reason (empty where it did not run)."""
    if m.judge.padding_probe_rel is None:
        return ""
    return (f"; float32 on sdpa in place of the cell's backend (no float32 kernel, or one it would compile for this "
            f"check alone), and that backend's padding probe "
            f"exact: {m.judge.padding_probe_rel:.3g} ≤ {PROBE_RTOL:g}")
