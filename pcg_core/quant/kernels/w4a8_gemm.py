"""`pcg::w4a8_linear`: y = x · Wᵀ (+ b) with W int4 codes in the canonical layout of schemes/int4.py and the activation
quantized per token to 8 bits (int8 or FP8 e4m3) on the fly: compressed-tensors' W4A8 and W4AFP8 presets.

Why (docs/quantization.md, "Why these kernels"): W4A16 at prefill sizes is dequantize + a bf16 GEMM;
an 8-bit activation lets the int4 weight go to the 8-bit tensor cores as it is. q − z lies in [−15, 15], exact in
int8 and in e4m3, so one K-group's partial sum is exact (int32) or fp32-accumulated products of exact values;
each group's partial is rescaled by the weight's group scale into an fp32 accumulator, and the per-token
activation scale is applied once in the epilogue (mslk's f8i4bf16_rowwise has the same structure).

Two launches (three with split-K or above THRESHOLD_M), M a Python int when the op runs so a captured graph holds
one path and config:
1. `_act_quant_kernel`, one program per token: absmax over K, then x / (absmax / qmax) rounded to nearest
   (int8: half to even, clamped to ±127 as schemes.quantize_activation; FP8: clamped to ±448, cast RTNE).
2. `_w4a8_gemm_kernel`: tiles (BLOCK_N, BLOCK_M) with the weight as the left operand (converted in registers,
   as mixed-input GEMMs feed the converted operand), K walked one BLOCK_K tile (inside one group) at a time;
   small M splits the K loop over SPLIT_K programs and w4a16's reduce kernel adds the partials in a fixed order
   (deterministic). Above THRESHOLD_M `_to_8bit_kernel` first writes q − z once as an (N, K) 8-bit scratch
   and the GEMM reads that instead of converting per M tile.

Configurations from a fixed table by M (no autotune, a capture never benchmarks); no host syncs; every
allocation's size depends on shapes only. Zero points are read per group (integer-valued, as every int4 format
stores them), so the op is exact for asymmetric codes too; the schemes declare symmetric weights as
compressed-tensors' presets do. Anything else (CPU, shapes no BLOCK_K ≥ 32 fits, float32 on CUDA) runs the
reference, which is this op's default implementation.
"""

from __future__ import annotations

import torch

import pcg_core.quant.kernels.tuning as tuning

from pcg_core.quant.schemes.nibbles import dequantize_codes, unpack_nibbles
from pcg_core.quant.kernels.fp8_gemm import block_scaled_mm
from pcg_core.quant.kernels.w4a16_gemm import launch_splitk_reduce

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines and CI: the op's CPU implementation is the reference
    triton = None

ACTS = ("int8", "fp8")  # the `act` argument's values: 8-bit activation types
FP8 = torch.float8_e4m3fn  # schemes.w8a8.FP8
QMAX = {"int8": 127.0, "fp8": float(torch.finfo(FP8).max)}  # schemes.INT8_MAX / FP8_MAX (no import: a cycle)
QDTYPE = {"int8": torch.int8, "fp8": FP8}
TINY = 1e-12  # schemes._TINY: an all-zero row quantizes to zeros, not NaN

# The GEMM's (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) by M: configs/w4a8_gemm.json (tuning.py;
# starting points, not swept yet). BLOCK_K is lowered at launch to divide the group (≥ 32: the 8-bit MMA's K);
# SPLIT_K to divide the groups.
KERNEL = "w4a8_gemm"
MIN_BLOCK_K = 32
# Above this M the codes are converted to 8 bits once into an (N, K) scratch that the GEMM reads: converting in
# registers costs as much as the MMA it feeds, and it is repeated by every M tile (32 times at M = 4096 with
# 128-row tiles). Measured on an H100, 8192×4096, an earlier version of the GEMM (a nested group loop): fused vs
# scratch at M = 64 0.028 vs 0.046 ms, 256 0.067 vs 0.068, 512 0.101 vs 0.086, 1024 0.195 vs 0.140 (int8; fp8
# crossed near 96). `benchmarks/w4a8_gemm.py --scan-threshold` times both paths by M on the H200.
THRESHOLD_M = {"int8": 128, "fp8": 64}  # by activation type (the H200 scan: FP8's conversion in registers is slower)
# (Large-M variants tried and dropped: benchmarks/README.md, "Kernel tuning history".)
# FP8 activations, groups of 128, above SCALED_MM_MIN_M: cuBLASLt's FP8 GEMM with 1×128 block scales on both operands
# (`torch._scaled_mm`; the per-token scale repeated per group on the activation side, the group scales on the
# weight's) computes exactly this op's sum — per-group partials promoted to float32 and scaled — on the 8-bit
# scratch. False: the Triton GEMM for every M.
SCALED_MM_FP8 = True
SCALED_MM_MIN_M = 128  # above it (the H200 scan: 0.0503 vs 0.0580 ms at 192, 0.0478 vs 0.0456 at 128)
CONVERT_CONFIG = (64, 128, 4)  # (BLOCK_N, BLOCK_K, num_warps) of the conversion kernel
NIBBLES_BLOCK = 16  # the conversion's smallest BLOCK_K: two int32 words of codes per row
QUANT_BLOCK = 1024  # columns per step of the activation-quant kernel


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


def gemm_config(m: int, k: int, group: int, config: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
    """The GEMM's config for M tokens: BLOCK_K dividing the group (so a tile never straddles two scales), SPLIT_K
    dividing the K loop; None when no BLOCK_K ≥ 32 fits (the reference takes those shapes)."""
    bm, bn, bk, split, warps, stages = config or tuning.pick(KERNEL, m)
    if k % group:
        return None
    while bk > MIN_BLOCK_K and group % bk:
        bk //= 2
    if group % bk:
        return None
    while split > 1 and (k // bk) % split:
        split //= 2
    return bm, bn, bk, split, warps, stages


# --- the reference ------------------------------------------------------------------------------------------


def quantize_act(x: torch.Tensor, act: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq (M, K) int8 or e4m3, scale (M, 1) float32): schemes.quantize_activation's per-token dynamic math."""
    if act not in ACTS:
        raise ValueError(f"W4A8 activations are one of {ACTS}, got {act!r}")
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    # Divided by a tensor, not a Python number: CUDA turns division by a scalar into a multiply by its reciprocal,
    # one ulp off the kernels' exact division, which moved 72 FP8 codes of one token at K = 2304 (H200, issue 47).
    scale = (amax / torch.full_like(amax, QMAX[act])).clamp(min=TINY)
    y = xf / scale
    q = y.round().clamp(-128, 127).to(torch.int8) if act == "int8" else y.clamp(-QMAX[act], QMAX[act]).to(FP8)
    return q, scale


def reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int,
              act: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(x_q · s_x) · Wᵀ in float32 with W = (q − z)·s dequantized; in x's dtype."""
    xq, sx = quantize_act(x, act)
    w = dequantize_codes(unpack_nibbles(qweight, 1), scales.float(), zeros.float(), group)
    out = torch.nn.functional.linear(xq.float() * sx, w, None if bias is None else bias.float())
    return out.to(x.dtype)


# --- the kernels --------------------------------------------------------------------------------------------

if triton is not None:
    from pcg_core.quant.kernels.w4a16_gemm import _spread8

    @triton.jit
    def _act_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, QMAX_: tl.constexpr, IS_FP8: tl.constexpr,
                          BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * stride_x + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        # IEEE division (div_rn), as torch divides: the codes and the scale equal the reference's bitwise.
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), QMAX_), 1e-12)
        tl.store(s_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            mask = k0 + cols < K
            x = tl.load(x_ptr + row * stride_x + k0 + cols, mask=mask, other=0.0).to(tl.float32)
            y = tl.math.div_rn(x, scale)
            if IS_FP8:
                q = tl.minimum(tl.maximum(y, -QMAX_), QMAX_).to(tl.float8e4nv)
            else:
                y = (y + 12582912.0) - 12582912.0  # 1.5·2^23: rounds half to even, as torch.round (|y| ≤ 2^22)
                q = tl.minimum(tl.maximum(y, -128.0), 127.0).to(tl.int8)
            tl.store(q_ptr + row * stride_q + k0 + cols, q, mask=mask)

    @triton.jit
    def _w4a8_gemm_kernel(xq_ptr, sx_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr,
                          M, N, K, stride_xm, stride_qw, stride_s, stride_om, stride_split,
                          GROUP: tl.constexpr, IS_FP8: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
                          W8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        bn = rn % N  # rows and columns past the edge read a valid one and are masked at the store
        bm = rm % M
        rw = tl.arange(0, BLOCK_K // 8)
        rk = tl.arange(0, BLOCK_K)
        shifts = (rk % 8) * 4  # nibble i of a word holds K index 8·word + i (plain order)
        steps = K // (SPLIT_K * BLOCK_K)  # SPLIT_K · BLOCK_K divides K (gemm_config)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        # One flat loop (Triton pipelines the innermost loop's loads): each BLOCK_K tile lies inside one group
        # (BLOCK_K divides GROUP), its exact partial rescaled by that group's scale as it leaves the tensor cores.
        for i in range(steps):
            k0 = (pid_k * steps + i) * BLOCK_K
            g = k0 // GROUP
            if W8:  # q − z already in 8 bits (the large-M path's scratch, _to_8bit_kernel)
                w = tl.load(qw_ptr + bn[:, None] * stride_qw + (k0 + rk)[None, :])
            else:
                wo = tl.multiple_of(k0 // 8, BLOCK_K // 8)
                words = _spread8(tl.load(qw_ptr + bn[:, None] * stride_qw + (wo + rw)[None, :]))
                z = tl.load(z_ptr + bn * stride_s + g).to(tl.int32)
                w = ((words >> shifts[None, :]) & 0xF) - z[:, None]  # q − z ∈ [−15, 15]: exact in int8 and e4m3
                if IS_FP8:
                    w = w.to(tl.float16).to(tl.float8e4nv)
                else:
                    w = w.to(tl.int8)
            xt = tl.load(xq_ptr + bm[None, :] * stride_xm + (k0 + rk)[:, None])
            if IS_FP8:
                part = tl.dot(w, xt)
            else:
                part = tl.dot(w, xt, out_dtype=tl.int32)
            s = tl.load(s_ptr + bn * stride_s + g)
            acc += part.to(tl.float32) * s[:, None]
        acc = acc * tl.load(sx_ptr + bm)[None, :]  # the per-token activation scale, once
        mask = (rn[:, None] < N) & (rm[None, :] < M)
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += tl.load(bias_ptr + bn).to(tl.float32)[:, None]
            tl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], acc.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(out_ptr + pid_k * stride_split + rm[None, :] * stride_om + rn[:, None], acc, mask=mask)


    @triton.jit
    def _to_8bit_kernel(qw_ptr, z_ptr, out_ptr, N, stride_qw, stride_s, stride_o, GROUP: tl.constexpr,
                        IS_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        bn = rn % N
        rw = pid_k * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        words = _spread8(tl.load(qw_ptr + bn[:, None] * stride_qw + rw[None, :]))
        z = tl.load(z_ptr + bn * stride_s + (pid_k * BLOCK_K) // GROUP).to(tl.int32)
        w = ((words >> ((rk % 8) * 4)[None, :]) & 0xF) - z[:, None]
        if IS_FP8:
            w8 = w.to(tl.float16).to(tl.float8e4nv)
        else:
            w8 = w.to(tl.int8)
        tl.store(out_ptr + rn[:, None] * stride_o + rk[None, :], w8, mask=rn[:, None] < N)


def launch_act_quant(x: torch.Tensor, act: str, xq: torch.Tensor, sx: torch.Tensor) -> None:
    """xq (M, K), sx (M,) float32 = the per-token quantization of x (M, K), one program per token."""
    m, k = x.shape
    block = min(QUANT_BLOCK, triton.next_power_of_2(k))
    _act_quant_kernel[(m,)](x, xq, sx, k, x.stride(0), xq.stride(0), QMAX_=QMAX[act], IS_FP8=act == "fp8",
                            BLOCK=block, num_warps=4)


def launch_to_8bit(qweight: torch.Tensor, zeros: torch.Tensor, group: int, out: torch.Tensor) -> None:
    """out (N, K) int8 or e4m3 = q − z: the weight in 8 bits, written once for the large-M GEMM to read."""
    n, k = out.shape
    bn, bk, warps = CONVERT_CONFIG
    while bk > NIBBLES_BLOCK and (k % bk or group % bk):
        bk //= 2
    _to_8bit_kernel[(triton.cdiv(n, bn), k // bk)](qweight, zeros, out, n, qweight.stride(0), zeros.stride(0),
                                                    out.stride(0), GROUP=group, IS_FP8=out.dtype == FP8, BLOCK_N=bn,
                                                    BLOCK_K=bk, num_warps=warps)


def launch_gemm(xq: torch.Tensor, sx: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                group: int, bias: torch.Tensor | None, out: torch.Tensor, config: tuple[int, ...]) -> None:
    """out (M, N) = (xq · (q − z)ᵀ per group · s) · sx (+ bias); `config` as gemm_config returns it (fitted).
    `qweight` is the packed int32 (N, K/8) codes, or (the large-M path) q − z already in xq's 8-bit dtype (N, K)."""
    m, k = xq.shape
    n = qweight.shape[0]
    w8 = qweight.dtype == xq.dtype
    bm, bn, bk, split, warps, stages = config
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, bm))
    ws = out if split == 1 else torch.empty(split, m, n, device=xq.device, dtype=torch.float32)
    _w4a8_gemm_kernel[grid](xq, sx, qweight, scales, zeros, qweight if bias is None else bias, ws, m, n, k,
                            xq.stride(0), qweight.stride(0), scales.stride(0), n, m * n, GROUP=group,
                            IS_FP8=xq.dtype == FP8, HAS_BIAS=bias is not None, SPLIT_K=split, W8=w8, BLOCK_M=bm,
                            BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    if split > 1:
        launch_splitk_reduce(ws, bias, out, split, qweight)


def triton_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int,
                  act: str, bias: torch.Tensor | None = None, config: tuple[int, ...] | None = None,
                  threshold: int | None = None, scaled_mm: bool | None = None) -> torch.Tensor:
    """The Triton path on whatever device the kernels launch on (CUDA; CPU tensors under TRITON_INTERPRET=1);
    `config`, `threshold` and `scaled_mm` override the table, THRESHOLD_M and SCALED_MM_FP8 (benchmark, tests)."""
    m, k = x.shape
    n = qweight.shape[0]
    group = k if group == -1 else group
    fitted = gemm_config(m, k, group, config)
    if fitted is None:
        return reference(x, qweight, scales, zeros, group, act, bias)
    x = x.contiguous()
    qweight, scales, zeros = qweight.contiguous(), scales.float().contiguous(), zeros.float().contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    if m:
        xq = torch.empty(m, k, device=x.device, dtype=QDTYPE[act])
        sx = torch.empty(m, device=x.device, dtype=torch.float32)
        launch_act_quant(x, act, xq, sx)
        if m > (THRESHOLD_M[act] if threshold is None else threshold):
            # the weight in 8 bits once, not once per M tile: a shape-sized scratch from the pool
            w8 = torch.empty(n, k, device=x.device, dtype=QDTYPE[act])
            launch_to_8bit(qweight, zeros, group, w8)
            smm = SCALED_MM_FP8 and m > SCALED_MM_MIN_M if scaled_mm is None else scaled_mm
            if smm and scaled_mm_fits(x, act, group, n, k):
                return block_scaled_mm(xq, sx, w8, scales, bias, x.dtype)
            qweight = w8
        launch_gemm(xq, sx, qweight, scales, zeros, group, bias, out, fitted)
    return out


def scaled_mm_fits(x: torch.Tensor, act: str, group: int, n: int, k: int) -> bool:
    """Whether cuBLASLt's block-scaled FP8 GEMM computes this op: FP8 activations, groups of 128 (its block),
    CUDA, K and N multiples of 16."""
    return act == "fp8" and group == 128 and x.is_cuda and n % 16 == 0 and k % 128 == 0


# --- the op ---------------------------------------------------------------------------------------------------


@torch.library.custom_op("pcg::w4a8_linear", mutates_args=())
def w4a8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int,
                act: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) 16-bit or float32; qweight int32 (N, K/8) packed along K (nibble i = K index 8j + i); scales,
    zeros float32 (N, K/G) (zeros integer-valued; 8 for symmetric weights), W = (q − z)·s; act "int8" or "fp8":
    the activation quantized per token, dynamically; bias (N,) or None. Returns (M, N) in x's dtype. This
    implementation (CPU and any device without a registered kernel) is the float32 reference."""
    return reference(x, qweight, scales, zeros, group, act, bias)


@w4a8_linear.register_kernel("cuda")
def _w4a8_linear_cuda(x, qweight, scales, zeros, group, act, bias=None):
    if triton is None or x.dtype not in (torch.bfloat16, torch.float16):
        return reference(x, qweight, scales, zeros, group, act, bias)
    return triton_linear(x, qweight, scales, zeros, group, act, bias)


@w4a8_linear.register_fake
def _w4a8_linear_fake(x, qweight, scales, zeros, group, act, bias=None):
    torch._check(x.dim() == 2, lambda: f"pcg::w4a8_linear takes x (M, K), got {x.dim()} dimensions")
    torch._check(qweight.shape[1] * 8 == x.shape[1], lambda: "pcg::w4a8_linear: K of x and qweight differ")
    return x.new_empty(x.shape[0], qweight.shape[0])
