"""The shape of a decoder read from its raw config: widths, the kind of each layer, the MoE numbers.

Both feature detection (features.py) and the parameter count (params.py) read this one description, so the
two never disagree about which layers are MoE, sliding-window or linear-attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.shape.fields import Fields, lm_fields

# Keys under which configs give the routed-expert count and the experts chosen per token.
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk")
# Fields the parameter count cannot do without.
REQUIRED_FOR_COUNT = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass
class MoE:
    experts: int
    top_k: int
    expert_intermediate: int
    shared_experts: int = 0  # DeepSeek-style: n_shared_experts MLPs of the expert width, fused into one
    shared_intermediate: int = 0  # Qwen-style: one shared MLP of this width, with a sigmoid gate
    residual_intermediate: int = 0  # Grok-style residual_moe: a dense MLP beside the experts in every MoE layer
    layers: list[int] = field(default_factory=list)


@dataclass
class Structure:
    model_type: str | None
    hidden: int | None
    layers: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    vocab: int | None
    intermediate: int | None
    tied: bool
    attention: list[str]  # per layer: full | sliding | linear | mla
    moe: MoE | None
    sliding_window: int | None
    missing: list[str]  # required fields that are absent: no parameter count then
    f: Fields  # the language model's fields, for the counters that need more than the above


def _moe_layers(f: Fields, n_layers: int, experts: int) -> list[int]:
    """Which layers carry experts: DeepSeek's first_k_dense_replace/moe_layer_freq, Qwen's
    decoder_sparse_step/mlp_only_layers, else every layer (Mixtral, gpt-oss, Grok)."""
    if not experts:
        return []
    if f.has("first_k_dense_replace") or f.has("moe_layer_freq"):
        first = f.get_int("first_k_dense_replace", 0)
        freq = f.get_int("moe_layer_freq", 1, minimum=1)
        return [i for i in range(n_layers) if i >= first and i % freq == 0]
    step = f.get_int("decoder_sparse_step", 1, minimum=1)
    dense = set(f.int_list("mlp_only_layers"))
    return [i for i in range(n_layers) if i not in dense and (i + 1) % step == 0]


def _attention_kinds(f: Fields, n_layers: int) -> list[str]:
    mla = f.has("kv_lora_rank") or f.has("q_lora_rank")
    layer_types = f.str_list("layer_types")
    if layer_types:
        kinds = {"sliding_attention": "sliding", "linear_attention": "linear"}
        out = [kinds.get(t, "full") for t in layer_types[:n_layers]]
        out += ["full"] * (n_layers - len(out))
    elif f.has("full_attention_interval"):  # Qwen3-Next: every interval-th layer is full attention, the rest linear
        every = f.get_int("full_attention_interval", 1, minimum=1)
        out = ["linear" if (i + 1) % every else "full" for i in range(n_layers)]
    elif sliding_window_of(f) is not None:
        # Qwen2-style max_window_layers: layers at and above it use the window; absent means all of them.
        start = f.get_int("max_window_layers", 0) if str(f.data.get("model_type") or "").startswith("qwen2") else 0
        out = ["sliding" if i >= start else "full" for i in range(n_layers)]
    else:
        out = ["full"] * n_layers
    return ["mla" if mla and k == "full" else k for k in out]


def sliding_window_of(f: Fields) -> int | None:
    """The window when the config turns it on: a positive sliding_window, unless use_sliding_window is false."""
    window = f.data.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if f.data.get("use_sliding_window") is False:
        return None
    return window


def read_structure(config: dict[str, Any], where: str) -> Structure:
    f = Fields(lm_fields(config), where)
    missing = [k for k in REQUIRED_FOR_COUNT if not f.has(k)]
    hidden = f.opt_int("hidden_size", minimum=1)
    n_layers = f.get_int("num_hidden_layers", 0)
    heads = f.opt_int("num_attention_heads", minimum=1)
    kv_heads = f.opt_int("num_key_value_heads", heads, minimum=1)
    head_dim = f.opt_int("head_dim", minimum=1)
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    intermediate = f.opt_int("intermediate_size")
    experts = f.first_int(EXPERT_COUNT_KEYS, 0) or 0
    moe = None
    if experts:
        moe = MoE(
            experts=experts,
            top_k=f.first_int(TOP_K_KEYS, 1) or 1,
            expert_intermediate=f.get_int("moe_intermediate_size", intermediate or 0),
            shared_experts=f.first_int(("n_shared_experts", "num_shared_experts"), 0) or 0,
            shared_intermediate=f.get_int("shared_expert_intermediate_size", 0),
            residual_intermediate=(intermediate or 0) if f.flag("residual_moe") else 0,
            layers=_moe_layers(f, n_layers, experts),
        )
    layer_types = set(f.str_list("layer_types"))
    window = sliding_window_of(f)
    if window is None and "sliding_attention" in layer_types:
        window = f.opt_int("sliding_window")
    return Structure(
        model_type=f.opt_str("model_type"),
        hidden=hidden,
        layers=n_layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=f.opt_int("vocab_size", minimum=1),
        intermediate=intermediate,
        tied=f.flag("tie_word_embeddings", False),
        attention=_attention_kinds(f, n_layers),
        moe=moe,
        sliding_window=window,
        missing=missing,
        f=f,
    )
