"""8-bit quantization: schemes against plain math, formats detected or refused, synthetic checkpoints in the real
formats loaded through the normal loader and held to the float model they were made from, planted faults."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from pcg_helpers import config_path, make_engine, prompts_of, routed_experts, tiny_model

from pcg_core import load_model
from pcg_core.errors import UnsupportedModel
from pcg_core.model.experts import pcg_experts_forward
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import SCHEMES, QuantLinear, detect, quantize_model, record_input_absmax, write_checkpoint
from pcg_core.quant.layers.experts import (
    expert_weight,
    grouped_quantized_experts_forward,
    is_experts,
    quantize_experts,
    quantized_experts_forward,
)
from pcg_core.quant.schemes.w8a8 import (
    FP8_MAX,
    dequantize_weight,
    expand_block_scale,
    get_scheme,
    quantize_activation,
    quantize_weight,
    reference_linear,
)

# (format, scheme, legacy ModelOpt declaration): every pairing a real producer writes
FORMATS = [
    ("fp8", "fp8_block", False),
    ("compressed-tensors", "fp8_per_tensor", False),
    ("compressed-tensors", "fp8_per_token", False),
    ("compressed-tensors", "fp8_block", False),
    ("compressed-tensors", "int8_w8a8", False),
    ("compressed-tensors", "int8_w8a8_static", False),
    ("modelopt", "fp8_per_tensor", False),
    ("modelopt", "fp8_per_tensor", True),
    ("modelopt", "fp8_per_token", False),
    ("w8a8_int8", "int8_w8a8", False),
]
# Max relative error of the quantized model's logits against the float model's (tiny Qwen3, float32): FP8 keeps
# 3 mantissa bits (2^-4 relative per element), INT8 7 per channel/token; a static per-tensor INT8 activation scale
# spends them on the largest activation of the whole tensor. Measured: FP8 0.03–0.06, INT8 dynamic ~0.01,
# INT8 static ~0.06. A planted scale fault moves them past 0.15 (test_planted_scale_faults_...).
LOGIT_RTOL = {"fp8": 0.15, "int8": 0.05, "int8_static": 0.1}


def _float_model(arch="qwen3", width=None, seed=0):
    data = shrink_config(read_config_file(config_path(arch)), tiny=True, layers=2)
    if width:  # whole 128-blocks
        data.update(hidden_size=width, intermediate_size=2 * width, head_dim=width // data["num_attention_heads"])
    return synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=seed, peaked=True), data


def _logits(model, n=24, seed=0):
    """float32 logits of one prompt, through the engine (our attention op runs inside its forward only)."""
    engine = make_engine(model, "disabled")
    prompt = torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return engine.logits(engine.forward(engine.prefill_batch([prompt])))


def _calibrated(model, scheme):
    """Input absmax per linear for a static scheme (None for a dynamic one), from one calibration prompt."""
    if scheme.act_dynamic:
        return None
    with record_input_absmax(model) as absmax:
        _logits(model, seed=7)
    return absmax


def _write(model, data, path, fmt, scheme, **kw):
    s = get_scheme(scheme)
    return write_checkpoint(model, data, path, fmt, s, input_absmax=_calibrated(model, s), **kw)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# Schemes --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SCHEMES))
def test_weight_round_trip_is_within_the_format_precision(name):
    s = SCHEMES[name]
    w = torch.randn(256, 384) * torch.rand(256, 1)  # rows of different magnitudes
    q, scale = quantize_weight(w, s)
    assert q.dtype == s.qdtype
    expected_scale = {"tensor": (), "channel": (256, 1), "block": (2, 3)}[s.weights]
    assert tuple(scale.shape) == expected_scale
    err = (dequantize_weight(q, scale, s) - w).abs()
    # one rounding: ≤ half a step of the largest magnitude in the scale's group; fp8 e4m3 has a 2^-3 relative step
    step = expand_block_scale(scale, 256, 384) if s.weights == "block" else scale
    bound = step * (FP8_MAX * 2**-4 if s.kind == "fp8" else 0.5)
    assert bool((err <= bound * 1.001 + 1e-12).all()), f"{name}: max err {float(err.max()):.3g}"


def test_block_scales_cover_partial_blocks():
    s = SCHEMES["fp8_block"]
    w = torch.randn(200, 130)
    q, scale = quantize_weight(w, s)
    assert tuple(scale.shape) == (2, 2)
    assert _rel(dequantize_weight(q, scale, s), w) < 0.05


@pytest.mark.parametrize("name", list(SCHEMES) + ["int8_w8a8_static"])
def test_reference_linear_is_dequantized_math(name):
    s = get_scheme(name)
    x, w, b = torch.randn(12, 256), torch.randn(64, 256) / 16, torch.randn(64)
    q, scale = quantize_weight(w, s)
    static = None if s.act_dynamic else torch.tensor(float(x.abs().max()) / s.qmax)
    got = reference_linear(x, q, scale, s, static, b)
    xq, sx = quantize_activation(x, s, static)
    sx_full = sx.repeat_interleave(128, dim=-1) if s.acts == "group" else sx  # spelled out, not the helper
    want = (xq.float() * sx_full) @ dequantize_weight(q, scale, s).t() + b
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert _rel(got, x @ w.t() + b) < (0.08 if s.kind == "fp8" else 0.03)  # and near the float layer


def test_activation_groups_are_per_token_and_per_128_columns():
    s = SCHEMES["fp8_block"]
    x = torch.ones(3, 256)
    x[1, 130] = 100.0
    _, sx = quantize_activation(x, s)
    assert tuple(sx.shape) == (3, 2)
    assert torch.allclose(sx[1], torch.tensor([1 / FP8_MAX, 100 / FP8_MAX]))
    assert torch.allclose(sx[0], torch.full((2,), 1 / FP8_MAX))


# Formats --------------------------------------------------------------------------------------------------------
def _declared(tmp_path, qc=None, legacy=None):
    data = {"model_type": "qwen3"}
    if qc is not None:
        data["quantization_config"] = qc
    if legacy is not None:
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(legacy))
    return detect(data, tmp_path)


def test_each_declaration_maps_onto_its_scheme(tmp_path):
    from pcg_core.quant.formats.detect import declaration

    for fmt, scheme, legacy in FORMATS:
        d = tmp_path / f"{fmt}-{scheme}-{legacy}"
        d.mkdir()
        qc, lc = declaration(fmt, get_scheme(scheme), ("lm_head",), legacy)
        spec = _declared(d, qc, lc)
        assert (spec.format, spec.scheme.name) == (fmt, scheme)
        assert not spec.ignored("model.layers.0.self_attn.q_proj")
        assert spec.ignored("lm_head") or fmt == "w8a8_int8"  # SGLang's declaration has no ignore list
    assert detect({"model_type": "qwen3"}, None) is None


@pytest.mark.parametrize("qc, words", [
    ({"quant_method": "awq", "bits": 4, "version": "exllama"}, "AWQ version 'exllama'"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "bitblas"}, "'bitblas'"),
    ({"quant_method": "bitsandbytes"}, "'bitsandbytes'"),
    ({"quant_method": "fp8", "weight_block_size": None}, "weight_block_size None"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}, "only dynamic"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "NVFP4 with group_size 32"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4_AWQ"}, "NVFP4-AWQ"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "0 config_groups"),
    ({"quant_method": "compressed-tensors", "format": "marlin-24"}, "'marlin-24'"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": False},
      "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}}}}, "asymmetric"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, "weight-only"),
    ("fp8", "not a mapping"),
])
def test_unsupported_declarations_are_refused_naming_the_format(tmp_path, qc, words):
    with pytest.raises(UnsupportedModel) as e:
        _declared(tmp_path, qc)
    assert words in str(e.value)
    assert "Supported quantized formats" in str(e.value)


def test_legacy_modelopt_declaration_beside_config_is_read(tmp_path):
    """The checkpoint transformers loads as unquantized: quantization only in hf_quant_config.json."""
    spec = _declared(tmp_path, None, {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8",
                                                                                          "exclude_modules": ["lm_head"]}})
    assert (spec.format, spec.scheme.name, spec.ignore) == ("modelopt", "fp8_per_tensor", ("lm_head",))
    (tmp_path / "hf_quant_config.json").write_text("{not json")
    with pytest.raises(UnsupportedModel, match="unreadable"):
        detect({"model_type": "qwen3"}, tmp_path)


# Checkpoints ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def float_qwen3():
    return _float_model()


@pytest.fixture(scope="module")
def float_qwen3_256():
    return _float_model(width=256)


@pytest.mark.parametrize("fmt, scheme, legacy", FORMATS, ids=[f"{f}-{s}{'-legacy' if lg else ''}" for f, s, lg in FORMATS])
def test_synthetic_checkpoint_loads_and_tracks_the_float_model(tmp_path, float_qwen3, fmt, scheme, legacy):
    model, data = float_qwen3
    _write(model, data, tmp_path, fmt, scheme, legacy=legacy, shards=2)
    lm = load_model(str(tmp_path), weights="real")
    quantized = {n: m for n, m in lm.model.named_modules() if isinstance(m, QuantLinear)}
    assert len(quantized) == 7 * 2  # q k v o gate up down × 2 layers; lm_head left in float
    assert all(m.scheme.name == scheme for m in quantized.values())
    name, mod = next(iter(quantized.items()))
    src = model.get_submodule(name).weight
    q, s = quantize_weight(src, get_scheme(scheme))
    assert torch.equal(mod.weight.view(torch.uint8), q.view(torch.uint8)), "stored bytes changed on the way"
    assert torch.equal(dequantize_weight(mod.weight, mod.weight_scale, mod.scheme), dequantize_weight(q, s, mod.scheme))
    rel = _rel(_logits(lm.model), _logits(model))
    s = get_scheme(scheme)
    bound = LOGIT_RTOL["int8_static" if s.kind == "int8" and not s.act_dynamic else s.kind]
    assert rel < bound, f"{fmt}/{scheme}: logits {rel:.3f} from the float model"


def test_transformers_dequantizing_fp8_loader_agrees_with_ours(tmp_path):
    """An oracle we did not write: on a CPU transformers loads an HF fp8 checkpoint dequantized. Every linear's
    weight must equal our dequantization of the same files, element for element."""
    pytest.importorskip("accelerate")  # transformers' fp8 loader needs it (a dev dependency)
    from transformers import AutoModelForCausalLM

    model, data = _float_model(width=256)
    _write(model, data, tmp_path, "fp8", "fp8_block")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ours = load_model(str(tmp_path), weights="real").model
    checked = 0
    for name, mod in ours.named_modules():
        if isinstance(mod, QuantLinear):
            want = theirs.get_submodule(name).weight.detach().float()
            got = dequantize_weight(mod.weight, mod.weight_scale, mod.scheme)
            assert torch.equal(got, want), name
            checked += 1
    assert checked == 14


@pytest.mark.parametrize("scheme", ["fp8_per_tensor", "fp8_per_token", "fp8_block", "int8_w8a8", "int8_w8a8_static"])
def test_compressed_tensors_package_reads_our_files_as_we_do(tmp_path, scheme):
    """The second oracle we did not write: the compressed-tensors package (what vLLM and llm-compressor read these
    files with) dequantizes our synthetic checkpoint. Each linear's weight must equal our loader's dequantization
    of the same files, element for element, and the package must find every module's quantization parameters."""
    pytest.importorskip("compressed_tensors")  # a dev dependency
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer
    from safetensors.torch import load_file

    model, data = _float_model(width=256)
    _write(model, data, tmp_path, "compressed-tensors", scheme)
    files = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        files.update(load_file(f))
    # Matching by tensor name alone, the package takes every "*.weight" for a Linear's: the embedding is named.
    theirs = CompressedTensorsDequantizer(tmp_path, ignore=["model.embed_tokens"], dtype=torch.float32).process(files)
    ours = load_model(str(tmp_path), weights="real").model
    checked = 0
    for name, mod in ours.named_modules():
        if isinstance(mod, QuantLinear):
            want = theirs[f"{name}.weight"]
            got = dequantize_weight(mod.weight, mod.weight_scale, mod.scheme)
            assert torch.equal(got, want), name
            checked += 1
    assert checked == 14


def test_block_checkpoint_at_whole_block_widths(tmp_path):
    model, data = _float_model(width=256)
    _write(model, data, tmp_path, "fp8", "fp8_block")
    lm = load_model(str(tmp_path), weights="real")
    mod = lm.model.model.layers[0].mlp.down_proj
    assert tuple(mod.weight_scale.shape) == (2, 4)  # N 256 × K 512
    assert _rel(_logits(lm.model), _logits(model)) < LOGIT_RTOL["fp8"]


def test_trimmed_load_skips_the_layers_past_the_kept_ones(tmp_path, float_qwen3):
    model, data = float_qwen3
    _write(model, data, tmp_path, "compressed-tensors", "fp8_per_token")
    lm = load_model(str(tmp_path), weights="real", layers=1)
    assert len(lm.model.model.layers) == 1
    assert isinstance(lm.model.model.layers[0].self_attn.q_proj, QuantLinear)


def _edit(tmp_path, fn):
    """Rewrite the single-file checkpoint's tensors with fn(dict) (a planted fault in the files)."""
    from safetensors.torch import load_file, save_file

    f = tmp_path / "model.safetensors"
    t = load_file(f)
    fn(t)
    save_file(t, f)


L0 = "model.layers.0."


@pytest.mark.parametrize("fault, words", [
    (lambda t: t.pop(L0 + "self_attn.q_proj.weight_scale_inv"), "weight_scale_inv is missing"),
    (lambda t: t.update({L0 + "mlp.down_proj.weight_scale_inv": t[L0 + "mlp.down_proj.weight_scale_inv"].t().contiguous()}), "expected (2, 4)"),
    (lambda t: t.update({L0 + "self_attn.k_proj.k_scale": torch.tensor(1.0)}), "declares no quantized KV cache"),
    (lambda t: t.update({"model.layers.0.mlp.experts.0.up_proj.weight": torch.zeros(4, 4, dtype=torch.float8_e4m3fn)}), "does not use"),
    (lambda t: t.update({L0 + "self_attn.q_proj.weight": t[L0 + "self_attn.q_proj.weight"].view(torch.int8)}), "needs torch.float8_e4m3fn"),
    (lambda t: t.update({L0 + "self_attn.q_proj.input_scale": torch.tensor(1.0)}), "declares dynamic activations"),
    (lambda t: t.update({"lm_head.weight": t["lm_head.weight"].to(torch.float8_e4m3fn)}), "lists lm_head as not quantized"),
])
def test_inconsistent_checkpoint_files_are_refused(tmp_path, float_qwen3_256, fault, words):
    model, data = float_qwen3_256
    _write(model, data, tmp_path, "fp8", "fp8_block")
    _edit(tmp_path, fault)
    with pytest.raises(UnsupportedModel) as e:
        load_model(str(tmp_path), weights="real")
    assert words in str(e.value)


# Per-expert MoE checkpoints -------------------------------------------------------------------------------------
MOE_FORMATS = [("fp8", "fp8_block"), ("compressed-tensors", "fp8_per_tensor"), ("compressed-tensors", "int8_w8a8"),
               ("modelopt", "fp8_per_token"), ("compressed-tensors", "int8_w8a8_static")]


def _float_moe(arch: str, width: int = 256):
    """A tiny MoE whose expert widths are whole 128-blocks (the real ones are: 768, 14336)."""
    data = shrink_config(read_config_file(config_path(arch)), tiny=True, layers=2)
    data.update(hidden_size=width, head_dim=width // data["num_attention_heads"], intermediate_size=width)
    if "moe_intermediate_size" in data:
        data["moe_intermediate_size"] = 128
    return synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True), data


@pytest.fixture(scope="module", params=["qwen3-moe", "mixtral"])
def float_moe(request):
    return request.param, *_float_moe(request.param)


@pytest.mark.parametrize("fmt, scheme", MOE_FORMATS, ids=[f"{f}-{s}" for f, s in MOE_FORMATS])
def test_per_expert_checkpoint_loads_into_the_fused_experts(tmp_path, float_moe, fmt, scheme):
    """Producers write one linear per expert (Mixtral under block_sparse_moe.experts.<e>.w1/w3/w2); the loader
    fuses them into transformers' [E, 2I, H] gate_up and [E, H, I] down with every scale kept: each expert's
    dequantized weights are its own shards', and the model tracks the float one."""
    arch, model, data = float_moe
    _write(model, data, tmp_path, fmt, scheme)
    on_disk = load_file(next(tmp_path.glob("*.safetensors")))
    segment = "block_sparse_moe.experts.3.w3" if arch == "mixtral" else "mlp.experts.3.up_proj"
    assert f"model.layers.1.{segment}.weight" in on_disk and not any(k.endswith("gate_up_proj") for k in on_disk)
    lm = load_model(str(tmp_path), weights="real")
    s = get_scheme(scheme)
    ours = next(m for m in lm.model.modules() if is_experts(m))
    theirs = next(m for m in model.modules() if is_experts(m))
    assert ours.quant_scheme == s and ours.gate_up_proj.dtype == s.qdtype
    i = theirs.gate_up_proj.shape[1] // 2
    for e in (0, 5):
        got = dequantize_weight(ours.gate_up_proj[e], ours.gate_up_proj_scale[e], s)
        want = torch.cat([dequantize_weight(*quantize_weight(w, s), s) for w in (theirs.gate_up_proj[e, :i], theirs.gate_up_proj[e, i:])])
        if s.weights == "tensor":  # one shard re-expressed on the larger scale: within one FP8 step of it
            assert _rel(got, want) < 0.07
        else:
            assert torch.equal(got, want)
        assert torch.equal(dequantize_weight(ours.down_proj[e], ours.down_proj_scale[e], s),
                           dequantize_weight(*quantize_weight(theirs.down_proj[e], s), s))
    # The whole model against the same float model quantized in memory (how synthetic cells run): the same
    # weights, so the same logits, but where per-tensor shards were put on one scale (then two FP8 roundings of
    # the same model: within the FP8 bound of each other).
    ref = copy.deepcopy(model)
    quantize_model(ref, s, input_absmax=_calibrated(ref, s))
    rel = _rel(_logits(lm.model), _logits(ref))
    assert rel < LOGIT_RTOL["fp8"] if s.weights == "tensor" else rel == 0, f"{arch} {fmt}/{scheme}: {rel:.3g} from the in-memory quantization"


@pytest.mark.parametrize("fault, words", [
    (lambda t: t.pop(L0 + "mlp.experts.2.down_proj.weight_scale_inv"), "weight_scale_inv is missing"),
    (lambda t: t.pop(L0 + "mlp.experts.7.gate_proj.weight"), "experts.7.gate_proj.weight"),
    (lambda t: t.update({L0 + "mlp.experts.1.up_proj.weight": t[L0 + "mlp.experts.1.up_proj.weight"].float()}), "mix 8-bit and 16-bit"),
    (lambda t: t.update({L0 + "mlp.experts.0.down_proj.weight_scale_inv": t[L0 + "mlp.experts.0.down_proj.weight_scale_inv"].t().contiguous()}), "expected (2, 1)"),
    (lambda t: t.update({L0 + "mlp.experts.9.down_proj.weight": t[L0 + "mlp.experts.0.down_proj.weight"].clone()}), "does not use"),
])
def test_inconsistent_expert_tensors_are_refused(tmp_path, fault, words):
    model, data = _float_moe("qwen3-moe")
    _write(model, data, tmp_path, "fp8", "fp8_block")
    _edit(tmp_path, fault)
    with pytest.raises(UnsupportedModel) as e:
        load_model(str(tmp_path), weights="real")
    assert words in str(e.value)


def test_swapped_expert_scales_are_caught_by_the_float_comparison(tmp_path):
    """A planted fault, each expert given its neighbour's scales, must show in the logits; held to the same model
    quantized in memory, which the intact checkpoint matches exactly."""
    model, data = _float_moe("qwen3-moe")
    _write(model, data, tmp_path, "compressed-tensors", "fp8_per_token")
    quantize_model(model := copy.deepcopy(model), SCHEMES["fp8_per_token"])
    good = _rel(_logits(load_model(str(tmp_path), weights="real").model), _logits(model))

    def swap(t):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            keys = [f"{L0}mlp.experts.{e}.{proj}.weight_scale" for e in range(8)]
            vals = [t[k] for k in keys]
            t.update(dict(zip(keys, vals[1:] + vals[:1])))

    _edit(tmp_path, swap)
    bad = _rel(_logits(load_model(str(tmp_path), weights="real").model), _logits(model))
    assert good == 0 and bad > LOGIT_RTOL["fp8"], (good, bad)


def test_static_scheme_without_input_scale_is_refused(tmp_path, float_qwen3):
    model, data = float_qwen3
    _write(model, data, tmp_path, "modelopt", "fp8_per_tensor")
    _edit(tmp_path, lambda t: t.pop(L0 + "mlp.up_proj.input_scale"))
    with pytest.raises(UnsupportedModel, match="input_scale is missing"):
        load_model(str(tmp_path), weights="real")


@pytest.mark.parametrize("fault", ["scale_as_divisor", "transposed_square_block_scale", "wrong_shard_scale"])
def test_planted_scale_faults_are_caught_by_the_float_comparison(tmp_path, fault):
    """Faults that leave every shape right: only the numbers are wrong, and the comparison with the float model
    the checkpoint was made from must see it."""
    model, data = _float_model(width=256, seed=3)
    with torch.no_grad():  # magnitudes that differ where a fault would mix them up: across o_proj's blocks, q vs k
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[:128, 128:] *= 8
            layer.mlp.gate_proj.weight *= 8  # (not k_proj: Qwen3's k_norm would undo a wrong scale there)
    fmt, scheme = ("compressed-tensors", "fp8_per_tensor") if fault == "wrong_shard_scale" else ("fp8", "fp8_block")
    _write(model, data, tmp_path, fmt, scheme)
    sname = "weight_scale_inv" if fmt == "fp8" else "weight_scale"
    clean = load_model(str(tmp_path), weights="real")
    assert _rel(_logits(clean.model), _logits(model)) < LOGIT_RTOL["fp8"]

    def plant(t):
        for layer in range(2):
            p = f"model.layers.{layer}."
            if fault == "scale_as_divisor":
                for k in [k for k in t if k.startswith(p) and k.endswith(sname)]:
                    t[k] = 1.0 / t[k]
            elif fault == "transposed_square_block_scale":
                k = p + "self_attn.o_proj." + sname  # 256 × 256: a square block grid
                t[k] = t[k].t().contiguous()
            else:  # up_proj given gate_proj's scale, as a loader fusing the two shards might
                t[p + "mlp.up_proj." + sname] = t[p + "mlp.gate_proj." + sname].clone()

    _edit(tmp_path, plant)
    bad = load_model(str(tmp_path), weights="real")
    assert _rel(_logits(bad.model), _logits(model)) > LOGIT_RTOL["fp8"], f"{fault} went unnoticed"


def test_declared_but_unquantized_files_are_refused(tmp_path, float_qwen3):
    model, data = float_qwen3
    d = dict(data)
    d["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    model.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((tmp_path / "config.json").read_text()),
                                                      "quantization_config": d["quantization_config"]}))
    with pytest.raises(UnsupportedModel, match="no linear layer's weight is stored in 8 bits"):
        load_model(str(tmp_path), weights="real")


# The engine -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("backend", ["piecewise", "breakable"])
def test_quantized_model_graph_path_matches_eager_bitwise_on_cpu(scheme, backend):
    model, _ = _float_model(width=256)
    swapped = quantize_model(model, SCHEMES[scheme], input_absmax=_calibrated(model, SCHEMES[scheme]))
    assert len(swapped) == 14 and "lm_head" not in swapped
    engine = make_engine(model, backend)
    prompts = prompts_of([5, 11, 3], model.config.vocab_size, seed=2)
    batch = engine.prefill_batch(prompts)
    got = engine.forward(batch).clone()
    want = engine.forward(batch, eager=True)
    assert torch.equal(got, want)


# MoE experts ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_quantized_experts_track_the_float_experts(arch, name):
    mod, x, idx, w = routed_experts(arch)
    want = pcg_experts_forward(mod, x, idx, w)
    with record_input_absmax(mod) as absmax:
        mod(x, idx, w)
    quantize_experts(mod, SCHEMES[name], {k: absmax[f".{k}"] for k in ("gate_up", "down")} if absmax else None)
    assert mod.down_proj.dtype == SCHEMES[name].qdtype and not any(p.dim() == 3 for p in mod.parameters())
    got = pcg_experts_forward(mod, x, idx, w)  # the registered path dispatches to the quantized forward
    rel = _rel(got.float(), want.float())
    assert rel < (0.08 if SCHEMES[name].kind == "fp8" else 0.03), f"{arch}/{name}: {rel:.3f} from the float experts"
    # planted: each expert's scales given to the next expert (a per-expert mix-up in a loader or a stack)
    for buf in ("gate_up_proj_scale", "up_proj_scale", "down_proj_scale"):
        if hasattr(mod, buf):
            t = getattr(mod, buf)
            t.copy_(t.roll(1, dims=0) * torch.linspace(0.5, 2, mod.num_experts).view(-1, *[1] * (t.dim() - 1)))
    assert _rel(pcg_experts_forward(mod, x, idx, w).float(), want.float()) > 0.1, "swapped expert scales went unnoticed"


@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_grouped_quantized_experts_equal_the_dense_reference(arch, name):
    """The grouped path CUDA runs (rows sorted by expert, two grouped GEMMs) against the dense reference, both in
    float32 here: the same math in another order. A planted routing fault (rows given back to the wrong
    tokens) must show."""
    mod, x, idx, w = routed_experts(arch)
    with record_input_absmax(mod) as absmax:
        mod(x, idx, w)
    quantize_experts(mod, SCHEMES[name], {k: absmax[f".{k}"] for k in ("gate_up", "down")} if absmax else None)
    want = quantized_experts_forward(mod, x, idx, w)
    got = grouped_quantized_experts_forward(mod, x, idx, w)
    assert _rel(got, want) < 1e-5, f"{arch}/{name}: {_rel(got, want):.3g}"
    assert _rel(grouped_quantized_experts_forward(mod, x, idx.roll(1, dims=0), w), want) > 0.1


@pytest.mark.parametrize("name", list(SCHEMES))
def test_an_experts_weight_dequantizes_as_a_linears_does(name):
    """expert_weight (every experts path's float32 weight: the reference forward, the float twin, the
    dequantize-then-grouped-GEMM operand) is each expert's codes × scales exactly as the linear layers' reference
    dequantize_weight makes them (the experts' scales differ, so a scale taken from another expert would show)."""
    mod, x, idx, w = routed_experts("qwen3-moe")
    with record_input_absmax(mod) as absmax:
        mod(x, idx, w)
    s = SCHEMES[name]
    quantize_experts(mod, s, {k: absmax[f".{k}"] for k in ("gate_up", "down")} if absmax else None)
    for proj in ("gate_up_proj", "down_proj"):
        codes, scales = getattr(mod, proj), getattr(mod, f"{proj}_scale")
        assert all(not torch.equal(scales[e], scales[e + 1]) for e in range(mod.num_experts - 1))
        for e in range(mod.num_experts):
            assert torch.equal(expert_weight(mod, proj, e), dequantize_weight(codes[e], scales[e], s)), (proj, e)


@pytest.mark.parametrize("scheme", ["fp8_per_tensor", "fp8_block"])
def test_quantized_moe_graph_path_matches_eager_bitwise_on_cpu(scheme):
    lm = tiny_model("qwen3-moe")
    s = SCHEMES[scheme]
    swapped = quantize_model(lm.model, s, input_absmax=_calibrated(lm.model, s))
    assert sum(".experts" in n for n in swapped) == 2  # the fused experts of both layers
    engine = make_engine(lm.model, "piecewise")
    batch = engine.prefill_batch(prompts_of([5, 11, 3], lm.config.vocab_size, seed=2))
    assert torch.equal(engine.forward(batch).clone(), engine.forward(batch, eager=True))
