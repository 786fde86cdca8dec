"""The FP8 128×128-block GEMM's scale operands, checked on the CPU through torch's own shape and stride rules (its
meta kernels): every K-block count 1…20 and odd N-block counts are taken in the layout linear.py passes, and the
plain transpose it passed before issue 47 (stride K/128, which cuBLASLt read as if padded to 4) is refused wherever
K/128 is not a multiple of 4 — so a return to it fails here, not only on a GPU (tests/pcg_core/quant/kernels/test_quant_shapes_gpu.py
holds the numbers to the reference there)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import ScalingType, scaled_mm

from pcg_core.quant.kernels.fp8_gemm import block_fp8_mm as _block_fp8_mm, block_weight_scales


def _operands(m: int, nb: int, kb: int):
    fp8 = torch.float8_e4m3fn
    return (torch.empty(m, 128 * kb, dtype=fp8, device="meta"), torch.empty(m, kb, device="meta"),
            torch.empty(128 * nb, 128 * kb, dtype=fp8, device="meta"), torch.empty(nb, kb, device="meta"))


@pytest.mark.parametrize("kb", range(1, 21))
@pytest.mark.parametrize("nb", [1, 7, 8, 37])
def test_every_k_block_count_is_taken(kb, nb):
    assert _block_fp8_mm(*_operands(8, nb, kb)).shape == (8, 128 * nb)


def test_the_scales_keep_their_values_with_k_padded_to_four():
    s = torch.rand(5, 7)
    t = block_weight_scales(s)
    assert t.shape == (8, 5) and t.stride() == (1, 8)
    assert torch.equal(t[:7], s.t()) and not t[7:].any()


@pytest.mark.parametrize("kb", [1, 3, 7, 9])
def test_the_old_transposed_layout_is_refused(kb):
    xq, sx, w, ws = _operands(8, 7, kb)
    with pytest.raises(RuntimeError):
        scaled_mm(xq, w.t(), sx.t().contiguous().t(), ScalingType.BlockWise1x128, ws.t(), ScalingType.BlockWise128x128,
                  output_dtype=torch.bfloat16)
