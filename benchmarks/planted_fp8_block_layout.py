"""PCG_PLUGINS module for the before/after of issue 47 on the H200: the FP8 128×128-block GEMM as it ran before the
fix (`torch._scaled_mm` with the weight-block scales as a plain transpose, stride K/128, which cuBLASLt reads as if
padded to 4), so a cell shows what the reference layer says of it. Never loaded by anything but a device script
that names it."""

import torch

import pcg_core.quant.layers.linear as linear


def old_block_fp8_mm(xq: torch.Tensor, sx: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    sx = sx.t().contiguous().t()
    return torch._scaled_mm(xq, weight.t(), scale_a=sx, scale_b=weight_scale.t(), out_dtype=torch.bfloat16)


linear.block_fp8_mm = old_block_fp8_mm
