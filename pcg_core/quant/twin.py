"""The float twin of a quantized model: a float32 copy in which every quantized layer is the float layer it stands
for (weights dequantized, activations no longer quantized).

Why: the judge tells padding *noise* from a padding *leak* by running the model in float32, padded and unpadded
(harness/cell/padding.py), where rounding differs by ~1e-7 and a leak keeps its size. A quantized model cannot
show that: its activation quantizers turn a 1e-7 change into a whole rounding step. Every activation quantizer
here is row-local (per token, per token and 128-group, or a static scale), so padding rows cannot reach real
rows through them; whatever else the model does with padding is the same in the twin, which has no quantizer.
"""

from __future__ import annotations

import copy

import torch

from pcg_core.quant.experts import PROJECTIONS, dequantized_experts_weight


def _quantized_linear(module: torch.nn.Module) -> bool:
    """QuantLinear, Int4Linear (W4A8Linear), Fp4Linear: a layer that holds codes and can give its float weight."""
    return not isinstance(module, torch.nn.Linear) and callable(getattr(module, "dequantized_weight", None)) \
        and hasattr(module, "in_features") and hasattr(module, "out_features")


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


def _dequantize_experts(module: torch.nn.Module) -> None:
    """The experts' projections back as float32 parameters in the module's own layout; the scheme dropped, so its
    forward is the float one again (the quantization buffers beside them are left unused)."""
    for name in PROJECTIONS:
        if not isinstance(getattr(module, name, None), torch.Tensor):
            continue
        w = dequantized_experts_weight(module, name, torch.float32)
        module._buffers.pop(name, None)
        module.register_parameter(name, torch.nn.Parameter(w, requires_grad=False))
    module.quant_scheme = None


def float_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy of `model` with every quantized linear an nn.Linear of its dequantized weight and every
    quantized experts module holding its dequantized weights. The caller's model is not touched."""
    twin = copy.deepcopy(model)
    for name, module in list(twin.named_modules()):
        if getattr(module, "quant_scheme", None) is not None and hasattr(module, "num_experts"):
            _dequantize_experts(module)
            continue
        if _quantized_linear(module) and name:
            parent_name, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent_name) if parent_name else twin, child, _as_linear(module))
    return twin.float()
