"""Attention written out as plain math: the definition every backend is tested against, and sdpa's path for the
score modifiers torch's fused kernels lack (soft-cap, sinks).

The conventions are transformers': scores are scaled, then soft-capped (then, for Grok, multiplied by the
query's length temperature), then masked; a sink is one more logit
per head in the softmax with no value behind it; a sliding window of w keeps keys at distance < w.
"""

from __future__ import annotations

import math

import torch


def causal(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int = 0) -> torch.Tensor:
    """[Tq, Tk] bool: key k is not in query q's future and inside its window (by position alone)."""
    dist = q_pos[:, None] - k_pos[None, :]
    ok = dist >= 0
    return ok & (dist < window) if window > 0 else ok


def visible(q_seq: torch.Tensor, q_pos: torch.Tensor, k_seq: torch.Tensor, k_pos: torch.Tensor, window: int = 0) -> torch.Tensor:
    """[Tq, Tk] bool: key k is visible to query q (same sequence, not in its future, inside the window)."""
    return (q_seq[:, None] == k_seq[None, :]) & causal(q_pos, k_pos, window)


def attention_math(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
                   softcap: float = 0.0, sinks: torch.Tensor | None = None,
                   temperature: torch.Tensor | None = None) -> torch.Tensor:
    """q [Tq, H, D], keys/values [Tk, Hkv, D] (GQA: query head h reads KV head h // (H / Hkv)), mask [Tq, Tk];
    temperature [Tq]: a per-query multiplier of the soft-capped scores (length_temperature). Returns [Tq, H, D]
    in q's dtype, computed in float32; a row with no visible key (and no sink) is 0."""
    h, hkv = q.shape[1], keys.shape[1]
    kf = keys.float().repeat_interleave(h // hkv, dim=1)
    vf = values.float().repeat_interleave(h // hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if temperature is not None:
        scores = scores * temperature.float()[None, :, None]
    scores = scores.masked_fill(~mask[None], float("-inf"))
    if sinks is not None:
        sink = sinks.float()[:, None, None].expand(h, scores.shape[1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all -inf rows: NaN → 0
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.einsum("hqk,khd->qhd", probs, vf).to(q.dtype)


def apply_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Add a per-head sink logit to a softmax computed without it: out [T, H, D], lse [T, H] (natural log). Exact:
    out·e^lse / (e^lse + e^sink) = out·sigmoid(lse − sink); a row with no key (lse −inf) stays 0."""
    w = torch.sigmoid(lse.float() - sinks.float()[None, :])
    return (out.float() * w[..., None]).to(out.dtype)


def length_temperature(positions: torch.Tensor, length: int) -> torch.Tensor:
    """Grok's length temperature, per query: log2(p) / log2(L) at positions p > L, else 1 (float32)."""
    p = positions.float()
    if length <= 0:
        return torch.ones_like(p)
    return torch.where(p > length, torch.log2(p.clamp_min(1.0)) / math.log2(length), torch.ones_like(p))
