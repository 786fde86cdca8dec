"""Quantized Qwen3-Next and VLM cells, tiny on the CPU: each passes under piecewise and breakable with the reference
layer (eager held to transformers' float32 forward on the float twin, and to the kernels' reference math), and its
quant_layers counts what the scheme quantized: Qwen3-Next's in_proj_qkvz, out_proj, attention, shared-expert
projections and experts (not in_proj_ba nor the scalar shared_expert_gate, which its FP8 checkpoint keeps in 16
bits); a VLM's text linears and experts, never its vision tower."""

import pytest

from harness.cell import CellSpec, run_cell
from harness.outcome import Status

# Tiny Qwen3-Next (2 layers): layer 0 in_proj_qkvz, out_proj; layer 1 q, k, v, o; each experts + 3 shared-expert.
NEXT_LAYERS = 2 + 4 + 2 * 4
# Tiny Qwen3-VL-MoE (2 layers): q, k, v, o and experts each; tiny Qwen2.5-VL: q, k, v, o, gate, up, down each.
VL_MOE_LAYERS, VL_LAYERS = 2 * 5, 2 * 7


def _cell(model: str, quant: str, graph: str):
    return run_cell(CellSpec(model=model, tiny=True, graph=graph, quant=quant, max_tokens=16, max_new_tokens=4))


def _passes(r, quant_layers: int) -> None:
    assert r.status == Status.PASS, r.reason
    assert r.metrics.quant.quant_layers == quant_layers
    assert r.metrics.judge.reference is not None and r.metrics.judge.reference.status == "pass", r.metrics.judge.reference
    assert r.metrics.judge.reference.positions > 0


@pytest.mark.slow
@pytest.mark.parametrize("quant, graph", [("fp8_block", "piecewise"), ("fp8_block", "breakable"),
                                          ("awq", "breakable"), ("nvfp4", "piecewise")])
def test_quantized_qwen3_next_cell_passes(quant, graph):
    _passes(_cell("qwen3-next-80b-a3b", quant, graph), NEXT_LAYERS)


@pytest.mark.slow
@pytest.mark.parametrize("model, quant, graph, layers", [
    ("qwen3-vl-30b-a3b", "fp8_block", "piecewise", VL_MOE_LAYERS),
    ("qwen3-vl-30b-a3b", "int8_w8a8", "breakable", VL_MOE_LAYERS),
    ("qwen2.5-vl-7b", "gptq", "piecewise", VL_LAYERS),
    ("qwen2.5-vl-7b", "fp8_per_token", "breakable", VL_LAYERS),
])
def test_quantized_vlm_cell_passes(model, quant, graph, layers):
    _passes(_cell(model, quant, graph), layers)
