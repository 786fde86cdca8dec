"""`pcg::linear_attention`, the split op of a Gated DeltaNet layer's core (Qwen3-Next's linear layers).

The layer's projections, its gated norm and out_proj stay in the graph pieces around the op; the op does what
depends on the sequences of the batch: the causal conv1d continued from each sequence's conv state, the gated delta
rule continued from its recurrent state, both states written back to the pool (pcg_core/linear_attention/state.py).
Like pcg::attention it writes into `out`, allocated by the piece before it, and reads the batch (which rows belong
to which sequence) from the forward context. Padding rows of `out` are exact zeros: fed to the MoE router or an
all-reduce, garbage there reaches real rows (SGLang's NaNs, #13081).

It runs a host-side loop over the batch's sequences, so it is not capturable: piecewise keeps it eager between
graphs, breakable runs it in a hole, and `full` refuses models that have it (`CAPTURABLE` below).
"""

from __future__ import annotations

import torch

from pcg_core.forward_context import get_forward_context
from pcg_core.linear_attention.gdn import causal_conv, decode_conv, decode_rule, gated_delta_rule
from pcg_core.split_ops import register_split_op, run_split_op

CAPTURABLE = False
WHY_NOT_CAPTURABLE = ("pcg::linear_attention loops over the batch's sequences on the host (per-sequence conv and "
                      "recurrent states); piecewise and breakable run it eagerly between graphs")


def _clear(out: torch.Tensor) -> None:
    """Every row zero first: padding rows (no sequence's) stay so; real rows are overwritten."""
    out.zero_()


def _linear_attention(mixed_qkv: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, conv_weight: torch.Tensor,
                      conv_bias: torch.Tensor | None, out: torch.Tensor, layer: int, num_k_heads: int, head_k_dim: int,
                      activation: str) -> None:
    ctx = get_forward_context()
    if ctx.observer is not None:  # the judge's diagnosis sees each linear layer's input as it sees attention's
        ctx.observer(layer, mixed_qkv)
    pool = ctx.linear_state
    if pool is None:
        raise RuntimeError("pcg::linear_attention: the forward context has no linear-state pool; the Engine makes one "
                           "for models with linear_attention layers")
    _clear(out)
    key_dim = num_k_heads * head_k_dim
    num_v_heads, head_v_dim = out.shape[1], out.shape[2]
    conv, rec = pool.conv[layer], pool.recurrent[layer]
    split = [key_dim, key_dim, num_v_heads * head_v_dim]
    rep = num_v_heads // num_k_heads

    def heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = x.split(split, dim=-1)
        q = q.reshape(-1, num_k_heads, head_k_dim).repeat_interleave(rep, dim=1)
        k = k.reshape(-1, num_k_heads, head_k_dim).repeat_interleave(rep, dim=1)
        return q, k, v.reshape(-1, num_v_heads, head_v_dim)

    decode = [r for r in pool.runs if r.length == 1]
    if decode:  # one token per sequence: all of them at once, states gathered by slot and version
        dev = out.device
        rows = torch.tensor([r.start for r in decode], device=dev)
        slots = torch.tensor([r.slot for r in decode], device=dev)
        read = torch.tensor([r.read for r in decode], device=dev)
        x, conv_state = decode_conv(mixed_qkv[rows], conv[slots, read], conv_weight, conv_bias, activation)
        o, state = decode_rule(*heads(x), g[rows], beta[rows], rec[slots, read])
        out[rows] = o.to(out.dtype)
        conv[slots, 1 - read] = conv_state
        rec[slots, 1 - read] = state
    for run in pool.runs:
        if run.length == 1:
            continue
        span = slice(run.start, run.start + run.length)
        x, conv_state = causal_conv(mixed_qkv[span], conv[run.slot, run.read], conv_weight, conv_bias, activation)
        o, state = gated_delta_rule(*heads(x), g[span], beta[span], rec[run.slot, run.read])
        out[span] = o.to(out.dtype)
        conv[run.slot, 1 - run.read].copy_(conv_state)
        rec[run.slot, 1 - run.read].copy_(state)


@torch.library.custom_op("pcg::linear_attention", mutates_args=("out",))
def linear_attention(mixed_qkv: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, conv_weight: torch.Tensor,
                     conv_bias: torch.Tensor | None, out: torch.Tensor, layer: int, num_k_heads: int, head_k_dim: int,
                     activation: str) -> None:
    """mixed_qkv [T, 2·Hk·Dk + Hv·Dv] (before the conv), beta and g [T, Hv] (g float32), conv_weight [C, K] →
    out [T, Hv, Dv]; the pool's states of the batch's sequences advance."""
    run_split_op(_linear_attention, mixed_qkv, beta, g, conv_weight, conv_bias, out, layer, num_k_heads, head_k_dim,
                 activation)


@linear_attention.register_fake
def _linear_attention_fake(mixed_qkv, beta, g, conv_weight, conv_bias, out, layer, num_k_heads, head_k_dim,
                           activation) -> None:
    return None


register_split_op(torch.ops.pcg.linear_attention, capturable=CAPTURABLE)
