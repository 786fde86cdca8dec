"""pcg_core/quant/synthetic_weights.py: weights whose quantization scales vary as a trained checkpoint's do, and a
planted scale-indexing fault that they expose where `randn · K^-½` weights all but hide it (issue 47)."""

from __future__ import annotations

import pytest
import torch
from pcg_helpers import tiny_model

from pcg_core.quant.layers.expert_layout import canonical_weight, in_out
from pcg_core.quant.layers.experts import PROJECTIONS, is_experts
from pcg_core.quant.schemes.w8a8 import SCHEMES, quantize_weight, reference_linear
from pcg_core.quant.synthetic_weights import make_realistic_, structured_weight, weight_structure


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ratio(t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return t.max() / t.min() if dim is None else t.amax(dim) / t.amin(dim)


# --- the structure ---------------------------------------------------------------------------------------------
# Thresholds: measured over seeds 0-7 at the shapes below, then set with margin (the seeds here are a subset).
# 128×128 block scales of 1024×896 (an 8×7 grid): max/min 42-117, median ratio along K 6.5-12 and along N 6.3-9.9.
# Group absmax along K of 1024×2048, median over rows: groups of 16 62-82, 32 41-56, 128 19-28; channels 144-229.


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_scales_differ_across_the_grid_in_both_directions(seed):
    _, scale = quantize_weight(structured_weight(1024, 896, generator=_gen(seed)), SCHEMES["fp8_block"])
    assert scale.shape == (8, 7)
    assert _ratio(scale) >= 10
    assert _ratio(scale, 1).median() >= 3 and _ratio(scale, 0).median() >= 3  # along K, along N


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("group", [16, 32, 128])
def test_group_scales_differ_along_k(seed, group):
    w = structured_weight(1024, 2048, generator=_gen(seed))
    absmax = w.abs().view(1024, 2048 // group, group).amax(-1)
    assert _ratio(absmax, 1).median() >= 10, f"group {group}"


def test_channel_scales_differ_across_rows():
    _, scale = quantize_weight(structured_weight(1024, 2048, generator=_gen(0)), SCHEMES["int8_w8a8"])
    assert _ratio(scale) >= 10


@pytest.mark.parametrize("frac", [1e-3, 4e-3])
def test_outliers_are_the_fraction_asked_for_and_10_to_30_local_rms(frac):
    """Divided by its row and column factors the weight is Gaussian but for the outliers: count the entries past 8σ
    (a Gaussian's share there is ~1e-15)."""
    n, k = 1024, 2048
    w = structured_weight(n, k, generator=_gen(3), outlier_frac=frac)
    s = weight_structure(n, k, generator=_gen(3), outlier_frac=frac)  # the same draws, first in the generator
    z = w / (s.rows[:, None] * s.cols[None, :])
    sigma = z.abs().median() / 0.6745
    big = z.abs() > 8 * sigma
    assert frac / 2 <= float(big.float().mean()) <= 2 * frac
    assert float(z.abs().max() / sigma) <= 31


def test_deterministic_under_the_generator_and_rms_kept():
    a = structured_weight(300, 200, generator=_gen(5), dtype=torch.bfloat16)
    assert a.dtype == torch.bfloat16 and a.shape == (300, 200)
    assert torch.equal(a, structured_weight(300, 200, generator=_gen(5), dtype=torch.bfloat16))
    assert not torch.equal(a, structured_weight(300, 200, generator=_gen(6), dtype=torch.bfloat16))
    w = structured_weight(512, 640, generator=_gen(0))
    assert float(w.pow(2).mean().sqrt()) == pytest.approx(640**-0.5, rel=0.02)  # randn · K^-½'s RMS
    assert bool(structured_weight(7, 5, generator=_gen(0), outlier_frac=0.0).isfinite().all())  # ragged blocks


# --- make_realistic_ on a synthetic model --------------------------------------------------------------------------


def _shaped_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What make_realistic_ is to shape (every Linear's weight but lm_head's, every experts projection), cloned."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and not name.endswith("lm_head"):
            out[f"{name}.weight"] = mod.weight.detach().clone()
        elif is_experts(mod):
            out.update({f"{name}.{p}": getattr(mod, p).detach().clone() for p in PROJECTIONS
                        if isinstance(getattr(mod, p, None), torch.Tensor)})
    return out


def _column_pattern(ratio: torch.Tensor) -> torch.Tensor:
    """c[j] (up to a constant) of ratio ≈ r[i]·c[j] (outliers aside): each row divided by its median, then the
    median over rows."""
    return (ratio / ratio.median(dim=1, keepdim=True).values).median(dim=0).values


def _assert_structure_along_k(before: torch.Tensor, after: torch.Tensor, what: str) -> None:
    """after / before, in the canonical (N, K) orientation, is rank one with its column factor constant over runs
    of 16 along K and varying between them: the structure lies along the input axis."""
    ok = before.abs() > 1e-3 * before.pow(2).mean().sqrt()
    ratio = torch.where(ok, after / torch.where(ok, before, 1.0), float("nan"))
    ratio = torch.where(ratio.isnan(), ratio.nanmedian(), ratio)  # the few near-zero entries: neutral
    cols = _column_pattern(ratio)
    runs = cols.view(-1, 16)
    assert float((_ratio(runs, 1) - 1).abs().max()) < 1e-3, f"{what}: column factor not constant over 16 columns"
    assert float(_ratio(runs.mean(1))) > 1.3, f"{what}: column factor flat along K"
    rows = (ratio / cols).median(dim=1, keepdim=True).values  # exact wherever fewer than half a row is outliers
    fitted = rows * cols
    assert float(((fitted - ratio).abs() <= 1e-3 * ratio.abs()).float().mean()) > 0.99, f"{what}: not rows × columns"


@pytest.mark.parametrize("arch", ["qwen3-moe", "gpt-oss"])  # experts [E, N, K], and gpt-oss's transposed [E, K, N]
def test_make_realistic_shapes_every_linear_but_lm_head_and_the_experts_along_k(arch):
    lm = tiny_model(arch)
    model = lm.model
    before = _shaped_tensors(model)
    lm_head = model.lm_head.weight.detach().clone()
    assert make_realistic_(model, seed=0) == len(before)
    assert torch.equal(model.lm_head.weight, lm_head)
    after = _shaped_tensors(model)
    mods = dict(model.named_modules())
    for key, old in before.items():
        new = after[key]
        assert not torch.equal(new, old), key
        owner, _, attr = key.rpartition(".")
        mod = mods[owner]
        if attr == "weight":
            pairs = [(old, new)]
        else:  # each expert in its canonical (N, K) orientation, as a linear layer holds it
            transposed = getattr(mod, "is_transposed", False)
            n, k = in_out(mod, attr)
            pairs = [(o.t() if transposed else o, w.t() if transposed else w) for o, w in zip(old, new)]
            assert all(p[1].shape == (n, k) for p in pairs)
            assert torch.equal(pairs[0][1], canonical_weight(mod, attr, 0))
        for i, (o, w) in enumerate(pairs):
            rms_old, rms_new = o.pow(2).mean().sqrt(), w.pow(2).mean().sqrt()
            assert float(rms_new) == pytest.approx(float(rms_old), rel=1e-5), f"{key}[{i}]: RMS"
            _assert_structure_along_k(o, w, f"{key}[{i}]")


def test_make_realistic_is_seeded_works_in_bf16_and_skips_by_name():
    a, b, c = (tiny_model("qwen3-moe", dtype=torch.bfloat16).model for _ in range(3))
    before = _shaped_tensors(a)
    assert make_realistic_(a, seed=1) == make_realistic_(b, seed=1) == len(before)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    make_realistic_(c, seed=2)
    assert not torch.equal(c.model.layers[0].self_attn.q_proj.weight, a.model.layers[0].self_attn.q_proj.weight)
    after = _shaped_tensors(a)
    for key, old in before.items():  # RMS kept within bf16 rounding
        rms_old, rms_new = (float(t.float().pow(2).mean().sqrt()) for t in (old, after[key]))
        assert rms_new == pytest.approx(rms_old, rel=2e-2), key
    d = tiny_model("qwen2").model
    q_proj = d.model.layers[0].self_attn.q_proj.weight.detach().clone()
    assert make_realistic_(d, seed=0, skip=("lm_head", "q_proj")) == len(_shaped_tensors(d)) - 2  # 2 layers
    assert torch.equal(d.model.layers[0].self_attn.q_proj.weight, q_proj)


# --- a planted fault these weights expose ------------------------------------------------------------------------


def _wrong_stride(scale: torch.Tensor) -> torch.Tensor:
    """The (N/128, K/128) block-scale grid read as cuBLASLt read the old operand (issue 47): with a row stride of
    round_up(K/128, 4) instead of K/128, so row i starts i·(L4 − K/128) scales late (reads past the end wrap to
    the grid again: on the GPU they were other memory)."""
    nb, kb = scale.shape
    return torch.cat([scale.flatten()] * 2).as_strided((nb, kb), (-(-kb // 4) * 4, 1))


FAULTS = {"row stride round_up(K/128, 4)": _wrong_stride, "blocks shifted by one along K": lambda s: s.roll(-1, 1)}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_misread_block_scale_grid_is_large_on_structured_weights_and_small_on_randn(fault):
    """The fp8_block GEMM with its weight scales misread, against the same GEMM read right. Measured at 1024×896
    (K/128 = 7, not a multiple of 4), seeds 0-7: structured weights 0.55-1.26 relative (a scale 10-100× off moves
    its whole block), randn · K^-½ 0.08-0.10 (every block's absmax ~4σ within a few per cent, so any other block's
    scale is nearly right). Thresholds with ~2× and ~1.5× margin: > 0.3 and < 0.15 — a test on randn weights sees
    such a fault only ~10× above the kernels' 1e-2 tolerance, and a subtler one not at all."""
    s = SCHEMES["fp8_block"]
    x = torch.randn(64, 896, generator=_gen(9))
    for seed in (0, 1):
        for kind, w in (("structured", structured_weight(1024, 896, generator=_gen(seed))),
                        ("randn", torch.randn(1024, 896, generator=_gen(seed)) * 896**-0.5)):
            q, scale = quantize_weight(w, s)
            want = reference_linear(x, q, scale, s)
            got = reference_linear(x, q, FAULTS[fault](scale), s)
            rel = float((got - want).norm() / want.norm())
            if kind == "structured":
                assert rel > 0.3, f"seed {seed}: {rel:.3g}"
            else:
                assert rel < 0.15, f"seed {seed}: {rel:.3g}"
