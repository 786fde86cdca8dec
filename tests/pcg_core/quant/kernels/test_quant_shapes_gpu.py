"""Every quantized-linear kernel against its reference over the shapes that matter (issue 47: "a pass must mean
*right*"), on weights whose scales vary as a trained checkpoint's (synthetic_weights.structured_weight).

The FP8 128×128-block GEMM returned garbage on the H200 at every K/128 not a multiple of 4 while the kernel tests
passed: they ran K = 2048 only, on `randn · K^-½` weights whose block scales are all alike. Here each kernel runs
- over K-block counts 1…20 (K = 128·b, N = 640: five blocks, not a multiple of 4 either) at M ∈ {3, 8, 129};
- at the widths of real models (Qwen2.5, Qwen3, Qwen3-MoE, Qwen1.5-MoE, gpt-oss, DeepSeek-V3) at M ∈ {1, 17, 64,
  512, 4096}, where the token-count thresholds put the paths (fused GEMMs, dequantize + cuBLAS, cuBLASLt's
  block-scaled GEMM for W4AFP8 above 128 tokens) on both sides;
- and the grouped MoE GEMM at expert widths whose K-block count is not a multiple of 4.
Shapes a kernel does not take (block FP8 at K = 2880) must still give the reference (the module routes them to
it); int4 at K = 2880 runs in groups of 64 (Int4Scheme.group_for). The tolerances are the existing kernel tests'
(test_quant_gpu.py, test_quant_w4a8.py), imported, not restated. A planted fault — the old block-scale operand
(a plain transpose, stride K/128) — must fail the check at K = 896, or the test could not catch what it is for.

GPU tests are marked `gpu` and skipped without CUDA; the tests at the end run the same builders and references on
the CPU (where each module's forward IS its reference) for the constructor and reference wiring. On the H200
(torch 2.11, Triton 3.6) the file took ~40 s with Triton's cache warm and ~105 s cold (compiling dominates).

    PYTHONPATH=. python -m pytest -q tests/pcg_core/quant/kernels/test_quant_shapes_gpu.py
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_quant_gpu import KERNEL_RTOL, W4A16_RTOL
from test_quant_w4a8 import RTOL as W4A8_RTOL

from pcg_core.quant.layers import experts
from pcg_core.quant.kernels import fp4_gemm as fp4_w4a16
from pcg_core.quant.kernels import moe_gemm
from pcg_core.quant.kernels import w4a8_gemm as w4a8
from pcg_core.quant.layers import linear as quant_linear
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.schemes.fp4 import FP4_SCHEMES
from pcg_core.quant.layers.fp4_experts import quantize_experts_fp4
from pcg_core.quant.layers.int4_linear import Int4Linear, W4A8Linear
from pcg_core.quant.schemes.int4 import INT4_SCHEMES
from pcg_core.quant.layers.linear import QuantLinear, _kernel_ok
from pcg_core.quant.schemes.nibbles import dequantize_codes, unpack_nibbles
from pcg_core.quant.schemes.w8a8 import BLOCK, SCHEMES, get_scheme, reference_linear
from pcg_core.quant.synthetic_weights import structured_weight

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def on_gpu(test):
    """Marked gpu and skipped without CUDA (the rest of this file runs on a CPU)."""
    return pytest.mark.gpu(needs_gpu(test))


EIGHT_BIT = [*SCHEMES, "int8_w8a8_static"]  # QuantLinear
FOUR_BIT = ["awq", "gptq", "w4a8", "w4afp8", "nvfp4", "mxfp4"]  # Int4Linear, W4A8Linear, Fp4Linear
KINDS = EIGHT_BIT + FOUR_BIT
K_BLOCKS = list(range(1, 21))
SWEEP_N = 640
SWEEP_M = [3, 8, 129]
REAL_M = [1, 17, 64, 512, 4096]
REAL_SHAPES = [  # (N out, K in): K-block count in the comment
    (896, 896),  # Qwen2.5-0.5B q/o_proj: 7
    (4864, 896),  # its gate/up_proj: 7
    (896, 4864),  # its down_proj: 38
    (8960, 1536),  # Qwen2.5-1.5B gate/up_proj: 12
    (1536, 8960),  # its down_proj: 70
    (2880, 2880),  # gpt-oss expert down (hidden = intermediate = 2880): 22.5 (block FP8 not taken)
    (1408, 2048),  # Qwen1.5-MoE-A2.7B expert gate/up (N = 11 blocks): 16
    (2048, 1408),  # its expert down: 11
    (2048, 768),  # Qwen3-30B-A3B expert down: 6
    (9728, 2560),  # Qwen3-4B gate/up_proj: 20
    (18944, 3584),  # Qwen2.5-7B gate/up_proj: 28
    (3584, 18944),  # its down_proj: 148
    (8192, 5120),  # Qwen3-32B q_proj: 40
    (4096, 7168),  # DeepSeek-V3 expert gate/up: 56
]
MOE_SHAPES = {"qwen3-30b-a3b-down": (2048, 768), "qwen1.5-moe-down": (2048, 1408), "gpt-oss-down": (2880, 2880)}
MOE_EXPERTS = 8  # the kernel's indexing does not depend on E; few experts keep the GPU time small
MOE_FORMATS = [*SCHEMES, "awq", "gptq", "nvfp4", "mxfp4"]  # what test_quant_gpu's moe_gemm test runs


def rtol(name: str) -> float:
    """The existing kernel tests' tolerance for this kind (see their comments for the reasoning)."""
    if name in ("w4a8", "w4afp8"):
        return W4A8_RTOL[torch.bfloat16]
    return W4A16_RTOL if name in FOUR_BIT else KERNEL_RTOL


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm())


# --- builders and references (device-agnostic: the CPU test below runs them too) ---------------------------------


def float_linear(n: int, k: int, device: str) -> torch.nn.Linear:
    """A bf16 nn.Linear holding a structured weight (seeded by its shape), as the existing tests build theirs."""
    g = torch.Generator(device=device).manual_seed(n * 100_003 + k)
    lin = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(structured_weight(n, k, generator=g, device=device))
    return lin


def build(name: str, n: int, k: int, device: str) -> torch.nn.Module:
    """The layer of scheme `name` from float_linear, through the constructor quantize_model uses for it."""
    lin, s = float_linear(n, k, device), get_scheme(name)
    if name in INT4_SCHEMES:
        return (W4A8Linear if s.w4a8 else Int4Linear).from_scheme(lin, s)
    if name in FP4_SCHEMES:
        return Fp4Linear.from_scheme(lin, s)
    return QuantLinear.from_linear(lin, s, None if s.act_dynamic else torch.ones((), device=device))


def activation(m: int, k: int, device: str, seed: int = 0) -> torch.Tensor:
    """x (M, K) bf16 as a layer sees it: token norms 1/3…3×, 1×128 groups 1/3…3× (so per-group activation scales
    differ along K too), and outlier channels ×8."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device)
    x = x * 3.0 ** (2 * torch.rand(m, 1, generator=g, device=device) - 1)
    groups = 3.0 ** (2 * torch.rand(1, -(-k // BLOCK), generator=g, device=device) - 1)
    x = x * groups.repeat_interleave(BLOCK, 1)[:, :k]
    x[:, ::61] *= 8
    return x.bfloat16()


def calibrate(layer: torch.nn.Module, x: torch.Tensor) -> None:
    """A static scheme's input_scale from this batch's absmax (as calibrate.py records it): no clamping."""
    if isinstance(layer, QuantLinear) and layer.input_scale is not None:
        layer.input_scale.copy_((x.float().abs().amax() / layer.scheme.qmax).reshape(()))


def reference(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The plain math each kind's kernels are held to, as the existing kernel tests call it."""
    if isinstance(layer, QuantLinear):
        return reference_linear(x, layer.weight, layer.weight_scale, layer.scheme, layer.input_scale)
    if isinstance(layer, W4A8Linear):  # before Int4Linear: its subclass
        return w4a8_reference(layer, x)
    if isinstance(layer, Int4Linear):
        return layer.weight_int4().reference_linear(x)
    return fp4_w4a16.reference(x.float(), layer.weight_packed, layer.weight_scale, layer.global_scale, layer.block,
                               layer.bias)


def w4a8_reference(layer: W4A8Linear, x: torch.Tensor) -> torch.Tensor:
    """w4a8.reference's math with the activation quantized on the CPU. On CUDA torch divides the absmax by 448 as a
    product with its reciprocal, an ulp off the exact division that the kernel and the CPU do (test_quant_w4a8 checks
    the kernel's codes bitwise against the CPU's): measured on the H200, 72 of one token's 2304 e4m3 codes then
    differ by a step and the CUDA reference alone is 1.2e-2 from the kernel (K = 2304, M = 3; 1.6e-4 from this one)."""
    xp = x if layer.perm is None else x.index_select(1, layer.perm)
    xq, sx = w4a8.quantize_act(xp.cpu(), layer.act)
    w = dequantize_codes(unpack_nibbles(layer.qweight, 1), layer.scales, layer.zeros, layer.group)
    return torch.nn.functional.linear(xq.to(x.device).float() * sx.to(x.device), w).to(x.dtype)


def kernel_takes(name: str, n: int, k: int) -> bool:
    """Whether QuantLinear's CUDA kernel is to run these widths (linear._kernel_ok's rule, restated)."""
    if get_scheme(name).weights == "block":
        return n % BLOCK == 0 and k % BLOCK == 0
    return n % 16 == 0 and k % 16 == 0


def check(name: str, layer: torch.nn.Module, m: int) -> None:
    """layer(x) against its reference within the kind's tolerance; 8-bit: routed as _kernel_ok should."""
    n, k = layer.out_features, layer.in_features
    x = activation(m, k, "cuda", seed=m)
    calibrate(layer, x)
    route = ""
    if isinstance(layer, QuantLinear):
        assert _kernel_ok(x, layer) == kernel_takes(name, n, k), f"{name} {n}×{k}: routed wrong"
        route = "kernel" if kernel_takes(name, n, k) else "reference path"
    elif name in INT4_SCHEMES:  # K = 2880: groups of 64, the largest dividing K
        assert layer.group == get_scheme(name).group_for(k)
    got = layer(x)
    want = reference(layer, x)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    err = rel(got, want)
    assert err < rtol(name), f"{name} N={n} K={k} ({k / BLOCK:g} blocks) M={m} {route}: {err:.3g}"


@pytest.fixture(scope="module")
def layers():
    """layers(name, n, k): built once on the GPU per module run, shared by every M."""
    cache: dict[tuple[str, int, int], torch.nn.Module] = {}

    def get(name: str, n: int, k: int) -> torch.nn.Module:
        if (name, n, k) not in cache:
            cache[(name, n, k)] = build(name, n, k, "cuda")
        return cache[(name, n, k)]

    yield get
    cache.clear()
    torch.cuda.empty_cache()


# --- dense layers -------------------------------------------------------------------------------------------------


@on_gpu
@pytest.mark.parametrize("m", SWEEP_M)
@pytest.mark.parametrize("blocks", K_BLOCKS)
@pytest.mark.parametrize("name", KINDS)
def test_every_kernel_over_k_block_counts(layers, name, blocks, m):
    check(name, layers(name, SWEEP_N, BLOCK * blocks), m)


@on_gpu
@pytest.mark.parametrize("m", REAL_M)
@pytest.mark.parametrize("n,k", REAL_SHAPES, ids=[f"{n}x{k}" for n, k in REAL_SHAPES])
@pytest.mark.parametrize("name", KINDS)
def test_every_kernel_at_real_widths(layers, name, n, k, m):
    check(name, layers(name, n, k), m)


@on_gpu
@pytest.mark.parametrize("scaled_mm", [True, False], ids=["block_scaled_mm", "triton"])
@pytest.mark.parametrize("blocks", K_BLOCKS)
def test_w4afp8_large_m_paths_over_k_block_counts(layers, blocks, scaled_mm):
    """W4AFP8 above SCALED_MM_MIN_M: cuBLASLt's 1×128 × 1×128 block-scaled GEMM (M = 130 padded to 132) and the
    Triton GEMM on the 8-bit scratch, forced either way, at every K-block count."""
    layer = layers("w4afp8", SWEEP_N, BLOCK * blocks)
    m, k = 130, layer.in_features
    assert w4a8.scaled_mm_fits(activation(1, k, "cuda"), "fp8", layer.group, SWEEP_N, k)
    x = activation(m, k, "cuda", seed=blocks)
    got = w4a8.triton_linear(x, layer.qweight, layer.scales, layer.zeros, layer.group, "fp8", scaled_mm=scaled_mm)
    err = rel(got, reference(layer, x))
    assert err < W4A8_RTOL[torch.bfloat16], f"K={k} ({blocks} blocks): {err:.3g}"


@on_gpu
@pytest.mark.parametrize("m", [8, 129])
def test_the_old_block_scale_layout_fails_this_check_at_k_896(layers, m, monkeypatch):
    """Planted fault: the block GEMM as linear.py ran it before issue 47 — `torch._scaled_mm` with the weight-block
    scales as a plain transpose (stride K/128), which cuBLASLt reads with a stride of round_up(K/128, 4) — must fail
    check() at K = 896 (7 blocks), on the same layer that passes it with the fix (measured on the H200, torch 2.11:
    ~0.95 relative at K = 896, up to 1e7 at other K-block counts)."""
    layer = layers("fp8_block", SWEEP_N, 896)
    check("fp8_block", layer, m)

    def old_block_fp8_mm(xq, sx, weight, weight_scale):
        sx = sx.t().contiguous().t()
        return torch._scaled_mm(xq, weight.t(), scale_a=sx, scale_b=weight_scale.t(), out_dtype=torch.bfloat16)

    monkeypatch.setattr(quant_linear, "block_fp8_mm", old_block_fp8_mm)
    with pytest.raises(AssertionError, match=r"fp8_block N=640 K=896 .* kernel: "):
        try:
            check("fp8_block", layer, m)
        except RuntimeError as e:  # a torch that checks the operand's strides refuses it: caught as well
            raise AssertionError(f"fp8_block N=640 K=896 (7 blocks) M={m} kernel: refused ({e})") from e


# --- the grouped MoE GEMM -----------------------------------------------------------------------------------------


def experts_module(name: str, n: int, k: int, device: str, num: int = MOE_EXPERTS) -> torch.nn.Module:
    """A module holding one projection (`down_proj`, [E, N, K]) of `num` experts with structured float weights,
    quantized in place by experts.py's (layers/fp4_experts.py's) own quantizer for scheme `name`."""
    g = torch.Generator(device=device).manual_seed(n * 100_003 + k)
    mod = torch.nn.Module()
    mod.num_experts = num
    w = torch.stack([structured_weight(n, k, generator=g, device=device) for _ in range(num)]).bfloat16()
    mod.down_proj = torch.nn.Parameter(w, requires_grad=False)
    s = get_scheme(name)
    if name in FP4_SCHEMES:
        quantize_experts_fp4(mod, s)
    else:
        experts.quantize_experts(mod, s, None if s.act_dynamic else {"gate_up": 1.0, "down": 1.0})
    return mod


def routing(rows: int, num: int, k: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows [S, K] bf16 sorted by expert, counts [E] int32, offsets [E] int32): random experts, some with none."""
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.sort(torch.randint(0, num - 1, (rows,), generator=g, device=device)).values  # the last gets none
    counts = torch.bincount(ids, minlength=num).int()
    return activation(rows, k, device, seed), counts, torch.cumsum(counts, 0, dtype=torch.int32)


def grouped_reference(mod: torch.nn.Module, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """experts.py's dequantize-every-expert + torch._grouped_mm path (test_quant_gpu's reference for moe_gemm)."""
    w = experts.dequantized_experts_weight(mod, "down_proj", x.dtype)
    return torch._grouped_mm(x, w.transpose(1, 2), offs=offsets).float()


@pytest.fixture(scope="module")
def experts_modules():
    """experts_modules(name, shape): built once on the GPU per module run, shared by both row counts."""
    cache: dict[tuple[str, str], torch.nn.Module] = {}

    def get(name: str, shape: str) -> torch.nn.Module:
        if (name, shape) not in cache:
            cache[(name, shape)] = experts_module(name, *MOE_SHAPES[shape], "cuda")
        return cache[(name, shape)]

    yield get
    cache.clear()
    torch.cuda.empty_cache()


@on_gpu
@pytest.mark.parametrize("rows", [37, 1024])
@pytest.mark.parametrize("shape", list(MOE_SHAPES))
@pytest.mark.parametrize("name", MOE_FORMATS)
def test_moe_gemm_at_expert_widths(experts_modules, name, shape, rows):
    """moe_gemm's kernel over the codes against the dequantizing path, at K-block counts 6, 11 and 22.5; act-order
    both ways (gathered inside the GEMM, rows permuted first)."""
    n, k = MOE_SHAPES[shape]
    mod = experts_modules(name, shape)
    w = experts.expert_weights(mod, "down_proj")
    assert moe_gemm.takes(w, k), f"{name} {shape}: the kernel does not take it"
    x, counts, offsets = routing(rows, MOE_EXPERTS, k, "cuda", seed=rows)
    want = grouped_reference(mod, x, offsets)
    for permute_rows_min in ((1, 1 << 62) if w.perm is not None else (moe_gemm.PERMUTE_ROWS_MIN,)):
        got = moe_gemm.grouped_linear(x, counts, w, permute_rows_min=permute_rows_min)
        err = rel(got, want)
        assert err < KERNEL_RTOL, f"{name} {shape} rows={rows} permute_rows_min={permute_rows_min}: {err:.3g}"


# --- the same builders and references on the CPU ------------------------------------------------------------------

CPU_SHAPES = [(128, 128), (128, 896), (128, 2880)]  # one block; 7 blocks; 22.5 blocks (int4 groups of 64)


@pytest.mark.parametrize("n,k", CPU_SHAPES, ids=[f"{n}x{k}" for n, k in CPU_SHAPES])
@pytest.mark.parametrize("name", KINDS)
def test_every_layer_builds_on_cpu(name, n, k):
    """Where a module's forward is its reference (the CPU), reference() must give the module's own output: the
    GPU tests' constructors, activations and references are wired right for every kind and shape class."""
    layer = build(name, n, k, "cpu")
    assert (layer.out_features, layer.in_features) == (n, k)
    if name in INT4_SCHEMES:
        assert layer.group == (128 if k % 128 == 0 else 64) and (layer.perm is not None) == get_scheme(name).act_order
    for m in (1, 3):
        x = activation(m, k, "cpu", seed=m)
        calibrate(layer, x)
        got, want = layer(x), reference(layer, x)
        assert got.shape == (m, n) and got.dtype == torch.bfloat16
        assert rel(got, want) < 5e-3, f"{name} {n}×{k} M={m}: {rel(got, want):.3g}"  # float32 refs: bf16 rounding


@pytest.mark.parametrize("name", EIGHT_BIT)
def test_the_restated_routing_rule_is_kernel_oks(name):
    """check() asserts QuantLinear's routing against kernel_takes; here kernel_takes is held to _kernel_ok itself
    (a stand-in for a bf16 CUDA activation: _kernel_ok reads only is_cuda and dtype) over every shape the GPU tests
    run, and block FP8 at K = 2880 is among the shapes routed to the reference."""
    cuda_bf16 = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)
    shapes = [(SWEEP_N, BLOCK * b) for b in K_BLOCKS] + REAL_SHAPES
    for n, k in shapes:
        layer = QuantLinear(k, n, get_scheme(name), device="meta")
        assert _kernel_ok(cuda_bf16, layer) == kernel_takes(name, n, k), f"{name} {n}×{k}"
    assert all(kernel_takes(name, n, k) for n, k in shapes) == (name != "fp8_block")


@pytest.mark.parametrize("name", MOE_FORMATS)
def test_every_experts_module_builds_on_cpu(name):
    """experts_module and routing on the CPU (3 experts, K = 768: 6 blocks): the grouped reference equals each row
    through its own expert's dequantized weight, and the layout is one moe_gemm reads."""
    n, k = 128, 768
    mod = experts_module(name, n, k, "cpu", num=3)
    w = experts.expert_weights(mod, "down_proj")
    assert w.shape == (3, n, k)
    x, counts, offsets = routing(40, 3, k, "cpu")
    assert int(counts[-1]) == 0 and int(counts.sum()) == 40
    ids = torch.repeat_interleave(torch.arange(3), counts.long())
    per_row = torch.stack([x[i].float() @ experts.expert_weight(mod, "down_proj", int(e)).t()
                           for i, e in enumerate(ids)])
    assert rel(grouped_reference(mod, x, offsets), per_row) < 1e-2  # bf16 weights in the grouped path
