"""Grok-2 (xai-org/grok-2, `Grok1ForCausalLM`): our own small module, since transformers has none.

Its config says `model_type: "git"`, which transformers reads as Microsoft's GIT (an image-to-text model), so the
loader routes it by `architectures` to `Grok1Config` here, registered with transformers' Auto classes under the
private type `pcg_grok1`. Written in transformers' style (attention through ALL_ATTENTION_FUNCTIONS, so our op,
tracing and splitting work unchanged), with the math of the reference implementation (xAI's release as SGLang
serves it):

- embeddings × `embedding_multiplier_scale`; logits = 50·tanh((lm_head(h) × `output_multiplier_scale`) / 50);
- four RMSNorms per layer: h = x + post_attn(attn(pre_attn(x))); y = h + post_moe(ffn(pre_moe(h)));
- attention: GQA, neox RoPE (`rope_type: original`: plain frequencies), scores scaled by head_dim^-½, soft-capped
  30·tanh(s/30), then × log2(p)/log2(L) for a query at position p > L = `attn_temperature_len` (xAI's length
  temperature);
- ffn = (dense MLP + MoE) / √2 (`residual_moe`), both GELU(tanh)-gated; router logits in float32, soft-capped
  30·tanh(l/30), top-2 of the capped logits weighted by their softmax over all experts (not renormalised).
Experts run densely masked (every expert on every token, zero weight where not routed): static shapes, capturable;
held in transformers' fused experts layout, so every quantization scheme quantizes them as it does transformers'.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from pcg_core.attention.op import ATTN_IMPLEMENTATION  # noqa: F401 - registers pcg::attention
from pcg_core.attention.reference import attention_math, length_temperature
from pcg_core.model.experts import quantized_forward
from pcg_core.quant.twin import routed_float_experts_forward

MODEL_TYPE = "pcg_grok1"
ARCHITECTURE = "Grok1ForCausalLM"


class Grok1Config(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, vocab_size=131072, hidden_size=8192, intermediate_size=32768, moe_intermediate_size=16384,
                 num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                 num_local_experts=8, num_experts_per_tok=2, residual_moe=True, rms_norm_eps=1e-5,
                 rope_theta=10000.0, max_position_embeddings=131072, embedding_multiplier_scale=1.0,
                 output_multiplier_scale=1.0, attn_logit_softcapping=30.0, router_logit_softcapping=30.0,
                 final_logit_softcapping=50.0, attn_temperature_len=-1, initializer_range=0.02,
                 tie_word_embeddings=False, **kwargs):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.moe_intermediate_size, self.num_hidden_layers = moe_intermediate_size, num_hidden_layers
        self.num_attention_heads, self.num_key_value_heads, self.head_dim = num_attention_heads, num_key_value_heads, head_dim
        self.num_local_experts, self.num_experts_per_tok, self.residual_moe = num_local_experts, num_experts_per_tok, residual_moe
        self.rms_norm_eps, self.rope_theta, self.max_position_embeddings = rms_norm_eps, rope_theta, max_position_embeddings
        self.embedding_multiplier_scale, self.output_multiplier_scale = embedding_multiplier_scale, output_multiplier_scale
        self.attn_logit_softcapping, self.router_logit_softcapping = attn_logit_softcapping, router_logit_softcapping
        self.final_logit_softcapping, self.attn_temperature_len = final_logit_softcapping, attn_temperature_len
        self.initializer_range = initializer_range
        kwargs.setdefault("architectures", [ARCHITECTURE])
        rope_type = kwargs.pop("rope_type", None)
        if rope_type not in (None, "original"):  # "original": plain frequencies (the scaling keys beside it unused)
            raise ValueError(f"rope_type {rope_type!r}: this module implements Grok's 'original' rotary only")
        if (kwargs.get("sliding_window_size") or -1) > 0:
            raise ValueError(f"sliding_window_size {kwargs['sliding_window_size']}: Grok's sliding window is not implemented")
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.rope_type = rope_type


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(x / cap) if cap and cap > 0 else x


class Grok1RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def grok_eager_attention(module, query, key, value, attention_mask, scaling=None, softcap=None, temperature_len=None,
                         position_ids=None, **kwargs):
    """Outside an engine: a batch of unpadded causal sequences, one per row, [B, H, T, D] in, [B, T, H, D] out, through
    the same plain math the reference backend uses (scale, soft-cap, length temperature) — each row its own sequence
    (the judge's reference runs sequences of one length as rows of one forward)."""
    t = query.shape[2]
    causal = torch.ones(t, key.shape[2], dtype=torch.bool, device=query.device).tril()
    rows = []
    for r in range(query.shape[0]):
        q, k, v = query[r].transpose(0, 1), key[r].transpose(0, 1), value[r].transpose(0, 1)
        pos = position_ids[r if position_ids.shape[0] > 1 else 0] if position_ids is not None \
            else torch.arange(t, device=q.device)
        temp = length_temperature(pos, temperature_len or 0) if temperature_len else None
        rows.append(attention_math(q, k, v, causal, scaling, softcap or 0.0, None, temp))
    return torch.stack(rows), None


class Grok1Attention(nn.Module):
    def __init__(self, config: Grok1Config, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.num_heads, self.num_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.scaling = self.head_dim**-0.5
        self.is_causal = True

    def forward(self, hidden_states, cos, sin, position_ids):
        b, t, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, grok_eager_attention)
        out, _ = attention(self, q, k, v, None, scaling=self.scaling, softcap=self.config.attn_logit_softcapping,
                           temperature_len=int(self.config.attn_temperature_len), position_ids=position_ids)
        return self.o_proj(out.reshape(b, t, -1))


class Grok1MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Grok1Router(nn.Module):
    """The router's weight [experts, hidden], applied in float32 by Grok1MoE.route. Not an nn.Linear, so an 8-bit
    scheme (which swaps every nn.Linear) leaves it as the reference does: unquantized."""

    def __init__(self, hidden: int, experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden))


class Grok1Experts(nn.Module):
    """The experts in transformers' fused layout (gate_up_proj [E, 2I, H], gate first; down_proj [E, H, I]) and its
    calling convention (hidden [T, H], top_k_index, top_k_weights), so pcg_core.quant.layers.experts quantizes them and
    runs them quantized as any transformers experts module. Unquantized they run densely masked: every expert on
    every token, zero weight where not routed (static shapes, capturable)."""

    has_gate = True

    def __init__(self, config: Grok1Config):
        super().__init__()
        e, h, i = config.num_local_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    def act_fn(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if getattr(self, "float_twin", False):  # a float twin's experts (pcg_core.quant.twin), quantized or not
            return routed_float_experts_forward(self, x, top_k_index, top_k_weights)
        if getattr(self, "quant_scheme", None) is not None:
            return quantized_forward(self, x, top_k_index, top_k_weights)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(self.num_experts):
            w = (top_k_weights * (top_k_index == e)).sum(-1, keepdim=True)
            out += F.linear(self._apply_gate(F.linear(x, self.gate_up_proj[e])), self.down_proj[e]).float() * w
        return out.to(x.dtype)


class Grok1MoE(nn.Module):
    def __init__(self, config: Grok1Config):
        super().__init__()
        self.top_k, self.cap = config.num_experts_per_tok, config.router_logit_softcapping
        self.gate = Grok1Router(config.hidden_size, config.num_local_experts)
        self.experts = Grok1Experts(config)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert indices [T, k], their weights [T, k] float32)."""
        logits = softcap(F.linear(x.float(), self.gate.weight.float()), self.cap)
        idx = logits.topk(self.top_k, dim=-1).indices
        return idx, torch.softmax(logits, dim=-1).gather(-1, idx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        idx, weights = self.route(x)
        return self.experts(x, idx, weights).reshape(shape)


class Grok1DecoderLayer(nn.Module):
    def __init__(self, config: Grok1Config, layer_idx: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Grok1Attention(config, layer_idx)
        self.block_sparse_moe = Grok1MoE(config)
        self.mlp = Grok1MLP(h, config.intermediate_size) if config.residual_moe else None
        self.pre_attn_norm, self.post_attn_norm = Grok1RMSNorm(h, eps), Grok1RMSNorm(h, eps)
        self.pre_moe_norm, self.post_moe_norm = Grok1RMSNorm(h, eps), Grok1RMSNorm(h, eps)

    def forward(self, x, cos, sin, position_ids):
        x = x + self.post_attn_norm(self.self_attn(self.pre_attn_norm(x), cos, sin, position_ids))
        h = self.pre_moe_norm(x)
        ffn = self.block_sparse_moe(h)
        if self.mlp is not None:
            ffn = (self.mlp(h) + ffn) / math.sqrt(2.0)
        return x + self.post_moe_norm(ffn)


class Grok1PreTrainedModel(PreTrainedModel):
    config_class = Grok1Config
    base_model_prefix = "model"
    _supports_attention_backend = True  # our op through ALL_ATTENTION_FUNCTIONS; sdpa/flash would drop the soft-cap
    _no_split_modules = ["Grok1DecoderLayer"]

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, Grok1RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, Grok1Experts):
            nn.init.normal_(module.gate_up_proj, mean=0.0, std=std)
            nn.init.normal_(module.down_proj, mean=0.0, std=std)
        elif isinstance(module, (Grok1Head, Grok1Router)):
            nn.init.normal_(module.weight, mean=0.0, std=std)


class Grok1Model(Grok1PreTrainedModel):
    def __init__(self, config: Grok1Config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Grok1DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Grok1RMSNorm(config.hidden_size, config.rms_norm_eps)
        d = config.head_dim
        self.register_buffer("inv_freq", 1.0 / config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d),
                             persistent=False)
        self.post_init()

    def forward(self, input_ids=None, position_ids=None, **kwargs) -> BaseModelOutputWithPast:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.embed_tokens(input_ids) * self.config.embedding_multiplier_scale
        freqs = position_ids[..., None].float() * self.inv_freq.float().to(x.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, position_ids)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x))


class Grok1Head(nn.Module):
    """lm_head × output_multiplier_scale, then the final soft-cap; in float32 (the engine's logits are)."""

    def __init__(self, config: Grok1Config):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))
        self.multiplier, self.cap = config.output_multiplier_scale, config.final_logit_softcapping

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return softcap(F.linear(h.float(), self.weight.float()) * self.multiplier, self.cap)


class Grok1ForCausalLM(Grok1PreTrainedModel):
    def __init__(self, config: Grok1Config):
        super().__init__(config)
        self.model = Grok1Model(config)
        self.lm_head = Grok1Head(config)
        self.post_init()

    def get_decoder(self):
        return self.model

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, head):
        self.lm_head = head

    def forward(self, input_ids=None, position_ids=None, **kwargs) -> CausalLMOutputWithPast:
        h = self.model(input_ids=input_ids, position_ids=position_ids).last_hidden_state
        return CausalLMOutputWithPast(logits=self.lm_head(h))


AutoConfig.register(MODEL_TYPE, Grok1Config)
AutoModelForCausalLM.register(Grok1Config, Grok1ForCausalLM)
