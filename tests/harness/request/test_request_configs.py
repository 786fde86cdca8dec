"""A correct analysis for every real config in harness/models/configs: architecture, runtime support, features
and quantization, exactly; and the per-axis verdicts that follow from the runtime's capability table."""

from __future__ import annotations

import json

import pytest

from harness.cards import load_cards
from harness.request.analyze import analyze
from harness.request.features import FEATURES
from pcg_core.capabilities import capabilities

from request_helpers import REPO_CONFIGS

FP8_BLOCK = {"method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
MXFP4 = {"method": "mxfp4",
         "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}

# file → (architecture, supported, features, quantization)
EXPECTED = {
    "Qwen__Qwen2.5-0.5B.json": ("Qwen2ForCausalLM", True, [], None),  # sliding_window set but use_sliding_window false
    "Qwen__Qwen3-0.6B.json": ("Qwen3ForCausalLM", True, [], None),
    "Qwen__Qwen3-8B.json": ("Qwen3ForCausalLM", True, [], None),
    "Qwen__Qwen3-30B-A3B.json": ("Qwen3MoeForCausalLM", True, ["moe"], None),
    "Qwen__Qwen3-235B-A22B.json": ("Qwen3MoeForCausalLM", True, ["moe"], None),
    "meta-llama__Llama-3.1-8B-Instruct.json": ("LlamaForCausalLM", True, ["rope_scaling"], None),  # llama3 rope
    "mistralai__Mixtral-8x7B-v0.1.json": ("MixtralForCausalLM", True, ["moe"], None),
    "deepseek-ai__DeepSeek-V3.json": ("DeepseekV3ForCausalLM", True, ["moe", "mla", "rope_scaling"], FP8_BLOCK),
    "moonshotai__Kimi-K2-Instruct.json": ("DeepseekV3ForCausalLM", True, ["moe", "mla", "rope_scaling"], FP8_BLOCK),
    # gpt-oss's rope_scaling is yarn (factor 32), so rope_scaling is exercised too.
    "openai__gpt-oss-120b.json": ("GptOssForCausalLM", True, ["moe", "sliding_window", "sinks", "rope_scaling"], MXFP4),
    "Qwen__Qwen3-Next-80B-A3B-Instruct.json": ("Qwen3NextForCausalLM", True, ["moe", "linear_attention"], None),
    # mrope with rope_type default is not scaling.
    "Qwen__Qwen3-VL-30B-A3B-Instruct.json": ("Qwen3VLMoeForConditionalGeneration", True, ["moe", "vlm"], None),
    "xai-org__grok-2.json": ("Grok1ForCausalLM", True, ["moe", "softcap", "length_temperature"], None),
}
CONFIG_FILES = sorted(p.name for p in REPO_CONFIGS.glob("*.json"))


def _analyze(name: str) -> dict:
    return analyze(json.loads((REPO_CONFIGS / name).read_text()), model=name)


def test_every_config_file_has_an_expectation():
    assert sorted(EXPECTED) == CONFIG_FILES, "a config was added to harness/models/configs: add its expected verdict here"


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_verdict_per_config(name):
    r = _analyze(name)
    arch, supported, features, quant = EXPECTED[name]
    assert r["architecture"] == arch
    assert r["supported"] is supported
    assert r["features"] == features
    assert r["quantization"] == quant
    assert set(r["verdicts"]) == {"model", "quant", "attention", "parallel", "graph", "kv_cache"}
    assert r["verdicts"]["model"]["ok"] is supported
    assert r["verdicts"]["kv_cache"]["ok"] and "fp8_e4m3 (FP8 read by sdpa, flex, varlen)" in r["verdicts"]["kv_cache"]["reason"]
    assert (r["reason"] is None) is supported
    if not supported:
        assert arch in r["reason"] or "model_type" in r["reason"]


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_features_use_only_the_matrix_words_in_order(name):
    r = _analyze(name)
    assert r["features"] == [f for f in FEATURES if f in r["features"]]
    assert set(r["feature_details"]) == set(r["features"])


def test_supported_set_is_the_runtime_table():
    supported = {EXPECTED[n][0] for n in CONFIG_FILES if _analyze(n)["supported"]}
    # Qwen2.5-VL's card transcribes its config inline (no config.json shipped): the cards' configs count too.
    cards = {c.architecture for c in load_cards().values() if analyze(c.config, model=c.id)["supported"]}
    assert supported | cards == set(capabilities()["architectures"])


def test_card_features_agree_with_the_analysis():
    """Each model card's features (less its quantization word) are found by the analysis, inline configs included."""
    for card in load_cards().values():
        r = analyze(card.config, model=card.id)
        quant = r["quantization"]["method"] if r["quantization"] else None
        assert set(card.features) - {quant} <= set(r["features"]), card.id
        assert r["architecture"] == card.architecture, card.id


def test_moe_and_mla_details():
    ds = _analyze("deepseek-ai__DeepSeek-V3.json")
    assert ds["feature_details"]["moe"] == {"experts": 256, "top_k": 8, "shared_experts": 1, "expert_intermediate_size": 2048,
                                            "moe_layers": 58, "dense_layers": 3}
    assert ds["feature_details"]["mla"]["kv_lora_rank"] == 512 and ds["feature_details"]["mla"]["q_lora_rank"] == 1536
    assert ds["feature_details"]["rope_scaling"]["type"] == "yarn"
    mixtral = _analyze("mistralai__Mixtral-8x7B-v0.1.json")["feature_details"]["moe"]
    assert (mixtral["experts"], mixtral["top_k"], mixtral["shared_experts"]) == (8, 2, 0)
    nxt = _analyze("Qwen__Qwen3-Next-80B-A3B-Instruct.json")["feature_details"]
    assert nxt["moe"]["experts"] == 512 and nxt["moe"]["top_k"] == 10 and nxt["moe"]["shared_experts"] == 1
    assert nxt["linear_attention"] == {"linear_layers": 36, "full_layers": 12, "full_attention_interval": 4}
    oss = _analyze("openai__gpt-oss-120b.json")["feature_details"]
    assert oss["sliding_window"] == {"window": 128, "sliding_layers": 18, "full_layers": 18}
    assert oss["moe"]["top_k"] == 4 and oss["sinks"] == {"heads": 64}


def test_qwen3_next_verdicts_agree_with_the_precheck():
    """linear_attention is the split op's (any attention backend serves the full layers); full cannot record it."""
    v = _analyze("Qwen__Qwen3-Next-80B-A3B-Instruct.json")["verdicts"]
    assert v["model"]["ok"] and v["attention"]["ok"] and v["graph"]["ok"]
    assert "full cannot: capture backend full records every op in one graph and pcg::linear_attention" in v["graph"]["reason"]
    assert "cannot" not in _analyze("Qwen__Qwen3-8B.json")["verdicts"]["graph"]["reason"]


def test_kimi_k2_remote_code_is_never_run_and_is_said_so():
    r = _analyze("moonshotai__Kimi-K2-Instruct.json")
    assert r["model_type"] == "kimi_k2" and r["supported"] and r["architecture"] == "DeepseekV3ForCausalLM"
    assert any("remote code" in n and "never runs it" in n for n in r["notes"])
    assert any("'kimi_k2'" in n and "'deepseek_v3'" in n for n in r["notes"])


def test_grok2_model_type_git_is_read_as_published():
    r = _analyze("xai-org__grok-2.json")
    assert r["model_type"] == "git" and r["architecture"] == "Grok1ForCausalLM"
    assert any("transformers has no class Grok1ForCausalLM" in n and "GitConfig" in n for n in r["notes"])
    assert r["feature_details"]["moe"]["experts"] == 8 and r["feature_details"]["moe"]["top_k"] == 2


def test_verdicts_of_a_supported_dense_model():
    v = _analyze("Qwen__Qwen3-0.6B.json")["verdicts"]
    assert all(x["ok"] for x in v.values()), v
    assert "Qwen3ForCausalLM" in v["model"]["reason"]
    assert "sdpa" in v["attention"]["reason"] and "piecewise" in v["graph"]["reason"]
    assert "tp1" in v["parallel"]["reason"]


def test_verdicts_of_unsupported_models_name_the_missing_capability():
    ds = _analyze("deepseek-ai__DeepSeek-V3.json")["verdicts"]
    # the loader reads DeepSeek's fp8 blocks, per-expert MoE tensors included: the quantization is not what is missing
    assert ds["quant"]["ok"] and "fp8 (as fp8_block)" in ds["quant"]["reason"], ds["quant"]
    # MLA runs on sdpa and flex: the verdict names the backend that lacks it
    assert ds["attention"]["ok"] and "flex (capturable)," in ds["attention"]["reason"]
    assert "varlen (capturable; not on cpu; lacks mla)" in ds["attention"]["reason"]
    assert ds["graph"]["ok"] and "full capture through sdpa, flex (capturable)" in ds["graph"]["reason"], ds["graph"]
    assert not ds["parallel"]["ok"] and "11 H200s" in ds["parallel"]["reason"]
    oss = _analyze("openai__gpt-oss-120b.json")["verdicts"]
    assert "sliding_window, sinks" in oss["attention"]["reason"] and "mxfp4" in oss["quant"]["reason"]
    oss4 = analyze(json.loads((REPO_CONFIGS / "openai__gpt-oss-120b.json").read_text()), model="oss", tps=[4])["verdicts"]
    assert oss4["parallel"]["ok"] and "tp4: runs on 4 GPU(s)" in oss4["parallel"]["reason"]
    vl = _analyze("Qwen__Qwen3-VL-30B-A3B-Instruct.json")["verdicts"]
    assert vl["attention"]["ok"] and vl["parallel"]["ok"] and vl["graph"]["ok"]  # the text decoder is captured


def test_verdicts_follow_the_capability_table():
    """A runtime that grows tp2 and an MLA architecture turns those verdicts ok with no change here; one whose
    loader cannot read some feature's checkpoints turns the quantization verdict down."""
    caps = capabilities()
    caps["quant_schemes"]["fp8_block"]["checkpoint_limits"] = {"moe": "per-expert tensors are not read"}
    r = analyze(json.loads((REPO_CONFIGS / "deepseek-ai__DeepSeek-V3.json").read_text()), model="ds", caps=caps)
    assert not r["verdicts"]["quant"]["ok"] and "per-expert tensors are not read" in r["verdicts"]["quant"]["reason"]
    caps["quant_schemes"]["fp8_block"]["checkpoint_limits"] = {}
    caps["parallel"] = {**caps["parallel"], "tp2": 2}
    caps["architectures"] = {**caps["architectures"], "Phantom": ["moe", "mla"]}
    r = analyze(json.loads((REPO_CONFIGS / "deepseek-ai__DeepSeek-V3.json").read_text()), model="ds", caps=caps, tps=[2])
    assert r["verdicts"]["quant"]["ok"] and r["verdicts"]["attention"]["ok"]
    assert not r["verdicts"]["parallel"]["ok"] and "need 11 H200s, more than 2" in r["verdicts"]["parallel"]["reason"]
    caps["capture_backends"] = {"disabled": {"requires_capturable_attention": False}}
    r = analyze(json.loads((REPO_CONFIGS / "Qwen__Qwen3-0.6B.json").read_text()), model="q", caps=caps)
    assert not r["verdicts"]["graph"]["ok"] and "no capture backend" in r["verdicts"]["graph"]["reason"]


def test_a_tp_size_the_runtime_does_not_run_is_said_as_a_what_if(pcgh, db):
    """`--tp 16` checks a size against the heads and the weights; while the runtime runs TP up to 8, the verdict and
    the headline say first that it does not run, not only that the model is supported."""
    par = analyze(json.loads((REPO_CONFIGS / "Qwen__Qwen3-30B-A3B.json").read_text()), model="q", tps=[16])["verdicts"]["parallel"]
    assert not par["ok"] and par["reason"].startswith("tp16: not run by the runtime yet, which runs tp1, tp2, tp4, tp8, ")
    assert "as a what-if" in par["reason"]
    rc, out, _ = pcgh("request", REPO_CONFIGS / "Qwen__Qwen3-30B-A3B.json", "--tp", "16", "--db", db)
    assert rc == 0 and "Qwen3MoeForCausalLM — supported, but not as asked: parallel" in " ".join(out.split())


def test_a_tp_size_the_runtime_runs_is_checked_against_its_sharding_of_the_model():
    """tp2 runs, but not for every shape: the verdict says what the sharding cannot divide for this one."""
    def par(name: str, **change) -> dict:
        cfg = {**json.loads((REPO_CONFIGS / name).read_text()), **change}
        return analyze(cfg, model="m", tps=[2])["verdicts"]["parallel"]

    assert par("Qwen__Qwen3-0.6B.json") == {"ok": True, "reason": "tp2: runs on 2 GPU(s)"}
    assert par("openai__gpt-oss-120b.json")["ok"] and par("Qwen__Qwen3-Next-80B-A3B-Instruct.json")["ok"]
    odd = par("Qwen__Qwen3-Next-80B-A3B-Instruct.json", linear_num_key_heads=3)
    assert not odd["ok"] and "does not divide the linear-attention layers' 3 key heads" in odd["reason"]


def test_requested_quant_and_tp_are_checked():
    cfg = json.loads((REPO_CONFIGS / "Qwen__Qwen3-0.6B.json").read_text())
    r = analyze(cfg, model="q", quants=["none", "gguf"], tps=[1, 3])
    assert r["requested"] == {"quant": ["none", "gguf"], "tp": [1, 3]}
    assert not r["verdicts"]["quant"]["ok"] and "gguf is not supported" in r["verdicts"]["quant"]["reason"]
    par = r["verdicts"]["parallel"]
    assert not par["ok"] and "TP 3 does not divide the heads" in par["reason"] and "tp1: runs on 1 GPU" in par["reason"]
    assert analyze(cfg, model="q", quants=["none"], tps=[1])["verdicts"]["parallel"]["ok"]


@pytest.mark.parametrize("word", ["nvfp4", "fp4"])
def test_nvfp4_is_the_runtimes_name_and_fp4_its_alias(word):
    """The runtime runs NVFP4 (W4A16); a request for it, by its name or the old one, is not `unsupported`."""
    cfg = json.loads((REPO_CONFIGS / "Qwen__Qwen3-0.6B.json").read_text())
    r = analyze(cfg, model="q", quants=[word], tps=[1])
    assert r["requested"]["quant"] == ["nvfp4"] and r["verdicts"]["quant"]["ok"], r["verdicts"]["quant"]
