"""Which modules a synthetic Qwen3-Next or VLM quantizes: what their published quantized checkpoints quantize.

Qwen/Qwen3-Next-80B-A3B-Instruct-FP8's quantization_config keeps (modules_to_not_convert) every layer's
linear_attn.in_proj_ba and mlp.shared_expert_gate in 16 bits, beside norms, conv1d, A_log, dt_bias and the router;
its in_proj_qkvz, out_proj, attention, shared-expert projections and experts are FP8. A VLM's vision tower stays
16-bit (Qwen3-VL-30B-A3B-Instruct-FP8 lists every model.visual module). The experts run the quantized experts'
path, whose grouped forward projects through moe_gemm.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from harness.cards import find_card
from pcg_core.model import load_model
from pcg_core.quant import get_scheme, quantize_model, quantized_modules
from pcg_core.quant.kernels import moe_gemm
from pcg_core.quant.layers import experts as quant_experts
from pcg_core.quant.layers.linear import KEPT_16BIT

SCHEMES = ["fp8_block", "fp8_per_token", "int8_w8a8", "awq", "gptq", "nvfp4"]
# Tiny Qwen3-Next: layer 0 Gated DeltaNet, layer 1 gated full attention, both MoE with a shared expert.
SHARED = ("mlp.experts", "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj")
NEXT_QUANTIZED = {f"model.layers.0.{n}" for n in ("linear_attn.in_proj_qkvz", "linear_attn.out_proj", *SHARED)} | {
    f"model.layers.1.{n}" for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", *SHARED)}
NEXT_16BIT = {"model.layers.0.linear_attn.in_proj_ba", "model.layers.0.mlp.shared_expert_gate",
              "model.layers.1.mlp.shared_expert_gate", "lm_head"}


@functools.cache
def _tiny(card: str) -> torch.nn.Module:
    return load_model(find_card(card).config, tiny=True, dtype=torch.float32, device="cpu", seed=0).model


@pytest.fixture(scope="module")
def next_model() -> torch.nn.Module:
    return _tiny("qwen3-next-80b-a3b")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_qwen3_next_quantizes_what_its_checkpoint_does(next_model, scheme):
    model = copy.deepcopy(next_model)
    names = quantize_model(model, get_scheme(scheme))
    assert set(names) == NEXT_QUANTIZED
    assert set(quantized_modules(model)) == NEXT_QUANTIZED  # what the cell counts as quant_layers
    for name in NEXT_16BIT:
        assert type(model.get_submodule(name)) is torch.nn.Linear, name


def test_without_the_keep_list_in_proj_ba_would_be_quantized(next_model, monkeypatch):
    """The check above can fail: with the table emptied, the 64-row in_proj_ba and the scalar gate are quantized."""
    monkeypatch.setitem(KEPT_16BIT, "qwen3_next", ())
    names = set(quantize_model(copy.deepcopy(next_model), get_scheme("fp8_block")))
    assert names - NEXT_QUANTIZED == NEXT_16BIT - {"lm_head"}


@pytest.mark.parametrize("scheme", ["fp8_block", "int8_w8a8", "awq", "nvfp4"])
def test_qwen3_next_experts_run_the_grouped_path_through_moe_gemm(next_model, scheme, monkeypatch):
    """The 512 experts (8 tiny) are quantized in place and their grouped forward (CUDA's) projects through
    moe_gemm.project (on the CPU its dequantized _grouped_mm fallback), matching the dense reference."""
    model = copy.deepcopy(next_model)
    quantize_model(model, get_scheme(scheme))
    experts = model.model.layers[0].mlp.experts
    assert experts.quant_scheme.name == scheme
    calls = []
    project = moe_gemm.project
    monkeypatch.setattr(moe_gemm, "project", lambda *a: (calls.append(1), project(*a))[1])
    torch.manual_seed(0)
    tokens, hidden = 9, model.config.hidden_size
    x = torch.randn(tokens, hidden)
    index = torch.stack([torch.randperm(experts.num_experts)[:2] for _ in range(tokens)])
    weights = torch.rand(tokens, 2)
    got = quant_experts.grouped_quantized_experts_forward(experts, x, index, weights)
    want = quant_experts.quantized_experts_forward(experts, x, index, weights)
    if scheme != "nvfp4":  # FP4 experts have their own grouped forward (fp4_experts.py), also through moe_gemm
        assert len(calls) == 2
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("card", ["qwen3-vl-30b-a3b", "qwen2.5-vl-7b"])
@pytest.mark.parametrize("scheme", ["fp8_block", "awq", "nvfp4"])
def test_a_vlm_quantizes_its_text_model_and_keeps_the_vision_tower_16bit(card, scheme):
    model = copy.deepcopy(_tiny(card))
    visual = {n for n, m in model.named_modules() if type(m) is torch.nn.Linear and n.startswith("model.visual.")}
    text = {n for n, m in model.named_modules() if type(m) is torch.nn.Linear and n.startswith("model.language_model.")}
    text |= {n for n, m in model.named_modules() if quant_experts.is_experts(m)}
    assert visual and text
    names = set(quantize_model(model, get_scheme(scheme)))
    assert names == text
    assert all(type(model.get_submodule(n)) is torch.nn.Linear for n in visual)
