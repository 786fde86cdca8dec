"""The math of a Gated DeltaNet layer's core, per sequence, in torch: the reference that runs on the CPU (and, for
now, on CUDA too).

Causal depthwise conv1d continued from a conv state, then the gated delta rule continued from a recurrent state:

    S_t = exp(g_t) S_{t-1} + k_t (β_t (v_t − exp(g_t) S_{t-1}ᵀ k_t))ᵀ,   o_t = S_tᵀ q_t / √Dk

with q and k L2-normalised per head, in float32. Prefill (L > 1) uses transformers' own chunked torch fallback
(`torch_chunk_gated_delta_rule`, present in 4.57 through 5.25), decode one recurrent step for all sequences at once,
written here (as is the token-by-token scan the chunked form is checked against).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # transformers' torch fallback; a recurrent scan below otherwise
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule as _hf_chunked
except ImportError:  # pragma: no cover - every transformers pcg supports has it
    _hf_chunked = None


def causal_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [L, C] continued from state [C, K-1] with weight [C, K] → (out [L, C], new state [C, K-1])."""
    full = torch.cat([state.to(weight.dtype), x.t().to(weight.dtype)], dim=-1)  # [C, K-1+L]
    out = F.conv1d(full.unsqueeze(0), weight.unsqueeze(1), bias, groups=weight.shape[0])[0]  # [C, L]
    if activation in ("silu", "swish"):
        out = F.silu(out)
    elif activation is not None:
        raise ValueError(f"linear attention: conv activation {activation!r} is not supported (silu is)")
    return out.t().to(x.dtype), full[:, full.shape[1] - state.shape[1]:]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of N sequences at once: q, k [N, H, Dk] (normalised, q scaled), v [N, H, Dv], g, beta [N, H],
    state [N, H, Dk, Dv], all float32 → (out [N, H, Dv], new state)."""
    s = state * g.exp()[..., None, None]
    delta = (v - (s * k[..., None]).sum(dim=-2)) * beta[..., None]
    s = s + k[..., None] * delta[..., None, :]
    return (s * q[..., None]).sum(dim=-2), s


def _prepare(q, k, v, g, beta):
    """float32; q and k L2-normalised per head, q scaled by 1/√Dk."""
    return (l2norm(q.float()) * q.shape[-1] ** -0.5, l2norm(k.float()), v.float(), g.float(), beta.float())


def recurrent_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token. q, k [L, H, Dk], v [L, H, Dv], g, beta [L, H]; state [H, Dk, Dv] float32 (heads already
    repeated to Hv) → (out [L, H, Dv] float32, new state)."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    s = state.float()[None]
    out = torch.empty_like(v)
    for t in range(q.shape[0]):
        o, s = recurrent_step(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s)
        out[t] = o[0]
    return out, s[0]


def decode_rule(q, k, v, g, beta, state):
    """One token each of N sequences (decode): q, k [N, H, Dk], v [N, H, Dv], g, beta [N, H], state [N, H, Dk, Dv]."""
    return recurrent_step(*_prepare(q, k, v, g, beta), state.float())


def decode_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token each of N sequences: x [N, C], state [N, C, K-1] → (out [N, C], new state)."""
    full = torch.cat([state.to(weight.dtype), x.to(weight.dtype)[..., None]], dim=-1)  # [N, C, K]
    out = (full * weight).sum(dim=-1)
    if bias is not None:
        out = out + bias
    if activation in ("silu", "swish"):
        out = F.silu(out)
    elif activation is not None:
        raise ValueError(f"linear attention: conv activation {activation!r} is not supported (silu is)")
    return out.to(x.dtype), full[..., 1:]


def chunked_rule(q, k, v, g, beta, state):
    """As recurrent_rule, through transformers' chunked torch fallback (chunks of 64) where it is importable."""
    if _hf_chunked is None:
        return recurrent_rule(q, k, v, g, beta, state)
    out, s = _hf_chunked(q[None], k[None], v[None], g=g[None], beta=beta[None], initial_state=state[None].float(),
                         output_final_state=True, use_qk_l2norm_in_kernel=True)
    return out[0].float(), s[0].float()


def gated_delta_rule(q, k, v, g, beta, state):
    """One sequence's stretch: chunked above one token, recurrent for one (decode batches go through decode_rule, all
    sequences at once); the two agree to float32 rounding (tests/pcg_core/linear_attention/test_qwen3_next.py)."""
    return recurrent_rule(q, k, v, g, beta, state) if q.shape[0] == 1 else chunked_rule(q, k, v, g, beta, state)
