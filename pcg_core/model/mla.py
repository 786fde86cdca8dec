"""Multi-head latent attention (DeepSeek-V3, Kimi-K2) over the latent KV cache.

transformers' DeepseekV3Attention expands the compressed KV to per-head keys (192 dims) and values (128) before
its attention call: 40 960 values per token and layer at DeepSeek-V3's widths, against the 576 of the latent
(kv_lora_rank 512 + the rotated shared key part 64). Here each attention module's forward is replaced by one that
keeps the latent row [c, k_rot] (576) per token in the cache and hands the split op pcg::mla_attention
(pcg_core/attention/mla_op.py) the per-head queries, that row and kv_b_proj's weight. The op runs the absorbed form,
the same math reassociated,

    q·k  = q_nope·(W_UK c) + q_rot·k_rot = (W_UKᵀ q_nope)·c + q_rot·k_rot    (W_UK: kv_b_proj's key rows)
    o    = W_UV (Σ p c)                                                       (W_UV: its value rows)

one KV head of cached latent rows, for decode and whatever reads the cache; and transformers' expanded form for a
forward of fresh sequences (prefill), where it is several times faster. Scale, YaRN's mscale and the
(interleaved) rotary embedding are the module's own, so the forward matches transformers' eager one up to
summation order.
"""

from __future__ import annotations

import types
from typing import cast

import torch

from pcg_core.attention import mla_op  # noqa: F401 - registers pcg::mla_attention

MLA_PARAMETERS = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")


def is_mla_attention(module: torch.nn.Module) -> bool:
    return all(hasattr(module, name) for name in MLA_PARAMETERS) and hasattr(module, "kv_lora_rank")


def install_mla(model: torch.nn.Module) -> int:
    """Replace every MLA attention module's forward (this model's instances only) with the absorbed one; returns
    how many. Idempotent."""
    n = 0
    for module in model.modules():
        if is_mla_attention(module):
            module.forward = types.MethodType(absorbed_mla_forward, module)
            n += 1
    return n


def mla_installed(model: torch.nn.Module) -> bool:
    """Whether any of this model's attention modules runs the latent form (install_mla)."""
    return any(is_mla_attention(m) and "forward" in m.__dict__ for m in model.modules())


def uninstall_mla(model: torch.nn.Module) -> int:
    """transformers' own MLA forward back on every absorbed module (this model's instances only; a reference twin's,
    pcg_core.quant.twin): the expanded per-head keys and values through its attention implementation, the same math
    unabsorbed. A quantized kv_b_proj then runs as a linear of its weight dequantized in the input's dtype, as the
    absorbed form reads it (never its activation quantized). Returns how many."""
    n = 0
    for module in model.modules():
        if is_mla_attention(module) and "forward" in module.__dict__:
            del module.forward
            proj = getattr(module, "kv_b_proj")
            if getattr(proj, "dequantized_weight", None) is not None:
                proj.forward = types.MethodType(_dequantized_forward, proj)
            n += 1
    return n


def _dequantized_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    bias = getattr(self, "bias", None)
    return torch.nn.functional.linear(x, _dense_weight(self, x.dtype), None if bias is None else bias.to(x.dtype))


def _dense_weight(linear: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """kv_b_proj's weight as a matrix to absorb: a quantized one (8-bit: DeepSeek's FP8 checkpoints quantize it;
    int4, FP4) dequantized, in the piece, each forward — the serving engines absorb the dequantized weight too, its
    activation never quantized."""
    dequantized = getattr(linear, "dequantized_weight", None)
    return cast(torch.Tensor, linear.weight) if dequantized is None else dequantized().to(dtype)  # torch: Tensor | Module


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotary embedding of x [T, h, r] with cos/sin [T, r] (transformers' layout: the frequencies twice). DeepSeek's
    checkpoints pair dimensions (0, 1), (2, 3) … (interleave); otherwise the halves pair up, as in Llama."""
    if interleave:
        c, s = cos[:, None, : cos.shape[-1] // 2], sin[:, None, : sin.shape[-1] // 2]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * c + rotated * s


def absorbed_mla_forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                         attention_mask: torch.Tensor | None = None, *args, **kwargs) -> tuple[torch.Tensor, None]:
    """DeepseekV3Attention.forward for a packed batch of one row: [1, T, hidden] in, [1, T, hidden] out."""
    if hidden_states.shape[0] != 1:
        raise ValueError(f"pcg runs packed batches of one row; got batch size {hidden_states.shape[0]}")
    h = hidden_states[0]
    t = h.shape[0]
    heads, nope, rope, rank, v_dim = (self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank,
                                      self.v_head_dim)
    q = self.q_proj(h) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(h)))
    q_nope, q_rot = q.view(t, heads, nope + rope).split([nope, rope], dim=-1)
    c, k_rot = self.kv_a_proj_with_mqa(h).split([rank, rope], dim=-1)
    c = self.kv_a_layernorm(c)
    cos, sin = (e[0] for e in position_embeddings)
    interleave = bool(getattr(self.config, "rope_interleave", False))
    q_rot = _rotate(q_rot, cos, sin, interleave)
    k_rot = _rotate(k_rot[:, None, :], cos, sin, interleave)
    w = _dense_weight(self.kv_b_proj, q.dtype).view(heads, nope + v_dim, rank)  # dequantized here, in the piece
    latent = torch.cat([c[:, None, :], k_rot], dim=-1)  # [T, 1, rank + rope]: the row the cache keeps
    out = q.new_empty(t, heads, v_dim)  # allocated here, in the piece before the split op
    torch.ops.pcg.mla_attention(q_nope, q_rot, latent, w, out, int(self.layer_idx), float(self.scaling))
    return self.o_proj(out.reshape(1, t, heads * v_dim)), None
