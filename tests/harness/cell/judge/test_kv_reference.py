"""The FP8 KV-cache reference's rounding (harness/cell/judge/kv_reference.py): the cache's own math, written apart
from it."""

from __future__ import annotations

import torch

from harness.cell.judge.kv_reference import fake_quant
from pcg_core.attention.kv_cache import dequantize_kv, quantize_kv


def test_fake_quant_agrees_with_the_cache_bitwise_and_saturates():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 37, generator=g) * torch.logspace(-3, 1, 37)  # magnitudes over 4 decades, odd width
    x[0, 0, 0] = 1e4  # past the range: saturates at 448 × scale
    scale = 0.013
    ours = fake_quant(x, scale)
    cache = dequantize_kv(quantize_kv(x, torch.tensor(scale)), torch.tensor(scale), torch.float32)
    assert torch.equal(ours, cache)
    assert float(ours[0, 0, 0]) == (torch.tensor(448.0) * torch.tensor(scale)).item()

