"""4-bit integer weights (AWQ, GPTQ): the on-disk packings, and the one canonical layout every one converts into.

Issue 15's first step, plain torch on a CPU: each format is unpacked at load into `Int4Weight` — unsigned 4-bit
codes q (N out, K in) as nn.Linear holds weights, per-group scales s and zero points z (N, K/G), W = (q − z)·s,
and for GPTQ's act-order the permutation of K that makes the groups contiguous (the activation is permuted the
same way at run time, x[..., perm] · Wᵀ, instead of dropping act-order as vLLM does). The packers write synthetic
checkpoints in the exact formats; `Int4Weight.dequantize` is the reference the kernels will be held to.

Formats (docs/quantization.md, "Tensor layouts on disk"):
- AWQ "gemm": qweight int32 (K, N/8) packed along N in the interleaved order AWQ_ORDER (nibble i of a word holds
  column AWQ_ORDER[i] of its 8), qzeros int32 (K/G, N/8) packed the same way, scales fp16 (K/G, N).
- GPTQ: qweight int32 (K/8, N) packed along K (nibble i of word r holds row 8r + i), qzeros int32 (K/G, N/8)
  packed along N in plain order, scales fp16 (K/G, N), g_idx int32 (K,) (each input channel's group; not
  monotonic under act-order). Checkpoint format "gptq" (v1) stores z − 1, "gptq_v2" stores z.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pcg_core.errors import ConfigError
from pcg_core.quant.schemes import registry
from pcg_core.quant.schemes.nibbles import NIBBLES, PLAIN_ORDER, dequantize_codes, pack_nibbles, unpack_nibbles  # noqa: F401 (the int4 words, here too)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # column (within 8) held by nibble i of an AWQ word


@dataclass(frozen=True)
class Int4Scheme:
    """A 4-bit integer weight scheme as a synthetic cell runs it: group size, symmetric or with zero points,
    act-order, and `activations`: None for 16-bit ones (W4A16, the weight-only schemes), "int8" or "fp8" for W4A8
    (quantized per token, dynamically, by pcg::w4a8_linear). `act_dynamic` (no static activation scale to
    calibrate) and `kind` speak the 8-bit Scheme's words where code asks them of any scheme."""

    name: str
    group: int
    sym: bool
    act_order: bool
    description: str
    kind: str = "int4"
    act_dynamic: bool = True
    activations: str | None = None

    @property
    def w4a8(self) -> bool:
        """Whether activations are quantized to 8 bits (W4A8Linear), not kept in 16 (Int4Linear)."""
        return self.activations is not None

    def group_for(self, k: int) -> int:
        """The scheme's group, or at widths too small for it (tiny models: 48-wide experts) the largest of 64, 32
        and 16 dividing K (16: the W4A16 kernel's smallest tile)."""
        for g in (self.group, 64, 32, 16):
            if g <= self.group and k % g == 0:
                return g
        raise NotImplementedError(f"{self.name}: K = {k} is not a multiple of its group {self.group} (nor of 64, 32 or 16)")


INT4_SCHEMES: dict[str, Int4Scheme] = {name: Int4Scheme(name=name, description=description, **fields)
                                      for name, description, fields in registry.math_params("int4")}


@dataclass
class Int4Weight:
    """The canonical layout: q uint8 (N, K) in 0..15, scales and zeros float32 (N, K/G), `perm` (K,) or None."""

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group: int
    perm: torch.Tensor | None = None

    def dequantize(self) -> torch.Tensor:
        """W (N, K) in the *permuted* K order when `perm` is set (the order the activation is permuted into)."""
        return dequantize_codes(self.q, self.scales, self.zeros, self.group)

    def original(self) -> torch.Tensor:
        """W (N, K) in the checkpoint's own K order: the matrix the checkpoint stands for."""
        w = self.dequantize()
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm] = w
        return out

    def reference_linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (…, K) · Wᵀ, as a kernel computes it: the activation permuted, the weight kept permuted."""
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        return torch.nn.functional.linear(x.float(), self.dequantize(), None if bias is None else bias.float())


# --- a reference quantizer (synthetic checkpoints) ------------------------------------------------------------


def quantize_int4(w: torch.Tensor, group: int, sym: bool) -> Int4Weight:
    """Round-to-nearest int4 of W (N, K) per group of `group` input channels (−1: one group per row). sym: z = 8,
    s = absmax/7 (GPTQ's symmetric form); asym: s = (max − min)/15, z = round(−min/s) (AWQ, GPTQ sym=False)."""
    n, k = w.shape
    group = k if group == -1 else group
    if k % group:
        raise ValueError(f"K = {k} is not a multiple of the group size {group}")
    g = w.float().reshape(n, k // group, group)
    if sym:
        scales = (g.abs().amax(-1) / 7).clamp_min(1e-8)
        zeros = torch.full_like(scales, 8.0)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scales = ((hi - lo) / 15).clamp_min(1e-8)
        zeros = (-lo / scales).round().clamp(0, 15)
    q = (g / scales[..., None] + zeros[..., None]).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
    return Int4Weight(q, scales, zeros, group)


def quantize_int4_ordered(w: torch.Tensor, group: int, sym: bool, act_order: bool) -> Int4Weight:
    """quantize_int4, with act_order its input channels taken by falling column norm (as GPTQ's desc_act takes
    them by falling Hessian diagonal): the synthetic weights of a linear layer or of one expert."""
    perm = torch.argsort(w.float().norm(dim=0), descending=True, stable=True) if act_order else None
    q = quantize_int4(w if perm is None else w[:, perm], group, sym)
    q.perm = perm
    return q


# --- AWQ "gemm" ---------------------------------------------------------------------------------------------


def awq_pack(weight: Int4Weight) -> dict[str, torch.Tensor]:
    """qweight, qzeros, scales of AutoAWQ's gemm format (its zeros are integers; no act-order)."""
    if weight.perm is not None:
        raise ValueError("AWQ has no act-order")
    return {"qweight": pack_nibbles(weight.q.t(), 1, AWQ_ORDER),
            "qzeros": pack_nibbles(weight.zeros.round().to(torch.uint8).t(), 1, AWQ_ORDER),
            "scales": weight.scales.t().to(torch.float16).contiguous()}


def awq_unpack(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int) -> Int4Weight:
    k, n = qweight.shape[0], qweight.shape[1] * NIBBLES
    _check_groups("AWQ", k, n, group, scales, qzeros)
    q = unpack_nibbles(qweight, 1, AWQ_ORDER).t().contiguous()
    zeros = unpack_nibbles(qzeros, 1, AWQ_ORDER).t().float()
    return Int4Weight(q, scales.t().float().contiguous(), zeros.contiguous(), k if group == -1 else group)


# --- GPTQ ---------------------------------------------------------------------------------------------------


def gptq_pack(weight: Int4Weight, v2: bool = False) -> dict[str, torch.Tensor]:
    """qweight, qzeros, scales, g_idx of a GPTQ checkpoint for W (N, K) = weight.original(); act-order when the
    weight has a `perm` (its groups were formed in that order). v1 stores z − 1 (mod 16)."""
    w_q, groups = original_codes(weight)
    g_idx = groups.to(torch.int32)
    stored = (weight.zeros.round().to(torch.int64) - (0 if v2 else 1)) & 0xF
    return {"qweight": pack_nibbles(w_q.t(), 0), "qzeros": pack_nibbles(stored.t().to(torch.uint8), 1),
            "scales": weight.scales.t().to(torch.float16).contiguous(), "g_idx": g_idx}


def gptq_unpack(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
                group: int, v2: bool = False) -> Int4Weight:
    """Canonical from GPTQ tensors. Act-order (g_idx not k // G) becomes `perm` = the stable argsort of g_idx, the
    codes' K columns permuted by it so each group's channels are contiguous."""
    k, n = qweight.shape[0] * NIBBLES, qweight.shape[1]
    _check_groups("GPTQ", k, n, group, scales, qzeros)
    g = k if group == -1 else group
    q = unpack_nibbles(qweight, 0).t().contiguous()  # (N, K)
    zeros = unpack_nibbles(qzeros, 1).t().float() + (0 if v2 else 1)  # v1: z − 1 on disk (so 0 reads as 16)
    return with_act_order(Int4Weight(q, scales.t().float().contiguous(), zeros.contiguous(), g), g_idx, "GPTQ g_idx")


def with_act_order(w: Int4Weight, g_idx: torch.Tensor | None, what: str) -> Int4Weight:
    """Codes in the checkpoint's K order and its g_idx (each input channel's group) → canonical: with act-order
    (g_idx not k // G) `perm` = the stable argsort of g_idx, the codes' K columns permuted by it so each group's
    channels are contiguous. Shared by every format that stores a g_idx (GPTQ, compressed-tensors)."""
    k = w.q.shape[1]
    if g_idx is None or torch.equal(g_idx.long(), torch.arange(k) // w.group):
        return w
    g_idx = g_idx.long()
    if g_idx.shape != (k,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= k // w.group:
        raise ConfigError(f"{what}: shape {tuple(g_idx.shape)} and values {int(g_idx.min())}..{int(g_idx.max())}"
                          f" do not index {k // w.group} groups of {k} input channels")
    sizes = torch.bincount(g_idx, minlength=k // w.group)
    if not bool((sizes == w.group).all()):
        raise ConfigError(f"{what} puts {sizes.tolist()} channels in its groups; act-order needs {w.group} in each")
    perm = torch.argsort(g_idx, stable=True)
    return Int4Weight(w.q[:, perm].contiguous(), w.scales, w.zeros, w.group, perm)


def original_codes(weight: Int4Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes (N, K) in the checkpoint's K order and each input channel's group there."""
    k = weight.q.shape[1]
    groups = torch.arange(k) // weight.group
    if weight.perm is None:
        return weight.q, groups
    q = torch.empty_like(weight.q)
    q[:, weight.perm] = weight.q
    g = torch.empty_like(groups)
    g[weight.perm] = groups
    return q, g


def _check_groups(fmt: str, k: int, n: int, group: int, scales: torch.Tensor, zeros: torch.Tensor) -> None:
    g = k if group == -1 else group
    if g <= 0 or k % g:
        raise ConfigError(f"{fmt}: group_size {group} does not divide the {k} input channels")
    want = (k // g, n)
    if tuple(scales.shape) != want or tuple(zeros.shape) != (k // g, n // NIBBLES):
        raise ConfigError(f"{fmt}: scales {tuple(scales.shape)} / qzeros {tuple(zeros.shape)} do not fit "
                          f"{k} inputs × {n} outputs in groups of {g} (want {want} / {(k // g, n // NIBBLES)})")
