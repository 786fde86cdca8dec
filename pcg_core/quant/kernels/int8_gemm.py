"""`pcg::int8_scaled_mm`: INT8 × INT8 → bf16 with the per-token and per-channel scales applied in the epilogue.

Why our own kernel: `torch._int_mm` writes an int32 [M, N] product that a second kernel then reads back to
scale, so at prefill sizes INT8 ends up slower than bf16 (M = 4096, 8192×4096 on the H200: 0.32 ms GEMM plus
the int32 round trip vs 0.35 ms bf16), and it refuses M ≤ 16. This Triton kernel accumulates in int32 on the
tensor cores, scales in registers and stores bf16 once; any M works. Configurations come from a fixed table
by token count, never autotuned, so a capture never benchmarks and eager and replay run the same kernel.

A torch.library op with a fake implementation: dynamo and inductor treat it as one opaque call, the
activation quantization before it stays plain torch for inductor to fuse.
"""

from __future__ import annotations

import torch

import pcg_core.quant.kernels.tuning as tuning

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines: QuantLinear never calls the op there
    triton = None

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) by the token count: configs/int8_gemm.json (tuning.py).
KERNEL = "int8_gemm"


def config_for(m: int) -> tuple[int, ...]:
    return tuning.pick(KERNEL, m)


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _int8_mm_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                        stride_am, stride_bn, stride_cm,
                        SA_PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        # Grouped tile order: GROUP_M row tiles share each weight column tile while it is in L2.
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        in_group = GROUP_M * num_n
        first_m = (pid // in_group) * GROUP_M
        group_m = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % group_m
        pid_n = (pid % in_group) // group_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        # Rows and columns past the edge read a valid row (modulo) and are masked at the store.
        am = rm % M
        bn = rn % N
        a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :]
        b_ptrs = b_ptr + bn[None, :] * stride_bn + rk[:, None]  # weight is [N, K]: its transpose, K-major
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < left, other=0)
            b = tl.load(b_ptrs, mask=rk[:, None] < left, other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        if SA_PER_ROW:
            sa = tl.load(sa_ptr + am)[:, None]
        else:
            sa = tl.load(sa_ptr)
        c = acc.to(tl.float32) * sa * tl.load(sb_ptr + bn)[None, :]
        if HAS_BIAS:
            c += tl.load(bias_ptr + bn)[None, :].to(tl.float32)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], c.to(tl.bfloat16), mask=mask)


def launch(a: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
           bias: torch.Tensor | None, out: torch.Tensor, config: tuple[int, int, int, int, int, int] | None = None) -> None:
    """out[M, N] = (a @ wᵀ) · scale_a · scale_bᵀ (+ bias); `config` overrides the table (the benchmark's sweep)."""
    m, k = a.shape
    n = w.shape[0]
    bm, bn, bk, group, warps, stages = config or config_for(m)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _int8_mm_kernel[grid](a, w, out, scale_a, scale_b, bias if bias is not None else scale_b, m, n, k,
                          a.stride(0), w.stride(0), out.stride(0),
                          SA_PER_ROW=scale_a.numel() > 1, HAS_BIAS=bias is not None,
                          BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_warps=warps, num_stages=stages,
                          enable_fp_fusion=False)  # no FMA contraction: the epilogue rounds as torch ops would


@torch.library.custom_op("pcg::int8_scaled_mm", mutates_args=())
def int8_scaled_mm(a: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """a int8 [M, K] row-major, w int8 [N, K] row-major (nn.Linear's layout), scale_a float32 [M, 1] or 0-d,
    scale_b float32 [N] or [N, 1]; bf16 [M, N]."""
    if not a.is_cuda or triton is None:
        raise RuntimeError("pcg::int8_scaled_mm runs on CUDA with Triton; QuantLinear uses its reference elsewhere")
    out = torch.empty(a.shape[0], w.shape[0], device=a.device, dtype=torch.bfloat16)
    launch(a.contiguous(), w.contiguous(), scale_a.float().contiguous(), scale_b.float().contiguous(),
           None if bias is None else bias.contiguous(), out)
    return out


@int8_scaled_mm.register_fake
def _int8_scaled_mm_fake(a, w, scale_a, scale_b, bias=None):
    return a.new_empty(a.shape[0], w.shape[0], dtype=torch.bfloat16)
