"""pcg_core/quant/kernels/w4a16_gemm.py: the `pcg::w4a16_linear` op's CPU implementation is the int4 reference exactly, its fake
implementation traces, and the Triton kernels (run by Triton's interpreter on CPU tensors) match the reference
for the shapes, groups, zero points and act-order the models use, while planted faults (a wrong group constexpr,
the nibble order reversed, act-order dropped) fail the same comparison.

The interpreter tests run only with TRITON_INTERPRET=1 set before the kernels are defined; where Triton is
installed and no GPU is, `test_the_kernels_under_the_interpreter` runs them in a child pytest with it set:

    python -m venv --system-site-packages /tmp/tvenv && /tmp/tvenv/bin/pip install triton==3.6.0 "numpy<2.4"
    /tmp/tvenv/bin/python -m pytest -q tests/pcg_core/quant/kernels/test_quant_w4a16.py
"""

from __future__ import annotations


import pytest
import torch
from triton_interpreter import interpreted, rel, run_interpreted_tests

from pcg_core.quant.kernels import w4a16_gemm as w4a16
from pcg_core.quant.layers.int4_linear import Int4Linear
from pcg_core.quant.schemes.int4 import PLAIN_ORDER, Int4Weight, pack_nibbles, quantize_int4, unpack_nibbles


# Kernel vs float32 reference, relative (Frobenius). fp16 activations: the dequantized weight is rounded to fp16
# (2^-11 relative) for the tensor cores, the output once more; measured ≈ 3e-4. The interpreter's bf16 casts
# truncate (2^-8), so its bf16 dequantize path sits near 3e-3. A planted fault moves whole groups: O(0.1–1).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
FAULT = 0.05


def _weight(n: int, k: int, group: int, sym: bool, act_order: bool, seed: int = 0) -> Int4Weight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * k**-0.5
    perm = torch.randperm(k, generator=g) if act_order else None
    q = quantize_int4(w if perm is None else w[:, perm], group, sym)
    q.perm = perm
    return q


def _args(q: Int4Weight) -> tuple:
    return pack_nibbles(q.q, 1), q.scales, q.zeros, q.group


# --- everywhere: the CPU implementation, the fake implementation, the configuration fitting ---------------------


@pytest.mark.parametrize("group", [32, 128, -1])
@pytest.mark.parametrize("sym,act_order", [(True, False), (False, False), (True, True), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_op_is_the_reference_linear(group, sym, act_order, dtype):
    q = _weight(48, 256, group, sym, act_order)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(dtype)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(2)).to(dtype)
    for b in (None, bias):
        got = torch.ops.pcg.w4a16_linear(x, *_args(q), q.perm, b)
        assert got.dtype == dtype and got.shape == (5, 48)
        assert torch.equal(got, q.reference_linear(x, b).to(dtype))


def test_the_module_forward_is_the_op_and_keeps_its_canonical_weight():
    lin = torch.nn.Linear(128, 40, bias=True)
    mod = Int4Linear.from_linear(lin, 32, sym=True, act_order=True)
    x = torch.randn(3, 7, 128, generator=torch.Generator().manual_seed(3))
    w = mod.weight_int4()
    assert torch.equal(mod(x), w.reference_linear(x.reshape(-1, 128), mod.bias).reshape(3, 7, 40))
    assert torch.equal(pack_nibbles(w.q, 1), mod.qweight) and w.perm is mod.perm and w.group == 32


def test_the_fake_implementation_gives_shape_and_dtype_and_dynamo_traces_the_module():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = _weight(64, 256, 64, sym=False, act_order=True)
    args = (torch.randn(9, 256).bfloat16(), *_args(q), q.perm, None)
    with FakeTensorMode() as mode:
        out = torch.ops.pcg.w4a16_linear(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert out.shape == (9, 64) and out.dtype == torch.bfloat16
    torch.library.opcheck(torch.ops.pcg.w4a16_linear.default,
                          (torch.randn(4, 256), *_args(q), q.perm, torch.randn(64)), test_utils=("test_schema", "test_faketensor"))
    mod = Int4Linear.from_weight(q, dtype=torch.float32)
    compiled = torch.compile(mod, backend="eager", fullgraph=True, dynamic=False)
    x = torch.randn(2, 6, 256)
    assert torch.equal(compiled(x), mod(x))


@pytest.mark.parametrize("fault", ["nibble order reversed", "zero points dropped", "act-order dropped", "groups shifted"])
def test_planted_faults_fail_the_comparison(fault):
    """What a wrong port of the layout does, through the op, against the reference: each must exceed FAULT (and
    so every kernel tolerance above), or the kernel tests below could not tell a broken kernel from a good one."""
    q = _weight(64, 256, 32, sym=False, act_order=True)
    qw, s, z, g = _args(q)
    perm = q.perm
    if fault == "nibble order reversed":
        qw = pack_nibbles(unpack_nibbles(qw, 1, PLAIN_ORDER[::-1]), 1)
    elif fault == "zero points dropped":
        z = torch.full_like(z, 8.0)
    elif fault == "act-order dropped":
        perm = None
    else:
        s, z = s.roll(1, dims=1), z.roll(1, dims=1)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(4))
    assert rel(torch.ops.pcg.w4a16_linear(x, qw, s, z, g, perm, None), q.reference_linear(x)) > FAULT, fault


@pytest.mark.parametrize("m,k,group", [(1, 4096, 128), (8, 4096, 32), (16, 64, 32), (33, 4096, 4096), (64, 96, 32),
                                       (8, 512, 8)])
def test_configurations_fit_the_group_and_k(m, k, group):
    cfg = w4a16.gemm_config(m, k, group)
    if group % 16:
        assert cfg is None and w4a16.dequant_block_k(k, group) is None  # such shapes take the reference path
        return
    bm, _, bk, split, *_ = cfg
    assert m <= bm or m > w4a16.THRESHOLD_M
    assert bk >= 16 and group % bk == 0 and k % (split * bk) == 0
    bkd = w4a16.dequant_block_k(k, group)
    assert group % bkd == 0 and k % bkd == 0


# --- the Triton kernels under the interpreter --------------------------------------------------------------------


@interpreted
@pytest.mark.parametrize("m", [1, 8, 33, 100])
@pytest.mark.parametrize("group", [32, 64, 128, -1])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
def test_interpreted_kernels_match_the_reference(m, group, sym, act_order):
    """M ≤ THRESHOLD_M: the fused GEMM (split-K 4 at M ≤ 16, 2 at M ≤ 32); above: dequantize + F.linear."""
    q = _weight(256, 512, group, sym, act_order, seed=m)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(5)).half()
    bias = torch.randn(256, generator=torch.Generator().manual_seed(6)).half()
    got = w4a16.triton_linear(x, *_args(q), q.perm, bias)
    assert got.dtype == torch.float16 and got.shape == (m, 256)
    err = rel(got, q.reference_linear(x, bias))
    assert err < RTOL[torch.float16], f"M={m} group={group} sym={sym} act_order={act_order}: {err:.3g}"


@interpreted
@pytest.mark.parametrize("m,n,threshold,dtype", [(100, 256, 128, torch.float16), (100, 200, 128, torch.float16),
                                                 (8, 200, 64, torch.float16), (8, 256, 0, torch.float16),
                                                 (33, 200, 0, torch.bfloat16), (100, 256, 64, torch.bfloat16)])
def test_interpreted_paths_forced_and_ragged_edges(m, n, threshold, dtype):
    """Each path at sizes the table would not give it (the GEMM at M = 100 with two M tiles, dequantize at M = 8),
    N not a multiple of the tile, act-order each way (the activation permuted first, by our kernel or index_select,
    or, in the GEMM, gathered as it loads); bf16 on the dequantize path only (the interpreter's bf16 tl.dot is
    wrong in Triton 3.6)."""
    q = _weight(n, 256, 64, sym=False, act_order=True, seed=n)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(7)).to(dtype)
    for perm_in_kernel, triton_permute in ((0, 1 << 30), (0, 0), (threshold, 1 << 30)):
        got = w4a16.triton_linear(x, *_args(q), q.perm, None, threshold=threshold, perm_in_kernel=perm_in_kernel,
                                  triton_permute=triton_permute)
        err = rel(got, q.reference_linear(x))
        assert err < RTOL[dtype], f"M={m} N={n} threshold={threshold} perm_in_kernel={perm_in_kernel} {dtype}: {err:.3g}"


@interpreted
@pytest.mark.parametrize("m,k", [(1, 256), (20, 640), (8, 1024), (5, 1100)])
def test_interpreted_permute_kernel_gathers_the_columns(m, k):
    """Our act-order gather against x[:, perm] (M over one row block, K over one column block)."""
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).half()
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(k))
    for spread, rows in ((m, 1 << 30), (0, 1)):  # K spread over programs; whole rows a program
        assert torch.equal(w4a16.permute_activation(x, perm, spread, rows), x[:, perm])
        assert not torch.equal(w4a16.permute_activation(x, perm.flip(0), spread, rows), x[:, perm])


@interpreted
def test_interpreted_split_k_is_deterministic_and_agrees_with_one_split():
    q = _weight(128, 1024, 128, sym=False, act_order=False)
    x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(8)).half()
    split4 = w4a16.triton_linear(x, *_args(q), None, None, config=(16, 64, 128, 4, 4, 4))
    assert torch.equal(split4, w4a16.triton_linear(x, *_args(q), None, None, config=(16, 64, 128, 4, 4, 4)))
    one = w4a16.triton_linear(x, *_args(q), None, None, config=(16, 64, 128, 1, 4, 4))
    assert rel(split4, one) < 1e-3


@interpreted
@pytest.mark.parametrize("path", ["gemm", "dequant"])
@pytest.mark.parametrize("fault", ["group constexpr doubled", "nibble order reversed", "act-order dropped"])
def test_interpreted_planted_faults_fail(path, fault):
    q = _weight(128, 512, 64, sym=False, act_order=True)
    qw, s, z, g = _args(q)
    perm = q.perm
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(9)).half()
    if fault == "nibble order reversed":
        qw = pack_nibbles(unpack_nibbles(qw, 1, PLAIN_ORDER[::-1]), 1)
    elif fault == "act-order dropped":
        perm = None
    if fault != "group constexpr doubled":
        got = w4a16.triton_linear(x, qw, s, z, g, perm, None, threshold=64 if path == "gemm" else 0)
    elif path == "gemm":
        got = torch.empty(8, 128, dtype=torch.float16)
        w4a16.launch_gemm(x, qw, s, z, 2 * g, perm, None, got, w4a16.gemm_config(8, 512, g))
    else:
        wd = torch.empty(128, 512, dtype=torch.float16)
        w4a16.launch_dequant(qw, s, z, 2 * g, wd, w4a16.dequant_block_k(512, g))
        got = torch.nn.functional.linear(x.index_select(1, perm), wd)
    assert rel(got, q.reference_linear(x)) > FAULT, f"{path}: {fault}"


def test_the_kernels_under_the_interpreter():
    """The interpreter tests above, in a child pytest with TRITON_INTERPRET=1 (it must be set before the kernels
    are defined). Where CUDA is, test_quant_gpu.py runs the compiled kernels instead."""
    run_interpreted_tests(__file__)
