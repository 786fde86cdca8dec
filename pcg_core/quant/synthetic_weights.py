"""Synthetic weights shaped like a real checkpoint's, so that quantization scales differ from block to block.

Why (issue 47): `randn · K^-½` weights have near-uniform scales: every 128×128 block's absmax is ~4σ within a few
per cent, so a kernel that reads another block's scale (a wrong stride, a shift along K, a transposed grid) is off
by only ~0.1 relative, and a test on such weights says little about the indexing. A trained model's scales vary
10-100× across rows, input channels and blocks, and it has rare large entries. `structured_weight` draws such a
weight; `make_realistic_` gives a synthetic model's float weights the same structure in place (RMS kept, so its
activations stay in range) before it is quantized.

The structure of an (N out, K in) weight: W[i, j] = base[i, j] · r[i] · c[j], with
- r: a factor per 128-row block times one per row (per-channel scales vary, and so do the rows inside one
  128×128 block);
- c: a factor per 128-column block times one per 16-column group, along K, the INPUT axis, which block and
  group scales run along (so groups of 16, 32 and 128 all see varying scales, and 128×128 blocks vary along both
  axes);
- each factor's log is a block term and a fine term, uniform over ⅔ and ⅓ of log(spread) (stratified draws, so
  the range is there whatever the seed): a factor spans up to `spread`, 128-blocks differ by up to spread^⅔ in
  each direction, and 128×128 block scales by 10-100× over a grid of a real layer's size;
- outliers: a fraction `outlier_frac` of entries set to ±(10-30)× their local RMS (r[i]·c[j] times the base
  RMS), random signs. Local, not the whole row's: a row's RMS is set by its largest column factors, so outliers
  of 10-30× that sit in nearly every 128×128 block (~16 each at 0.1%) and make every block's scale the outlier's,
  flat along K — exactly what hides a K-indexing fault (measured at 1024×896: a one-block shift along K then
  moves the GEMM by 0.16-0.35 relative instead of 0.55-1.26).
Deterministic under the generator (on one device: CPU and CUDA generators draw different streams).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from pcg_core.quant.layers.expert_layout import in_out
from pcg_core.quant.layers.experts import PROJECTIONS, is_experts

ROW_BLOCK = 128  # 128×128 weight blocks (schemes.BLOCK), and the rows that share a block's scale
COL_BLOCK = 128
COL_GROUP = 16  # the smallest scale group along K (NVFP4); 32 (MXFP4) and 128 (int4, 1×128) are multiples of it
COARSE_SHARE = 2 / 3  # of log(spread): the per-block term; the rest is the per-row / per-group term
OUTLIER_RANGE = (10.0, 30.0)  # outliers' magnitude, in units of their local RMS


class WeightStructure(NamedTuple):
    """The multiplicative structure of an (N, K) weight: row factors r [N], column factors c [K] (both in
    [1, spread]), and the outliers as flat indices into N·K with their signed magnitudes (units of local RMS)."""

    rows: torch.Tensor
    cols: torch.Tensor
    outlier_index: torch.Tensor
    outlier_value: torch.Tensor


def _stratified(count: int, g: torch.Generator, device: torch.device | str | None) -> torch.Tensor:
    """[count] uniforms in [0, 1), one in each of `count` equal strata, in random order: uniform each, and their
    range always spans (count − 2)/count of the interval, so even 7 blocks (K = 896) differ by most of the span,
    whatever the seed (independent draws left some seeds' 8×7 block grids within 15× of each other)."""
    return (torch.randperm(count, generator=g, device=device) + torch.rand(count, generator=g, device=device)) / count


def _log_uniform(coarse: int, fine: int, size: int, span: float, g: torch.Generator,
                 device: torch.device | str | None) -> torch.Tensor:
    """[size] factors exp(span · (⅔·u_block + ⅓·u_fine)): one u per `coarse` block, one per `fine` run."""
    ub, uf = _stratified(-(-size // coarse), g, device), _stratified(-(-size // fine), g, device)
    u = COARSE_SHARE * ub.repeat_interleave(coarse)[:size] + (1 - COARSE_SHARE) * uf.repeat_interleave(fine)[:size]
    return torch.exp(span * u)


def weight_structure(n: int, k: int, *, generator: torch.Generator, device: torch.device | str | None = None,
                     spread: float = 30.0, outlier_frac: float = 1e-3) -> WeightStructure:
    """The structure (module docstring) of one (N, K) weight, drawn from `generator` (on `device`)."""
    if spread < 1:
        raise ValueError(f"spread is a ratio ≥ 1, got {spread}")
    span = math.log(spread)
    rows = _log_uniform(ROW_BLOCK, 1, n, span, generator, device)
    cols = _log_uniform(COL_BLOCK, COL_GROUP, k, span, generator, device)
    count = round(outlier_frac * n * k)
    index = torch.randint(0, max(1, n * k), (count,), generator=generator, device=device)
    lo, hi = OUTLIER_RANGE
    mag = lo + (hi - lo) * torch.rand(count, generator=generator, device=device)
    sign = torch.where(torch.rand(count, generator=generator, device=device) < 0.5, -1.0, 1.0)
    return WeightStructure(rows, cols, index, mag * sign)


def shape_(w: torch.Tensor, s: WeightStructure) -> torch.Tensor:
    """w (N, K), any float dtype, any strides (a transposed expert's view too), multiplied in place by the
    structure's rows and columns, its outliers set, then rescaled to its own RMS before. Returns w."""
    n, k = w.shape
    rms = w.detach().float().pow(2).mean().sqrt()
    w.mul_(s.rows[:, None].to(w.dtype)).mul_(s.cols[None, :].to(w.dtype))
    if s.outlier_index.numel():
        i, j = s.outlier_index // k, s.outlier_index % k
        w[i, j] = (s.outlier_value * s.rows[i] * s.cols[j] * rms).to(w.dtype)
    now = w.detach().float().pow(2).mean().sqrt()
    w.mul_(torch.where(now > 0, rms / now, torch.ones_like(now)).to(w.dtype))
    return w


def structured_weight(n: int, k: int, *, generator: torch.Generator, device: torch.device | str | None = None,
                      dtype: torch.dtype = torch.float32, spread: float = 30.0,
                      outlier_frac: float = 1e-3) -> torch.Tensor:
    """An (N, K) weight like a trained checkpoint's: `randn · K^-½` (its RMS kept) shaped by weight_structure."""
    s = weight_structure(n, k, generator=generator, device=device, spread=spread, outlier_frac=outlier_frac)
    w = torch.randn(n, k, generator=generator, device=device) * k**-0.5
    return shape_(w, s).to(dtype)


def make_realistic_(model: torch.nn.Module, seed: int, skip: tuple[str, ...] = ("lm_head",), *,
                    spread: float = 30.0, outlier_frac: float = 1e-3) -> int:
    """Shape in place every float nn.Linear weight of `model` (names ending in `skip` left alone) and every fused
    MoE experts module's stacked projections, expert by expert along each one's own K (input) axis, whatever the
    layout ([E, N, K], or gpt-oss's transposed [E, K, N]); each keeps its RMS. Returns how many tensors were shaped
    (a linear's weight: one; an experts projection: one for all its experts). Seeded per tensor, in module order, on
    the tensor's device."""
    seen: set[int] = set()  # a weight shared by two modules (tied) is shaped once
    shaped = 0
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.endswith(skip):
                continue
            if isinstance(mod, torch.nn.Linear):
                views: list[tuple[str, torch.Tensor | None, bool]] = [("weight", mod.weight, False)]
            elif is_experts(mod):
                views = [(p, getattr(mod, p, None), getattr(mod, "is_transposed", False)) for p in PROJECTIONS]
            else:
                continue
            for proj, w, transposed in views:
                if not isinstance(w, torch.Tensor) or not w.is_floating_point() or id(w) in seen:
                    continue
                seen.add(id(w))
                g = torch.Generator(device=w.device).manual_seed(seed * 1_000_003 + shaped)
                experts = [w] if w.dim() == 2 else [w[e].t() if transposed else w[e] for e in range(w.shape[0])]
                n, k = w.shape if w.dim() == 2 else in_out(mod, proj)
                for view in experts:  # each expert its own structure, drawn in turn from the tensor's generator
                    shape_(view, weight_structure(n, k, generator=g, device=w.device, spread=spread,
                                                  outlier_frac=outlier_frac))
                shaped += 1
    return shaped
