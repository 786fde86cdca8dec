"""Parameter counts from the config alone, against published counts; memory, H200s, TP and EP sizes."""

from __future__ import annotations

import math

import pytest
from request_helpers import load_config

from harness.cards import load_cards
from harness.request.analyze import analyze
from harness.shape.params import BYTES_PER_PARAM, H200_BYTES, h200s_needed, memory_bytes

B = 1e9
# file → (published total, published active or None for dense); model cards and technical reports.
PUBLISHED = {
    "Qwen__Qwen3-0.6B.json": (0.6 * B, None),
    "Qwen__Qwen3-8B.json": (8.2 * B, None),
    "meta-llama__Llama-3.1-8B-Instruct.json": (8.03 * B, None),
    "Qwen__Qwen2.5-0.5B.json": (0.49 * B, None),
    "Qwen__Qwen3-30B-A3B.json": (30.5 * B, 3.3 * B),
    "Qwen__Qwen3-235B-A22B.json": (235 * B, 22 * B),
    "mistralai__Mixtral-8x7B-v0.1.json": (46.7 * B, 12.9 * B),
    "deepseek-ai__DeepSeek-V3.json": (671 * B, 37 * B),
    "moonshotai__Kimi-K2-Instruct.json": (1.04e12, 32 * B),  # "1T total, 32B activated"
    "openai__gpt-oss-120b.json": (116.8 * B, None),  # OpenAI's 5.1B active leaves the input embedding out
    "Qwen__Qwen3-Next-80B-A3B-Instruct.json": (80 * B, None),
    "xai-org__grok-2.json": (270 * B, None),
}
TOLERANCE = 0.03


def _close(value: int, published: float, tol: float = TOLERANCE) -> bool:
    return abs(value - published) / published <= tol


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts_match_published(name):
    r = analyze(load_config(name), model=name)
    total, active = PUBLISHED[name]
    assert _close(r["params"], total), f"{name}: {r['params'] / B:.2f}B vs {total / B:.2f}B"
    if active is not None:
        assert _close(r["active_params"], active), f"{name}: active {r['active_params'] / B:.2f}B vs {active / B:.2f}B"
    assert sum(r["param_breakdown"].values()) == r["params"]


def test_qwen3_0_6b_non_embedding():
    r = analyze(load_config("Qwen__Qwen3-0.6B.json"))
    assert _close(r["params"], 0.596 * B, 0.01)  # tied embeddings: one table
    assert _close(r["non_embedding_params"], 0.44 * B, 0.01)
    assert "lm_head" not in r["param_breakdown"]
    assert r["active_params"] == r["params"]  # dense: every parameter is used per token


def test_qwen3_8b_untied_and_non_embedding():
    r = analyze(load_config("Qwen__Qwen3-8B.json"))
    assert r["param_breakdown"]["lm_head"] == r["param_breakdown"]["embedding"] == 151936 * 4096
    assert _close(r["non_embedding_params"], 6.95 * B, 0.01)


def test_vlm_tower_is_counted_in_total_not_in_active():
    vl = analyze(load_config("Qwen__Qwen3-VL-30B-A3B-Instruct.json"))
    text = analyze(load_config("Qwen__Qwen3-30B-A3B.json"))
    assert 0.4 * B < vl["param_breakdown"]["vision"] < 0.7 * B
    assert _close(vl["params"], 31.1 * B, 0.02)
    assert vl["active_params"] == text["active_params"]
    card = load_cards()["qwen2.5-vl-7b"]  # inline config, transcribed; published 8.29B
    assert _close(analyze(card.config)["params"], 8.29 * B, 0.02)


def test_mla_and_shared_experts_and_dense_layers_are_counted():
    b = analyze(load_config("deepseek-ai__DeepSeek-V3.json"))["param_breakdown"]
    assert b["shared_experts"] == 58 * 3 * 7168 * 2048
    assert b["mlp"] == 3 * 3 * 7168 * 18432  # first_k_dense_replace=3 dense layers
    per_layer_mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 * 128 * 256 + 128 * 128 * 7168
    assert b["attention"] == 61 * per_layer_mla
    nxt = analyze(load_config("Qwen__Qwen3-Next-80B-A3B-Instruct.json"))["param_breakdown"]
    assert nxt["linear_attention"] > 0 and nxt["shared_experts"] == 48 * (3 * 2048 * 512 + 2048)


def test_memory_per_dtype_and_h200_rule():
    r = analyze(load_config("Qwen__Qwen3-30B-A3B.json"))
    p = r["params"]
    assert r["memory_bytes"] == {"float32": 4 * p, "bfloat16": 2 * p, "fp8": p, "int4": math.ceil(p / 2)}
    assert r["h200s"] == 1  # 61 GB of bf16 weights
    assert analyze(load_config("Qwen__Qwen3-235B-A22B.json"))["h200s"] == 4  # 470 GB × 1.1 / 141 GB → 3.67
    assert analyze(load_config("deepseek-ai__DeepSeek-V3.json"))["h200s"] == 11
    assert set(memory_bytes(10)) == set(BYTES_PER_PARAM)
    # The rule: ceil(bf16 bytes × 1.1 / 141 GB).
    just_fits = int(H200_BYTES / 2 / 1.1)
    assert h200s_needed(just_fits) == 1 and h200s_needed(just_fits + 10**6) == 2


@pytest.mark.parametrize("name, tp, ep", [
    ("Qwen__Qwen3-0.6B.json", [1, 2, 4, 8], []),  # 16 heads, 8 KV heads
    ("Qwen__Qwen2.5-0.5B.json", [1, 2], []),  # 14 heads, 2 KV heads
    ("Qwen__Qwen3-30B-A3B.json", [1, 2, 4, 8], [1, 2, 4, 8]),  # 4 KV heads (tp8: each kept by 2 ranks); 128 experts
    ("mistralai__Mixtral-8x7B-v0.1.json", [1, 2, 4, 8], [1, 2, 4, 8]),
    ("moonshotai__Kimi-K2-Instruct.json", [1, 2, 4, 8], [1, 2, 3, 4, 6, 8]),  # 384 experts
    ("Qwen__Qwen3-Next-80B-A3B-Instruct.json", [1, 2, 4, 8], [1, 2, 4, 8]),  # 2 KV heads, replicated past tp2
])
def test_tp_and_ep_sizes(name, tp, ep):
    r = analyze(load_config(name))
    assert r["tp_sizes"] == tp
    assert r["ep_sizes"] == ep


def test_missing_widths_give_no_count_but_an_analysis():
    r = analyze({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_attention_heads": 8})
    assert r["params"] is None and r["memory_bytes"] == {} and r["h200s"] is None
    assert any("hidden_size" in n for n in r["notes"])
    assert not r["verdicts"]["parallel"]["ok"]
