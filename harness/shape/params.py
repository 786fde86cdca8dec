"""Parameter count, active parameters per token, memory per dtype, H200s, TP and EP sizes — from the config alone.

The count (H hidden, V vocab, L layers, nh/nkv query/KV heads, d head_dim, I intermediate):

    embedding      V·H                       (the input table)
    lm_head        V·H, 0 when tie_word_embeddings (absent counts as untied, as in most model classes)
    norms          2·H per layer + H final   (+ q/k norms of d each for Qwen3, MLA's latent norms)
    attention      full/sliding:  H·nh·d (q, ×2 with Qwen3-Next's output gate) + 2·H·nkv·d (k, v) + nh·d·H (o)
                                  + biases (attention_bias: all four; Qwen2 family: q, k, v) + nh sinks (gpt-oss)
                   MLA:           q: H·rq + rq·nh·(dn+dr)  (or H·nh·(dn+dr) without q_lora_rank)
                                  kv: H·(rkv+dr) + rkv·nh·(dn+dv);  o: nh·dv·H
                   linear (Qwen3-Next gated delta net, nk/dk key heads, nv/dv value heads, conv kernel c):
                                  H·(2·nk·dk + 2·nv·dv) + H·2·nv + (2·nk·dk + nv·dv)·c + 2·nv + dv + nv·dv·H
    dense MLP      3·H·I (gate, up, down; + biases with mlp_bias)
    MoE layer      router H·E (+E bias: gpt-oss, DeepSeek's correction bias)
                   + E experts of 3·H·Ie (+ 2·Ie + H biases each for gpt-oss)
                   + shared: n_shared·3·H·Ie (DeepSeek) or 3·H·Is + H (Qwen's gated shared expert)
                   + Grok's residual dense MLP 3·H·I when residual_moe
    vision tower   (approximate, ViT-shaped) depth·(4·Hv² + 4·Hv + MLP(Hv, Iv) + 4·Hv) + patch embedding
                   (channels·temporal_patch·patch²·Hv) + position table + merger/projector
                   ((Hv·m)² + Hv·m·Hout, m = spatial_merge_size², once plus once per deepstack layer)

A multi-token-prediction head (DeepSeek's num_nextn_predict_layers) is not counted: transformers does not
load it and published totals (671B for DeepSeek-V3) leave it out.

active_params: what one text token passes through — the total minus the vision tower and minus the routed
experts it is not sent to ((E − k) experts in every MoE layer). Embedding and lm_head are counted, which is
the convention of Qwen, Mistral and DeepSeek (3.3B, 12.9B, 37B); OpenAI's 5.1B for gpt-oss-120b leaves the
input embedding out (ours: 5.7B).

Memory: params × bytes per parameter (float32 4, bfloat16 2, fp8 1, int4 ½), weights only — no quantization
scales, no KV cache. H200s: ceil(bfloat16 bytes × 1.10 / 141 GB): the bf16 weights plus 10% headroom for
activations and CUDA graphs, on 141 GB (decimal) H200s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from harness.shape.fields import Fields, vision_fields
from harness.shape.structure import Structure

BYTES_PER_PARAM = {"float32": 4.0, "bfloat16": 2.0, "fp8": 1.0, "int4": 0.5}
H200_BYTES = 141 * 10**9
HEADROOM = 0.10  # activations, KV cache for the test prompts, CUDA graph pools
MAX_SIZE = 8  # one node of 8 GPUs: the TP/EP sizes considered


@dataclass
class ParamCount:
    total: int
    active: int
    non_embedding: int
    breakdown: dict[str, int] = field(default_factory=dict)


@dataclass
class Dims:
    """The widths the count needs, all present (count() checks Structure.missing first)."""

    hidden: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    model_type: str
    f: Fields


def _mlp(h: int, i: int, bias: bool = False) -> int:
    return 3 * h * i + ((2 * i + h) if bias else 0)


def _attention(d: Dims, kind: str) -> tuple[int, int]:
    """(attention weights, norm weights) of one layer of this kind."""
    f, h, nh, nkv, hd, mt = d.f, d.hidden, d.heads, d.kv_heads, d.head_dim, d.model_type
    if kind == "mla":
        rq, rkv = f.get_int("q_lora_rank", 0), f.get_int("kv_lora_rank", 0)
        dn, dr, dv = f.get_int("qk_nope_head_dim", hd), f.get_int("qk_rope_head_dim", 0), f.get_int("v_head_dim", hd)
        q = (h * rq + rq * nh * (dn + dr)) if rq else h * nh * (dn + dr)
        kv = h * (rkv + dr) + rkv * nh * (dn + dv)
        bias = (nh * (dn + dr) + h) if f.flag("attention_bias") else 0
        return q + kv + nh * dv * h + bias, rq + rkv
    if kind == "linear":
        nk, dk = f.get_int("linear_num_key_heads", nkv), f.get_int("linear_key_head_dim", hd)
        nv, dv = f.get_int("linear_num_value_heads", nh), f.get_int("linear_value_head_dim", hd)
        conv = f.get_int("linear_conv_kernel_dim", 4)
        key_dim, value_dim = nk * dk, nv * dv
        weights = h * (2 * key_dim + 2 * value_dim) + h * 2 * nv + (2 * key_dim + value_dim) * conv + 2 * nv + value_dim * h
        return weights, dv
    q_out = nh * hd * (2 if mt == "qwen3_next" or f.flag("attn_output_gate") else 1)
    weights = h * q_out + 2 * h * nkv * hd + nh * hd * h
    if f.flag("attention_bias"):
        weights += q_out + 2 * nkv * hd + h
    elif mt.startswith("qwen2"):
        weights += q_out + 2 * nkv * hd
    if mt == "gpt_oss":
        weights += nh  # sinks
    qk_norm = 2 * hd if (mt.startswith("qwen3") or f.flag("use_qk_norm")) else 0
    return weights, qk_norm


def _vision(v: dict[str, Any], lm_hidden: int, where: str) -> int:
    f = Fields(v, f"{where} vision_config")
    hv = f.first_int(("hidden_size", "embed_dim", "width"), 0) or 0
    depth = f.first_int(("depth", "num_hidden_layers", "num_layers", "layers"), 0) or 0
    if not hv or not depth:
        return 0
    ratio = v.get("mlp_ratio")
    iv = f.get_int("intermediate_size", int(hv * (ratio if isinstance(ratio, (int, float)) and ratio > 0 else 4)))
    gated = str(v.get("hidden_act") or "").lower() in ("silu", "swiglu")
    mlp = (3 * hv * iv + 2 * iv + hv) if gated else (2 * hv * iv + iv + hv)
    block = 4 * hv * hv + 4 * hv + mlp + 4 * hv
    patch = f.get_int("patch_size", 14, minimum=1)
    channels = f.first_int(("in_channels", "in_chans", "num_channels"), 3) or 3
    patch_embed = channels * f.get_int("temporal_patch_size", 1) * patch * patch * hv + hv
    positions = f.get_int("num_position_embeddings", 0) or (f.get_int("image_size", 0) // patch) ** 2
    out = f.get_int("out_hidden_size", lm_hidden)
    m = f.get_int("spatial_merge_size", 1, minimum=1) ** 2
    merger = (hv * m) ** 2 + hv * m + hv * m * out + out + hv
    mergers = 1 + len(v.get("deepstack_visual_indexes") or [])
    return depth * block + patch_embed + positions * hv + mergers * merger


def count(config: dict[str, Any], s: Structure, where: str = "config") -> ParamCount | None:
    """The analytic count, or None when a required width is missing (Structure.missing says which)."""
    if s.missing or not s.hidden or not s.heads or not s.vocab:
        return None
    f = s.f
    d = Dims(hidden=s.hidden, vocab=s.vocab, heads=s.heads, kv_heads=s.kv_heads or s.heads,
             head_dim=s.head_dim or s.hidden // s.heads, intermediate=s.intermediate or 0, model_type=s.model_type or "", f=f)
    h, v = d.hidden, d.vocab
    b = {"embedding": v * h, "lm_head": 0 if s.tied else v * h, "attention": 0, "linear_attention": 0,
         "mlp": 0, "experts": 0, "shared_experts": 0, "router": 0, "norms": h, "vision": 0}
    inactive = 0
    mlp_bias = f.flag("mlp_bias")
    m = s.moe
    moe_layers = set(m.layers) if m is not None else set()
    for i, kind in enumerate(s.attention):
        weights, norms = _attention(d, kind)
        b["linear_attention" if kind == "linear" else "attention"] += weights
        b["norms"] += 2 * h + norms
        if m is not None and i in moe_layers:
            expert = _mlp(h, m.expert_intermediate) + ((2 * m.expert_intermediate + h) if d.model_type == "gpt_oss" else 0)
            b["experts"] += m.experts * expert
            inactive += (m.experts - min(m.top_k, m.experts)) * expert
            router_bias = d.model_type == "gpt_oss" or f.opt_str("topk_method") == "noaux_tc"
            b["router"] += h * m.experts + (m.experts if router_bias else 0)
            if m.shared_experts:
                b["shared_experts"] += _mlp(h, m.expert_intermediate * m.shared_experts)
            if m.shared_intermediate:
                b["shared_experts"] += _mlp(h, m.shared_intermediate) + h
            if m.residual_intermediate:
                b["mlp"] += _mlp(h, m.residual_intermediate, mlp_bias)
        elif d.intermediate:
            b["mlp"] += _mlp(h, d.intermediate, mlp_bias)
    vision = vision_fields(config)
    if vision is not None:
        b["vision"] = _vision(vision, h, where)
    total = sum(b.values())
    return ParamCount(total=total, active=total - b["vision"] - inactive,
                      non_embedding=total - b["embedding"] - b["lm_head"], breakdown={k: n for k, n in b.items() if n})


def memory_bytes(params: int) -> dict[str, int]:
    return {dtype: math.ceil(params * per) for dtype, per in BYTES_PER_PARAM.items()}


def h200s_needed(params: int) -> int:
    """H200s the bf16 weights need, with HEADROOM for activations and graphs."""
    return max(1, math.ceil(params * BYTES_PER_PARAM["bfloat16"] * (1 + HEADROOM) / H200_BYTES))


def _head_counts(s: Structure) -> list[int]:
    counts = [n for n in (s.heads, s.kv_heads) if n]
    if "linear" in s.attention:
        counts += [n for n in (s.f.opt_int("linear_num_key_heads"), s.f.opt_int("linear_num_value_heads")) if n]
    return counts


def divides_heads(s: Structure, tp: int) -> bool:
    """Whether TP size `tp` splits the query heads (and linear attention's) evenly, and the KV heads evenly or as a
    multiple of them (each KV head kept whole by tp / KV ranks, as the runtime shards: pcg_core.distributed)."""
    counts = _head_counts(s)
    if not counts:
        return False
    kv_ok = not s.kv_heads or s.kv_heads % tp == 0 or tp % s.kv_heads == 0
    return kv_ok and all(n % tp == 0 for n in counts if n != s.kv_heads or n == s.heads)


def tp_sizes(s: Structure) -> list[int]:
    """TP sizes up to 8 (one node) that divide the heads."""
    return [t for t in range(1, MAX_SIZE + 1) if divides_heads(s, t)]


def ep_sizes(s: Structure) -> list[int]:
    """EP sizes up to 8 that divide the routed-expert count; [] for a dense model."""
    if s.moe is None:
        return []
    return [e for e in range(1, MAX_SIZE + 1) if s.moe.experts % e == 0]
