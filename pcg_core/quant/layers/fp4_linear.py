"""`Fp4Linear`: the FP4 (NVFP4, MXFP4) weight-only linear layer, one `pcg::fp4_linear` call over the canonical
layout of schemes/fp4.py."""

from __future__ import annotations

import torch

from pcg_core.quant.kernels.fp4_gemm import fp4_linear  # registers pcg::fp4_linear
from pcg_core.quant.kernels.fp4_gemm import reference as fp4_reference
from pcg_core.quant.schemes.e2m1 import e2m1_table, pack_e2m1, unpack_e2m1
from pcg_core.quant.schemes.fp4 import MXFP4_BLOCK, NVFP4_BLOCK, Fp4Scheme, Fp4Weight, quantize_mxfp4, quantize_nvfp4


class Fp4Linear(torch.nn.Module):
    """y = x Wᵀ + b with W in the canonical FP4 layout: codes packed two a byte along K, low nibble first
    (`weight_packed`, (N, K/2)), float32 block `weight_scale` (N, K/B) and a float32 `global_scale` multiplier
    (1 when the format has none). The forward is one `pcg::fp4_linear` call (kernels/fp4_gemm.py): on CUDA the FP4
    W4A16 Triton kernels read these buffers as they are, elsewhere the reference math (dequantize, then the float
    GEMM); static shapes and no host syncs, so a CUDA graph can capture it."""

    weight_packed: torch.Tensor
    weight_scale: torch.Tensor
    global_scale: torch.Tensor
    e2m1: torch.Tensor
    bias: torch.Tensor | None
    quant_scheme: Fp4Scheme  # set by from_scheme

    def __init__(self, in_features: int, out_features: int, block: int = NVFP4_BLOCK, bias: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        if block not in (NVFP4_BLOCK, MXFP4_BLOCK) or in_features % block:
            raise ValueError(f"FP4 weights need blocks of 16 or 32 dividing K = {in_features}, got {block}")
        self.in_features, self.out_features, self.block, self.dtype = in_features, out_features, block, dtype
        self.register_buffer("weight_packed", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, in_features // block, device=device))
        self.register_buffer("global_scale", torch.ones((), device=device))
        self.register_buffer("e2m1", e2m1_table(device), persistent=False)
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_weight(cls, w: Fp4Weight, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16) -> Fp4Linear:
        if w.codes.dim() != 2:
            raise ValueError(f"Fp4Linear takes a 2-D weight, got codes {tuple(w.codes.shape)}")
        n, k = w.codes.shape
        mod = cls(k, n, w.block, bias is not None, w.codes.device, dtype)
        mod.weight_packed.copy_(pack_e2m1(w.codes))
        mod.weight_scale.copy_(w.scales)
        mod.global_scale.fill_(1.0 if w.global_scale is None else w.global_scale)
        if bias is not None:
            assert mod.bias is not None  # built with a bias
            mod.bias.copy_(bias)
        return mod

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, block: int = NVFP4_BLOCK) -> Fp4Linear:
        """A float linear layer (a synthetic model's) quantized by the reference NVFP4 (16) or MXFP4 (32) quantizer."""
        w = linear.weight.detach()
        q = quantize_nvfp4(w) if block == NVFP4_BLOCK else quantize_mxfp4(w)
        return cls.from_weight(q, None if linear.bias is None else linear.bias.detach(), linear.weight.dtype)

    @classmethod
    def from_scheme(cls, linear: torch.nn.Linear, scheme: Fp4Scheme) -> Fp4Linear:
        mod = cls.from_linear(linear, scheme.block)
        mod.quant_scheme = scheme  # what the cell reads back of a quantized model (as of an Int4Linear)
        return mod

    def dequantized_weight(self) -> torch.Tensor:
        """W (N, K) float32, computed on the device as Fp4Weight.dequantize does (same products, same order)."""
        v = self.e2m1[unpack_e2m1(self.weight_packed).long()].unflatten(-1, (-1, self.block))
        return (v * self.weight_scale[..., None] * self.global_scale).flatten(-2)

    def weight_fp4(self) -> Fp4Weight:
        """The canonical weight back (reads the global to the host: for inspection, not for a captured region); a
        global of 1 reads as none, the same W."""
        g = float(self.global_scale)
        return Fp4Weight(unpack_e2m1(self.weight_packed), self.weight_scale, self.block, None if g == 1.0 else g)

    def reference(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 (M, K) through the plain math pcg::fp4_linear is held to, on any device."""
        return fp4_reference(x2, self.weight_packed, self.weight_scale, self.global_scale, self.block, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`pcg::fp4_linear` (kernels/fp4_gemm.py): W4A16 Triton kernels on CUDA, elsewhere this reference exactly."""
        return fp4_linear(x, self.weight_packed, self.weight_scale, self.global_scale, self.block, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, block={self.block}"
