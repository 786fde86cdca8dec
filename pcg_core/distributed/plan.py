"""Which module of a decoder is sharded how at tensor parallelism, and what is refused.

The plan is transformers' own (`base_model_tp_plan` of the model's config, the strings its TP loader reads):
q/k/v and gate/up `colwise`, o and down `rowwise`, per-head norms replicated. Fused MoE experts are pcg's own
rule in both transformers versions (5.17's plan names them `packed_colwise`/`moe_tp_experts`, 5.25's leaves
them to its EP plan): every rank keeps every expert with a slice of its intermediate dimension, and the experts'
output is summed over ranks (EP = TP in "all-reduce" style, capturable: no data-dependent shapes). Embedding and
LM head stay replicated (exact, and nothing to gather outside the decoder).
"""

from __future__ import annotations

import re
from typing import Any

# Styles of transformers' plans pcg applies, by what they mean for the runtime form.
COLWISE = ("colwise",)
ROWWISE = ("rowwise",)
REPLICATED = ("replicated_with_grad_allreduce", "embedding_rowwise", "replicate")  # kept whole on every rank
# Styles on fused experts (5.17 TP plan, 5.25 EP plan): pcg's expert rule shards them instead.
EXPERT_STYLES = ("packed_colwise", "moe_tp_experts", "grouped_gemm", "ep_dispatch_experts", "ep_router",
                 "local_colwise", "local_rowwise", "local_packed_rowwise", "gather")
# pcg's own plan entries where transformers' plan lacks them (5.17's DeepSeek-V3 plan shards only its MLPs): MLA
# heads sharded as its q/kv_b rows (per head: nope then rope, nope then v) and o_proj's columns; the latent
# projection and its norm stay whole, so every rank keeps the whole latent cache.
# gpt-oss (transformers 5.25's plan names only its embedding): heads as Llama's, the sinks with them (shard.py); its
# biased, transposed experts with interleaved gate/up rows take pcg's expert rule. Grok-2 (pcg's own module,
# pcg_core/model/grok.py, which transformers has no plan for): heads and dense MLP as Llama's, experts as every other.
PCG_PLANS: dict[str, dict[str, str]] = {
    "deepseek_v3": {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.q_b_proj": "colwise",
                    "layers.*.self_attn.kv_a_proj_with_mqa": "replicate", "layers.*.self_attn.kv_b_proj": "colwise",
                    "layers.*.self_attn.o_proj": "rowwise"},
    "gpt_oss": {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
                "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise"},
    # Qwen3-Next's Gated DeltaNet by key-head group (distributed/linear.py), in place of transformers' gathered output
    "qwen3_next": {"layers.*.linear_attn.in_proj_qkvz": "colwise", "layers.*.linear_attn.in_proj_ba": "colwise",
                   "layers.*.linear_attn.out_proj": "rowwise"},
    "pcg_grok1": {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
                  "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
                  "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
                  "layers.*.mlp.down_proj": "rowwise"},
}
KNOWN_STYLES = (*COLWISE, *ROWWISE, *REPLICATED, *EXPERT_STYLES, "mla_kv_a_proj")  # the styles pcg applies
TP_DEGREES = (1, 2, 4, 8)  # tensor-parallel sizes the runtime shards for (4 and 8: gloo on a CPU; GPUs: issue 45)


def plan_regex(key: str) -> re.Pattern[str]:
    """transformers' plan key (`layers.*.self_attn.q_proj`) as a full-match regex over module names."""
    return re.compile("^" + re.escape(key).replace(r"\*", r"\d+") + "$")


def decoder_plan(config: Any) -> dict[str, str]:
    """transformers' TP plan of the model's decoder (keys relative to it), pcg's entries (PCG_PLANS) where it has none
    for a module or one pcg does not apply; {} when neither has one."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    plan = dict(getattr(text, "base_model_tp_plan", None) or {})
    for key, style in PCG_PLANS.get(getattr(text, "model_type", ""), {}).items():
        if key not in plan or plan[key] not in KNOWN_STYLES:  # theirs where pcg applies it
            plan[key] = style
    return plan


def style_for(plan: dict[str, str], name: str) -> str | None:
    for key, style in plan.items():
        if plan_regex(key).match(name):
            return style
    return None


def tp_unsupported_reason(config: Any, tp: int) -> str | None:
    """Why a model with `config` cannot run at tensor parallelism `tp`, or None: the degree, what the sharding
    does not cover yet (linear attention, vision towers), and head counts it does not divide."""
    if tp == 1:
        return None
    if tp not in TP_DEGREES:
        return f"tensor parallelism {tp}: the runtime runs TP {', '.join(map(str, TP_DEGREES))} only so far"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    if (kh := getattr(text, "linear_num_key_heads", None)) and kh % tp:
        return f"tp{tp} does not divide the linear-attention layers' {kh} key heads"
    plan = decoder_plan(config)
    if not any(plan_regex(k).match("layers.0.self_attn.o_proj") and v in ROWWISE for k, v in plan.items()):
        return f"tp{tp}: {arch} has no tensor-parallel plan for its attention in transformers ({type(text).__name__}" \
               ".base_model_tp_plan); pcg has none of its own yet"
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    if heads % tp or (kv % tp and tp % kv):
        return (f"tp{tp} does not divide the heads ({heads} attention, {kv} KV heads), nor is it a multiple of the "
                "KV heads (each KV head kept whole by several ranks)")
    return None


def unknown_styles(plan: dict[str, str]) -> list[str]:
    """Plan entries whose style pcg does not apply (such a model is refused rather than sharded half-way)."""
    return [f"{k}: {v}" for k, v in plan.items() if v not in KNOWN_STYLES]
