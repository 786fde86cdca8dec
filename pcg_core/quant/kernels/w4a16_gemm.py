"""`pcg::w4a16_linear`: y = x · Wᵀ (+ b) with W held as int4 codes in the canonical layout of schemes/int4.py.

Why our own kernels (docs/quantization.md, "Why these kernels"): tinygemm collapses above
M ≈ 16 and Int4Linear's reference dequantizes to float32 on every call. Two paths, chosen by the token count
M (a Python int when the op runs, so a captured graph holds one of them):

- M ≤ THRESHOLD_M: a Triton GEMM that reads the packed codes, dequantizes a tile in registers (float32,
  w = q·s + b with b = −z·s per group) and feeds it to the tensor cores against the bf16/fp16 activation;
  fp32 accumulation. "Swap AB": the weight tile is the dot's left operand (N rows × K), the activation the
  right (K × M), since M is tiny. Act-order is fused: the activation's K index is read through `perm`. For
  M ≤ 16 the K loop is split across programs (SPLIT_K) so the 132 SMs have work; the partial sums go to an
  fp32 workspace and a second kernel adds them in a fixed order (deterministic, unlike atomics, so a replay
  equals eager bitwise).
- M > THRESHOLD_M: a Triton kernel dequantizes W once into a scratch (N, K) tensor of the activation dtype,
  then cuBLAS `F.linear`, the activation permuted first for act-order. (Writing W back in the original K order
  instead, to spare the activation copy, measured 25-40x slower: scattered 2-byte stores.)

The kernels read the module's own buffers (qweight int32 (N, K/8) packed along K in plain nibble order, float32
scales and zeros (N, K/G)): no second copy of the weight to keep in step, rows of N are K-contiguous as a
Linear's weight is. Configurations come from fixed tables by M, never autotuned, so a capture never
benchmarks; each distinct M compiles once in the warm-up that precedes capture. No host syncs, and every
allocation's size depends on shapes only. Any other device (CPU) runs the exact reference math of
`Int4Weight.reference_linear`, as do shapes the kernels do not take (groups not a multiple of 16, float32).
"""

from __future__ import annotations

import torch

import pcg_core.quant.kernels.tuning as tuning
from pcg_core.quant.schemes.nibbles import dequantize_codes, unpack_nibbles

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines and CI: the op's CPU implementation is the reference
    triton = None

# The measurements behind the numbers below: benchmarks/README.md, "Kernel tuning history".
# Token counts up to this run the fused GEMM; above it dequantize + cuBLAS (the two cross at 96–192 tokens).
THRESHOLD_M = 128

# The GEMM's (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) by M: configs/w4a16_gemm.json, per GPU
# (tuning.py; the sweeps behind it: benchmarks/README.md). BLOCK_K is lowered at launch to divide the group and K;
# SPLIT_K to divide K. The last row serves 65…THRESHOLD_M tokens.
KERNEL = "w4a16_gemm"
# Act-order inside the GEMM (the activation gathered through `perm` as it loads) up to this M; above it the
# activation permuted first (gathering in the GEMM costs more from M = 8 on).
PERM_IN_KERNEL_MAX_M = 1
# Act-order outside the GEMM: the activation permuted by our gather kernel up to this M, by index_select above.
TRITON_PERMUTE_MAX_M = 8
# From this M on, whole rows are permuted in one program each (`_permute_rows_kernel`: a contiguous load, the
# permutation through shared memory by tl.gather, a contiguous store): 1.12× bf16 at 4096 where index_select is 1.22×.
ROW_PERMUTE_MIN_M = 128
ROW_PERMUTE_ELEMENTS = 16384  # rows per program: as many as keep BLOCK_M · next_pow2(K) at most this (≥ 1 row)
# Rows up to this K only (index_select beyond): compiled and timed at K = 4096 so far; test_quant_gpu.py's
# rows_permuted test runs it up to 16384 (Qwen3-8B's and Llama-3.1-8B's MLP widths) for this to be raised.
ROW_PERMUTE_MAX_K = 4096
# (BLOCK_N, BLOCK_K, num_warps) of the dequantize-to-scratch kernel.
DEQUANT_CONFIG = (64, 128, 4)
REDUCE_BLOCK = 1024


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


def gemm_config(m: int, k: int, group: int, config: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
    """The GEMM's configuration for M tokens, BLOCK_K fitted inside one group and dividing K, SPLIT_K dividing
    the K loop; None when no BLOCK_K ≥ 16 fits (the dequantize path takes those shapes)."""
    bm, bn, bk, split, warps, stages = config or tuning.pick(KERNEL, m)
    while bk > 16 and (k % bk or group % bk):
        bk //= 2
    if k % bk or group % bk:
        return None
    while split > 1 and k % (split * bk):
        split //= 2
    return bm, bn, bk, split, warps, stages


def dequant_block_k(k: int, group: int, block_k: int = DEQUANT_CONFIG[1]) -> int | None:
    while block_k > 16 and (k % block_k or group % block_k):
        block_k //= 2
    return None if k % block_k or group % block_k else block_k


if triton is not None:

    @triton.jit
    def _spread8(words):
        """[R, C] words → [R, 8C], each word repeated 8 times in place. Interleaving keeps a thread's 8 copies in
        its own registers; a 3-D expand + reshape instead spread them over threads and spilled (255 registers)."""
        words = tl.interleave(words, words)
        words = tl.interleave(words, words)
        return tl.interleave(words, words)

    @triton.jit
    def _w4a16_gemm_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, out_ptr,
                           M, N, K, stride_xm, stride_qw, stride_s, stride_om, stride_split,
                           GROUP: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
                           SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        # Rows and columns past the edge read a valid one (modulo) and are masked at the store.
        bn = rn % N
        bm = rm % M
        rw = tl.arange(0, BLOCK_K // 8)
        rk = tl.arange(0, BLOCK_K)
        shifts = (rk % 8) * 4  # nibble i of a word holds K index 8·word + i (plain order)
        steps = K // (SPLIT_K * BLOCK_K)  # SPLIT_K · BLOCK_K divides K (gemm_config)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for i in range(steps):
            k0 = (pid_k * steps + i) * BLOCK_K
            wo = tl.multiple_of(k0 // 8, BLOCK_K // 8)
            words = _spread8(tl.load(qw_ptr + bn[:, None] * stride_qw + (wo + rw)[None, :]))
            q = (words >> shifts[None, :]) & 0xF
            g = k0 // GROUP  # the tile lies inside one group: BLOCK_K divides GROUP
            s = tl.load(s_ptr + bn * stride_s + g)
            b = -tl.load(z_ptr + bn * stride_s + g) * s
            w = q.to(tl.float32) * s[:, None] + b[:, None]
            if HAS_PERM:
                kx = tl.load(perm_ptr + k0 + rk)  # act-order: the activation's channels in the weight's order
            else:
                kx = k0 + rk
            xt = tl.load(x_ptr + bm[None, :] * stride_xm + kx[:, None])
            acc = tl.dot(w.to(xt.dtype), xt, acc)
        mask = (rn[:, None] < N) & (rm[None, :] < M)
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += tl.load(bias_ptr + bn).to(tl.float32)[:, None]
            tl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], acc.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            ws = out_ptr + pid_k * stride_split + rm[None, :] * stride_om + rn[:, None]
            tl.store(ws, acc, mask=mask)

    @triton.jit
    def _splitk_reduce_kernel(ws_ptr, bias_ptr, out_ptr, MN, N, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                              BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < MN
        acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
        for s in tl.static_range(1, SPLIT_K):  # a fixed order: the sum is the same on every run
            acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _permute_kernel(x_ptr, perm_ptr, out_ptr, M, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        """out[m, k] = x[m, perm[k]]: one perm block serves BLOCK_M rows, K spread over programs (few rows); the
        stores are contiguous."""
        rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = rk < K
        src = tl.load(perm_ptr + rk, mask=kmask, other=0)
        mask = (rm[:, None] < M) & kmask[None, :]
        v = tl.load(x_ptr + rm[:, None] * stride_xm + src[None, :], mask=mask)
        tl.store(out_ptr + rm[:, None] * K + rk[None, :], v, mask=mask)

    @triton.jit
    def _permute_rows_kernel(x_ptr, perm_ptr, out_ptr, M, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        """out[m, k] = x[m, perm[k]] for BLOCK_M whole rows (BLOCK_K ≥ K): rows read and written contiguously,
        the permutation applied on chip (a 1-D tl.gather, which Triton lowers through shared memory; a 2-D one
        becomes warp shuffles), each row read from memory once."""
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        kmask = rk < K
        src = tl.load(perm_ptr + rk, mask=kmask, other=0).to(tl.int32)
        mask = (rm[:, None] < M) & kmask[None, :]
        rows = rm.to(tl.int64)[:, None]  # M·K may pass 2^31
        x = tl.load(x_ptr + rows * stride_xm + rk[None, :], mask=mask, other=0.0)
        x = tl.reshape(x, [BLOCK_M * BLOCK_K])
        index = tl.reshape(tl.arange(0, BLOCK_M)[:, None] * BLOCK_K + src[None, :], [BLOCK_M * BLOCK_K])
        v = tl.reshape(tl.gather(x, index, axis=0), [BLOCK_M, BLOCK_K])  # 1-D: through shared memory
        tl.store(out_ptr + rows * K + rk[None, :], v, mask=mask)

    @triton.jit
    def _dequant_kernel(qw_ptr, s_ptr, z_ptr, out_ptr, N, stride_qw, stride_s, stride_o,
                        GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        bn = rn % N
        rw = pid_k * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        words = _spread8(tl.load(qw_ptr + bn[:, None] * stride_qw + rw[None, :]))
        q = (words >> ((rk % 8) * 4)[None, :]) & 0xF
        g = (pid_k * BLOCK_K) // GROUP
        s = tl.load(s_ptr + bn * stride_s + g)
        b = -tl.load(z_ptr + bn * stride_s + g) * s
        w = q.to(tl.float32) * s[:, None] + b[:, None]
        tl.store(out_ptr + rn[:, None] * stride_o + rk[None, :], w.to(out_ptr.dtype.element_ty),
                 mask=rn[:, None] < N)


def launch_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int,
                perm: torch.Tensor | None, bias: torch.Tensor | None, out: torch.Tensor,
                config: tuple[int, ...]) -> None:
    """out[M, N] = x[:, perm] · Wᵀ (+ bias) by the fused kernel; `config` as gemm_config returns it (fitted)."""
    m, k = x.shape
    n = qweight.shape[0]
    bm, bn, bk, split, warps, stages = config
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, bm))
    dummy = qweight
    ws = out if split == 1 else torch.empty(split, m, n, device=x.device, dtype=torch.float32)
    _w4a16_gemm_kernel[grid](x, qweight, scales, zeros, dummy if perm is None else perm,
                             dummy if bias is None else bias, ws, m, n, k, x.stride(0), qweight.stride(0),
                             scales.stride(0), n, m * n, GROUP=group, HAS_PERM=perm is not None,
                             HAS_BIAS=bias is not None, SPLIT_K=split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                             num_warps=warps, num_stages=stages)
    if split > 1:
        launch_splitk_reduce(ws, bias, out, split, dummy)


def launch_splitk_reduce(ws: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, split: int,
                         dummy: torch.Tensor | None = None) -> None:
    """out (M, N) = Σ ws[s] (+ bias) over the split in a fixed order (shared with kernels/fp4_gemm.py)."""
    mn, n = out.numel(), out.shape[-1]
    _splitk_reduce_kernel[(triton.cdiv(mn, REDUCE_BLOCK),)](ws, (ws if dummy is None else dummy) if bias is None
                                                            else bias, out, mn, n, SPLIT_K=split,
                                                            HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK)


def permute_activation(x: torch.Tensor, perm: torch.Tensor, triton_max_m: int = TRITON_PERMUTE_MAX_M,
                       rows_min_m: int = ROW_PERMUTE_MIN_M) -> torch.Tensor:
    """x[:, perm] as a new contiguous (M, K) tensor (act-order's activation in the weight's K order): our gather
    kernel spread over K up to `triton_max_m` rows, whole rows per program from `rows_min_m` on (K up to
    ROW_PERMUTE_MAX_K), index_select between and beyond."""
    m, k = x.shape
    if triton_max_m < m and (m < rows_min_m or k > ROW_PERMUTE_MAX_K):
        return x.index_select(1, perm)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if m and m <= triton_max_m:
        block_m = min(16, triton.next_power_of_2(m))
        _permute_kernel[(triton.cdiv(k, 512), triton.cdiv(m, block_m))](x, perm, out, m, k, x.stride(0),
                                                                         BLOCK_M=block_m, BLOCK_K=512)
    elif m:
        block_k = triton.next_power_of_2(k)
        block_m = max(1, min(triton.next_power_of_2(m), ROW_PERMUTE_ELEMENTS // block_k))
        _permute_rows_kernel[(triton.cdiv(m, block_m),)](x, perm, out, m, k, x.stride(0), BLOCK_M=block_m,
                                                         BLOCK_K=block_k, num_warps=8)
    return out


def launch_dequant(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int, out: torch.Tensor,
                   block_k: int, block_n: int = DEQUANT_CONFIG[0], num_warps: int = DEQUANT_CONFIG[2]) -> None:
    """out (N, K) in its own dtype = (q − z)·s, written once for cuBLAS to read."""
    n, k = out.shape
    grid = (triton.cdiv(n, block_n), k // block_k)
    _dequant_kernel[grid](qweight, scales, zeros, out, n, qweight.stride(0), scales.stride(0), out.stride(0),
                          GROUP=group, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)


def triton_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int,
                  perm: torch.Tensor | None = None, bias: torch.Tensor | None = None, threshold: int = THRESHOLD_M,
                  config: tuple[int, ...] | None = None, perm_in_kernel: int = PERM_IN_KERNEL_MAX_M,
                  triton_permute: int = TRITON_PERMUTE_MAX_M, rows_permute: int = ROW_PERMUTE_MIN_M) -> torch.Tensor:
    """The Triton path on whatever device the kernels launch on (CUDA; CPU tensors under TRITON_INTERPRET=1).
    `threshold`, `config`, `perm_in_kernel`, `triton_permute` and `rows_permute` override the module constants (the
    benchmark's sweeps, tests)."""
    m, k = x.shape
    n = qweight.shape[0]
    x = x.contiguous()
    qweight, scales, zeros = qweight.contiguous(), scales.contiguous(), zeros.contiguous()
    if scales.dtype != torch.float32 or zeros.dtype != torch.float32:
        scales, zeros = scales.float(), zeros.float()
    bias = None if bias is None else bias.contiguous()
    fitted = gemm_config(m, k, group, config) if m <= threshold else None
    if fitted is not None:
        if perm is not None and m > perm_in_kernel:
            x, perm = permute_activation(x, perm, triton_permute, rows_permute), None
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
        if m:
            launch_gemm(x, qweight, scales, zeros, group, perm, bias, out, fitted)
        return out
    block_k = dequant_block_k(k, group)
    if block_k is None:
        return reference(x, qweight, scales, zeros, group, perm, bias)
    w = torch.empty(n, k, device=x.device, dtype=x.dtype)  # the scratch: a shape-sized block from the pool
    launch_dequant(qweight, scales, zeros, group, w, block_k)
    if perm is not None:
        x = permute_activation(x, perm, triton_permute, rows_permute)
    return torch.nn.functional.linear(x, w, None if bias is None else bias.to(x.dtype))


def reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int,
              perm: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """Int4Weight.reference_linear's math: the activation permuted, the weight dequantized in float32."""
    if perm is not None:
        x = x.index_select(-1, perm)
    w = dequantize_codes(unpack_nibbles(qweight, 1), scales, zeros, group)
    return torch.nn.functional.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)


@torch.library.custom_op("pcg::w4a16_linear", mutates_args=())
def w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int,
                 perm: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) 16-bit or float32; qweight int32 (N, K/8) packed along K (nibble i = K index 8j + i); scales,
    zeros float32 (N, K/G), W = (q − z)·s in act-order's permuted K order; perm int64 (K,) or None: the
    activation is read as x[:, perm]; bias (N,) or None. Returns (M, N) in x's dtype. This implementation
    (CPU and any device without a registered kernel) is the reference: float32 dequantize, float32 GEMM."""
    return reference(x, qweight, scales, zeros, group, perm, bias)


@w4a16_linear.register_kernel("cuda")
def _w4a16_linear_cuda(x, qweight, scales, zeros, group, perm=None, bias=None):
    if triton is None or x.dtype not in (torch.bfloat16, torch.float16):
        return reference(x, qweight, scales, zeros, group, perm, bias)
    return triton_linear(x, qweight, scales, zeros, group, perm, bias)


@w4a16_linear.register_fake
def _w4a16_linear_fake(x, qweight, scales, zeros, group, perm=None, bias=None):
    torch._check(x.dim() == 2, lambda: f"pcg::w4a16_linear takes x (M, K), got {x.dim()} dimensions")
    torch._check(qweight.shape[1] * 8 == x.shape[1], lambda: "pcg::w4a16_linear: K of x and qweight differ")
    return x.new_empty(x.shape[0], qweight.shape[0])
