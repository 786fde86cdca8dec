"""Which architectures the runtime runs: THE table (the loader checks models against it, `capabilities()`
publishes it to the harness, which keeps no list of its own). Torch- and transformers-free at import: the
table is read by name (`architecture_reason`) where no model runs, e.g. `pcgh models`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pcg_core.errors import UnsupportedModel

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["MODEL_TYPE_ALIASES", "OWN_MODEL_TYPES", "SUPPORTED_ARCHITECTURES", "architecture_of", "architecture_reason",
           "check_supported", "is_moe", "unsupported_reason"]

# architecture → features it exercises. Adding an architecture here is the whole of "supporting" it only
# when transformers' module runs unchanged with our attention op and expert path.
SUPPORTED_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "LlamaForCausalLM": (),
    "Qwen2ForCausalLM": (),
    "Qwen3ForCausalLM": (),
    "Qwen3MoeForCausalLM": ("moe",),
    "MixtralForCausalLM": ("moe",),
    # attention sinks (per-head s_aux) and every other layer a 128-token sliding window; clamped SwiGLU experts
    # with biases (transformers' grouped path); FP4 experts in pcg_core/quant/layers/fp4_experts.py
    "GptOssForCausalLM": ("moe", "sliding_window", "sinks"),
    # MLA (absorbed, over a latent cache: pcg_core/model/mla.py), dense first layers, routed + shared experts
    # behind the sigmoid, group-limited router; YaRN rotary scaling as transformers implements it
    "DeepseekV3ForCausalLM": ("moe", "mla"),
    # Grok-2: our own module (pcg_core/model/grok.py); attention soft-cap 30 and xAI's length temperature, dense MLP
    # + MoE per layer, four norms per layer, soft-capped router and final logits
    "Grok1ForCausalLM": ("moe", "softcap", "length_temperature"),
    # VLMs: the vision tower, image merge, M-RoPE index and deepstack run eagerly before the captured text decoder
    # (pcg_core/engine/vision.py); the text decoder is transformers' own with our attention op
    "Qwen2_5_VLForConditionalGeneration": ("vlm", "rope_scaling"),
    "Qwen3VLMoeForConditionalGeneration": ("moe", "vlm"),
    # Qwen3-Next: Gated DeltaNet layers over the pcg::linear_attention split op and a per-sequence state pool
    # (pcg_core/linear_attention/, pcg_core/model/qwen3_next.py), gated full attention every 4th layer, MoE with a
    # gated shared expert; MTP weights ignored, as transformers does
    "Qwen3NextForCausalLM": ("moe", "linear_attention"),
}

# architecture → the model_type of our own module for it, where transformers has none: the config's own
# model_type is not read (Grok-2's says "git", transformers' Microsoft GIT).
OWN_MODEL_TYPES: dict[str, str] = {"Grok1ForCausalLM": "pcg_grok1"}

# model_type → the transformers one that implements it, for configs published with remote code only: Kimi-K2's
# `kimi_k2` is DeepSeek-V3's architecture (its config names DeepseekV3ForCausalLM; transformers maps Kimi-K2.5
# the same way), so it loads as deepseek_v3 and no remote code runs.
MODEL_TYPE_ALIASES: dict[str, str] = {"kimi_k2": "deepseek_v3"}


def architecture_of(config: PretrainedConfig) -> str:
    archs = getattr(config, "architectures", None) or []
    if archs:
        return archs[0]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, config.model_type)


def is_moe(config: PretrainedConfig) -> bool:
    if getattr(config, "text_config", None) is not None:  # a VLM: the experts are the text model's
        config = config.text_config
    return bool(getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
                or getattr(config, "n_routed_experts", None))


def architecture_reason(arch: str) -> str | None:
    """Why the runtime cannot run architecture `arch` (a class name, e.g. a config.json's `architectures[0]`), or
    None: the table alone, no config is built."""
    if arch not in SUPPORTED_ARCHITECTURES:
        return f"architecture {arch} is not supported yet (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
    return None


def unsupported_reason(config: PretrainedConfig) -> str | None:
    return architecture_reason(architecture_of(config))


def check_supported(config: PretrainedConfig) -> None:
    reason = unsupported_reason(config)
    if reason:
        raise UnsupportedModel(reason)
