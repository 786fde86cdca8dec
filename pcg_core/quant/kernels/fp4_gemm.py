"""`pcg::fp4_linear`: y = x · Wᵀ (+ b) with W in Fp4Linear's layout (e2m1 codes two a byte, block scales, a global).

Hopper has no FP4 MMA (docs/quantization.md, "FP4 weight-only"), so FP4 runs weight-only, as
kernels/w4a16_gemm.py runs int4, with the same two paths chosen by the token count M (a Python int when the op runs):

- M ≤ THRESHOLD_M: a Triton GEMM that reads the packed bytes, decodes each e2m1 code arithmetically (its three
  magnitude bits placed in an fp16's exponent/mantissa: fp16 bits (c & 7) << 9 are the magnitude · 2^-14, sign bit
  3 → bit 15), multiplies by the block scale in float32 and feeds the tensor cores in the activation dtype with
  fp32 accumulation ("swap AB", as kernels/w4a16_gemm.py). The global scale is applied to the fp32 accumulator, not the tile:
  e2m1 × an e4m3 scale has at most 6 significant bits, so the tile is then EXACT in bf16/fp16 (NVFP4; MXFP4's
  power-of-two scales too, within the dtype's range). Deterministic split-K at M ≤ 32 (w4a16's reduce kernel).
- M > THRESHOLD_M: a Triton kernel writes W = (e2m1 · s) · g into a scratch (N, K) of the activation dtype, the
  reference's own float32 W rounded once, then cuBLAS `F.linear`.

Configurations come from a fixed table by M (w4a16's fitting; the block scales are spread per element inside
the tile, so BLOCK_K need only divide K and be a multiple of the block). No host syncs (the global is read on
the device), allocation sizes depend on shapes only. CPU and unsupported dtypes run Fp4Linear's reference math.
"""

from __future__ import annotations

import torch

import pcg_core.quant.kernels.w4a16_gemm as w4a16  # noqa: PLR0402 - the module, not the package (whose __init__ imports schemes/fp4.py)
import pcg_core.quant.kernels.tuning as tuning
from pcg_core.quant.schemes.e2m1 import e2m1_table, unpack_e2m1
from pcg_core.quant.kernels.w4a16_gemm import triton

if triton is not None:
    import triton.language as tl

# Token counts up to this run the fused GEMM; above it dequantize + cuBLAS. Not scanned yet (w4a16's crosses at
# 96–128 tokens; the FP4 GEMM is ~1.3× the int4 one at 64, so its crossing is lower).
THRESHOLD_M = 64
# The GEMM's (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) by M: configs/fp4_gemm.json (tuning.py).
# A 128-wide decoded tile spills in ptxas above 16 tokens (254–255 registers for sm_90a), so those rows decode 64 at
# a time.
KERNEL = "fp4_gemm"
DEQUANT_CONFIG = w4a16.DEQUANT_CONFIG  # (BLOCK_N, BLOCK_K, num_warps)


def available() -> bool:
    return w4a16.available()


def gemm_config(m: int, k: int, block: int, config: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
    """The table's row for M fitted to K (BLOCK_K dividing K, ≥ the scale block; SPLIT_K dividing the K loop)."""
    cfg = config or tuning.pick(KERNEL, m)
    fitted = w4a16.gemm_config(m, k, k, cfg)  # group = K: no group constraint, the scales are spread per element
    return fitted if fitted is not None and fitted[2] % block == 0 else None


def dequant_block_k(k: int, block: int) -> int | None:
    bk = w4a16.dequant_block_k(k, k)
    return bk if bk is not None and bk % block == 0 else None


def reference(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor,
              global_scale: torch.Tensor | None, block: int, bias: torch.Tensor | None) -> torch.Tensor:
    """Fp4Linear's dequantized reference, product for product: F.linear(x.float(), (e2m1 · s) · g, bias)."""
    v = e2m1_table(weight_packed.device)[unpack_e2m1(weight_packed).long()].unflatten(-1, (-1, block))
    v = v * weight_scale[..., None]
    if global_scale is not None:
        v = v * global_scale
    return torch.nn.functional.linear(x.float(), v.flatten(-2), None if bias is None else bias.float()).to(x.dtype)


if triton is not None:

    @triton.jit
    def _decode_tile(wp_ptr, s_ptr, rn, k0, stride_w, stride_s, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
        """[BLOCK_N, BLOCK_K] float32 e2m1 · block scale for K indices k0 … k0 + BLOCK_K of rows rn."""
        rb = tl.arange(0, BLOCK_K // 2)
        b = tl.load(wp_ptr + rn[:, None] * stride_w + (k0 // 2 + rb)[None, :]).to(tl.int32)
        c = tl.interleave(b & 0xF, b >> 4)  # LOW nibble = even k
        h = (((c & 7) << 9) | ((c & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True)  # e2m1 · 2^-14, exact
        rs = tl.arange(0, BLOCK_K // BLOCK)
        s = tl.load(s_ptr + rn[:, None] * stride_s + (k0 // BLOCK + rs)[None, :]) * 16384.0  # · 2^14 back
        # Each scale repeated BLOCK times in place (interleave keeps the copies in the thread's own registers).
        s = tl.interleave(s, s)
        s = tl.interleave(s, s)
        s = tl.interleave(s, s)
        s = tl.interleave(s, s)
        if BLOCK == 32:
            s = tl.interleave(s, s)
        return h.to(tl.float32) * s

    @triton.jit
    def _fp4_gemm_kernel(x_ptr, wp_ptr, s_ptr, g_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_w, stride_s,
                         stride_om, stride_split, BLOCK: tl.constexpr, HAS_GLOBAL: tl.constexpr,
                         HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        bn = rn % N  # rows/columns past the edge read a valid one and are masked at the store
        bm = rm % M
        rk = tl.arange(0, BLOCK_K)
        steps = K // (SPLIT_K * BLOCK_K)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for i in range(steps):
            k0 = tl.multiple_of((pid_k * steps + i) * BLOCK_K, BLOCK_K)
            w = _decode_tile(wp_ptr, s_ptr, bn, k0, stride_w, stride_s, BLOCK, BLOCK_K)
            xt = tl.load(x_ptr + bm[None, :] * stride_xm + (k0 + rk)[:, None])
            acc = tl.dot(w.to(xt.dtype), xt, acc)
        if HAS_GLOBAL:
            acc = acc * tl.load(g_ptr)
        mask = (rn[:, None] < N) & (rm[None, :] < M)
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += tl.load(bias_ptr + bn).to(tl.float32)[:, None]
            tl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], acc.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(out_ptr + pid_k * stride_split + rm[None, :] * stride_om + rn[:, None], acc, mask=mask)

    @triton.jit
    def _fp4_dequant_kernel(wp_ptr, s_ptr, g_ptr, out_ptr, N, stride_w, stride_s, stride_o, BLOCK: tl.constexpr,
                            HAS_GLOBAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        k0 = tl.program_id(1) * BLOCK_K
        w = _decode_tile(wp_ptr, s_ptr, rn % N, k0, stride_w, stride_s, BLOCK, BLOCK_K)
        if HAS_GLOBAL:
            w = w * tl.load(g_ptr)  # (e2m1 · s) · g in float32: the reference's W, rounded once below
        tl.store(out_ptr + rn[:, None] * stride_o + (k0 + tl.arange(0, BLOCK_K))[None, :],
                 w.to(out_ptr.dtype.element_ty), mask=rn[:, None] < N)


def launch_gemm(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                global_scale: torch.Tensor | None, block: int, bias: torch.Tensor | None, out: torch.Tensor,
                config: tuple[int, ...]) -> None:
    """out[M, N] = x · Wᵀ (+ bias) by the fused kernel; `config` as gemm_config returns it (fitted)."""
    m, k = x.shape
    n = weight_packed.shape[0]
    bm, bn, bk, split, warps, stages = config
    ws = out if split == 1 else torch.empty(split, m, n, device=x.device, dtype=torch.float32)
    dummy = weight_scale
    _fp4_gemm_kernel[(triton.cdiv(n, bn), split, triton.cdiv(m, bm))](
        x, weight_packed, weight_scale, dummy if global_scale is None else global_scale,
        dummy if bias is None else bias, ws, m, n, k, x.stride(0), weight_packed.stride(0), weight_scale.stride(0),
        n, m * n, BLOCK=block, HAS_GLOBAL=global_scale is not None, HAS_BIAS=bias is not None, SPLIT_K=split,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    if split > 1:
        w4a16.launch_splitk_reduce(ws, bias, out, split)


def launch_dequant(weight_packed: torch.Tensor, weight_scale: torch.Tensor, global_scale: torch.Tensor | None,
                   block: int, out: torch.Tensor, block_k: int) -> None:
    """out (N, K) in its own dtype = (e2m1 · s) · g, written once for cuBLAS to read."""
    n, k = out.shape
    bn, _, warps = DEQUANT_CONFIG
    _fp4_dequant_kernel[(triton.cdiv(n, bn), k // block_k)](
        weight_packed, weight_scale, weight_scale if global_scale is None else global_scale, out, n,
        weight_packed.stride(0), weight_scale.stride(0), out.stride(0), BLOCK=block,
        HAS_GLOBAL=global_scale is not None, BLOCK_N=bn, BLOCK_K=block_k, num_warps=warps)


def triton_linear(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                  global_scale: torch.Tensor | None, block: int, bias: torch.Tensor | None = None,
                  threshold: int = THRESHOLD_M, config: tuple[int, ...] | None = None) -> torch.Tensor:
    """The Triton path for 2-D x (CUDA; CPU tensors under TRITON_INTERPRET=1); `threshold` and `config` override
    the module's constants (benchmark sweeps, tests)."""
    m, k = x.shape
    n = weight_packed.shape[0]
    x, weight_packed = x.contiguous(), weight_packed.contiguous()
    weight_scale = weight_scale.contiguous().float()
    global_scale = None if global_scale is None else global_scale.reshape(()).float()
    bias = None if bias is None else bias.contiguous()
    fitted = gemm_config(m, k, block, config) if m <= threshold else None
    if fitted is not None:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
        if m:
            launch_gemm(x, weight_packed, weight_scale, global_scale, block, bias, out, fitted)
        return out
    block_k = dequant_block_k(k, block)
    if block_k is None:
        return reference(x, weight_packed, weight_scale, global_scale, block, bias)
    w = torch.empty(n, k, device=x.device, dtype=x.dtype)  # the scratch: a shape-sized block from the pool
    launch_dequant(weight_packed, weight_scale, global_scale, block, w, block_k)
    return torch.nn.functional.linear(x, w, None if bias is None else bias.to(x.dtype))


@torch.library.custom_op("pcg::fp4_linear", mutates_args=())
def fp4_linear(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor,
               global_scale: torch.Tensor | None, block: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (…, K) 16-bit or float32; weight_packed uint8 (N, K/2), LOW nibble = even k; weight_scale float32
    (N, K/block); global_scale a 0-d float32 multiplier or None; bias (N,) or None. Returns (…, N) in x's dtype
    ((M, N) for x (M, K)). This implementation (CPU, any device without a kernel) is Fp4Linear's reference."""
    return reference(x, weight_packed, weight_scale, global_scale, block, bias)


@fp4_linear.register_kernel("cuda")
def _fp4_linear_cuda(x, weight_packed, weight_scale, global_scale, block, bias=None):
    if triton is None or x.dtype not in (torch.bfloat16, torch.float16):
        return reference(x, weight_packed, weight_scale, global_scale, block, bias)
    out = triton_linear(x.reshape(-1, x.shape[-1]), weight_packed, weight_scale, global_scale, block, bias)
    return out.reshape(*x.shape[:-1], weight_packed.shape[0])


@fp4_linear.register_fake
def _fp4_linear_fake(x, weight_packed, weight_scale, global_scale, block, bias=None):
    torch._check(weight_packed.shape[1] * 2 == x.shape[-1], lambda: "pcg::fp4_linear: K of x and weight differ")
    torch._check(weight_scale.shape[1] * block == x.shape[-1], lambda: "pcg::fp4_linear: scales do not fit K")
    return x.new_empty(*x.shape[:-1], weight_packed.shape[0])
