"""A grouped GEMM over quantized experts that reads the codes as they are held: out[S, N] = rows[S, K] · W[e(s)]ᵀ,
rows sorted by expert, each tile of an expert's weight dequantized in registers (float32, rounded once to the
activations' dtype, exactly the weight the dequantize-then-`torch._grouped_mm` path builds) and fed to the tensor
cores, fp32 accumulation.

Why: the grouped path of experts.py dequantizes every expert's weight to 16 bits on every forward (DeepSeek-V3's
one MoE layer: 22 GiB written and read per forward, whatever the token count), which dominates a quantized MoE
cell's forward and memory; serving engines run fused MoE kernels over the quantized weights instead.

Capturable: the rows of each expert are cut into blocks of BLOCK_M rows (its last block short); `block_table`
lays the blocks out with torch ops of static shape (cumsum, searchsorted), for as many blocks as any routing can
need (⌈S/BLOCK_M⌉ + min(E, S)), and a block past the routing's own count exits at once. No atomics: every output
tile is written by one program in a fixed order, so a replay equals eager bitwise.

Weights, the canonical [E, N, K] rows of experts.py (`ExpertWeights`):
- "float": W itself (16-bit);
- "8bit": FP8 e4m3 or int8 codes × a float32 scale per expert ("tensor", [E]), per row ("channel", [E, N, 1]) or per
  128×128 block ("block", [E, ⌈N/128⌉, ⌈K/128⌉]);
- "int4": codes packed 8 per int32 along K ([E, N, K/8]), float32 scales and zeros per group ([E, N, K/G]), the
  product (q − z)·s; act-order's permutation ([E, K], one per expert) read on the activation's side, as
  w4a16's fused GEMM reads it;
- "fp4": E2M1 codes two per byte along K, low nibble first ([E, N, K/2]), decoded to their values, times a
  float32 scale per block of `group` (16 NVFP4, 32 MXFP4: [E, N, K/B]) and NVFP4's per-row global ([E, N]), in
  fp4_experts' order.
Anything else (act-order per row shard, K or a group not a multiple of 16) is not taken (`takes`): the caller
keeps its own path. Callers inside a traced forward go through the custom op `pcg::moe_grouped_linear` (`linear`):
opaque to dynamo, as every kernel a graph captures is; its tile configuration is chosen from the concrete row
count when it runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal, NamedTuple, cast

import torch

import pcg_core.quant.kernels.tuning as tuning

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines and CI: the callers' dequantizing paths run
    triton = None

# The experts' grouped forwards (experts.py, layers/fp4_experts.py) run this kernel where it takes the layout (a switch for
# the tests and benchmarks that time both ways; its measured gains: benchmarks/README.md, "Kernel tuning history").
ENABLED = True
SCALE_BLOCK = 128  # the 8-bit block schemes' 128×128 weight blocks (schemes.BLOCK)
SCALE_KINDS = {"none": 0, "tensor": 1, "channel": 2, "block": 3}
FORMATS = {"float": 0, "8bit": 1, "int4": 2, "fp4": 3}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by the most rows an expert gets on average (S / E):
# configs/moe_gemm.json (tuning.py; not swept yet).
KERNEL = "moe_gemm"


# Act-order (int4 experts with a permutation of K each): from this many sorted rows on, each row is permuted by its
# expert's permutation first (`_permute_expert_rows_kernel`: one pass over the rows, S·K elements) and the GEMM
# reads it as it is; below, the GEMM gathers the activation through the permutation inside its K loop. Off until the
# row pass has been compiled and timed on the GPU (benchmarks/moe_gemm.py times GPTQ both ways): then the row count
# where it wins.
PERMUTE_ROWS_MIN = 1 << 62
PERMUTE_BLOCK_K = 1024


Format = Literal["float", "8bit", "int4", "fp4"]
ScaleKind = Literal["none", "tensor", "channel", "block"]


class ExpertWeights(NamedTuple):
    """One projection of quantized experts as held: `codes` [E, N, K] (int4's [E, N, K/8], FP4's [E, N, K/2]), the
    scale (int4's zeros and act-order `perm`; FP4's row globals) the module holds beside them;
    `group`: int4's group, FP4's scale block. A NamedTuple: built inside traced forwards, which dynamo follows."""

    format: Format
    codes: torch.Tensor
    scale: torch.Tensor | None = None
    scale_kind: ScaleKind = "none"
    zeros: torch.Tensor | None = None
    group: int = 0
    perm: torch.Tensor | None = None
    global_rows: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K) of the weight these codes stand for."""
        e, n, k = self.codes.shape
        return e, n, k * {"int4": 8, "fp4": 2}.get(self.format, 1)


def available(x: torch.Tensor) -> bool:
    """The kernel runs where Triton launches: CUDA (or CPU tensors under TRITON_INTERPRET=1)."""
    return triton is not None and (x.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def config_for(rows: int, experts: int) -> tuple[int, ...]:
    per_expert = -(-rows // max(1, experts))
    return tuning.pick(KERNEL, per_expert)


def block_table(counts: torch.Tensor, rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expert, first row, end row) per block of at most `block_m` sorted rows, int32, for the most blocks any
    routing of `rows` rows over len(counts) experts can need; a block past the routing's count has end ≤ first.
    Static shapes, no host sync."""
    experts = counts.numel()
    counts = counts.to(torch.int64)
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    blocks = (counts + block_m - 1) // block_m
    block_ends = torch.cumsum(blocks, 0)
    nb = -(-rows // block_m) + min(experts, rows)
    b = torch.arange(nb, device=counts.device)
    owner = torch.searchsorted(block_ends, b, right=True)  # the expert whose blocks cover b; `experts` past the last
    e = owner.clamp(max=experts - 1)
    first = starts[e] + (b - (block_ends[e] - blocks[e])) * block_m
    end = torch.where(owner < experts, ends[e], torch.zeros_like(first))
    return e.to(torch.int32), first.to(torch.int32), end.to(torch.int32)


def takes(w: ExpertWeights, k: int) -> bool:
    """Whether the kernel runs this projection for rows of width k: a tile of 16 columns or more fits K and lies
    inside one int4 group (or 128-column scale block); act-order one permutation per expert. Shapes only, so
    it is the same for every row count."""
    e, _, kw = w.shape
    group = w.group if w.format == "int4" else SCALE_BLOCK if w.scale_kind == "block" else kw
    return (triton is not None and kw == k and k % 16 == 0 and group % 16 == 0
            and (w.perm is None or tuple(w.perm.shape) == (e, kw)))


def permute_expert_rows(rows: torch.Tensor, counts: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """out[i, j] = rows[i, perm[e(i), j]] for rows sorted by expert (counts [E] each): act-order's activation in
    each row's expert's K order, one new contiguous [S, K]. Static shapes, no host sync."""
    s, k = rows.shape
    out = torch.empty(s, k, device=rows.device, dtype=rows.dtype)
    if s == 0:
        return out
    rows = rows.contiguous()
    expert = torch.searchsorted(torch.cumsum(counts.to(torch.int64), 0), torch.arange(s, device=rows.device),
                                right=True).clamp_(max=counts.numel() - 1).to(torch.int32)
    perm = perm.contiguous()
    _permute_expert_rows_kernel[(s, triton.cdiv(k, PERMUTE_BLOCK_K))](
        rows, perm, expert, out, k, rows.stride(0), perm.stride(0), BLOCK_K=PERMUTE_BLOCK_K)
    return out


def grouped_linear(rows: torch.Tensor, counts: torch.Tensor, w: ExpertWeights,
                   config: tuple[int, int, int, int, int] | None = None,
                   permute_rows_min: int = PERMUTE_ROWS_MIN) -> torch.Tensor | None:
    """rows [S, K] sorted by expert (counts [E] rows each) through each row's expert's weight: [S, N] in the rows'
    dtype; None for a layout the kernel does not take (the caller's own path runs). `config` and
    `permute_rows_min` override the tuning table (configs/moe_gemm.json) and PERMUTE_ROWS_MIN (tests, benchmarks)."""
    if not takes(w, rows.shape[1]):
        return None
    e, n, k = w.shape
    s = rows.shape[0]
    if w.perm is not None and s >= max(1, permute_rows_min):  # act-order met once, before the GEMM
        rows, w = permute_expert_rows(rows, counts, w.perm), w._replace(perm=None)
    bm, bn, bk, warps, stages = config or config_for(s, e)
    group = w.group if w.format == "int4" else SCALE_BLOCK if w.scale_kind == "block" else k  # FP4: scales gathered
    while bk > 16 and (k % bk or group % bk):  # a tile inside one int4 group or 128-column scale block
        bk //= 2
    out = torch.empty(s, n, device=rows.device, dtype=rows.dtype)
    if s == 0:
        return out
    expert, first, end = block_table(counts, s, bm)
    rows = rows.contiguous()
    codes = w.codes.contiguous()
    scale = codes if w.scale is None else w.scale.float().contiguous()
    zeros = scale if w.zeros is None else w.zeros.float().contiguous()
    glob = scale if w.global_rows is None else w.global_rows.float().contiguous()
    perm = expert if w.perm is None else w.perm.to(torch.int32).contiguous()
    scale_row = scale.stride(1) if scale.dim() > 1 else 0
    grid = (expert.numel(), triton.cdiv(n, bn))
    _moe_gemm_kernel[grid](rows, codes, scale, zeros, glob, perm, out, expert, first, end, n, k, rows.stride(0),
                           codes.stride(0), codes.stride(1), scale.stride(0), scale_row, glob.stride(0),
                           FORMAT=FORMATS[w.format], SCALE=SCALE_KINDS[w.scale_kind], GROUP=max(w.group, 1),
                           HAS_PERM=w.perm is not None, HAS_GLOBAL=w.global_rows is not None,
                           LOG2_GROUP=max(w.group, 1).bit_length() - 1, IEEE=rows.dtype == torch.float32, BLOCK_M=bm,
                           BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return out


@torch.library.custom_op("pcg::moe_grouped_linear", mutates_args=())
def moe_grouped_linear(rows: torch.Tensor, counts: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor | None,
                       zeros: torch.Tensor | None, global_rows: torch.Tensor | None,
                       perm: torch.Tensor | None, fmt: str, scale_kind: str, group: int) -> torch.Tensor:
    """grouped_linear as an op (`ExpertWeights`' fields spread): where Triton launches (CUDA, or CPU tensors under
    TRITON_INTERPRET=1) and the layout is taken — callers check `available` and `takes` first."""
    # the op's schema carries the Literal fields as str: ExpertWeights' own values, spread by the caller
    out = grouped_linear(rows, counts, ExpertWeights(cast(Format, fmt), codes, scale, cast(ScaleKind, scale_kind), zeros, group, perm,
                                                     global_rows))
    if out is None:
        raise NotImplementedError(f"pcg::moe_grouped_linear: {fmt} experts of this layout are not taken (check "
                                  "moe_gemm.takes first)")
    return out


@moe_grouped_linear.register_fake
def _moe_grouped_linear_fake(rows, counts, codes, scale, zeros, global_rows, perm, fmt, scale_kind, group):
    torch._check(rows.dim() == 2, lambda: f"pcg::moe_grouped_linear takes rows (S, K), got {rows.dim()} dimensions")
    return rows.new_empty(rows.shape[0], codes.shape[1])


def linear(rows: torch.Tensor, counts: torch.Tensor, w: ExpertWeights) -> torch.Tensor:
    """The op on w: rows [S, K] sorted by expert through each row's expert's weight."""
    return moe_grouped_linear(rows, counts, w.codes, w.scale, w.zeros, w.global_rows, w.perm, w.format,
                              w.scale_kind, w.group)


def project(rows: torch.Tensor, counts: torch.Tensor, offsets: torch.Tensor, weights: Callable[[], ExpertWeights],
            dequantized: Callable[[], torch.Tensor]) -> torch.Tensor:
    """rows [S, K] sorted by expert (counts [E] each, offsets their cumulative sums) through each row's expert's
    projection: this kernel over weights() as held where it is ENABLED and takes them, else every expert's
    dequantized() [E, N, K] weight and torch._grouped_mm. What the experts' grouped forwards call."""
    if ENABLED and available(rows) and takes(w := weights(), rows.shape[1]):
        return linear(rows, counts, w)
    return torch._grouped_mm(rows, dequantized().transpose(1, 2), offs=offsets)


if triton is not None:

    @triton.jit
    def _permute_expert_rows_kernel(x_ptr, perm_ptr, expert_ptr, out_ptr, K, stride_x, stride_p,
                                    BLOCK_K: tl.constexpr):
        """One row, BLOCK_K of its columns: out[row, j] = x[row, perm[expert[row], j]] (the row is a few KiB: its
        scattered reads hit in cache), contiguous stores."""
        row = tl.program_id(0).to(tl.int64)
        rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = rk < K
        e = tl.load(expert_ptr + row).to(tl.int64)
        src = tl.load(perm_ptr + e * stride_p + rk, mask=mask, other=0)
        v = tl.load(x_ptr + row * stride_x + src, mask=mask)
        tl.store(out_ptr + row * K + rk, v, mask=mask)

    @triton.jit
    def _repeat_columns(x, LOG2: tl.constexpr):
        """[R, C] → [R, C · 2^LOG2], each column repeated in place (LOG2 ≤ 5): packed int4 words (3) and FP4 block
        scales widened to the tile (interleaving keeps a thread's copies in its own registers, as w4a16's
        _spread8)."""
        if LOG2 >= 1:
            x = tl.interleave(x, x)
        if LOG2 >= 2:
            x = tl.interleave(x, x)
        if LOG2 >= 3:
            x = tl.interleave(x, x)
        if LOG2 >= 4:
            x = tl.interleave(x, x)
        if LOG2 >= 5:
            x = tl.interleave(x, x)
        return x

    @triton.jit
    def _e2m1(c):
        """E2M1 codes (int32 0…15) → their float32 values, exactly: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and the negatives
        (decoded with arithmetic: a table lookup per element is a scattered load the pipeline stages in shared
        memory)."""
        mag = c & 7
        ex = mag >> 1
        m = (mag & 1).to(tl.float32)
        v = tl.where(ex == 0, m * 0.5, (2.0 + m) * (1 << ex).to(tl.float32) * 0.25)
        return tl.where(c >= 8, -v, v)

    @triton.jit
    def _weight_tile(w_ptr, s_ptr, z_ptr, g_ptr, e, bn, k0, stride_we, stride_wn, stride_se, stride_sn, stride_ge,
                     dtype: tl.constexpr, FORMAT: tl.constexpr, SCALE: tl.constexpr, GROUP: tl.constexpr,
                     LOG2_GROUP: tl.constexpr, HAS_GLOBAL: tl.constexpr, BLOCK_K: tl.constexpr):
        """Expert e's weight rows `bn`, columns k0…k0+BLOCK_K, dequantized in float32 and rounded once to `dtype`."""
        rk = k0 + tl.arange(0, BLOCK_K)
        e = e.to(tl.int64)
        bn = bn.to(tl.int64)
        base = w_ptr + e * stride_we + bn[:, None] * stride_wn
        srow = s_ptr + e * stride_se + bn * stride_sn  # the rows' scales (8-bit channel/block, int4, FP4)
        if FORMAT == 0:
            w = tl.load(base + rk[None, :]).to(dtype)
        elif FORMAT == 1:
            c = tl.load(base + rk[None, :]).to(tl.float32)
            if SCALE == 1:
                w = c * tl.load(s_ptr + e)
            elif SCALE == 2:
                w = c * tl.load(srow)[:, None]
            else:  # a tile lies inside one 128-column block: BLOCK_K divides 128
                w = c * tl.load(s_ptr + e * stride_se + (bn // 128) * stride_sn + k0 // 128)[:, None]
            w = w.to(dtype)
        elif FORMAT == 3:  # FP4: a block of GROUP columns per scale (NVFP4 16, MXFP4 32)
            b = tl.load(base + (k0 // 2 + tl.arange(0, BLOCK_K // 2))[None, :]).to(tl.int32)
            v = _e2m1(tl.interleave(b & 0xF, b >> 4))  # column 2j: byte j's low nibble, 2j + 1: its high
            if BLOCK_K >= GROUP:  # the tile's blocks' scales, each widened over its GROUP columns
                sb = tl.load(srow[:, None] + (k0 // GROUP + tl.arange(0, BLOCK_K // GROUP))[None, :])
                w = v * _repeat_columns(sb, LOG2_GROUP)
            else:  # the tile inside one block
                w = v * tl.load(srow + k0 // GROUP)[:, None]
            if HAS_GLOBAL:
                w = w * tl.load(g_ptr + e * stride_ge + bn)[:, None]
            w = w.to(dtype)
        else:
            rw = k0 // 8 + tl.arange(0, BLOCK_K // 8)
            words = _repeat_columns(tl.load(base + rw[None, :]), 3)
            q = ((words >> ((rk % 8) * 4)[None, :]) & 0xF).to(tl.float32)
            g = k0 // GROUP  # the tile lies inside one group: BLOCK_K divides GROUP
            s = tl.load(srow + g)
            z = tl.load(z_ptr + e * stride_se + bn * stride_sn + g)
            w = ((q - z[:, None]) * s[:, None]).to(dtype)
        return w

    @triton.jit
    def _moe_gemm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, g_ptr, perm_ptr, out_ptr, expert_ptr, first_ptr, end_ptr, N, K,
                         stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_ge,
                         FORMAT: tl.constexpr, SCALE: tl.constexpr, GROUP: tl.constexpr, HAS_PERM: tl.constexpr,
                         HAS_GLOBAL: tl.constexpr, LOG2_GROUP: tl.constexpr, IEEE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_b = tl.program_id(0)
        pid_n = tl.program_id(1)
        first = tl.load(first_ptr + pid_b)
        end = tl.load(end_ptr + pid_b)
        if first < end:
            e = tl.load(expert_ptr + pid_b)
            rm = first + tl.arange(0, BLOCK_M)
            mmask = rm < end
            bm = tl.where(mmask, rm, first)  # rows past the block's end read a valid row, masked at the store
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            bn = rn % N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            dtype = x_ptr.dtype.element_ty
            for k0 in range(0, K, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                if HAS_PERM:  # act-order: the activation's channels in the weight's order
                    kx = tl.load(perm_ptr + e.to(tl.int64) * K + rk)
                else:
                    kx = rk
                xt = tl.load(x_ptr + bm[:, None].to(tl.int64) * stride_xm + kx[None, :])
                w = _weight_tile(w_ptr, s_ptr, z_ptr, g_ptr, e, bn, k0, stride_we, stride_wn, stride_se, stride_sn,
                                 stride_ge, dtype, FORMAT, SCALE, GROUP, LOG2_GROUP, HAS_GLOBAL, BLOCK_K)
                if IEEE:  # float32 rows in float32 (the default would round them to TF32)
                    acc = tl.dot(xt, tl.trans(w), acc, input_precision="ieee")
                else:
                    acc = tl.dot(xt, tl.trans(w), acc)
            mask = mmask[:, None] & (rn[None, :] < N)
            tl.store(out_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(dtype), mask=mask)
