"""The int4 linear layers: `Int4Linear` (W4A16: AWQ, GPTQ, compressed-tensors pack-quantized) and `W4A8Linear`
(int4 weights × 8-bit activations), each one custom-op call over the canonical layout of schemes/int4.py."""

from __future__ import annotations

from typing import Self

import torch

from pcg_core.quant.kernels.w4a8_gemm import ACTS as W4A8_ACTS
from pcg_core.quant.kernels.w4a8_gemm import reference as w4a8_reference
from pcg_core.quant.kernels.w4a8_gemm import w4a8_linear  # registers pcg::w4a8_linear
from pcg_core.quant.kernels.w4a16_gemm import reference as w4a16_reference
from pcg_core.quant.kernels.w4a16_gemm import w4a16_linear  # registers pcg::w4a16_linear
from pcg_core.quant.schemes.int4 import Int4Scheme, Int4Weight, quantize_int4_ordered
from pcg_core.quant.schemes.nibbles import NIBBLES, pack_nibbles, unpack_nibbles


class Int4Linear(torch.nn.Module):
    """y = x Wᵀ + b with W in the canonical int4 layout: codes packed 8 per int32 along K (`qweight`, (N, K/8)),
    float32 group `scales` and `zeros` (N, K/G), and act-order's `perm` (K,) or None. The forward is one
    `pcg::w4a16_linear` call (kernels/w4a16_gemm.py): on CUDA the W4A16 Triton kernels read these buffers as they are (the
    activation read through `perm`), elsewhere the reference math (dequantize, then the float GEMM); static-shape
    and sync-free like every op a graph captures, opaque to dynamo."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    perm: torch.Tensor | None
    bias: torch.Tensor | None
    quant_scheme: Int4Scheme  # set by from_scheme

    def __init__(self, in_features: int, out_features: int, group: int, bias: bool = False, act_order: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        group = in_features if group == -1 else group
        if in_features % NIBBLES or in_features % group:
            raise ValueError(f"int4 weights need K = {in_features} to be a multiple of 8 and of the group {group}")
        self.in_features, self.out_features, self.group, self.dtype = in_features, out_features, group, dtype
        groups = in_features // group
        self.register_buffer("qweight", torch.zeros(out_features, in_features // NIBBLES, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.ones(out_features, groups, device=device))
        self.register_buffer("zeros", torch.full((out_features, groups), 8.0, device=device))
        self.register_buffer("perm", torch.arange(in_features, device=device) if act_order else None)
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_weight(cls, w: Int4Weight, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16) -> Self:
        n, k = w.q.shape
        mod = cls(k, n, w.group, bias is not None, w.perm is not None, w.q.device, dtype)
        mod.qweight.copy_(pack_nibbles(w.q, 1))
        mod.scales.copy_(w.scales)
        mod.zeros.copy_(w.zeros)
        if w.perm is not None:
            assert mod.perm is not None  # built with act_order
            mod.perm.copy_(w.perm)
        if bias is not None:
            assert mod.bias is not None  # built with a bias
            mod.bias.copy_(bias)
        return mod

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group: int, sym: bool, act_order: bool = False) -> Self:
        """A float linear layer (a synthetic model's) quantized round-to-nearest; act_order: its input channels
        taken by falling column norm, as GPTQ's desc_act takes them by falling Hessian diagonal."""
        q = quantize_int4_ordered(linear.weight.detach(), group, sym, act_order)
        return cls.from_weight(q, None if linear.bias is None else linear.bias.detach(), linear.weight.dtype)

    @classmethod
    def from_scheme(cls, linear: torch.nn.Linear, scheme: Int4Scheme) -> Self:
        mod = cls.from_linear(linear, scheme.group_for(linear.in_features), scheme.sym, scheme.act_order)
        mod.quant_scheme = scheme  # what the cell reads back of a quantized model (as of an experts module)
        return mod

    def weight_int4(self) -> Int4Weight:
        return Int4Weight(unpack_nibbles(self.qweight, 1), self.scales, self.zeros, self.group, self.perm)

    def dequantized_weight(self) -> torch.Tensor:
        """W (N, K) float32 in the checkpoint's K order (act-order undone), on the device: for callers that use the
        weight as a matrix (MLA's absorbed kv_b_proj) rather than through the layer."""
        return self.weight_int4().original()

    def reference(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 (M, K) through the plain math pcg::w4a16_linear is held to, on any device."""
        return w4a16_reference(x2, self.qweight, self.scales, self.zeros, self.group, self.perm, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = w4a16_linear(x.reshape(-1, self.in_features), self.qweight, self.scales, self.zeros, self.group,
                           self.perm, self.bias)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}, "
                f"act_order={self.perm is not None}")


class W4A8Linear(Int4Linear):
    """Int4Linear's buffers with the activation quantized per token to 8 bits (`act`: "int8" or "fp8"): the
    forward is one `pcg::w4a8_linear` call (kernels/w4a8_gemm.py), the 8-bit tensor cores on CUDA, the reference elsewhere.
    Act-order permutes the activation first (an index_select): a per-token scale does not depend on K's order,
    so quantizing the permuted row is quantizing the row."""

    act: str

    def __init__(self, in_features: int, out_features: int, group: int, bias: bool = False, act_order: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16, act: str = "int8"):
        super().__init__(in_features, out_features, group, bias, act_order, device, dtype)
        if act not in W4A8_ACTS:
            raise ValueError(f"W4A8 activations are one of {W4A8_ACTS}, got {act!r}")
        self.act = act

    @classmethod
    def from_scheme(cls, linear: torch.nn.Linear, scheme: Int4Scheme) -> W4A8Linear:
        if scheme.activations is None:  # not scheme.w4a8
            raise ValueError(f"{scheme.name} keeps 16-bit activations: an Int4Linear runs it")
        mod = super().from_scheme(linear, scheme)
        mod.act = scheme.activations
        return mod

    def reference(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 (M, K) through the plain math pcg::w4a8_linear is held to (act-order's permutation first)."""
        x2 = x2 if self.perm is None else x2.index_select(1, self.perm)
        return w4a8_reference(x2, self.qweight, self.scales, self.zeros, self.group, self.act, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.perm is not None:
            x2 = x2.index_select(1, self.perm)
        out = w4a8_linear(x2, self.qweight, self.scales, self.zeros, self.group, self.act, self.bias)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, act={self.act}"
