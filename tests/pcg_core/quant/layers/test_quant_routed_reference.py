"""The experts' reference in a twin runs only the routed experts on their routed rows
(pcg_core/quant/layers/expert_layout.py: expert_rows): the same numbers as every expert on every token weighted 0
where not routed — the loop the engine runs off the GPU kernels, static and capturable — at a fraction of the
launches, which were most of a quantized MoE cell's reference layer on the GPU (Qwen3-30B-A3B:4, H100: 175–213 s of
~300 s)."""

from __future__ import annotations

import pytest
import torch
from pcg_helpers import routed_experts

from pcg_core.model.experts import pcg_experts_forward
from pcg_core.quant.layers import experts as quant_experts
from pcg_core.quant.layers import fp4_experts
from pcg_core.quant.layers.experts import quantize_experts, quantized_experts_forward
from pcg_core.quant.layers.fp4_experts import quantize_experts_fp4
from pcg_core.quant.schemes.fp4 import FP4_SCHEMES
from pcg_core.quant.schemes.w8a8 import get_scheme
from pcg_core.quant.twin import reference_twin

SCHEMES = ["fp8_per_tensor", "fp8_per_token", "fp8_block", "int8_w8a8", "awq", "gptq", "w4a8", "nvfp4"]
# Relative (norm) difference allowed between the two loops in float32: a GEMM over fewer rows may sum in another
# order, and a 1e-7 change can turn an 8-bit activation's rounding step (here ~1e-7 everywhere; at Qwen3-30B-A3B's
# widths, fp8_block, 2.2e-5 at 16 tokens and 1.4e-4 at 64: benchmarks/reference_experts.py). A wrong row moves it by ~1.
SAME = 1e-4


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _quantized(name: str):
    """A tiny Qwen3-MoE experts module quantized with `name`, 16 tokens routed to 2 of its experts each, one slot
    routed nowhere (-1), and a few experts routed no token."""
    mod, x, idx, w = routed_experts("qwen3-moe")
    scheme = get_scheme(name)
    if name in FP4_SCHEMES:
        quantize_experts_fp4(mod, scheme)
    else:  # 8-bit and int4 (quantize_experts hands int4 on); static schemes' input scales from these absmaxes
        quantize_experts(mod, scheme, input_absmax={"gate_up": 4.0, "down": 4.0})
    idx = idx % (mod.num_experts - 3)  # the last three experts routed nothing
    idx[0, 1] = -1
    return mod, x, idx, w


def _experts_run(monkeypatch, name: str) -> list[int]:
    """Which experts the reference computes, in order (their first projection's weight dequantized)."""
    seen: list[int] = []
    if name in FP4_SCHEMES:
        real = fp4_experts.fp4_dequantized
        monkeypatch.setattr(fp4_experts, "fp4_dequantized", lambda m, p, dt, e=None: (
            seen.append(e) if p != "down_proj" else None) or real(m, p, dt, e))
    else:
        real_project = quant_experts._project
        monkeypatch.setattr(quant_experts, "_project", lambda x, m, p, e, k=slice(None): (
            seen.append(e) if p != "down_proj" else None) or real_project(x, m, p, e, k))
    return seen


@pytest.mark.parametrize("name", SCHEMES)
def test_the_routed_reference_computes_what_every_expert_on_every_token_does(name, monkeypatch):
    mod, x, idx, w = _quantized(name)
    seen = _experts_run(monkeypatch, name)
    dense = quantized_experts_forward(mod, x, idx, w)
    assert seen == list(range(mod.num_experts))
    seen.clear()
    routed = quantized_experts_forward(mod, x, idx, w, routed=True)
    want = sorted(e for e in set(idx.flatten().tolist()) if e >= 0)
    assert seen == want and len(want) < mod.num_experts  # only the routed experts, in expert order
    assert dense.abs().max() > 0 and _rel(routed, dense) < SAME, name


def test_a_routed_reference_reading_the_wrong_rows_is_told_apart(monkeypatch):
    """Planted: each expert's routed rows off by one token (an index a gather could get wrong) must not pass the
    comparison above."""
    mod, x, idx, w = _quantized("fp8_block")
    dense = quantized_experts_forward(mod, x, idx, w)
    real = quant_experts.rows_of
    monkeypatch.setattr(quant_experts, "rows_of", lambda t, rows: real(t, None if rows is None else (rows + 1) % t.shape[0]))
    shifted = quantized_experts_forward(mod, x, idx, w, routed=True)
    assert _rel(shifted, dense) > 100 * SAME


@pytest.mark.parametrize("name", ["fp8_block", "gptq", "nvfp4"])
def test_a_reference_twin_runs_the_routed_experts_alone_and_the_model_every_expert(name, monkeypatch):
    """The dispatch (pcg_core/model/experts.py): the reference twin's experts take the routed loop; the model's own
    (off the GPU kernels, where it may be captured) keeps every expert on every token."""
    mod, x, idx, w = _quantized(name)
    twin = reference_twin(torch.nn.ModuleList([mod]))[0]
    seen = _experts_run(monkeypatch, name)
    twin_out = pcg_experts_forward(twin, x, idx, w)
    assert seen == sorted(e for e in set(idx.flatten().tolist()) if e >= 0)
    seen.clear()
    model_out = pcg_experts_forward(mod, x, idx, w)
    assert seen == list(range(mod.num_experts))
    assert _rel(twin_out, model_out) < SAME
