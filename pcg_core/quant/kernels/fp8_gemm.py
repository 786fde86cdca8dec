"""The FP8 GEMMs on CUDA: cuBLASLt through torch's scaled-mm ops, for every FP8 weight layout pcg runs.

- `scaled_fp8_mm`: per-tensor or row-wise scales (fp8_per_tensor, fp8_per_token), fast accumulation as the
  serving engines' FP8 GEMMs run on Hopper.
- `block_fp8_mm`: 128×128 weight blocks × 1×128 activation groups (fp8_block, DeepSeek-V3's layout), through
  `scaled_mm` with the recipes named and the weight scales in the layout cuBLASLt reads (`block_weight_scales`).
- `block_scaled_mm`: 1×128 groups on both sides (W4AFP8 after its int4 weight is converted to FP8).

No reference lives here: schemes/w8a8.py's `reference_linear` is the plain math each of these is held to (the
GPU tests in tests/pcg_core/quant/kernels/test_quant_gpu.py and test_quant_shapes_gpu.py).
"""

from __future__ import annotations

import torch

from pcg_core.quant.schemes.w8a8 import FP8


def scaled_fp8_mm(xq: torch.Tensor, weight: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """xq (M, K) FP8 times the (N, K) FP8 weight, scaled by sa (a scalar, or (M, 1) per token) and sb (a scalar,
    or (1, N) per channel): bf16 (M, N)."""
    return torch._scaled_mm(xq, weight.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=True)


def pad_rows(x: torch.Tensor, multiple: int, extra: int = 0) -> torch.Tensor:
    """x with zero rows appended up to a multiple of `multiple` (plus `extra`): token counts the kernels refuse
    (block FP8 wants M % 4 == 0; _int_mm, the INT8 fallback without Triton, M > 16) padded, not branched on."""
    pad = (-x.shape[0]) % multiple + extra
    return torch.nn.functional.pad(x, (0, 0, 0, pad))


def block_weight_scales(scale: torch.Tensor) -> torch.Tensor:
    """128×128 weight-block scales (N/128, K/128) as cuBLASLt reads them for the second operand: (L4, N/128), stride
    (1, L4), L4 = K/128 rounded up to a multiple of 4, the rows past K/128 zero (torch's scaled_mm documents the
    layout). `torch._scaled_mm` took the plain transpose (stride K/128) and handed cuBLASLt a pointer it reads with
    stride L4: every K/128 that is not a multiple of 4 (Qwen2.5-0.5B's 896 = 7 blocks) multiplied blocks by other
    blocks' scales (relative error 0.9–1.8e7 on the H200), in eager and graph alike; and torch 2.11's `_scaled_mm`
    refuses the padded stride. So the block GEMM goes through `scaled_mm` with the recipes named. A copy per call:
    (N/128) × L4 floats."""
    kb = scale.shape[1]
    return torch.nn.functional.pad(scale.float(), (0, (-kb) % 4)).t()


@torch.library.custom_op("pcg::block_fp8_mm", mutates_args=())
def block_fp8_mm(xq: torch.Tensor, sx: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """xq (M, K) FP8 with 1×128 group scales sx (M, K/128), times the (N, K) FP8 weight with 128×128 block scales:
    bf16 (M, N). M must be a multiple of 4 (the caller pads). A custom op because Dynamo cannot trace torch 2.11's
    `scaled_mm` (it lands on the untraceable builtin `_scaled_mm_v2`): piecewise capture sees one opaque node."""
    from torch.nn.functional import ScalingType, scaled_mm

    sx = sx.t().contiguous().t()  # column-major, as cuBLASLt's 1×128 block scaling wants
    return scaled_mm(xq, weight.t(), sx, ScalingType.BlockWise1x128, block_weight_scales(weight_scale),
                     ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)


@block_fp8_mm.register_fake
def _block_fp8_mm_fake(xq, sx, weight, weight_scale):
    return xq.new_empty((xq.shape[0], weight.shape[0]), dtype=torch.bfloat16)


def block_scaled_mm(xq: torch.Tensor, sx: torch.Tensor, w8: torch.Tensor, scales: torch.Tensor,
                    bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """(M, N) = Σ_g sx · s_g · (xq_g · w8_gᵀ) (+ bias) through `torch._scaled_mm` with 1×128 blocks on both sides:
    the activation's scale per (token, group) is its per-token scale repeated, column-major (M, K/128); the
    weight's is `scales` (N, K/128) handed over as (K/128, N) row-major, the layout cuBLASLt reads. M is padded
    to a multiple of 4 (the block-scaled kernels' requirement, as block_fp8_mm)."""
    m, k = xq.shape
    pad = (-m) % 4
    if pad:
        xq = torch.nn.functional.pad(xq.view(torch.uint8), (0, 0, 0, pad)).view(FP8)
        sx = torch.nn.functional.pad(sx, (0, pad), value=1.0)
    sa = sx[None, :].expand(k // 128, m + pad).contiguous().t()
    sb = scales.t().contiguous()
    out = torch._scaled_mm(xq, w8.t(), scale_a=sa, scale_b=sb, out_dtype=dtype)[:m]
    return out if bias is None else out + bias
