"""pcg_core/quant/kernels/fp4_gemm.py: the `pcg::fp4_linear` op's CPU implementation is Fp4Linear's reference exactly, its
fake implementation traces, and the Triton kernels (run by Triton's interpreter on CPU tensors) match the float32
reference for NVFP4 (block 16) and MXFP4 (block 32) weights with and without a global scale, while planted faults
(nibble order swapped, the wrong block size, the global scale dropped) fail the same comparison.

As in test_quant_w4a16.py, the interpreter tests run only with TRITON_INTERPRET=1 set before the kernels are
defined; `test_the_kernels_under_the_interpreter` runs them in a child pytest with it set where Triton is and no GPU:

    TRITON_INTERPRET=1 /tmp/tvenv/bin/python -m pytest -q tests/pcg_core/quant/kernels/test_quant_fp4_w4a16.py
"""

from __future__ import annotations


import pytest
import torch
from triton_interpreter import interpreted, rel, run_interpreted_tests

from pcg_core.quant.kernels import fp4_gemm as fp4_w4a16
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.schemes.fp4 import MXFP4_BLOCK, NVFP4_BLOCK, Fp4Weight, pack_e2m1, quantize_mxfp4, quantize_nvfp4


# Kernel vs float32 reference, relative (Frobenius). e2m1 × an e4m3 or power-of-two scale has ≤ 6 significant
# bits, so the GEMM's fp16 weight tile is exact (the global is applied to the fp32 accumulator) and x is fp16 in
# both: what differs is the output's fp16 rounding (≤ 2^-11 relative, RMS ≈ 2e-4 measured) and fp32 summation
# order; the dequantize path also rounds W·g to fp16 once more (≈ 3e-4). The interpreter's bf16 casts truncate
# (2^-8): ≈ 3e-3. 2e-3 / 1e-2 leave ≥ 3× margin; a planted fault moves whole blocks or the scale: O(0.1–1).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
FAULT = 0.05
GLOBALS = {"none": None, "pow2": 2.0**-3, "odd": 0.37}  # "odd": not a power of two, so its rounding shows


def _weight(n: int, k: int, block: int, glob: float | None, seed: int = 0) -> Fp4Weight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * k**-0.5
    q = quantize_nvfp4(w) if block == NVFP4_BLOCK else quantize_mxfp4(w)
    return Fp4Weight(q.codes, q.scales, block, glob)


def _args(q: Fp4Weight) -> tuple:
    gs = None if q.global_scale is None else torch.tensor(q.global_scale, dtype=torch.float32)
    return pack_e2m1(q.codes), q.scales, gs, q.block


def _swap_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return (packed << 4) | (packed >> 4)


# --- everywhere: the CPU implementation, the fake implementation, the configuration fitting ---------------------


@pytest.mark.parametrize("block", [NVFP4_BLOCK, MXFP4_BLOCK])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_cpu_op_and_forward_are_fp4_linears_reference_bit_for_bit(block, dtype):
    """The formula Fp4Linear.forward ran before the op: F.linear(x.float(), dequantized_weight(), bias)."""
    lin = torch.nn.Linear(128, 40, bias=True)
    for bias in (True, False):
        mod = Fp4Linear.from_linear(lin, block) if bias else Fp4Linear.from_weight(
            quantize_nvfp4(lin.weight.detach()) if block == NVFP4_BLOCK else quantize_mxfp4(lin.weight.detach()))
        mod.global_scale.fill_(0.37)  # not a power of two: the order of the products shows in the bits
        b = None if mod.bias is None else mod.bias.float()
        for shape in ((5, 128), (2, 3, 128), (128,)):
            x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
            want = torch.nn.functional.linear(x.float(), mod.dequantized_weight(), b).to(dtype)
            got = mod(x)
            assert got.dtype == dtype and got.shape == (*shape[:-1], 40) and torch.equal(got, want)
            op = torch.ops.pcg.fp4_linear(x, mod.weight_packed, mod.weight_scale, mod.global_scale, block, mod.bias)
            assert torch.equal(op, want)
    q = _weight(40, 128, block, None)  # no global at all: the same as a global of 1
    x = torch.randn(5, 128).to(dtype)
    assert torch.equal(torch.ops.pcg.fp4_linear(x, *_args(q), None),
                       torch.ops.pcg.fp4_linear(x, *_args(q)[:2], torch.tensor(1.0), block, None))


def test_the_fake_implementation_gives_shape_and_dtype_and_dynamo_traces_the_module():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = _weight(64, 256, NVFP4_BLOCK, 0.5)
    args = (torch.randn(3, 9, 256).bfloat16(), *_args(q), None)
    with FakeTensorMode() as mode:
        out = torch.ops.pcg.fp4_linear(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert out.shape == (3, 9, 64) and out.dtype == torch.bfloat16
    for glob, bias in ((torch.tensor(0.5), torch.randn(64)), (None, None)):
        torch.library.opcheck(torch.ops.pcg.fp4_linear.default, (torch.randn(4, 256), *_args(q)[:2], glob, 16, bias),
                              test_utils=("test_schema", "test_faketensor"))
    mod = Fp4Linear.from_weight(q, torch.randn(64), dtype=torch.float32)
    compiled = torch.compile(mod, backend="eager", fullgraph=True, dynamic=False)
    x = torch.randn(2, 6, 256)
    assert torch.equal(compiled(x), mod(x))


@pytest.mark.parametrize("fault", ["nibble order swapped", "block size wrong", "global scale dropped"])
def test_planted_faults_fail_the_comparison(fault):
    """What a wrong port of the layout does, through the op, against the reference: each must exceed FAULT (and
    so every kernel tolerance above), or the kernel tests below could not tell a broken kernel from a good one."""
    q = _weight(64, 256, NVFP4_BLOCK, 0.37)
    packed, s, g, block = _args(q)
    if fault == "nibble order swapped":
        packed = _swap_nibbles(packed)
    elif fault == "block size wrong":  # 32-blocks read from 16's scales: the shape is right, the scale is not
        s, block = s[:, ::2].contiguous(), MXFP4_BLOCK
    else:
        g = None
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(4))
    assert rel(torch.ops.pcg.fp4_linear(x, packed, s, g, block, None), q.reference_linear(x)) > FAULT, fault


@pytest.mark.parametrize("m,k,block", [(1, 4096, 16), (8, 4096, 32), (16, 64, 32), (33, 4096, 16), (64, 96, 32),
                                       (100, 4096, 16), (8, 48, 16)])
def test_configurations_fit_k_and_the_block(m, k, block):
    cfg = fp4_w4a16.gemm_config(m, k, block)
    bm, _, bk, split, *_ = cfg
    assert m <= bm or m > fp4_w4a16.THRESHOLD_M
    assert bk >= 16 and bk % block == 0 and k % (split * bk) == 0
    bkd = fp4_w4a16.dequant_block_k(k, block)
    assert bkd % block == 0 and k % bkd == 0


# --- the Triton kernels under the interpreter --------------------------------------------------------------------


@interpreted
@pytest.mark.parametrize("m", [1, 8, 33, 100])
@pytest.mark.parametrize("block", [NVFP4_BLOCK, MXFP4_BLOCK])
@pytest.mark.parametrize("glob", list(GLOBALS))
def test_interpreted_kernels_match_the_reference(m, block, glob):
    """M ≤ THRESHOLD_M: the fused GEMM (split-K 4 at M ≤ 16, 2 at M ≤ 32); above: dequantize + F.linear."""
    q = _weight(256, 512, block, GLOBALS[glob], seed=m)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(5)).half()
    bias = torch.randn(256, generator=torch.Generator().manual_seed(6)).half()
    got = fp4_w4a16.triton_linear(x, *_args(q), bias)
    assert got.dtype == torch.float16 and got.shape == (m, 256)
    err = rel(got, q.reference_linear(x, bias))
    assert err < RTOL[torch.float16], f"M={m} block={block} global={glob}: {err:.3g}"


@interpreted
@pytest.mark.parametrize("m,n,threshold,dtype", [(100, 256, 128, torch.float16), (100, 200, 128, torch.float16),
                                                 (8, 200, 64, torch.float16), (8, 256, 0, torch.float16),
                                                 (33, 200, 0, torch.bfloat16), (100, 256, 64, torch.bfloat16)])
def test_interpreted_paths_forced_and_ragged_edges(m, n, threshold, dtype):
    """Each path at sizes the table would not give it, N not a multiple of the tile; bf16 on the dequantize path
    only (the interpreter's bf16 tl.dot is wrong in Triton 3.6)."""
    for block in (NVFP4_BLOCK, MXFP4_BLOCK):
        q = _weight(n, 256, block, 0.37, seed=n)
        x = torch.randn(m, 256, generator=torch.Generator().manual_seed(7)).to(dtype)
        got = fp4_w4a16.triton_linear(x, *_args(q), None, threshold=threshold)
        err = rel(got, q.reference_linear(x))
        assert err < RTOL[dtype], f"M={m} N={n} block={block} threshold={threshold} {dtype}: {err:.3g}"


@interpreted
def test_interpreted_split_k_is_deterministic_and_agrees_with_one_split():
    q = _weight(128, 1024, NVFP4_BLOCK, 0.37)
    x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(8)).half()
    bias = torch.randn(128).half()
    split4 = fp4_w4a16.triton_linear(x, *_args(q), bias, config=(16, 64, 128, 4, 4, 4))
    assert torch.equal(split4, fp4_w4a16.triton_linear(x, *_args(q), bias, config=(16, 64, 128, 4, 4, 4)))
    one = fp4_w4a16.triton_linear(x, *_args(q), bias, config=(16, 64, 128, 1, 4, 4))
    assert rel(split4, one) < 1e-3


@interpreted
@pytest.mark.parametrize("path", ["gemm", "dequant"])
@pytest.mark.parametrize("fault", ["nibble order swapped", "block size wrong", "global scale dropped"])
def test_interpreted_planted_faults_fail(path, fault):
    """The kernels launched with the fault (the block constexpr itself for "block size wrong": 16's scales read
    as 32's), judged by the comparison the kernel tests use."""
    q = _weight(128, 512, NVFP4_BLOCK, 0.37)
    packed, s, g, block = _args(q)
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(9)).half()
    if fault == "nibble order swapped":
        packed = _swap_nibbles(packed)
    elif fault == "block size wrong":
        block = MXFP4_BLOCK
    else:
        g = None
    if path == "gemm":
        got = torch.empty(8, 128, dtype=torch.float16)
        fp4_w4a16.launch_gemm(x, packed, s, g, block, None, got, fp4_w4a16.gemm_config(8, 512, 32))
    else:
        wd = torch.empty(128, 512, dtype=torch.float16)
        fp4_w4a16.launch_dequant(packed, s, g, block, wd, fp4_w4a16.dequant_block_k(512, 32))
        got = torch.nn.functional.linear(x, wd)
    assert rel(got, q.reference_linear(x)) > FAULT, f"{path}: {fault}"


@interpreted
def test_interpreted_planted_faults_fail_only_when_planted():
    """The fault test's harness without a fault passes (so its failures above are the faults')."""
    q = _weight(128, 512, NVFP4_BLOCK, 0.37)
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(9)).half()
    got = torch.empty(8, 128, dtype=torch.float16)
    fp4_w4a16.launch_gemm(x, *_args(q), None, got, fp4_w4a16.gemm_config(8, 512, 32))
    assert rel(got, q.reference_linear(x)) < RTOL[torch.float16]


def test_the_kernels_under_the_interpreter():
    """The interpreter tests above, in a child pytest with TRITON_INTERPRET=1 (it must be set before the kernels
    are defined). Where CUDA is, test_quant_gpu.py runs the compiled kernels instead."""
    run_interpreted_tests(__file__)
