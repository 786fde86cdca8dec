"""8-bit kernels on CUDA against the plain math they stand for, and under graph capture (device runs only)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pcg_core.quant.kernels import tuning
from pcg_core.quant import SCHEMES, QuantLinear
from pcg_core.quant.layers.linear import _kernel_ok
from pcg_core.quant.schemes.w8a8 import get_scheme, quantize_activation, reference_linear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Kernel vs reference, relative (Frobenius): both quantize the activations the same way, so what differs is
# accumulation order and the bf16 output rounding (2^-9).
KERNEL_RTOL = 1e-2


def _layer(name: str, n: int, k: int, seed: int = 0) -> QuantLinear:
    g = torch.Generator(device="cuda").manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g, device="cuda") * k**-0.5)
    s = get_scheme(name)
    return QuantLinear.from_linear(lin, s, None if s.act_dynamic else torch.tensor(4.0 / s.qmax, device="cuda"))


@pytest.mark.parametrize("m", [1, 8, 17, 64, 512, 4096])
@pytest.mark.parametrize("name", [*SCHEMES, "int8_w8a8_static"])
def test_kernel_matches_the_reference(name, m):
    layer = _layer(name, 1024, 2048)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    assert _kernel_ok(x, layer)
    got = layer(x)
    want = reference_linear(x, layer.weight, layer.weight_scale, layer.scheme, layer.input_scale)
    rel = float((got.float() - want.float()).norm() / want.float().norm())
    assert got.dtype == torch.bfloat16 and rel < KERNEL_RTOL, f"{name} M={m}: {rel:.3g}"


@pytest.mark.parametrize("name", [*SCHEMES])
def test_planted_wrong_scale_is_caught_by_the_kernel_check(name):
    layer = _layer(name, 1024, 2048)
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    want = reference_linear(x, layer.weight, layer.weight_scale, layer.scheme, layer.input_scale)
    layer.weight_scale.mul_(torch.linspace(0.5, 1.5, layer.weight_scale.numel(), device="cuda").view_as(layer.weight_scale))
    rel = float((layer(x).float() - want.float()).norm() / want.float().norm())
    assert rel > KERNEL_RTOL


@pytest.mark.parametrize("name", list(SCHEMES))
def test_replay_is_bitwise_equal_to_eager(name):
    layer = _layer(name, 1024, 2048)
    x = torch.randn(48, 2048, device="cuda", dtype=torch.bfloat16)
    eager = layer(x).clone()
    assert torch.equal(_replayed(layer, x), eager)


def _replayed(layer: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """layer(x) (a module or any function of x) captured in a CUDA graph (after a warm-up on the capture stream)
    and replayed once: its output."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = layer(x)
    g.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("m", [1, 16, 17, 64, 300, 4096])
@pytest.mark.parametrize("n,k", [(1024, 2048), (1040, 2064)])  # the second: partial N tiles and a partial K step
def test_int8_kernel_equals_int_mm_with_the_same_epilogue(m, n, k):
    """INT8 products accumulate exactly in int32, so our kernel must equal torch._int_mm followed by the same
    float32 scaling, bit for bit, whatever its tiles and tile edges."""
    from pcg_core.quant.kernels import int8_gemm as int8_mm

    if not int8_mm.available():
        pytest.skip("needs Triton")
    layer = _layer("int8_w8a8", n, k, seed=m)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq, sx = quantize_activation(x, layer.scheme)
    got = torch.ops.pcg.int8_scaled_mm(xq, layer.weight, sx, layer.weight_scale, bias)
    pad = torch.nn.functional.pad(xq, (0, 0, 0, max(0, 32 - m)))
    acc = torch._int_mm(pad, layer.weight.t())[:m]
    want = (acc.float() * sx * layer.weight_scale.view(1, -1) + bias.float()).to(torch.bfloat16)
    assert torch.equal(got, want), float((got.float() - want.float()).abs().max())


@pytest.mark.parametrize("fused", [False, True], ids=["dequantized", "moe_gemm"])
@pytest.mark.parametrize("name", [*SCHEMES, "awq", "gptq", "w4a8", "w4afp8"])
def test_grouped_quantized_experts_track_the_dense_reference(name, fused, monkeypatch):
    """The CUDA expert path (grouped GEMMs over bf16-dequantized weights, or moe_gemm's kernel over the codes)
    against the float32 dense reference on the same quantized experts, and its replay bitwise equal to eager."""
    from pcg_helpers import tiny_model

    from pcg_core.quant import record_input_absmax
    from pcg_core.quant.kernels import moe_gemm
    from pcg_core.quant.layers.experts import grouped_quantized_experts_forward, is_experts, quantize_experts, quantized_experts_forward

    monkeypatch.setattr(moe_gemm, "ENABLED", fused)
    calls = []
    real = moe_gemm.grouped_linear
    monkeypatch.setattr(moe_gemm, "grouped_linear", lambda *a, **k: calls.append(1) or real(*a, **k))

    lm = tiny_model("qwen3-moe", dtype=torch.bfloat16, device="cuda")
    mod = next(m for m in lm.model.modules() if is_experts(m))
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(40, lm.config.hidden_size, generator=g, device="cuda").bfloat16()
    idx = torch.stack([torch.randperm(mod.num_experts, generator=g, device="cuda")[:2] for _ in range(40)])
    w = torch.rand(40, 2, generator=g, device="cuda").bfloat16()
    with record_input_absmax(mod) as absmax:
        mod(x, idx, w)
    s = get_scheme(name)  # the int4 ones: quantize_experts_int4 (w4a8/w4afp8: activations fake-quantized per token)
    quantize_experts(mod, s, None if s.act_dynamic else {k: absmax[f".{k}"] for k in ("gate_up", "down")})
    want = quantized_experts_forward(mod, x, idx, w).float()
    got = grouped_quantized_experts_forward(mod, x, idx, w)
    rel = float((got.float() - want).norm() / want.norm())
    assert rel < 2e-2, f"{name}: {rel:.3g}"
    graph = torch.cuda.CUDAGraph()
    s_ = torch.cuda.Stream()
    s_.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s_):
        grouped_quantized_experts_forward(mod, x, idx, w)
    torch.cuda.current_stream().wait_stream(s_)
    with torch.cuda.graph(graph):
        out = grouped_quantized_experts_forward(mod, x, idx, w)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got)
    assert bool(calls) == fused, "the kernel ran where asked, and only there"


@pytest.mark.parametrize("name", ["awq", "gptq"])
def test_int4_linear_on_cuda_replays_its_cpu_reference(name):
    """Int4Linear's path on the GPU (today the dequantized reference; the W4A16 kernel will be held to the same
    check): at a real width, bf16 activations, equal to the CPU computation within bf16 rounding, and a CUDA graph
    of it replaying bitwise what it ran eagerly."""
    import copy

    from pcg_core.quant import Int4Linear, get_scheme

    torch.manual_seed(0)
    lin = torch.nn.Linear(4096, 1024, bias=False, dtype=torch.bfloat16)
    cpu = Int4Linear.from_scheme(lin, get_scheme(name))
    gpu = copy.deepcopy(cpu).cuda()  # the same codes, scales and act-order permutation
    x = torch.randn(64, 4096, dtype=torch.bfloat16)
    want = cpu(x).float()
    xg = x.cuda()
    eager = gpu(xg)
    torch.testing.assert_close(eager.float().cpu(), want, rtol=2e-2, atol=2e-2)
    assert torch.equal(_replayed(gpu, xg.clone()), eager)


# --- W4A16: pcg::w4a16_linear (quant/kernels/w4a16_gemm.py) at a real width ----------------------------------------------------

# Kernel vs the float32 reference (Int4Weight.reference_linear), relative (Frobenius). Both use the same codes,
# scales and zero points; the kernel rounds the dequantized weight to bf16 for the tensor cores (≤ 2^-9 relative
# each, unbiased, so ≈ 2^-9/√3 ≈ 1e-3 on a sum of 4096 independent terms) and the output once more (≤ 2^-9,
# ≈ 1e-3 RMS); fp32 accumulation order adds ~1e-6. Expected ≈ 1.5e-3; 1e-2 leaves a 6× margin, while a wrong
# group, nibble order or permutation moves whole groups (rel err O(0.1–1), checked below).
W4A16_RTOL = 1e-2


@pytest.fixture(scope="module")
def int4_layers():
    """One awq-like (asym, g128) and one gptq-like (sym, g128, act-order) Int4Linear of 8192×4096, built once."""
    from pcg_core.quant import Int4Linear, get_scheme

    layers = {}
    for seed, name in enumerate(("awq", "gptq")):
        g = torch.Generator(device="cuda").manual_seed(seed)
        lin = torch.nn.Linear(4096, 8192, bias=False, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(8192, 4096, generator=g, device="cuda") * 4096**-0.5)
        layers[name] = Int4Linear.from_scheme(lin, get_scheme(name))
    return layers


def _w4a16_rel(layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> float:
    w = layer.weight_int4()
    got = torch.ops.pcg.w4a16_linear(x, layer.qweight, layer.scales, layer.zeros, layer.group, layer.perm, bias)
    want = w.reference_linear(x, bias)
    assert got.dtype == x.dtype and got.shape == want.shape
    return float((got.float() - want).norm() / want.norm())


@pytest.mark.parametrize("m", [1, 2, 8, 9, 16, 17, 33, 64, 65, 128, 129, 512, 4096])
@pytest.mark.parametrize("name", ["awq", "gptq"])
def test_w4a16_kernel_matches_the_reference_at_a_real_width(int4_layers, name, m):
    """M ≤ THRESHOLD_M: the fused GEMM (split-K at M ≤ 16); above: dequantize + cuBLAS."""
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    rel = _w4a16_rel(int4_layers[name], x)
    assert rel < W4A16_RTOL, f"{name} M={m}: {rel:.3g}"


@pytest.mark.parametrize("m,k", [(128, 4096), (4096, 4096), (200, 2048), (129, 14336), (4096, 12288), (512, 16384)])
def test_w4a16_act_order_rows_permuted_at_real_widths(m, k, monkeypatch):
    """Act-order's activation permute where whole rows go one per program (from ROW_PERMUTE_MIN_M), at the hidden
    and MLP widths the cells run (Qwen3-8B 12288, Llama-3.1-8B 14336) — beyond ROW_PERMUTE_MAX_K too, for it to be
    raised — M not a multiple of the rows per program: exactly x[:, perm], a replay bitwise equal, a reversed
    permutation caught."""
    from pcg_core.quant.kernels import w4a16_gemm as w4a16

    monkeypatch.setattr(w4a16, "ROW_PERMUTE_MAX_K", w4a16.ROW_PERMUTE_ELEMENTS)

    g = torch.Generator(device="cuda").manual_seed(k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    perm = torch.randperm(k, device="cuda", generator=g)
    got = w4a16.permute_activation(x, perm)
    assert torch.equal(got, x[:, perm])
    assert torch.equal(_replayed(lambda t: w4a16.permute_activation(t, perm), x), got)
    assert not torch.equal(w4a16.permute_activation(x, perm.flip(0)), got)


@pytest.mark.parametrize("m", [8, 64, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_w4a16_bias_and_fp16_activations(int4_layers, dtype, m):
    bias = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, 4096, device="cuda", dtype=dtype)
    rel = _w4a16_rel(int4_layers["gptq"], x, bias)
    assert rel < W4A16_RTOL, f"{dtype} M={m}: {rel:.3g}"


@pytest.mark.parametrize("m", [8, 64, 65, 512])
def test_w4a16_kernel_launched_with_a_wrong_group_is_caught(int4_layers, m):
    """A planted fault: the kernel told the group is 256 while the weight's is 128 (every other group's scales
    read wrong); the comparison above must fail it."""
    from pcg_core.quant.kernels import w4a16_gemm as w4a16

    layer = int4_layers["awq"]
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    want = layer.weight_int4().reference_linear(x)
    if m <= w4a16.THRESHOLD_M:
        got = torch.empty(m, 8192, device="cuda", dtype=torch.bfloat16)
        w4a16.launch_gemm(x, layer.qweight, layer.scales, layer.zeros, 256, None, None, got,
                          w4a16.gemm_config(m, 4096, 128))
    else:
        wd = torch.empty(8192, 4096, device="cuda", dtype=torch.bfloat16)
        w4a16.launch_dequant(layer.qweight, layer.scales, layer.zeros, 256, wd, w4a16.dequant_block_k(4096, 128))
        got = torch.nn.functional.linear(x, wd)
    assert float((got.float() - want).norm() / want.norm()) > W4A16_RTOL


@pytest.mark.parametrize("m", [1, 8, 33, 64, 512])
@pytest.mark.parametrize("name", ["awq", "gptq"])
def test_w4a16_replay_is_bitwise_equal_to_eager(int4_layers, name, m):
    """Split-K reduces in a fixed order (no atomics) and configurations come from a table, so a CUDA graph of the
    op (after the warm-up _replayed does) replays exactly what eager computed."""
    layer = int4_layers[name]
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    eager = layer(x).clone()
    assert torch.equal(_replayed(layer, x), eager)
    assert torch.equal(layer(x), eager)  # and eager is deterministic run to run


def test_w4a16_every_table_row_compiles_and_matches(int4_layers):
    """Each tuning-table row at the largest M it serves (capped at 128), forced past the threshold."""
    from pcg_core.quant.kernels import w4a16_gemm as w4a16

    layer = int4_layers["gptq"]
    for top, cfg in tuning.configs(w4a16.KERNEL):
        m = min(top, 128)
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        got = w4a16.triton_linear(x, layer.qweight, layer.scales, layer.zeros, layer.group, layer.perm, None,
                                  threshold=1 << 30, config=cfg)
        want = layer.weight_int4().reference_linear(x)
        rel = float((got.float() - want).norm() / want.norm())
        assert rel < W4A16_RTOL, f"{cfg} M={m}: {rel:.3g}"


# --- FP4 W4A16 (pcg::fp4_linear, kernels/fp4_gemm.py) -------------------------------------------------------------------
# The fused GEMM's bf16 weight tile is exact (e2m1 × e4m3/e8m0 scale ≤ 6 significant bits; the global multiplies
# the fp32 accumulator), so it differs from the float32 reference by the bf16 output rounding (≈ 1e-3 RMS) and
# fp32 summation order; dequantize + cuBLAS also rounds W·g to bf16 once (≈ 1.5e-3). W4A16_RTOL leaves ≥ 6×, while
# a swapped nibble order, a wrong block or a dropped global moves whole blocks (O(0.3–1), checked below).


@pytest.fixture(scope="module")
def fp4_layers():
    """An NVFP4 (block 16, power-of-two global) and an MXFP4 (block 32) Fp4Linear of 8192×4096 with bias, built once."""
    from pcg_core.quant import Fp4Linear

    layers = {}
    for seed, (name, block) in enumerate((("nvfp4", 16), ("mxfp4", 32))):
        g = torch.Generator(device="cuda").manual_seed(seed)
        lin = torch.nn.Linear(4096, 8192, bias=True, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(8192, 4096, generator=g, device="cuda") * 4096**-0.5)
        layers[name] = Fp4Linear.from_linear(lin, block)
    return layers


def _fp4_rel(layer, x: torch.Tensor, got: torch.Tensor | None = None) -> float:
    from pcg_core.quant.kernels import fp4_gemm as fp4_w4a16

    got = layer(x) if got is None else got
    want = fp4_w4a16.reference(x.float(), layer.weight_packed, layer.weight_scale, layer.global_scale, layer.block,
                               layer.bias)
    assert got.dtype == x.dtype and got.shape == want.shape
    return float((got.float() - want).norm() / want.norm())


@pytest.mark.parametrize("m", [1, 2, 8, 9, 16, 17, 33, 64, 65, 128, 129, 512, 4096])
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_fp4_kernel_matches_the_reference_at_a_real_width(fp4_layers, name, m):
    """M ≤ THRESHOLD_M: the fused GEMM (split-K at M ≤ 32); above: dequantize + cuBLAS; bf16 activations."""
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    rel = _fp4_rel(fp4_layers[name], x)
    assert rel < W4A16_RTOL, f"{name} M={m}: {rel:.3g}"


@pytest.mark.parametrize("m", [8, 64, 512])
def test_fp4_fp16_activations_odd_global_and_3d_input(fp4_layers, m):
    layer = fp4_layers["nvfp4"]
    saved = layer.global_scale.clone()
    layer.global_scale.mul_(0.37)  # not a power of two
    try:
        x = torch.randn(2, m, 4096, device="cuda", dtype=torch.float16)
        got = layer(x)
        assert got.shape == (2, m, 8192)
        rel = _fp4_rel(layer, x.reshape(-1, 4096), got.reshape(-1, 8192))
        assert rel < W4A16_RTOL, f"fp16 M={m}: {rel:.3g}"
    finally:
        layer.global_scale.copy_(saved)


@pytest.mark.parametrize("m", [8, 64, 65, 512])
@pytest.mark.parametrize("fault", ["nibble order swapped", "block size wrong", "global scale dropped"])
def test_fp4_planted_faults_are_caught(fp4_layers, m, fault):
    from pcg_core.quant.kernels import fp4_gemm as fp4_w4a16

    layer = fp4_layers["nvfp4"]
    packed, s, g, block = layer.weight_packed, layer.weight_scale, layer.global_scale, 16
    if fault == "nibble order swapped":
        packed = (packed << 4) | (packed >> 4)
    elif fault == "block size wrong":
        block = 32
    else:
        g = None
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    if m <= fp4_w4a16.THRESHOLD_M:
        got = torch.empty(m, 8192, device="cuda", dtype=torch.bfloat16)
        fp4_w4a16.launch_gemm(x, packed, s, g, block, layer.bias, got, fp4_w4a16.gemm_config(m, 4096, 32))
    else:
        wd = torch.empty(8192, 4096, device="cuda", dtype=torch.bfloat16)
        fp4_w4a16.launch_dequant(packed, s, g, block, wd, fp4_w4a16.dequant_block_k(4096, 32))
        got = torch.nn.functional.linear(x, wd, layer.bias)
    assert _fp4_rel(layer, x, got) > W4A16_RTOL, f"M={m}: {fault}"


@pytest.mark.parametrize("m", [1, 8, 33, 64, 512])
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_fp4_replay_is_bitwise_equal_to_eager(fp4_layers, name, m):
    """Split-K reduces in a fixed order, the global is read on the device, configurations come from a table: a
    CUDA graph of Fp4Linear (after _replayed's warm-up) replays exactly what eager computed."""
    layer = fp4_layers[name]
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    eager = layer(x).clone()
    assert torch.equal(_replayed(layer, x), eager)
    assert torch.equal(layer(x), eager)


def test_fp4_every_table_row_compiles_and_matches(fp4_layers):
    """Each tuning-table row at the largest M it serves (capped at 128), forced past the threshold, both blocks."""
    from pcg_core.quant.kernels import fp4_gemm as fp4_w4a16

    for name, layer in fp4_layers.items():
        for top, cfg in tuning.configs(fp4_w4a16.KERNEL):
            m = min(top, 128)
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            got = fp4_w4a16.triton_linear(x, layer.weight_packed, layer.weight_scale, layer.global_scale,
                                          layer.block, layer.bias, threshold=1 << 30, config=cfg)
            rel = _fp4_rel(layer, x, got)
            assert rel < W4A16_RTOL, f"{name} {cfg} M={m}: {rel:.3g}"


# --- moe_gemm: the grouped GEMM over quantized experts' codes (quant/kernels/moe_gemm.py) at Qwen3-30B-A3B's widths --------


@pytest.fixture(scope="module")
def moe_weights():
    """gate_up of 128 experts (1536×2048) in each format moe_gemm takes, random codes, and a top-8 routing of 512
    tokens (rows sorted by expert)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))
    import moe_gemm as bench  # benchmarks/moe_gemm.py: the same stand-ins the timing uses

    from pcg_core.quant.layers import experts

    e, n, k = bench.SHAPES["qwen3-30b"]
    mods = {name: bench.stand_in(name, e, n, k) for name in bench.ALL_FORMATS}
    weights = {name: (mod, experts.expert_weights(mod, "gate_up_proj")) for name, mod in mods.items()}
    return weights, bench.routed(512, e, k)


@pytest.mark.parametrize("rows", [1, 37, 4096])
@pytest.mark.parametrize("name", [*SCHEMES, "awq", "gptq", "nvfp4", "mxfp4"])
def test_moe_gemm_equals_the_dequantizing_path(moe_weights, name, rows):
    """moe_gemm against dequantize-every-expert + torch._grouped_mm (the same bf16 weights, another summation
    order), every configuration row, a replay bitwise equal to eager, and the rows given to the neighbouring
    experts caught."""
    from pcg_core.quant.layers import experts
    from pcg_core.quant.kernels import moe_gemm

    weights, (x, counts, _) = moe_weights
    mod, w = weights[name]
    x = x[:rows]
    counts = torch.bincount(torch.repeat_interleave(torch.arange(counts.numel(), device="cuda"), counts)[:rows],
                            minlength=counts.numel()).int()
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    want = torch._grouped_mm(x, experts.dequantized_experts_weight(mod, "gate_up_proj", x.dtype).transpose(1, 2),
                             offs=offsets).float()
    ways = (1, 1 << 62) if w.perm is not None else (moe_gemm.PERMUTE_ROWS_MIN,)  # act-order: rows permuted first, or
    for _, cfg in tuning.configs(moe_gemm.KERNEL):                                                 # gathered inside the GEMM
        for permute_rows_min in ways:
            got = moe_gemm.grouped_linear(x, counts, w, config=cfg, permute_rows_min=permute_rows_min)
            rel = float((got.float() - want).norm() / want.norm())
            assert rel < KERNEL_RTOL, f"{name} {cfg} rows={rows} permute_rows_min={permute_rows_min}: {rel:.3g}"
    eager = moe_gemm.grouped_linear(x, counts, w)
    assert torch.equal(_replayed(lambda t: moe_gemm.grouped_linear(t, counts, w), x), eager)
    if rows > 1:
        wrong = moe_gemm.grouped_linear(x, counts.roll(1), w).float()
        assert float((wrong - want).norm() / want.norm()) > 0.1, "rows given to other experts went unnoticed"
