"""pcg_core/quant/kernels/w4a8_gemm.py and W4A8Linear: int4 weights × 8-bit activations (int8, FP8 e4m3) quantized per token.

The op's CPU implementation is held to an independent computation (schemes.quantize_activation, the int4
dequantization, a hand-computed known answer); the Triton kernels, run by Triton's interpreter on CPU tensors,
are held to that reference, and planted faults (group scales one group off, the activation scale dropped, the
nibble order reversed) must fail the same comparison. GPU tests (marked `gpu`) run the compiled kernels at a real
width and replay them in a CUDA graph. Interpreter tests run in a child pytest with TRITON_INTERPRET=1:

    /tmp/tvenv/bin/python -m pytest -q tests/pcg_core/quant/kernels/test_quant_w4a8.py
"""

from __future__ import annotations

import json

import pytest
import torch
from triton_interpreter import interpreted, rel, run_interpreted_tests

from pcg_core.errors import UnsupportedModel
from pcg_core.quant.kernels import fp8_gemm
from pcg_core.quant.kernels import w4a8_gemm as w4a8
from pcg_core.quant.formats.detect import detect
from pcg_core.quant.layers.int4_linear import W4A8Linear
from pcg_core.quant.schemes.int4 import (INT4_SCHEMES, PLAIN_ORDER, Int4Weight, pack_nibbles, quantize_int4,
                                         unpack_nibbles)
from pcg_core.quant.schemes.w8a8 import SCHEMES, get_scheme, quantize_activation

# Kernel vs the float32 reference, relative (Frobenius). int8: the kernel quantizes the activation bitwise as the
# reference does and sums each group exactly in int32, so only fp32 summation order (~1e-6) and the fp16/bf16
# output rounding (2^-11 / 2^-8 per element) differ. fp8: the products are exact, the tensor cores' fp8
# accumulation and the output rounding add ~1e-3. A planted fault moves whole groups or rows: O(0.1–1).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
FAULT = 0.05
PER_TOKEN = {"int8": SCHEMES["int8_w8a8"], "fp8": SCHEMES["fp8_per_token"]}  # the 8-bit schemes' own quantizers


def _weight(n: int, k: int, group: int, sym: bool = True, seed: int = 0) -> Int4Weight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * k**-0.5
    return quantize_int4(w, group, sym)


def _args(q: Int4Weight) -> tuple:
    return pack_nibbles(q.q, 1), q.scales, q.zeros, q.group


def _x(m: int, k: int, seed: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    x[:, ::7] *= 6  # outlier channels: the per-token scale is set by them, as in real activations
    return x.to(dtype)


def _independent(x: torch.Tensor, q: Int4Weight, act: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the op stands for, from the 8-bit schemes' activation quantizer and Int4Weight's dequantization."""
    xq, sx = quantize_activation(x, PER_TOKEN[act])
    out = torch.nn.functional.linear(xq.float() * sx, q.dequantize(), None if bias is None else bias.float())
    return out.to(x.dtype)


# --- everywhere: the reference, the module, the op's registration ------------------------------------------------


def test_the_reference_gives_a_hand_computed_answer():
    """K = 32 in two groups of 16; the row's absmax is 127 so its int8 scale is 1 and its codes are its values."""
    k, group = 32, 16
    x = torch.tensor([[127.0, -3.0, 2.0, 0.0] * 8])
    codes = torch.tensor([[(i % 16) for i in range(k)], [15 - (i % 16) for i in range(k)]], dtype=torch.uint8)
    scales = torch.tensor([[0.5, 2.0], [0.25, 1.0]])
    zeros = torch.full((2, 2), 8.0)
    want = []
    for n in range(2):
        total = 0.0
        for i in range(k):
            total += float(x[0, i]) * (int(codes[n, i]) - 8) * float(scales[n, i // group])
        want.append(total)
    got = torch.ops.pcg.w4a8_linear(x, pack_nibbles(codes, 1), scales, zeros, group, "int8", None)
    assert got.tolist() == [want]


@pytest.mark.parametrize("act", ["int8", "fp8"])
@pytest.mark.parametrize("group,sym", [(32, True), (128, True), (-1, True), (64, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_op_is_the_independent_math(act, group, sym, dtype):
    q = _weight(48, 256, group, sym)
    x = _x(5, 256, dtype=dtype)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(2)).to(dtype)
    for b in (None, bias):
        got = torch.ops.pcg.w4a8_linear(x, *_args(q), act, b)
        assert got.dtype == dtype and got.shape == (5, 48)
        assert torch.equal(got, _independent(x, q, act, b))


@pytest.mark.parametrize("act", ["int8", "fp8"])
def test_the_activation_quantizer_is_the_8bit_schemes_bitwise(act):
    x = _x(9, 300, dtype=torch.bfloat16)
    x[3] = 0  # an all-zero token: scale TINY, codes 0
    xq, sx = w4a8.quantize_act(x, act)
    want_q, want_s = quantize_activation(x, PER_TOKEN[act])
    assert xq.dtype == want_q.dtype and torch.equal(xq.view(torch.int8), want_q.view(torch.int8))
    assert torch.equal(sx, want_s)


def test_the_schemes_are_registered_as_int4_schemes_with_8bit_activations():
    for name, act in (("w4a8", "int8"), ("w4afp8", "fp8")):
        s = get_scheme(name)
        assert s is INT4_SCHEMES[name] and s.activations == act and s.w4a8 and s.act_dynamic and s.kind == "int4"
        assert s.group == 128 and s.sym and not s.act_order
    assert not INT4_SCHEMES["awq"].w4a8 and INT4_SCHEMES["gptq"].activations is None


@pytest.mark.parametrize("act_order", [False, True])
def test_the_module_forward_is_the_op_and_act_order_permutes_first(act_order):
    lin = torch.nn.Linear(128, 40, bias=True)
    mod = W4A8Linear.from_linear(lin, 32, sym=True, act_order=act_order)
    mod.act = "fp8"
    x = _x(21, 128).reshape(3, 7, 128)
    w = mod.weight_int4()
    x2 = x.reshape(-1, 128)
    if act_order:
        x2 = x2.index_select(1, w.perm)
    want = _independent(x2, w, "fp8", mod.bias).reshape(3, 7, 40)
    assert torch.equal(mod(x), want)
    assert "act=fp8" in repr(mod)
    with pytest.raises(ValueError, match="one of"):
        W4A8Linear(128, 40, 32, act="int4")


def test_quantize_model_swaps_in_w4a8_linears():
    """Dense linears become W4A8Linears (MoE experts: test_quant_w4a8_experts.py)."""
    from pcg_core.quant.layers.linear import quantize_model

    model = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    names = quantize_model(model, get_scheme("w4afp8"), skip=())
    assert names == ["0", "2"] and all(type(model[i]) is W4A8Linear and model[i].act == "fp8" for i in (0, 2))
    assert model[0].group == 128 and model[2].group == 64  # group_for at a width the scheme's group does not divide
    assert model[0].quant_scheme.name == "w4afp8"
    model(torch.randn(3, 256))


def test_the_fake_implementation_gives_shape_and_dtype_and_dynamo_traces_the_module():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = _weight(64, 256, 64)
    args = (torch.randn(9, 256).bfloat16(), *_args(q), "fp8", None)
    with FakeTensorMode() as mode:
        out = torch.ops.pcg.w4a8_linear(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert out.shape == (9, 64) and out.dtype == torch.bfloat16
    torch.library.opcheck(torch.ops.pcg.w4a8_linear.default, (torch.randn(4, 256), *_args(q), "int8", torch.randn(64)),
                          test_utils=("test_schema", "test_faketensor"))
    mod = W4A8Linear.from_weight(q, dtype=torch.float32)
    compiled = torch.compile(mod, backend="eager", fullgraph=True, dynamic=False)
    x = torch.randn(2, 6, 256)
    assert torch.equal(compiled(x), mod(x))


def _faulty(fault: str, x: torch.Tensor, q: Int4Weight, act: str) -> torch.Tensor:
    """The reference computed with one planted layout fault."""
    qw, s, z, g = _args(q)
    if fault == "group scales one group off":
        s = s.roll(1, dims=1)
    elif fault == "nibble order reversed":
        qw = pack_nibbles(unpack_nibbles(qw, 1, PLAIN_ORDER[::-1]), 1)
    else:  # "activation scale dropped": the codes taken for the activation
        xq, _ = w4a8.quantize_act(x, act)
        return torch.nn.functional.linear(xq.float(), q.dequantize()).to(x.dtype)
    return torch.ops.pcg.w4a8_linear(x, qw, s, z, g, act, None)


FAULTS = ["group scales one group off", "activation scale dropped", "nibble order reversed"]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("act", ["int8", "fp8"])
def test_planted_faults_fail_the_comparison(fault, act):
    """Each fault must exceed FAULT (and so every kernel tolerance), or the kernel tests could not tell."""
    q = _weight(64, 256, 32, seed=3)
    q.scales = q.scales * torch.linspace(0.5, 2.0, q.scales.shape[1])  # group scales that differ along K
    x = _x(8, 256)
    assert rel(_faulty(fault, x, q, act), _independent(x, q, act)) > FAULT, fault


@pytest.mark.parametrize("m,k,group,ok", [(1, 4096, 128, True), (8, 4096, 32, True), (16, 64, 64, True),
                                          (600, 4096, 4096, True), (8, 512, 16, False), (8, 96, 48, False)])
def test_configurations_fit_the_group(m, k, group, ok):
    cfg = w4a8.gemm_config(m, k, group)
    if not ok:
        assert cfg is None  # no BLOCK_K ≥ 32 divides the group: the reference runs
        return
    bm, _, bk, split, *_ = cfg
    assert bk >= w4a8.MIN_BLOCK_K and group % bk == 0 and (k // bk) % split == 0
    assert m <= bm or bm == 128


# --- the checkpoint format: compressed-tensors pack-quantized W4A8 / W4AFP8 ----------------------------------------


@pytest.fixture(scope="module")
def llama():
    from pathlib import Path

    from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model

    configs = Path(__file__).resolve().parents[4] / "harness" / "models" / "configs"
    data = shrink_config(read_config_file(configs / "meta-llama__Llama-3.1-8B-Instruct.json"), tiny=True, layers=2)
    return data, synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)


@pytest.mark.parametrize("name", ["w4a8", "w4afp8"])
def test_a_checkpoint_round_trip_loads_the_buffers_written(name, llama, tmp_path):
    from pcg_core.model.loader import load_model
    from pcg_core.quant.formats.checkpoint import write_checkpoint
    from pcg_core.quant.schemes.int4 import quantize_int4_ordered
    from pcg_core.quant.formats.int4 import Int4Format, common_group, stored_weight

    data, model = llama
    scheme = INT4_SCHEMES[name]
    write_checkpoint(model, data, tmp_path, "compressed-tensors", scheme)
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    acts = qc["config_groups"]["group_0"]["input_activations"]
    assert acts == {"num_bits": 8, "type": "int" if name == "w4a8" else "float", "symmetric": True, "dynamic": True,
                    "strategy": "token"}
    spec = detect({"quantization_config": qc})
    assert spec.scheme.name == name and spec.scheme.activations == scheme.activations and spec.int4.name == "compressed-tensors"
    lm = load_model(str(tmp_path), weights="real")
    linears = {n: m for n, m in model.named_modules() if type(m) is torch.nn.Linear and not n.endswith("lm_head")}
    group = common_group(scheme, [m.in_features for m in linears.values()])
    mods = dict(lm.model.named_modules())
    for n, m in linears.items():
        want = stored_weight(quantize_int4_ordered(m.weight.detach(), group, True, False), Int4Format("compressed-tensors", group),
                             m.weight.dtype)
        got = mods[n]
        assert type(got) is W4A8Linear and got.act == scheme.activations and got.quant_scheme.name == name
        assert torch.equal(got.qweight, pack_nibbles(want.q, 1)) and torch.equal(got.scales, want.scales)
        assert torch.equal(got.zeros, want.zeros) and got.perm is None and got.group == group
    assert type(lm.model.lm_head) is torch.nn.Linear


@pytest.mark.parametrize("name", ["w4a8", "w4afp8"])
def test_compressed_tensors_parses_our_declaration(name):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStrategy, QuantizationType

    from pcg_core.quant.formats.int4 import declaration

    qc = QuantizationConfig.model_validate(declaration("compressed-tensors", INT4_SCHEMES[name], 128, ("lm_head",)))
    group = qc.config_groups["group_0"]
    assert qc.format == "pack-quantized" and group.weights.num_bits == 4 and group.weights.group_size == 128
    assert group.weights.strategy == QuantizationStrategy.GROUP and group.weights.symmetric
    a = group.input_activations
    assert a.num_bits == 8 and a.dynamic is True and a.strategy == QuantizationStrategy.TOKEN and a.symmetric
    assert a.type == (QuantizationType.INT if name == "w4a8" else QuantizationType.FLOAT)


def _ct(acts: dict | None, **weights) -> dict:
    w = {"num_bits": 4, "type": "int", "symmetric": True, "dynamic": False, "strategy": "group", "group_size": 128} | weights
    return {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                    "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                                                  "input_activations": acts}}}}


TOKEN = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"}


@pytest.mark.parametrize("acts", [TOKEN | {"dynamic": False}, TOKEN | {"strategy": "tensor", "dynamic": False},
                                  TOKEN | {"symmetric": False}, TOKEN | {"strategy": "group", "group_size": 128},
                                  TOKEN | {"num_bits": 4}])
def test_w4a8_declarations_the_loader_cannot_run_are_refused_by_name(acts):
    with pytest.raises(UnsupportedModel, match=r"config_groups\.group_0.*W4A8: type int.*static activation scales"):
        detect(_ct(acts))


def test_w4a8_declarations_the_loader_runs():
    for acts, name in ((TOKEN, "w4a8"), (TOKEN | {"type": "float"}, "w4afp8")):
        assert detect(_ct(acts)).scheme.name == name
        s = detect(_ct(acts, symmetric=False, actorder="group")).scheme  # zero points and act-order run too
        assert s.name == name and not s.sym and s.act_order and s.w4a8
    assert detect(_ct(None)).scheme.name == "gptq" and not detect(_ct(None)).scheme.w4a8


def test_w4a8_is_written_as_compressed_tensors_only():
    from pcg_core.quant.formats.int4 import declaration

    with pytest.raises(ValueError, match="compressed-tensors pack-quantized or int-quantized only"):
        declaration("gptq", INT4_SCHEMES["w4a8"], 128, ())


def test_capabilities_run_w4a8_dense_and_moe():
    from pcg_core.capabilities import QUANTIZATION, capabilities, quant_unsupported_reason
    from pcg_core.known import KNOWN_QUANTIZATION

    for name in ("w4a8", "w4afp8"):
        assert name in QUANTIZATION and name in KNOWN_QUANTIZATION and name in capabilities()["quant_schemes"]
        assert quant_unsupported_reason(name, features=["gqa"]) is None
        assert quant_unsupported_reason(name, features=["gqa"], real_weights=True) is None
        assert quant_unsupported_reason(name, features=["moe"]) is None
        assert "moe" not in capabilities()["quant_schemes"][name]["checkpoint_limits"]
    assert quant_unsupported_reason("gptq", features=["moe"]) is None


# --- the Triton kernels under the interpreter ------------------------------------------------------------------


@interpreted
@pytest.mark.parametrize("act", ["int8", "fp8"])
@pytest.mark.parametrize("m,k", [(1, 512), (5, 300), (8, 2500)])
def test_interpreted_activation_quant_kernel(act, m, k):
    """int8: codes and scales bitwise the reference's. fp8: scales bitwise; the interpreter's own fp32 → e4m3 cast
    (Triton 3.6) is not torch's: it drops the carry when rounding up crosses a power of two (31.4 → 16, not 32),
    rounds ties away from zero (21 → 22, not 20) and misrounds subnormals by a step, so codes may differ from
    torch's exactly there, by those amounts; the compiled cast (cvt.rn.satfinite) is checked bitwise on the GPU."""
    x = _x(m, k, dtype=torch.float16)
    if m > 1:
        x[1] = 0
    xq = torch.empty(m, k, dtype=w4a8.QDTYPE[act])
    sx = torch.empty(m)
    w4a8.launch_act_quant(x, act, xq, sx)
    want_q, want_s = w4a8.quantize_act(x, act)
    assert torch.equal(sx, want_s[:, 0])
    if act == "int8":
        assert torch.equal(xq, want_q)
    else:
        got, want = xq.float(), want_q.float()
        step = torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=2.0**-6))) - 3)  # one e4m3 step at |want|
        assert bool(((got == want) | (2 * got == want) | ((got - want).abs() <= step)).all())
        assert float((got != want).float().mean()) < 0.1


@interpreted
@pytest.mark.parametrize("m", [1, 8, 33, 100])
@pytest.mark.parametrize("group", [32, 64, 128, -1])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("threshold", [None, 0])
def test_interpreted_int8_kernels_match_the_reference(m, group, sym, threshold):
    """The whole Triton path (quantize, GEMM; split-K 4 at M ≤ 16, 2 up to 64) against the reference, with the
    codes converted in the GEMM's registers or (threshold 0: the large-M path) into an 8-bit scratch first."""
    q = _weight(256, 512, group, sym, seed=m)
    x = _x(m, 512, dtype=torch.float16)
    bias = torch.randn(256, generator=torch.Generator().manual_seed(6)).half()
    got = w4a8.triton_linear(x, *_args(q), "int8", bias, threshold=threshold)
    assert got.dtype == torch.float16 and got.shape == (m, 256)
    err = rel(got, _independent(x, q, "int8", bias))
    assert err < RTOL[torch.float16], f"M={m} group={group} sym={sym} threshold={threshold}: {err:.3g}"


@interpreted
@pytest.mark.parametrize("act", ["int8", "fp8"])
@pytest.mark.parametrize("group,sym", [(128, True), (64, False), (-1, True)])
def test_interpreted_conversion_to_8_bits_is_exact(act, group, sym):
    q = _weight(200, 512, group, sym)
    w8 = torch.empty(200, 512, dtype=w4a8.QDTYPE[act])
    qw, _, z, g = _args(q)
    w4a8.launch_to_8bit(qw, z, g, w8)
    assert torch.equal(w8.float(), q.q.float() - z.repeat_interleave(g, dim=1))


def _gemm(x: torch.Tensor, q: Int4Weight, act: str, config: tuple, qweight=None, scales=None, sx=None,
          bias=None, convert: bool = False) -> torch.Tensor:
    """The GEMM kernel alone on the reference's quantized activation (so fp8 is tested despite the interpreter's
    cast, see above), on the packed codes or (convert) their 8-bit conversion; the keyword arguments plant faults."""
    m, k = x.shape
    group = q.group
    xq, s = w4a8.quantize_act(x, act)
    out = torch.empty(m, q.q.shape[0], dtype=x.dtype)
    qw, sc, z, _ = _args(q)
    qw = qw if qweight is None else qweight
    if convert:
        w8 = torch.empty(q.q.shape, dtype=xq.dtype)
        w4a8.launch_to_8bit(qw, z, group, w8)
        qw = w8
    w4a8.launch_gemm(xq, s[:, 0].contiguous() if sx is None else sx, qw, sc if scales is None else scales, z, group,
                     bias, out, w4a8.gemm_config(m, k, group, config))
    return out


@interpreted
@pytest.mark.parametrize("act", ["int8", "fp8"])
@pytest.mark.parametrize("m,n,config", [(8, 256, (16, 64, 128, 4, 4, 4)), (33, 200, (32, 64, 64, 2, 4, 4)),
                                        (100, 200, (64, 64, 128, 1, 4, 4)), (300, 256, (128, 128, 128, 1, 8, 3)),
                                        (40, 72, (128, 128, 32, 1, 8, 3))])
@pytest.mark.parametrize("convert", [False, True])
def test_interpreted_gemm_paths_and_ragged_edges(act, m, n, config, convert):
    """Each table row's tile shape, split-K or not, at ragged M and N (masked edges), BLOCK_K below the group
    (several dots per group's partial), the large-M tile (128×128) with several M tiles; packed codes or 8-bit."""
    q = _weight(n, 512, 128, sym=act == "int8", seed=n)
    x = _x(m, 512, dtype=torch.float16)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(7)).half()
    got = _gemm(x, q, act, config, bias=bias, convert=convert)
    err = rel(got, _independent(x, q, act, bias))
    assert err < RTOL[torch.float16], f"{act} M={m} N={n} {config} convert={convert}: {err:.3g}"


@interpreted
@pytest.mark.parametrize("act", ["int8", "fp8"])
def test_interpreted_split_k_is_deterministic_and_agrees_with_one_split(act):
    q = _weight(128, 1024, 128)
    x = _x(8, 1024, dtype=torch.float16)
    split4 = _gemm(x, q, act, (16, 64, 128, 4, 4, 4))
    assert torch.equal(split4, _gemm(x, q, act, (16, 64, 128, 4, 4, 4)))
    assert rel(split4, _gemm(x, q, act, (16, 64, 128, 1, 4, 4))) < 1e-3


@interpreted
@pytest.mark.parametrize("act", ["int8", "fp8"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("config,convert", [((16, 64, 128, 4, 4, 4), False), ((128, 128, 64, 1, 8, 3), False),
                                            ((128, 128, 128, 1, 8, 3), True)])
def test_interpreted_planted_faults_fail(act, fault, config, convert):
    q = _weight(128, 512, 128, seed=4)
    q.scales = q.scales * torch.linspace(0.5, 2.0, q.scales.shape[1])
    x = _x(8, 512, dtype=torch.float16)
    if fault == "group scales one group off":
        got = _gemm(x, q, act, config, scales=q.scales.roll(1, dims=1).contiguous(), convert=convert)
    elif fault == "activation scale dropped":
        got = _gemm(x, q, act, config, sx=torch.ones(8), convert=convert)
    else:
        got = _gemm(x, q, act, config, qweight=pack_nibbles(unpack_nibbles(_args(q)[0], 1, PLAIN_ORDER[::-1]), 1),
                    convert=convert)
    assert rel(got, _independent(x, q, act)) > FAULT, f"{act} {config} convert={convert}: {fault}"


def test_the_kernels_under_the_interpreter():
    """The interpreter tests above, in a child pytest with TRITON_INTERPRET=1 (it must be set before the kernels
    are defined). Where CUDA is, the gpu tests below run the compiled kernels instead."""
    run_interpreted_tests(__file__)


# --- the compiled kernels on a GPU -----------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def w4a8_layers():
    """One W4A8 and one W4AFP8 layer of 8192×4096 (group 128, symmetric), built once on the GPU."""
    layers = {}
    for seed, name in enumerate(("w4a8", "w4afp8")):
        g = torch.Generator(device="cuda").manual_seed(seed)
        lin = torch.nn.Linear(4096, 8192, bias=False, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(8192, 4096, generator=g, device="cuda") * 4096**-0.5)
        layers[name] = W4A8Linear.from_scheme(lin, INT4_SCHEMES[name])
    return layers


@pytest.mark.parametrize("m", [1, 8, 17, 64, 512, 4096])
@pytest.mark.parametrize("name", ["w4a8", "w4afp8"])
@pytest.mark.gpu
@needs_gpu
def test_gpu_kernel_matches_the_reference_at_a_real_width(w4a8_layers, name, m):
    layer = w4a8_layers[name]
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    x[:, ::7] *= 6
    got = layer(x)
    want = w4a8.reference(x, layer.qweight, layer.scales, layer.zeros, layer.group, layer.act)
    assert got.dtype == torch.bfloat16 and got.shape == (m, 8192)
    assert rel(got, want) < RTOL[torch.bfloat16], f"{name} M={m}: {rel(got, want):.3g}"
    xq = torch.empty(m, 4096, device="cuda", dtype=w4a8.QDTYPE[layer.act])
    sx = torch.empty(m, device="cuda")
    w4a8.launch_act_quant(x, layer.act, xq, sx)
    want_q, want_s = w4a8.quantize_act(x.cpu(), layer.act)  # the CPU reference: torch's CUDA divides by a scalar
    assert torch.equal(sx.cpu(), want_s[:, 0])              # as a product with its reciprocal (an ulp off), the kernel
    assert torch.equal(xq.cpu().view(torch.int8), want_q.view(torch.int8))  # and the CPU divide exactly (div_rn)


@pytest.mark.parametrize("m", [8, 512])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.gpu
@needs_gpu
def test_gpu_planted_faults_fail(w4a8_layers, fault, m):
    layer = w4a8_layers["w4afp8"]
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    xq, sx = w4a8.quantize_act(x, layer.act)
    sx = sx[:, 0].contiguous()
    qw, scales = layer.qweight, layer.scales
    if fault == "group scales one group off":
        scales = (scales * torch.linspace(0.5, 2.0, 32, device="cuda")).contiguous()
        want = w4a8.reference(x, qw, scales, layer.zeros, 128, layer.act)
        scales = scales.roll(1, dims=1).contiguous()
    else:
        want = w4a8.reference(x, qw, scales, layer.zeros, 128, layer.act)
    if fault == "activation scale dropped":
        sx = torch.ones_like(sx)
    elif fault == "nibble order reversed":
        qw = pack_nibbles(unpack_nibbles(qw, 1, PLAIN_ORDER[::-1]), 1)
    got = torch.empty(m, 8192, device="cuda", dtype=torch.bfloat16)
    w4a8.launch_gemm(xq, sx, qw, scales, layer.zeros, 128, None, got, w4a8.gemm_config(m, 4096, 128))
    assert rel(got, want) > RTOL[torch.bfloat16]


@pytest.mark.parametrize("m", [1, 8, 64, 512, 4096])
@pytest.mark.parametrize("name", ["w4a8", "w4afp8"])
@pytest.mark.gpu
@needs_gpu
def test_gpu_replay_is_bitwise_eager(w4a8_layers, name, m):
    layer = w4a8_layers[name]
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    eager = layer(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("m", [130, 4096])
@pytest.mark.gpu
@needs_gpu
def test_gpu_fp8_large_m_paths_match_and_the_block_scaled_gemm_catches_faults(w4a8_layers, m):
    """Above SCALED_MM_MIN_M FP8 runs cuBLASLt's block-scaled GEMM (M = 130 pads to 132) or the Triton one: both the
    reference; the block-scaled GEMM with the group scales one group off, or the activation scale dropped, is not."""
    layer = w4a8_layers["w4afp8"]
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    scales = (layer.scales * torch.linspace(0.5, 2.0, 32, device="cuda")).contiguous()
    args = (layer.qweight, scales, layer.zeros, 128, "fp8")
    want = w4a8.reference(x, *args)
    for scaled_mm in (True, False):
        got = w4a8.triton_linear(x, *args, scaled_mm=scaled_mm)
        assert rel(got, want) < RTOL[torch.bfloat16], f"M={m} scaled_mm={scaled_mm}: {rel(got, want):.3g}"
    xq = torch.empty(m, 4096, device="cuda", dtype=w4a8.FP8)
    sx = torch.empty(m, device="cuda")
    w4a8.launch_act_quant(x, "fp8", xq, sx)
    w8 = torch.empty(8192, 4096, device="cuda", dtype=w4a8.FP8)
    w4a8.launch_to_8bit(layer.qweight, layer.zeros, 128, w8)
    assert rel(fp8_gemm.block_scaled_mm(xq, sx, w8, scales, None, torch.bfloat16), want) < RTOL[torch.bfloat16]
    off = fp8_gemm.block_scaled_mm(xq, sx, w8, scales.roll(1, dims=1).contiguous(), None, torch.bfloat16)
    assert rel(off, want) > RTOL[torch.bfloat16]
    assert rel(fp8_gemm.block_scaled_mm(xq, torch.ones_like(sx), w8, scales, None, torch.bfloat16), want) > RTOL[torch.bfloat16]
