"""pcg_core/quant/formats/fp4.py and the loader: ModelOpt NVFP4 (config.json and the legacy hf_quant_config.json)
and compressed-tensors nvfp4-pack-quantized (NVFP4A16, and the NVFP4 preset's W4A4 run as W4A16) checkpoints
written from a float model load back into exactly the FP4 weights that model quantizes to; compressed-tensors'
NVFP4 decompressor and its ModelOpt converter read our files; planted reader faults (nibble order, the global's
convention) move the loaded weights; bad declarations and files are refused with the place named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pcg_core.errors import UnsupportedModel
from pcg_core.model.loader import build_config, load_model, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import FP4_SCHEMES, Fp4Linear, detect, get_scheme, quantize_model, write_checkpoint
from pcg_core.quant.formats import fp4 as ckpt
from pcg_core.quant.schemes.fp4 import NVFP4_BLOCK, quantize_nvfp4

CONFIGS = Path(__file__).resolve().parents[4] / "harness" / "models" / "configs"
LLAMA, MOE = "meta-llama__Llama-3.1-8B-Instruct.json", "Qwen__Qwen3-30B-A3B.json"
FP4 = FP4_SCHEMES["nvfp4"]
# variant → (format, legacy declaration file, W4A4 declared); "ct-w4a4" is written as NVFP4A16, then declared W4A4
VARIANTS = {
    "modelopt": ("modelopt", False, True),
    "modelopt-legacy": ("modelopt", True, True),
    "ct": ("compressed-tensors", False, False),
    "ct-w4a4": ("compressed-tensors", False, True),
}
Q = "model.layers.0.self_attn.q_proj"


def _synthetic(config: str = LLAMA, seed: int = 0):
    data = shrink_config(read_config_file(CONFIGS / config), tiny=True, layers=2)
    return data, synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=seed, peaked=True)


def _linears(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    return {n: m for n, m in model.named_modules() if type(m) is torch.nn.Linear and not n.endswith("lm_head")}


def _expected(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each linear's weight as the checkpoint stands for it, computed here from the float model (not read back)."""
    return {n: quantize_nvfp4(m.weight.detach()).dequantize() for n, m in _linears(model).items()}


def _mismatch(loaded: torch.nn.Module, expected: dict[str, torch.Tensor]) -> float:
    mods = dict(loaded.named_modules())
    assert all(isinstance(mods[n], Fp4Linear) for n in expected), [n for n in expected if not isinstance(mods[n], Fp4Linear)]
    return max(float((mods[n].weight_fp4().dequantize() - w).abs().max()) for n, w in expected.items())


def _edit_config(path: Path, edit) -> None:
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg["quantization_config"])
    (path / "config.json").write_text(json.dumps(cfg))


def _rewrite(path: Path, edit) -> None:
    f = path / "model.safetensors"
    tensors = load_file(f)
    edit(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


def _write(variant: str, model: torch.nn.Module, data: dict, path: Path) -> Path:
    fmt, legacy, w4a4 = VARIANTS[variant]
    write_checkpoint(model, data, path, fmt, FP4, legacy=legacy)
    if fmt == "compressed-tensors" and w4a4:  # the NVFP4 preset: activations declared, input_global_scale stored
        acts = {"num_bits": 4, "type": "float", "symmetric": True, "dynamic": "local", "strategy": "tensor_group",
                "group_size": 16}
        _edit_config(path, lambda qc: qc["config_groups"]["group_0"].update(input_activations=acts))
        _rewrite(path, lambda t: t.update({f"{n}.input_global_scale": torch.tensor([2688.0])
                                           for n in _linears(model)}))
    return path


@pytest.fixture(scope="module")
def llama():
    return _synthetic()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_format_loads_back_exactly_the_weights_it_wrote(variant, llama, tmp_path):
    data, model = llama
    fmt, legacy, w4a4 = VARIANTS[variant]
    _write(variant, model, data, tmp_path)
    assert (tmp_path / "hf_quant_config.json").is_file() is legacy
    spec = detect(json.loads((tmp_path / "config.json").read_text()), tmp_path)
    assert (spec.format, spec.scheme.name, spec.fp4.name, spec.fp4.act_scale) == (fmt, "nvfp4", fmt, w4a4)
    assert spec.where.endswith("hf_quant_config.json") is legacy
    lm = load_model(str(tmp_path), weights="real")
    assert _mismatch(lm.model, _expected(model)) == 0.0
    assert all(m.quant_scheme.name == "nvfp4" for m in lm.model.modules() if isinstance(m, Fp4Linear))
    assert type(lm.model.lm_head) is torch.nn.Linear  # left in 16 bits, as written
    assert ("W4A4" in spec.scheme.description) is w4a4


def test_quantize_model_swaps_dense_linears_for_fp4_and_keeps_lm_head():
    _, model = _synthetic()
    expected = _expected(model)
    names = quantize_model(model, get_scheme("fp4"))
    assert sorted(names) == sorted(expected) and len(names) == 14
    assert _mismatch(model, expected) == 0.0 and type(model.lm_head) is torch.nn.Linear
    assert {m.quant_scheme for m in model.modules() if isinstance(m, Fp4Linear)} == {FP4}
    assert (FP4.block, FP4.kind, FP4.act_dynamic) == (NVFP4_BLOCK, "fp4", True)


def test_a_module_stored_in_16_bits_stays_in_16_bits(llama, tmp_path):
    data, model = llama
    _write("modelopt", model, data, tmp_path)

    def unquantize(t):
        for s in ("weight_scale", "weight_scale_2", "input_scale"):
            t.pop(f"{Q}.{s}")
        t[f"{Q}.weight"] = dict(model.named_modules())[Q].weight.detach().clone()
    _rewrite(tmp_path, unquantize)
    lm = load_model(str(tmp_path), weights="real")
    q = lm.model.get_submodule(Q)
    assert type(q) is torch.nn.Linear and torch.equal(q.weight, dict(model.named_modules())[Q].weight)
    assert _mismatch(lm.model, {n: w for n, w in _expected(model).items() if n != Q}) == 0.0


# --- compressed-tensors as the oracle ---------------------------------------------------------------------------


def _ct():
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import NVFP4A16
    return NVFP4PackedCompressor, ModelOptNvfp4Converter, QuantizationScheme(targets=["Linear"], **NVFP4A16)


@pytest.mark.parametrize("variant", ["ct", "modelopt"])
def test_compressed_tensors_reads_our_files(variant, llama, tmp_path):
    """Its NVFP4 decompressor, fed each quantized linear's tensors from our file (ModelOpt's first renamed and
    inverted by its own ModelOpt converter), gives the weight the float model quantizes to (bf16, as it returns)."""
    compressor, converter, scheme = _ct()
    data, model = llama
    _write(variant, model, data, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    if variant == "modelopt":
        tensors = converter(ignore=["lm_head"], targets=["Linear"]).process(tensors)
        assert f"{Q}.weight_packed" in tensors and f"{Q}.input_global_scale" in tensors
    for name, want in _expected(model).items():
        mine = {k: tensors[f"{name}.{k}"] for k in ("weight_packed", "weight_scale", "weight_global_scale")}
        got = compressor.decompress(mine, scheme)["weight"]
        assert torch.equal(got, want.to(got.dtype)), name


def test_compressed_tensors_converter_output_loads_as_our_modelopt_read(llama, tmp_path):
    """Their ModelOpt → compressed-tensors conversion of our ModelOpt file, declared as the NVFP4 preset, loads into
    the same weights our ModelOpt reader gives: the two conventions agree through an outside statement of them."""
    _, converter, _ = _ct()
    data, model = llama
    src, dst = _write("modelopt", model, data, tmp_path / "mo"), _write("ct-w4a4", model, data, tmp_path / "ct")
    save_file(converter(ignore=["lm_head"], targets=["Linear"]).process(load_file(src / "model.safetensors")),
              dst / "model.safetensors", metadata={"format": "pt"})
    assert _mismatch(load_model(str(dst), weights="real").model, _expected(model)) == 0.0


# --- planted reader faults --------------------------------------------------------------------------------------


def _swap_nibbles(t: torch.Tensor) -> torch.Tensor:
    return (t << 4) | (t >> 4)


def _plant_nibbles(monkeypatch):
    mo, ct = ckpt.modelopt_nvfp4_unpack, ckpt.ct_nvfp4_unpack
    monkeypatch.setattr(ckpt, "modelopt_nvfp4_unpack", lambda w, *a: mo(_swap_nibbles(w), *a))
    monkeypatch.setattr(ckpt, "ct_nvfp4_unpack", lambda w, *a: ct(_swap_nibbles(w), *a))


def _plant_global_flipped(monkeypatch):
    """Each format read with the other's convention: ModelOpt's weight_scale_2 divided by, CT's global multiplied."""
    mo, ct = ckpt.modelopt_nvfp4_unpack, ckpt.ct_nvfp4_unpack
    monkeypatch.setattr(ckpt, "modelopt_nvfp4_unpack", lambda w, s, g, i=None: ct(w, s, g, i))
    monkeypatch.setattr(ckpt, "ct_nvfp4_unpack", lambda w, s, g, i=None: mo(w, s, g, i))


@pytest.mark.parametrize("variant", ["modelopt", "ct"])
@pytest.mark.parametrize("plant", [_plant_nibbles, _plant_global_flipped], ids=["nibbles swapped", "global flipped"])
def test_planted_reader_faults_move_the_loaded_weights(variant, plant, llama, tmp_path, monkeypatch):
    data, model = llama
    _write(variant, model, data, tmp_path)
    expected = _expected(model)
    assert _mismatch(load_model(str(tmp_path), weights="real").model, expected) == 0.0  # the check passes unplanted
    plant(monkeypatch)
    assert _mismatch(load_model(str(tmp_path), weights="real").model, expected) > 0.0


# --- bad declarations and files ---------------------------------------------------------------------------------


CT_W = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True, "dynamic": False}


def _ct_decl(weights=None, acts=None, **extra):
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", **extra,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights or CT_W, "input_activations": acts}}}


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "NVFP4 with group_size 32"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4_AWQ", "group_size": 16}, "NVFP4-AWQ (pre_quant_scale"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}, "kv_cache_quant_algo 'NVFP4' is not read"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_NVFP4_FP8"}, "quant_algo 'W4A8_NVFP4_FP8'"),
    (_ct_decl(dict(CT_W, group_size=32)), "'group_size': 32"),
    (_ct_decl(dict(CT_W, num_bits=8)), "'num_bits': 8"),
    (_ct_decl(dict(CT_W, symmetric=False)), "'symmetric': False"),
    (_ct_decl(acts={"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}), "'num_bits': 8"),
    (_ct_decl(acts=dict(CT_W, dynamic=True)), "'dynamic': True"),
    (_ct_decl(kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme with {'type': 'int'} is not read"),
    (_ct_decl(quantization_status="frozen"), "quantization_status 'frozen'"),
])
def test_declarations_the_loader_cannot_read_are_refused_by_name(qc, message):
    with pytest.raises(UnsupportedModel, match="quantization_config") as e:
        detect({"quantization_config": qc})
    assert message in str(e.value), str(e.value)


def test_legacy_declaration_refusals_name_the_file(tmp_path):
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 8}}))
    with pytest.raises(UnsupportedModel, match=r"hf_quant_config.json: ModelOpt NVFP4 with group_size 8"):
        detect({"model_type": "llama"}, tmp_path)


W4A16_INPUT = "the checkpoint declares no quantized activations (W4A16)"


@pytest.mark.parametrize("variant, edit, message", [
    ("modelopt", lambda t: t.pop(f"{Q}.weight_scale_2"), f"{Q}.weight_scale_2 is missing"),
    ("modelopt-legacy", lambda t: t.pop(f"{Q}.input_scale"), f"{Q}.input_scale is missing"),
    ("modelopt", lambda t: t.update({f"{Q}.weight_scale": t[f"{Q}.weight_scale"].float()}),
     "weight_scale is torch.float32"),
    ("modelopt", lambda t: t.update({f"{Q}.weight_scale": t[f"{Q}.weight_scale"][:, :1].contiguous()}), "expected torch.float8_e4m3fn"),
    ("modelopt", lambda t: t.update({f"{Q}.input_scale": torch.tensor(-1.0)}), "input_scale = -1.0"),
    ("modelopt", lambda t: t.update({f"{Q}.pre_quant_scale": torch.ones(64)}), "NVFP4-AWQ"),
    ("ct", lambda t: t.pop(f"{Q}.weight_global_scale"), f"{Q}.weight_global_scale is missing"),
    ("ct", lambda t: t.update({f"{Q}.weight_global_scale": torch.tensor([0.0])}), "weight_global_scale = 0.0"),
    ("ct", lambda t: t.update({f"{Q}.input_global_scale": torch.tensor([1.0])}), W4A16_INPUT),
    ("ct", lambda t: t.update({f"{Q}.weight_zero_point": torch.zeros(1)}), "symmetric"),
    ("ct", lambda t: t.update({f"{Q}.weight_shape": torch.tensor([8, 64])}), "weight_shape (8, 64)"),
    ("ct", lambda t: t.update({f"{Q}.weight_packed": t[f"{Q}.weight_packed"][:8].contiguous(),
                               f"{Q}.weight_scale": t[f"{Q}.weight_scale"][:8].contiguous()}), "FP4 tensors hold a (8, 64)"),
    ("ct-w4a4", lambda t: t.pop(f"{Q}.input_global_scale"), f"{Q}.input_global_scale is missing"),
    ("ct", lambda t: t.update({f"{Q}.stray": torch.zeros(1)}), "does not use"),
    ("modelopt", lambda t: [t.pop(f"{Q}.{k}") for k in ("weight_scale", "weight_scale_2", "input_scale")] and
     t.update({f"{Q}.weight": torch.zeros(64, 64, dtype=torch.float8_e4m3fn)}), f"{Q}.weight is stored in torch.float8_e4m3fn"),
])
def test_bad_files_name_the_tensor(variant, edit, message, llama, tmp_path):
    data, model = llama
    _write(variant, model, data, tmp_path)
    _rewrite(tmp_path, edit)
    with pytest.raises(UnsupportedModel) as e:
        load_model(str(tmp_path), weights="real")
    assert message in str(e.value) and str(tmp_path) in str(e.value), str(e.value)


@pytest.mark.parametrize("variant, key", [("modelopt", "exclude_modules"), ("ct", "ignore")])
def test_a_module_the_declaration_leaves_alone_must_not_be_packed(variant, key, llama, tmp_path):
    data, model = llama
    _write(variant, model, data, tmp_path)
    _edit_config(tmp_path, lambda qc: qc.update({key: ["lm_head", "q_proj"] if variant == "modelopt" else ["re:.*q_proj$"]}))
    with pytest.raises(UnsupportedModel, match=r"q_proj\.weight(_packed)? is packed in FP4 but .* lists .*q_proj as not quantized"):
        load_model(str(tmp_path), weights="real")


@pytest.mark.parametrize("variant", ["modelopt", "ct"])
def test_moe_experts_load_back_exactly_the_weights_written(variant, tmp_path):
    """Qwen3-MoE's experts as ModelOpt / compressed-tensors write them (one NVFP4 linear per expert and projection,
    each with its own global) read into the fused FP4 expert buffers: gate's and up's rows keep their own globals;
    a missing companion tensor is named."""
    from pcg_core.quant.layers.fp4_experts import fp4_dequantized

    data, model = _synthetic(MOE)
    data = data | {"moe_intermediate_size": 64}  # whole blocks of 16 (the tiny MoE's experts are 48 wide)
    model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    with torch.no_grad():  # up's rows ×8: gate's and up's globals differ
        for m in model.modules():
            if hasattr(m, "gate_up_proj") and hasattr(m, "num_experts"):
                m.gate_up_proj[:, m.gate_up_proj.shape[1] // 2:] *= 8
    fmt, legacy, _ = VARIANTS[variant]
    write_checkpoint(model, data, tmp_path, fmt, FP4, legacy=legacy)
    lm = load_model(str(tmp_path), weights="real")
    mods = dict(lm.model.named_modules())
    experts = {n: m for n, m in model.named_modules() if hasattr(m, "gate_up_proj") and hasattr(m, "num_experts")}
    assert experts
    for name, flt in experts.items():
        i = flt.gate_up_proj.shape[1] // 2
        want = torch.stack([torch.cat([quantize_nvfp4(w[:i]).dequantize(), quantize_nvfp4(w[i:]).dequantize()])
                            for w in flt.gate_up_proj.detach()])
        assert mods[name].quant_scheme.name == "nvfp4"
        assert torch.equal(fp4_dequantized(mods[name], "gate_up_proj", torch.float32), want), name
        down = torch.stack([quantize_nvfp4(w).dequantize() for w in flt.down_proj.detach()])
        assert torch.equal(fp4_dequantized(mods[name], "down_proj", torch.float32), down), name
        glob = mods[name].gate_up_proj_global
        assert not torch.equal(glob[:, :i], glob[:, i:])  # gate's and up's own globals
    files = load_file(tmp_path / "model.safetensors")
    key = next(k for k in files if k.endswith(".experts.3.down_proj.weight_scale"))
    save_file({k: v for k, v in files.items() if k != key}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedModel, match=key.replace(".", r"\.") + " is missing"):
        load_model(str(tmp_path), weights="real")


def test_fp4_moe_experts_quantized_in_memory_beside_the_linears():
    data, model = _synthetic(MOE)
    names = quantize_model(model, FP4)
    experts = [n for n, m in model.named_modules() if getattr(m, "quant_scheme", None) is FP4 and not isinstance(m, Fp4Linear)]
    assert experts and set(experts) <= set(names) and any(isinstance(m, Fp4Linear) for m in model.modules())


def test_gpt_oss_mxfp4_checkpoint_loads_back_exactly_the_experts_written(tmp_path):
    """gpt-oss's own format (`quant_method: mxfp4`: the experts' blocks, e8m0 scales and bf16 biases; every linear
    in 16 bits) read into the FP4 expert buffers: the same weights the in-memory mxfp4 quantizer holds; a missing
    tensor is named; the dense linears stay nn.Linear."""
    import copy

    from pcg_core.quant.layers.fp4_experts import fp4_dequantized, quantize_experts_fp4

    data, model = _synthetic("openai__gpt-oss-120b.json")
    mx = FP4_SCHEMES["mxfp4"]
    write_checkpoint(model, data, tmp_path, "mxfp4", mx)
    spec = detect(json.loads((tmp_path / "config.json").read_text()))
    assert spec.format == "mxfp4" and spec.scheme is mx and spec.int4 is None and spec.fp4 is None
    files = load_file(tmp_path / "model.safetensors")
    assert any(k.endswith("experts.gate_up_proj_blocks") for k in files) and files[Q + ".weight"].dtype == torch.float32
    lm = load_model(str(tmp_path), weights="real")
    mods = dict(lm.model.named_modules())
    experts = {n: m for n, m in model.named_modules() if hasattr(m, "gate_up_proj_bias")}
    assert experts
    for name, flt in experts.items():
        want = copy.deepcopy(flt)
        quantize_experts_fp4(want, mx)
        for proj in ("gate_up_proj", "down_proj"):
            assert torch.equal(fp4_dequantized(mods[name], proj, torch.float32), fp4_dequantized(want, proj, torch.float32))
            assert torch.equal(getattr(mods[name], f"{proj}_bias"), getattr(flt, f"{proj}_bias").bfloat16().float())
    assert type(mods[Q]) is torch.nn.Linear
    key = next(k for k in files if k.endswith("layers.1.mlp.experts.down_proj_scales"))
    save_file({k: v for k, v in files.items() if k != key}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedModel, match=key.replace(".", r"\.") + " missing"):
        load_model(str(tmp_path), weights="real")
