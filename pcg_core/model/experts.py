"""A capturable MoE expert path, registered with transformers' ExpertsInterface as `pcg`.

transformers' default expert loop uses `nonzero` and data-dependent shapes (a host sync; not capturable).
On CUDA in bf16 we use transformers' own `grouped_mm` path (sort + histc + grouped GEMM: static shapes, no
sync). Elsewhere (CPU, or CUDA in fp32/fp16 where grouped_mm is unavailable under compile) every expert runs
on every token with its routing weight, zero where not routed: more FLOPs, but static and sync-free.
"""

from __future__ import annotations

import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, grouped_mm_experts_forward

from pcg_core.quant.layers.experts import grouped_quantized_experts_forward, quantized_experts_forward
from pcg_core.quant.twin import routed_float_experts_forward

EXPERTS_IMPLEMENTATION = "pcg"


def _dense_masked_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(hidden_states, dtype=torch.float32)
    for e in range(self.num_experts):
        weight = (top_k_weights * (top_k_index == e)).sum(dim=-1, keepdim=True)  # [T, 1], 0 if not routed
        if self.has_gate:
            proj = self._apply_gate(torch.nn.functional.linear(hidden_states, self.gate_up_proj[e]))
        else:
            proj = self.act_fn(torch.nn.functional.linear(hidden_states, self.up_proj[e]))
        proj = torch.nn.functional.linear(proj, self.down_proj[e])
        out += proj.float() * weight.float()
    return out.to(hidden_states.dtype)


def quantized_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor) -> torch.Tensor:
    """Experts quantized in place (pcg_core.quant.layers.experts): the grouped path on CUDA in bf16, the reference
    elsewhere and in a reference twin (`reference_math`, pcg_core.quant.twin: eager only, so the reference runs the
    routed experts alone). Shared by every experts module that holds transformers' layout (transformers' and our own)."""
    kernel = hidden_states.device.type == "cuda" and hidden_states.dtype == torch.bfloat16
    emulated = getattr(module, "row_shards", 1) > 1  # the reference rounds per row-parallel shard (quant_experts.py)
    twin = getattr(module, "reference_math", False)
    if kernel and not twin and not emulated:
        return grouped_quantized_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    return quantized_experts_forward(module, hidden_states, top_k_index, top_k_weights, routed=twin)


def pcg_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    if getattr(self, "float_twin", False):  # a float twin's experts (pcg_core.quant.twin), quantized or not
        return routed_float_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    if getattr(self, "quant_scheme", None) is not None:
        return quantized_forward(self, hidden_states, top_k_index, top_k_weights)
    weights = self.gate_up_proj if self.has_gate else self.up_proj
    if getattr(self, "is_transposed", False) or getattr(self, "has_bias", False) or not getattr(self, "is_concatenated", True):
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    if weights.device.type == "cuda" and weights.dtype == torch.bfloat16:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    return _dense_masked_experts(self, hidden_states, top_k_index, top_k_weights)


ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPLEMENTATION, pcg_experts_forward)
