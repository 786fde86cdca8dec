"""The checkpoint's quantization, read from quantization_config, for the schemes contributors publish."""

from __future__ import annotations

import pytest

from harness.request.analyze import analyze
from harness.request.quantization import describe, quantization_of
from request_helpers import load_config

BASE = load_config("Qwen__Qwen3-8B.json")


@pytest.mark.parametrize("qc, expected", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
     {"method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
     {"method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}),
    ({"quant_method": "fp8", "activation_scheme": "static"}, {"method": "fp8", "activation_scheme": "static"}),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None},
     {"method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None}),
    ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
     {"method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}),
])
def test_schemes(qc, expected):
    assert quantization_of(BASE | {"quantization_config": qc}) == expected


def test_compressed_tensors_lifts_the_first_groups_scheme():
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
          "config_groups": {"group_0": {"targets": ["Linear"],
                                        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True},
                                        "input_activations": None}}}
    q = quantization_of(BASE | {"quantization_config": qc})
    assert q == {"method": "compressed-tensors", "weight_bits": 4, "weight_type": "int", "weight_strategy": "group",
                 "group_size": 128, "groups": 1, "format": "pack-quantized", "ignore": ["lm_head"]}
    fp8 = {"quant_method": "compressed-tensors", "format": "float-quantized",
           "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                   "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}
    q = quantization_of(BASE | {"quantization_config": fp8})
    assert (q["weight_bits"], q["activation_bits"], q["activation_dynamic"]) == (8, 8, True)


def test_absent_or_empty_is_null_and_describe_reads_well():
    assert quantization_of(BASE) is None
    assert quantization_of(BASE | {"quantization_config": None}) is None
    assert describe(None) == "none (unquantized)"
    assert describe(quantization_of(load_config("deepseek-ai__DeepSeek-V3.json"))) == "fp8 (fmt e4m3, block 128x128, dynamic activations)"


def test_quantized_supported_architecture_fails_only_the_quant_axis():
    r = analyze(BASE | {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}})
    assert r["supported"] is True and r["quantization"]["method"] == "awq"
    assert r["verdicts"]["quant"]["ok"] and "awq supported" in r["verdicts"]["quant"]["reason"]  # the loader reads it
    # what the loader refuses in an int4 declaration is the verdict's reason
    q8 = analyze(BASE | {"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 128}})["verdicts"]["quant"]
    assert not q8["ok"] and "gptq with 8-bit weights: only 4-bit ones are read" in q8["reason"], q8
    ct = analyze(BASE | {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                                  "config_groups": {"g": {"targets": ["Linear"], "weights": {
                                                      "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}})
    assert ct["verdicts"]["quant"]["ok"] and "compressed-tensors (as gptq)" in ct["verdicts"]["quant"]["reason"]
    moe = load_config("Qwen__Qwen3-30B-A3B.json") | {"quantization_config": {"quant_method": "gptq", "bits": 4}}
    v = analyze(moe)["verdicts"]["quant"]
    assert v["ok"] and "gptq supported" in v["reason"], v  # the per-expert int4 tensors are read
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    nv = analyze(BASE | {"quantization_config": nvfp4})["verdicts"]["quant"]
    assert nv["ok"] and "modelopt (as nvfp4) supported" in nv["reason"], nv  # the loader reads NVFP4, runs it W4A16
    nv_moe = analyze(load_config("Qwen__Qwen3-30B-A3B.json") | {"quantization_config": nvfp4})["verdicts"]["quant"]
    assert nv_moe["ok"] and "modelopt (as nvfp4) supported" in nv_moe["reason"], nv_moe  # per-expert NVFP4 tensors are read
    g32 = analyze(BASE | {"quantization_config": nvfp4 | {"group_size": 32}})["verdicts"]["quant"]
    assert not g32["ok"] and "NVFP4 with group_size 32" in g32["reason"], g32
    assert r["verdicts"]["model"]["ok"] and r["verdicts"]["graph"]["ok"]
    ok = analyze(BASE | {"quantization_config": {"quant_method": "awq", "bits": 4}}, quants=["none"])["verdicts"]["quant"]
    assert ok["ok"] and "published weights are awq" in ok["reason"]


def test_a_quantization_config_that_is_not_a_mapping_is_a_clear_error():
    from pcg_core.errors import ConfigError

    with pytest.raises(ConfigError, match="quantization_config must be a mapping"):
        quantization_of(BASE | {"quantization_config": "fp8"})


def test_the_kv_cache_verdict_names_a_declared_fp8_kv_cache():
    plain = analyze(BASE)["verdicts"]["kv_cache"]
    assert plain["ok"] and "declares no KV-cache scales" in plain["reason"] and "calibrates" in plain["reason"]
    modelopt = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    v = analyze(BASE | {"quantization_config": modelopt})["verdicts"]["kv_cache"]
    assert v["ok"] and "declares an FP8 KV cache (kv_cache_quant_algo FP8)" in v["reason"], v
    ct = {"quant_method": "compressed-tensors", "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor"}}
    v = analyze(BASE | {"quantization_config": ct})["verdicts"]["kv_cache"]
    assert "kv_cache_scheme type float, num_bits 8, strategy tensor" in v["reason"], v
    none_declared = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None}
    assert "declares no KV-cache scales" in analyze(BASE | {"quantization_config": none_declared})["verdicts"]["kv_cache"]["reason"]
