"""FP8 KV-cache declarations and scales (pcg_core/quant/formats/kv_scales.py): what ModelOpt and compressed-tensors declare
is read or refused by name; the per-layer k/v scales are read in either producer's naming, checked (one element,
floating point, finite, positive; every attention layer both) and handed to the runtime as the model's
`pcg_kv_scales`; the writers put them where the producers do."""

from __future__ import annotations

import json

import pytest
import torch
from pcg_helpers import CONFIGS, config_path, make_engine
from safetensors.torch import load_file, save_file

from pcg_core import load_model
from pcg_core.errors import UnsupportedModel
from pcg_core.model.loader import (
    build_config,
    read_config_file,
    shrink_config,
    synthetic_model,
)
from pcg_core.quant import (
    FP4_SCHEMES,
    INT4_SCHEMES,
    SCHEMES,
    producer_kv_scales,
    detect,
    load_quantized,
    write_checkpoint,
)
from pcg_core.quant.formats.kv_scales import (
    CT_FP8_KV_SCHEME,
    MODELOPT_FP8_KV_SCHEME,
    READ_TODAY,
)

L0, L1 = "model.layers.0.self_attn.", "model.layers.1.self_attn."


# Declarations ---------------------------------------------------------------------------------------------------
def _modelopt(**kv):
    return {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN", **kv}}


def _ct(kv_cache_scheme):
    return {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "kv_cache_scheme": kv_cache_scheme,
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}}


@pytest.mark.parametrize("config", [
    _modelopt(kv_cache_quant_algo="FP8"),
    _modelopt(kv_cache_scheme=MODELOPT_FP8_KV_SCHEME),  # ModelOpt's config.json layout (convert_hf_quant_config_format)
    _modelopt(kv_cache_scheme="FP8"),
    _modelopt(kv_cache_quant_algo="FP8", kv_cache_scheme=MODELOPT_FP8_KV_SCHEME),
    _ct(CT_FP8_KV_SCHEME),
    _ct({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True, "observer": "minmax",
         "group_size": None, "block_structure": None, "actorder": None, "observer_kwargs": {}}),  # older writers' keys
], ids=["modelopt-algo", "modelopt-scheme", "modelopt-scheme-string", "modelopt-both", "ct", "ct-older-keys"])
def test_fp8_kv_cache_declarations_are_read(config):
    spec = detect(config)
    assert spec.kv_cache is not None and spec.kv_cache.algo == "fp8_e4m3"


def test_a_legacy_modelopt_declaration_of_an_fp8_kv_cache_is_read(tmp_path):
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}))
    spec = detect({"model_type": "llama"}, tmp_path)
    assert spec.kv_cache.where.endswith("hf_quant_config.json") and spec.scheme.name == "nvfp4"


@pytest.mark.parametrize("config", [_modelopt(), _modelopt(kv_cache_quant_algo=None), _ct(None)])
def test_no_kv_cache_declared_means_none(config):
    assert detect(config).kv_cache is None


def test_the_written_ct_scheme_is_compressed_tensors_own():
    """compressed-tensors' QuantizationArgs (vLLM reads the declaration with it) reads what the writer declares as
    FP8 per tensor, static, symmetric, and its model_dump is that declaration."""
    qa = pytest.importorskip("compressed_tensors.quantization").QuantizationArgs
    args = qa.model_validate(CT_FP8_KV_SCHEME)
    assert (args.num_bits, args.type, args.strategy, args.dynamic, args.symmetric) == (8, "float", "tensor", False, True)
    assert qa(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True).model_dump(mode="json") == CT_FP8_KV_SCHEME
    assert detect(_ct(qa.model_validate(MODELOPT_FP8_KV_SCHEME).model_dump(mode="json"))).kv_cache is not None


@pytest.mark.parametrize("config, words", [
    (_modelopt(kv_cache_quant_algo="NVFP4"), "kv_cache_quant_algo 'NVFP4' is not read"),
    (_modelopt(kv_cache_quant_algo="NVFP4_AFFINE"), "'NVFP4_AFFINE'"),
    (_modelopt(kv_cache_quant_algo="INT8"), "'INT8'"),
    (_modelopt(kv_cache_quant_algo="FP8_K_NVFP4_V"), "'FP8_K_NVFP4_V'"),
    (_modelopt(kv_cache_scheme="NVFP4"), "kv_cache_scheme 'NVFP4' is not read"),
    (_modelopt(kv_cache_quant_algo="FP8", kv_cache_scheme="NVFP4"), "the two disagree"),
    (_ct({"num_bits": 8}), "{'type': 'int'}"),  # compressed-tensors' default type: an INT8 KV cache
    (_ct(dict(CT_FP8_KV_SCHEME, num_bits=4)), "{'num_bits': 4}"),
    (_ct(dict(CT_FP8_KV_SCHEME, strategy="attn_head")), "{'strategy': 'attn_head'}"),
    (_ct(dict(CT_FP8_KV_SCHEME, strategy="channel")), "{'strategy': 'channel'}"),
    (_ct(dict(CT_FP8_KV_SCHEME, dynamic=True)), "{'dynamic': True}"),
    (_ct(dict(CT_FP8_KV_SCHEME, symmetric=False)), "{'symmetric': False}"),
    (_ct("FP8"), "is not a mapping"),
])
def test_other_kv_caches_are_refused_by_name_saying_what_is_read(config, words):
    with pytest.raises(UnsupportedModel) as e:
        detect(config)
    assert words in str(e.value) and "quantization_config" in str(e.value) and READ_TODAY in str(e.value)


# Checkpoints ------------------------------------------------------------------------------------------------------
def _tiny(arch="qwen3"):
    path = CONFIGS / "deepseek-ai__DeepSeek-V3.json" if arch == "deepseek-v3" else config_path(arch)
    data = shrink_config(read_config_file(path), tiny=True, layers=2)
    return synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True), data


@pytest.fixture(scope="module")
def qwen3():
    model, data = _tiny()
    kv = producer_kv_scales(model, torch.randint(0, data["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(1)))
    return model, data, kv


def _write(tmp_path, qwen3, fmt="modelopt", scheme=FP4_SCHEMES["nvfp4"], **kw):
    model, data, kv = qwen3
    write_checkpoint(model, data, tmp_path, fmt, scheme, kv_scales=kv, **kw)
    return kv


def _close(got, want):
    return got.keys() == want.keys() and all(g == pytest.approx(w, rel=1e-6) for g, w in zip(got.values(), want.values()))


def test_calibrated_scales_vary_by_layer_and_leave_the_model_as_it_was(qwen3):
    model, _, kv = qwen3
    assert sorted(kv) == [0, 1] and all(0 < s < 1 for pair in kv.values() for s in pair)
    assert len({s for pair in kv.values() for s in pair}) == 4  # a mixed-up layer or k/v would show
    assert model.config._attn_implementation == "pcg"


@pytest.mark.parametrize("fmt, legacy", [("modelopt", True), ("modelopt", False), ("compressed-tensors", False)])
def test_kv_scales_are_read_as_written_and_handed_to_the_runtime(tmp_path, qwen3, fmt, legacy):
    kv = _write(tmp_path, qwen3, fmt, legacy=legacy)
    lm = load_model(str(tmp_path), weights="real")
    assert _close(lm.model.pcg_kv_scales, kv)
    spec = detect(json.loads((tmp_path / "config.json").read_text()), tmp_path)
    model, _, _ = qwen3
    fresh = type(model)(model.config)
    report = load_quantized(fresh, tmp_path, spec, layers=2)
    assert _close(report.kv_scales, kv) and fresh.pcg_kv_scales == report.kv_scales


def test_the_files_hold_the_scales_as_each_producer_writes_them(tmp_path, qwen3):
    _write(tmp_path / "mo", qwen3, "modelopt", legacy=True)
    mo = load_file(tmp_path / "mo" / "model.safetensors")
    assert mo[L0 + "k_proj.k_scale"].shape == () and mo[L1 + "v_proj.v_scale"].dtype == torch.float32
    assert json.loads((tmp_path / "mo" / "hf_quant_config.json").read_text())["quantization"]["kv_cache_quant_algo"] == "FP8"
    _write(tmp_path / "ct", qwen3, "compressed-tensors", scheme=FP4_SCHEMES["nvfp4"])
    ct = load_file(tmp_path / "ct" / "model.safetensors")
    assert ct[L0 + "k_scale"].shape == (1,) and ct[L1 + "v_scale"].dtype == torch.float32  # the model's dtype
    assert json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["kv_cache_scheme"] == CT_FP8_KV_SCHEME


def test_a_mixed_up_layer_in_the_files_is_seen_in_what_is_handed_on(tmp_path, qwen3):
    """The planted fault: layers 0 and 1's k scales swapped in the file. The scales are valid, so the loader takes
    them; what it hands on follows the files, and the comparison above catches the swap."""
    kv = _write(tmp_path, qwen3)
    _edit(tmp_path, lambda t: t.update({L0 + "k_proj.k_scale": t[L1 + "k_proj.k_scale"], L1 + "k_proj.k_scale": t[L0 + "k_proj.k_scale"]}))
    got = load_model(str(tmp_path), weights="real").model.pcg_kv_scales
    assert not _close(got, kv) and got[0][0] == pytest.approx(kv[1][0], rel=1e-6)


def test_a_trimmed_load_reads_the_kept_layers_scales(tmp_path, qwen3):
    kv = _write(tmp_path, qwen3)
    assert _close(load_model(str(tmp_path), weights="real", layers=1).model.pcg_kv_scales, {0: kv[0]})


def test_an_mla_model_hands_on_its_latent_scale_for_k_and_v(tmp_path):
    """DeepSeek-V3 caches one latent row, read as K and V: vLLM writes and reads it with k_scale."""
    model, data = _tiny("deepseek-v3")
    kv = producer_kv_scales(model, torch.randint(0, data["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(2)))
    assert all(k == v for k, v in kv.values()) and kv[0] != kv[1]
    kv = {i: (k, 2 * k) for i, (k, _) in kv.items()}  # a v_scale apart: ModelOpt's files carry one
    write_checkpoint(model, data, tmp_path, "modelopt", SCHEMES["fp8_per_token"], kv_scales=kv)
    got = load_model(str(tmp_path), weights="real").model.pcg_kv_scales
    assert _close(got, {i: (k, k) for i, (k, _) in kv.items()})
    _edit(tmp_path, lambda t: t.update({L1 + "v_proj.v_scale": torch.tensor(-1.0)}))  # still checked
    with pytest.raises(UnsupportedModel, match=r"v_proj.v_scale is -1;"):
        load_model(str(tmp_path), weights="real")


def _edit(path, fn):
    f = path / "model.safetensors"
    t = load_file(f)
    fn(t)
    save_file(t, f)


@pytest.mark.parametrize("fault, words", [
    (lambda t: t.update({L1 + "v_proj.v_scale": torch.tensor(float("nan"))}), L1 + "v_proj.v_scale is nan"),
    (lambda t: t.update({L0 + "k_proj.k_scale": torch.tensor(float("inf"))}), L0 + "k_proj.k_scale is inf"),
    (lambda t: t.update({L0 + "k_proj.k_scale": torch.tensor(-0.01)}), "is -0.01; a KV-cache scale must be finite and positive"),
    (lambda t: t.update({L1 + "k_proj.k_scale": torch.tensor(0.0)}), L1 + "k_proj.k_scale is 0;"),
    (lambda t: t.update({L0 + "v_proj.v_scale": torch.full((2,), 0.01)}), L0 + "v_proj.v_scale has shape (2,)"),
    (lambda t: t.update({L0 + "v_proj.v_scale": torch.full((1, 1), 0.01)}), "has shape (1, 1)"),
    (lambda t: t.update({L0 + "k_proj.k_scale": torch.tensor(1, dtype=torch.int32)}), "is torch.int32"),
    (lambda t: t.pop(L1 + "v_proj.v_scale"), f"layer 1's {L1}v_proj.v_scale (or {L1}v_scale) is missing; {L1}k_proj.k_scale is there"),
    (lambda t: [t.pop(L1 + "k_proj.k_scale"), t.pop(L1 + "v_proj.v_scale")], f"layer 1's {L1}k_proj.k_scale (or {L1}k_scale) and"),
    (lambda t: t.update({L0 + "k_scale": torch.tensor([0.01])}), "both " + L0 + "k_proj.k_scale and " + L0 + "k_scale"),
    (lambda t: t.update({"model.layers.0.mlp.k_scale": torch.tensor(0.01)}), "no attention layer of that name"),
])
def test_broken_kv_scales_are_refused_naming_the_tensor_and_file(tmp_path, qwen3, fault, words):
    _write(tmp_path, qwen3)
    _edit(tmp_path, fault)
    with pytest.raises(UnsupportedModel) as e:
        load_model(str(tmp_path), weights="real")
    assert words in str(e.value), str(e.value)
    assert "model.safetensors" in str(e.value) or str(tmp_path) in str(e.value)


def test_scales_without_a_declaration_are_refused(tmp_path, qwen3):
    _write(tmp_path, qwen3, legacy=True)
    cfg = tmp_path / "hf_quant_config.json"
    decl = json.loads(cfg.read_text())
    decl["quantization"]["kv_cache_quant_algo"] = None
    cfg.write_text(json.dumps(decl))
    with pytest.raises(UnsupportedModel, match=r"holds KV-cache scales .* declares no quantized KV cache"):
        load_model(str(tmp_path), weights="real")


def test_a_declaration_without_any_scales_is_refused(tmp_path, qwen3):
    _write(tmp_path, qwen3)
    _edit(tmp_path, lambda t: [t.pop(k) for k in list(t) if k.endswith(("k_scale", "v_scale"))])
    with pytest.raises(UnsupportedModel, match=r"declares an FP8 KV cache .* layer 0's"):
        load_model(str(tmp_path), weights="real")


def test_the_writer_declares_kv_caches_only_where_the_format_has_one(tmp_path, qwen3):
    model, data, kv = qwen3
    with pytest.raises(ValueError, match="no FP8 KV-cache declaration for format 'awq'"):
        write_checkpoint(model, data, tmp_path, "awq", INT4_SCHEMES["awq"], kv_scales=kv)
    with pytest.raises(ValueError, match="attention layers are"):
        write_checkpoint(model, data, tmp_path, "modelopt", FP4_SCHEMES["nvfp4"], kv_scales={0: kv[0]})


@pytest.mark.parametrize("arch", ["qwen3", "deepseek-v3"])
def test_calibration_measures_what_pcg_s_kv_cache_holds(arch):
    """The scales × 448 against the absmax of pcg's own KV cache after the same prompt's prefill: equal for K and V
    (after Qwen3's k_norm and the rotary embedding, as cached); for MLA's latent an upper bound, tight within √2 (its
    rope part is bounded by its pairs' norms). A calibration of k_proj's raw output would be off by the norm's gain."""
    model, data = _tiny(arch)
    ids = torch.randint(0, data["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(4))
    kv = producer_kv_scales(model, ids)
    engine = make_engine(model, "disabled")
    engine.forward(engine.prefill_batch([ids[0].tolist()]))
    for layer, (k, v) in kv.items():
        held_k, held_v = float(engine.cache.k[layer].abs().max()), float(engine.cache.v[layer].abs().max())
        if arch == "deepseek-v3":
            assert held_k <= k * 448 * (1 + 1e-5) and k * 448 <= held_k * 2**0.5 and k == v
        else:
            assert k * 448 == pytest.approx(held_k, rel=1e-4) and v * 448 == pytest.approx(held_v, rel=1e-4)


def _modelopt_export_layout(tmp_path):
    """The folder as ModelOpt's export leaves it: hf_quant_config.json, and config.json's quantization_config its
    conversion (convert_hf_quant_config_format: quant_algo, ignore, kv_cache_scheme, config_groups, producer)."""
    legacy = json.loads((tmp_path / "hf_quant_config.json").read_text())
    q = legacy["quantization"]
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {
        "config_groups": {"group_0": {"input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
                                      "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
                                      "targets": ["Linear"]}},
        "ignore": q["exclude_modules"], "quant_algo": q["quant_algo"], "kv_cache_scheme": dict(MODELOPT_FP8_KV_SCHEME),
        "producer": legacy["producer"], "quant_method": "modelopt"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return cfg


def test_a_modelopt_export_with_both_declarations_loads_when_they_agree(tmp_path, qwen3):
    kv = _write(tmp_path, qwen3, legacy=True)
    cfg = _modelopt_export_layout(tmp_path)
    assert _close(load_model(str(tmp_path), weights="real").model.pcg_kv_scales, kv)
    for key, value, words in [("kv_cache_scheme", None, "FP8 KV cache True vs False"),
                              ("ignore", [], "excluded modules {'lm_head'} vs set()")]:
        bad = json.loads(json.dumps(cfg))
        bad["quantization_config"][key] = value
        (tmp_path / "config.json").write_text(json.dumps(bad))
        with pytest.raises(UnsupportedModel, match="disagree") as e:
            load_model(str(tmp_path), weights="real")
        assert words in str(e.value) and "hf_quant_config.json" in str(e.value)


def test_another_producers_declaration_beside_hf_quant_config_is_still_refused(tmp_path):
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}))
    with pytest.raises(UnsupportedModel, match="remove the stale one"):
        detect(_ct(CT_FP8_KV_SCHEME), tmp_path)


def test_older_compressed_tensors_naming_is_refused_saying_so(tmp_path, qwen3):
    _write(tmp_path, qwen3, "compressed-tensors")
    _edit(tmp_path, lambda t: [t.update({k.replace("self_attn.k_scale", "self_attn.k_proj.output_scale")
                                         .replace("self_attn.v_scale", "self_attn.v_proj.output_scale"): t.pop(k)})
                               for k in list(t) if k.endswith(("k_scale", "v_scale"))])
    with pytest.raises(UnsupportedModel, match=r"layer 0's .* is missing; .*k_proj.output_scale \(older compressed-tensors' naming\)"):
        load_model(str(tmp_path), weights="real")
