"""Which features a config exercises, named with the matrix's words, and the numbers behind each.

The words are the ones model cards and the runtime's capability table use:
moe, mla, sliding_window, sinks, softcap, length_temperature, linear_attention, vlm, rope_scaling (in that order in
every list).
Quantization is not a feature here: it has its own field (quantization.py).
"""

from __future__ import annotations

from typing import Any

from harness.shape.fields import vision_fields
from harness.shape.structure import Structure

FEATURES = ("moe", "mla", "sliding_window", "sinks", "softcap", "length_temperature", "linear_attention", "vlm",
            "rope_scaling")
ATTENTION_FEATURES = ("mla", "sliding_window", "sinks", "softcap", "length_temperature", "linear_attention")
# Attention sinks (a learned per-head logit in the softmax) have no config field; gpt-oss always has them.
SINK_MODEL_TYPES = ("gpt_oss",)
NO_SCALING = (None, "default")


def rope_scaling_of(config: dict[str, Any], lm: dict[str, Any]) -> dict[str, Any] | None:
    """The rope scaling in force (rope_scaling or transformers 5's rope_parameters), or None for plain RoPE.

    rope_parameters may hold one dict per layer type ({"full_attention": {...}, "sliding_attention": {...}});
    the first one with a type other than default counts.
    """
    for source in (lm, config):
        for key in ("rope_scaling", "rope_parameters"):
            value = source.get(key)
            if not isinstance(value, dict):
                continue
            candidates = [v for v in value.values() if isinstance(v, dict)] if not ({"type", "rope_type"} & value.keys()) else [value]
            for c in candidates:
                kind = c.get("rope_type", c.get("type"))
                if kind in NO_SCALING and c.get("factor") in (None, 1, 1.0):
                    continue
                details = {"type": kind or "unknown"}
                for k in ("factor", "original_max_position_embeddings"):
                    if c.get(k) is not None:
                        details[k] = c[k]
                return details
    return None


def detect(config: dict[str, Any], s: Structure, architecture: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """(features in canonical order, details per feature)."""
    f = s.f
    found: dict[str, dict[str, Any]] = {}
    if s.moe is not None:
        m = s.moe
        shared = m.shared_experts or (1 if m.shared_intermediate else 0)
        found["moe"] = {
            "experts": m.experts,
            "top_k": m.top_k,
            "shared_experts": shared,
            "expert_intermediate_size": m.expert_intermediate,
            "moe_layers": len(m.layers),
            "dense_layers": (s.layers or 0) - len(m.layers),
        }
        if m.shared_intermediate:
            found["moe"]["shared_expert_intermediate_size"] = m.shared_intermediate
    if "mla" in s.attention or f.has("kv_lora_rank") or f.has("q_lora_rank"):
        found["mla"] = {k: f.data.get(k) for k in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    if "sliding" in s.attention:
        found["sliding_window"] = {"window": s.sliding_window, "sliding_layers": s.attention.count("sliding"),
                                   "full_layers": len(s.attention) - s.attention.count("sliding")}
    if (s.model_type or "") in SINK_MODEL_TYPES or architecture.startswith("GptOss"):
        found["sinks"] = {"heads": s.heads}
    cap = f.data.get("attn_logit_softcapping")
    if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0:  # Grok-2, Gemma 2
        found["softcap"] = {"attention": cap}
    temp = f.data.get("attn_temperature_len")
    if isinstance(temp, int) and not isinstance(temp, bool) and temp > 0:  # Grok-2: xAI's length temperature
        found["length_temperature"] = {"length": temp}
    if "linear" in s.attention:
        found["linear_attention"] = {"linear_layers": s.attention.count("linear"),
                                     "full_layers": len(s.attention) - s.attention.count("linear")}
        if f.has("full_attention_interval"):
            found["linear_attention"]["full_attention_interval"] = f.data["full_attention_interval"]
    vision = vision_fields(config)
    if vision is not None:
        found["vlm"] = {k: vision.get(k) for k in ("model_type", "depth", "num_hidden_layers", "hidden_size") if vision.get(k) is not None}
    rope = rope_scaling_of(config, f.data)
    if rope is not None:
        found["rope_scaling"] = rope
    features = [name for name in FEATURES if name in found]
    return features, {name: found[name] for name in features}
