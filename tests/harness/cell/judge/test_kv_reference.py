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


def test_the_noise_twin_turns_exactly_the_values_a_summation_order_could_turn():
    """`turn` rounds to the other FP8 neighbour the values within AMBIGUOUS of a midpoint, and no other."""
    from harness.cell.judge.kv_reference import AMBIGUOUS

    scale = 0.5  # a power of two: x / scale and back are exact
    grid = torch.tensor([0.5, 1.0, 1.125, 3.0, 14.0, 96.0, 416.0])  # FP8 values and their upper neighbours' midpoints
    upper = torch.tensor([0.5625, 1.125, 1.25, 3.25, 15.0, 104.0, 448.0])
    mid = (grid + upper) / 2
    near = torch.cat([mid * (1 - 0.3 * AMBIGUOUS), mid * (1 + 0.3 * AMBIGUOUS)])  # either side, within reach
    far = torch.cat([mid * (1 - 30 * AMBIGUOUS), grid, -grid])  # out of reach, or exactly representable
    plain, turned = fake_quant(near * scale, scale) / scale, fake_quant(near * scale, scale, turn=True) / scale
    assert torch.equal(plain, torch.cat([grid, upper])) and torch.equal(turned, torch.cat([upper, grid]))
    assert torch.equal(fake_quant(far * scale, scale, turn=True), fake_quant(far * scale, scale))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 4096, generator=g)
    changed = (fake_quant(x, scale, turn=True) != fake_quant(x, scale)).float().mean()
    # e4m3's step is ≥ 1/16 of a normal value: at most 2 × 16 × AMBIGUOUS of the values sit that near a midpoint
    assert 0 < changed <= 32 * AMBIGUOUS
