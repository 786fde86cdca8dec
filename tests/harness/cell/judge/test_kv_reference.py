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
    plain, turned = fake_quant(near * scale, scale) / scale, fake_quant(near * scale, scale, turn=AMBIGUOUS) / scale
    assert torch.equal(plain, torch.cat([grid, upper])) and torch.equal(turned, torch.cat([upper, grid]))
    assert torch.equal(fake_quant(far * scale, scale, turn=AMBIGUOUS), fake_quant(far * scale, scale))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 4096, generator=g)
    changed = (fake_quant(x, scale, turn=AMBIGUOUS) != fake_quant(x, scale)).float().mean()
    # e4m3's step is ≥ 1/16 of a normal value: at most 2 × 16 × AMBIGUOUS of the values sit that near a midpoint
    assert 0 < changed <= 32 * AMBIGUOUS


def test_the_chance_twin_turns_small_values_from_as_far_as_their_rows_scale():
    """`row`: the band is relative to the larger of the value and its row's RMS (a summation order's error scales
    with the row): a small value near a midpoint is turned from further than its own size allows, a large one not."""
    from harness.cell.judge.kv_reference import CHANCE_TWINS

    band = max(b for b, row in CHANCE_TWINS if row)

    scale = 0.5
    small_mid = (0.5 + 0.5625) / 2  # midpoint of two FP8 neighbours, ~1/100 of the row's RMS below
    big = torch.full((1, 63), 64.0)  # exactly representable: never turned
    off = small_mid * (1 + 5 * band)  # past the band relative to itself, within it relative to the row
    x = torch.cat([torch.tensor([[off]]), big], dim=1) * scale
    plain = fake_quant(x, scale)
    assert torch.equal(fake_quant(x, scale, turn=band), plain)  # relative to the value: out of reach
    by_row = fake_quant(x, scale, turn=band, row=True)
    assert by_row[0, 0] != plain[0, 0] and torch.equal(by_row[0, 1:], plain[0, 1:])


def _positions(err: list[float], chance: list[float] | None, flips=()):
    from harness.cell.judge.reference import _Positions

    n = len(err)
    return _Positions(eager=[-1.0 - e for e in err], ref32=[-1.0] * n, ref16=[-1.0] * n, flips=list(flips),
                      where=[f"case[0] position {k}" for k in range(n)], chance=chance)


def _judge(err, chance, flips=()):
    from harness.cell.judge.reference import _judge_transformers
    from harness.metrics import ReferenceCheck

    check = ReferenceCheck(attention="sdpa", kv_cache="fp8_e4m3")
    return check, _judge_transformers(check, _positions(err, chance, flips), "float32")


def test_a_chance_fp8_turn_is_excused_where_the_chance_twin_moves_that_position_and_only_there():
    """Measured on the CPU (2026-12-06d-cpu-fp8-kv-seeds): pcg's eager turned an FP8 rounding the noise twin did
    not, 1e-3 to 0.3 at a few positions and a little at the later positions the turned value's KV reaches."""
    base = [1e-6] * 400
    turn = base[:]
    turn[100:104] = [0.03, 0.002, 2e-4, 2e-4]  # a turn at 100, carried a little further
    reach = [0.0] * 400
    reach[100:104] = [0.02, 0.001, 1e-4, 1e-4]  # the chance twin's own turn moves the same positions
    check, problems = _judge(turn, reach)
    assert not problems and check.chance_turns == 2 and check.positions_over_max == 0, problems
    # the same error where no chance turn reaches: a fault, caught
    check, problems = _judge(turn, [0.0] * 400)
    assert problems and check.positions_over_max == 2 and check.chance_turns == 0
    # without a chance twin (16-bit cache or half precision) nothing changes
    check, problems = _judge(turn, None)
    assert problems and check.chance_turns is None and check.chance_adjusted_mean is None


def test_a_fault_that_moves_every_position_is_not_excused_by_chance():
    """A truncating quantizer or a scale 12.5% off moves every position by tenths of a nat (measured: means 0.2-0.7);
    the chance twin moves positions by ~5e-3 on average: the mean, judged past chance, fails."""
    g = torch.Generator().manual_seed(0)
    chance = (torch.rand(500, generator=g) * 0.01).tolist()
    err = [4 * c + 0.01 for c in chance]  # past each position's chance by a hundredth of a nat: a broad shift
    check, problems = _judge(err, chance)
    assert any("on average beyond what a chance FP8 turn does" in p for p in problems), problems
    assert check.chance_adjusted_mean is not None and abs(check.chance_adjusted_mean - 0.01) < 1e-6
    nan = [float("nan")] + [0.0] * 499
    assert _judge([float("nan")] + [1e-6] * 499, [1.0] * 500)[1] and _judge([0.5] + [1e-6] * 499, nan)[1]


def test_a_greedy_flip_is_a_near_tie_within_the_chance_turn_at_its_position():
    err = [1e-6] * 10
    reach = [0.0] * 10
    reach[7] = 0.002
    flip = [("case[0] output 0: eager 5 vs reference 6", 0.01, 7)]
    assert not _judge(err, reach, flip)[1]  # margin 0.01 ≤ 2 × (1e-3 + 4 × 0.002)
    assert _judge(err, [0.0] * 10, flip)[1]  # no chance turn there: a real flip
