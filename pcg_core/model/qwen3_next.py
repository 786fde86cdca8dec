"""Qwen3-Next's Gated DeltaNet layers over pcg's linear-attention split op.

transformers' Qwen3NextGatedDeltaNet runs its causal conv1d and gated delta rule inline, over transformers' own
cache (whose API differs between 5.17 and 5.25), and never through the AttentionInterface. Each such module's
forward is replaced here (this model's instances only): its own projections (in_proj_qkvz, in_proj_ba with its
`fix_query_key_value_ordering`), β = σ(b), g = −exp(A_log)·softplus(a + dt_bias), its gated RMSNorm and out_proj
stay as transformers has them, inside the graph pieces; the conv and the delta rule are `pcg::linear_attention`.
The full-attention layers (gated, through the AttentionInterface) and the MoE with its shared expert are untouched.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

import pcg_core.linear_attention.op  # noqa: F401 - registers pcg::linear_attention

GDN_PARAMETERS = ("in_proj_qkvz", "in_proj_ba", "conv1d", "A_log", "dt_bias", "norm", "out_proj")


def is_gated_deltanet(module: torch.nn.Module) -> bool:
    return all(hasattr(module, n) for n in GDN_PARAMETERS) and hasattr(module, "fix_query_key_value_ordering")


def install_gated_deltanet(model: torch.nn.Module) -> int:
    """Replace every Gated DeltaNet module's forward with the split-op one; returns how many. Idempotent."""
    n = 0
    for module in model.modules():
        if is_gated_deltanet(module):
            module.forward = types.MethodType(gated_deltanet_forward, module)
            n += 1
    return n


def uninstall_gated_deltanet(model: torch.nn.Module) -> int:
    """transformers' own forward back (a reference model for tests)."""
    n = 0
    for module in model.modules():
        if is_gated_deltanet(module) and "forward" in module.__dict__:
            del module.forward
            n += 1
    return n


def gated_deltanet_forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """[1, T, hidden] of a packed batch → [1, T, hidden]; the transformers cache arguments are not used (the state
    pool in the forward context holds the states)."""
    if hidden_states.shape[0] != 1:
        raise ValueError(f"pcg runs packed batches of one row; got batch size {hidden_states.shape[0]}")
    t = hidden_states.shape[1]
    qkvz = self.in_proj_qkvz(hidden_states)
    ba = self.in_proj_ba(hidden_states)
    query, key, value, z, b, a = self.fix_query_key_value_ordering(qkvz, ba)
    mixed = torch.cat([query.reshape(t, -1), key.reshape(t, -1), value.reshape(t, -1)], dim=-1)
    beta = b[0].sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a[0].float() + self.dt_bias)
    out = torch.empty(t, self.num_v_heads, self.head_v_dim, dtype=hidden_states.dtype, device=hidden_states.device)
    torch.ops.pcg.linear_attention(mixed, beta, g, self.conv1d.weight[:, 0], self.conv1d.bias, out, int(self.layer_idx),
                                   int(self.num_k_heads), int(self.head_k_dim), str(self.activation))
    core = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(1, t, -1))
