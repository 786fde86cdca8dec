"""The float twin of a quantized model: a float32 copy in which every quantized layer is the float layer it stands
for (weights dequantized, activations no longer quantized).

Why: the judge tells padding *noise* from a padding *leak* by running the model in float32, padded and unpadded
(harness/cell/padding.py), where rounding differs by ~1e-7 and a leak keeps its size. A quantized model cannot
show that: its activation quantizers turn a 1e-7 change into a whole rounding step. Every activation quantizer
here is row-local (per token, per token and 128-group, or a static scale), so padding rows cannot reach real
rows through them; whatever else the model does with padding is the same in the twin, which has no quantizer.

Quantized experts stay as they are held (their codes shared with the quantized model, not copied) and run
`routed_float_experts_forward`: each routed expert's weight dequantized in float32 when it runs. A float32 copy of
the experts would not fit beside the cells sharing a GPU (DeepSeek-V3's one MoE layer: 45 GB; Qwen3-235B's two
layers ran out of memory with 8 cells on the H200), and the float experts' float32 forward would run every expert on
every token. The twin is only ever run eagerly, so which experts run may be read on the host.
"""

from __future__ import annotations

import copy

import torch

from pcg_core.quant import experts as quant_experts
from pcg_core.quant.expert_layout import add_bias, first_projection


def _quantized_linear(module: torch.nn.Module) -> bool:
    """QuantLinear, Int4Linear (W4A8Linear), Fp4Linear: a layer that holds codes and can give its float weight."""
    return not isinstance(module, torch.nn.Linear) and callable(getattr(module, "dequantized_weight", None)) \
        and hasattr(module, "in_features") and hasattr(module, "out_features")


def _quantized_experts(module: torch.nn.Module) -> bool:
    return getattr(module, "quant_scheme", None) is not None and hasattr(module, "num_experts")


def _as_linear(module: torch.nn.Module) -> torch.nn.Linear:
    w = module.dequantized_weight().float()
    bias = getattr(module, "bias", None)
    lin = torch.nn.Linear(module.in_features, module.out_features, bias=bias is not None, device=w.device,
                          dtype=torch.float32)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias is not None:
            lin.bias.copy_(bias.float())
    return lin.requires_grad_(False)


def float_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy of `model` with every quantized linear an nn.Linear of its dequantized weight and every
    quantized experts module a twin (`float_twin`: routed_float_experts_forward over its codes, shared with
    `model`'s). The caller's model is not touched."""
    shared = {id(t): t for m in model.modules() if _quantized_experts(m) for t in m.buffers()}
    twin = copy.deepcopy(model, shared)
    held = []  # the experts' buffers kept out of .float(): codes and scales as the forward reads them
    for name, module in list(twin.named_modules()):
        if _quantized_experts(module):
            module.float_twin = True
            held.append((module, dict(module._buffers)))
            module._buffers.clear()
        elif _quantized_linear(module) and name:
            parent_name, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent_name) if parent_name else twin, child, _as_linear(module))
    twin = twin.float()
    for module, buffers in held:
        module._buffers.update(buffers)
    return twin


@torch.no_grad()
def routed_float_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                 top_k_weights: torch.Tensor) -> torch.Tensor:
    """The float experts these quantized ones stand for, in float32: each routed expert's tokens through its
    weights dequantized (experts.expert_weight), biases added, the module's own gate or activation, no activation
    quantizer; each token's experts summed in expert order (ids outside the experts skipped). Eager only (the
    routed experts read on the host)."""
    first, gated = first_projection(module)
    x = hidden_states.float()
    out = torch.zeros_like(x)
    for e in torch.unique(top_k_index).tolist():
        if not 0 <= e < module.num_experts:  # a slot routed nowhere (as the dense reference ignores it)
            continue
        tokens, slots = torch.nonzero(top_k_index == e, as_tuple=True)
        h = add_bias(x[tokens] @ quant_experts.expert_weight(module, first, e).t(), module, first, e)
        h = module._apply_gate(h) if gated else module.act_fn(h)
        y = add_bias(h @ quant_experts.expert_weight(module, "down_proj", e).t(), module, "down_proj", e)
        out.index_add_(0, tokens, y * top_k_weights[tokens, slots, None].float())
    return out.to(hidden_states.dtype)
