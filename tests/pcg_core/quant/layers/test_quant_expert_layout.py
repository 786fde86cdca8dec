"""Every expert's weight dequantized at once (the grouped forwards, a float twin) is built chunk by chunk of experts
(pcg_core/quant/layers/expert_layout.py: dequantize_by_chunks), so a big MoE layer's float32 temporaries stay one chunk's:
the chunked result equals the one-shot result bitwise for every scheme family, and a chunk written at the wrong
experts shows."""

from __future__ import annotations

import pytest
import torch
from pcg_helpers import routed_experts

from pcg_core.quant.layers import expert_layout
from pcg_core.quant.layers.expert_layout import dequantize_by_chunks
from pcg_core.quant.layers.experts import _all_dequantized, quantize_experts
from pcg_core.quant.schemes.fp4 import FP4_SCHEMES
from pcg_core.quant.layers.fp4_experts import fp4_dequantized, quantize_experts_fp4
from pcg_core.quant.schemes.w8a8 import get_scheme


def test_chunks_cover_every_expert_once(monkeypatch):
    w = torch.randn(7, 3, 4)
    monkeypatch.setattr(expert_layout, "DEQUANT_CHUNK_ELEMENTS", 2 * 12)  # two experts a chunk: 4 chunks, the last short
    seen = []
    got = dequantize_by_chunks(lambda sel: seen.append(sel) or w[sel] * 2, 7, 3, 4, torch.float32, w.device)
    assert torch.equal(got, w * 2)
    assert [(s.start, s.stop) for s in seen] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    # planted: each chunk dequantized from the experts before it (an offset lost) must not pass
    shifted = dequantize_by_chunks(lambda sel: w[max(0, sel.start - 1):sel.stop - 1] * 2 if sel.start else w[sel] * 2,
                                   7, 3, 4, torch.float32, w.device)
    assert not torch.equal(shifted, w * 2)


@pytest.mark.parametrize("name", ["fp8_per_tensor", "fp8_per_token", "fp8_block", "int8_w8a8", "awq", "gptq", "w4a8",
                                  "nvfp4"])
def test_chunked_equals_one_shot(name, monkeypatch):
    mod, *_ = routed_experts("qwen3-moe")
    scheme = get_scheme(name)
    if name in FP4_SCHEMES:
        quantize_experts_fp4(mod, scheme)
        whole = lambda p: fp4_dequantized(mod, p, torch.bfloat16)  # noqa: E731
    else:
        absmax = {"gate_up": 4.0, "down": 4.0}  # static schemes' input scales: not read by the weights' dequantization
        quantize_experts(mod, scheme, input_absmax=absmax)
        whole = lambda p: _all_dequantized(mod, p, torch.bfloat16)  # noqa: E731
    for p in ("gate_up_proj", "down_proj"):
        monkeypatch.setattr(expert_layout, "DEQUANT_CHUNK_ELEMENTS", 1 << 40)
        one_shot = whole(p)
        per_expert = one_shot[0].numel()
        monkeypatch.setattr(expert_layout, "DEQUANT_CHUNK_ELEMENTS", 3 * per_expert)  # 3 experts a chunk
        chunked = whole(p)
        assert mod.num_experts > 3 and torch.equal(chunked, one_shot), (name, p)
        assert chunked.abs().sum() > 0
