"""int4 MoE experts (pcg_core/quant/layers/experts.py, awq and gptq): each expert quantized as an int4 linear is, held in
the canonical layout stacked over experts; the dequantized weights equal each expert's own Int4Weight exactly
(act-order undone in the weight), the forward tracks the float experts, the grouped path (what CUDA runs) equals
the dense reference, and planted faults (scales given to the next expert, act-order's permutation ignored)
show."""

from __future__ import annotations

import pytest
import torch
from pcg_helpers import routed_experts

from pcg_core.model.experts import pcg_experts_forward
from pcg_core.quant import INT4_SCHEMES
from pcg_core.quant.layers.experts import (_int4_dequantized, grouped_quantized_experts_forward, quantize_experts,
                                    quantized_experts_forward)
from pcg_core.quant.schemes.int4 import quantize_int4_ordered


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral"])
@pytest.mark.parametrize("name", list(INT4_SCHEMES))
def test_int4_experts_hold_each_experts_own_weight_and_track_the_float_experts(arch, name):
    mod, x, idx, w = routed_experts(arch)
    scheme = INT4_SCHEMES[name]
    floats = {p: getattr(mod, p).detach().clone() for p in ("gate_up_proj", "up_proj", "down_proj") if hasattr(mod, p)}
    want = pcg_experts_forward(mod, x, idx, w)
    quantize_experts(mod, scheme)
    assert mod.quant_scheme is scheme and not any(p.dim() == 3 for p in mod.parameters())
    for p, f in floats.items():
        group = scheme.group_for(f.shape[-1])
        for e in (0, f.shape[0] - 1):
            own = quantize_int4_ordered(f[e], group, scheme.sym, scheme.act_order).original()
            assert torch.equal(_int4_dequantized(mod, p, torch.float32, e), own), (p, e)
        assert torch.equal(_int4_dequantized(mod, p, torch.float32)[-1], _int4_dequantized(mod, p, torch.float32, f.shape[0] - 1))
    got = pcg_experts_forward(mod, x, idx, w)  # the registered path dispatches to the quantized forward
    # int4 round-to-nearest in groups of 16–64 at these tiny widths: 0.16–0.22 measured, through two projections
    assert _rel(got, want) < 0.3, f"{arch}/{name}: {_rel(got, want):.3f} from the float experts"
    # planted: each expert's scales given to the next expert
    for p in floats:
        t = getattr(mod, f"{p}_scales")
        t.copy_(t.roll(1, dims=0) * torch.linspace(0.5, 2, mod.num_experts).view(-1, 1, 1))
    assert _rel(pcg_experts_forward(mod, x, idx, w), want) > 0.5, "swapped expert scales went unnoticed"


@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral"])
@pytest.mark.parametrize("name", list(INT4_SCHEMES))
def test_grouped_int4_experts_equal_the_dense_reference(arch, name):
    """The grouped path CUDA runs against the dense reference, both in float32 here; a planted routing fault
    (rows given back to the wrong tokens) must show."""
    mod, x, idx, w = routed_experts(arch)
    quantize_experts(mod, INT4_SCHEMES[name])
    want = quantized_experts_forward(mod, x, idx, w)
    got = grouped_quantized_experts_forward(mod, x, idx, w)
    assert _rel(got, want) < 1e-5, f"{arch}/{name}: {_rel(got, want):.3g}"
    assert _rel(grouped_quantized_experts_forward(mod, x, idx.roll(1, dims=0), w), want) > 0.1


def test_act_order_ignored_in_the_experts_moves_their_output():
    mod, x, idx, w = routed_experts("qwen3-moe")
    quantize_experts(mod, INT4_SCHEMES["gptq"])  # act-order
    want = quantized_experts_forward(mod, x, idx, w)
    mod.down_proj_perm = None  # the codes read in the stored (permuted) K order
    assert _rel(quantized_experts_forward(mod, x, idx, w), want) > 0.3
